// GaLore under --offload optimizer, stepped on the host (issue 43 point 6): only the low-rank
// gradient crosses to the host.
//
// For a unit with GaLore matrices, the unit's gradient shard stays on the device until the step (not
// handed over in backward), and there, once the global norm is known, each GaLore matrix's gradient
// is scaled by the clip coefficient, its projector (a device copy of the host's) refreshed when the
// schedule says so, and the gradient projected, by the rule's own code (optim/update_rules.h), on
// the device, its collectives (a sharded matrix's refresh gathers its gradient; a left projection
// sums across ranks) over the device's communicator, every rank in the optimizer's order:
//   the low-rank gradient (rows x r or r x cols, in place of rows x cols) crosses into the first
//   elements of the matrix's range of the unit's host landing buffer, where the host step reads it
//   as the moments' input (ParameterState::precomputed_input);
//   at a refresh, the projector crosses into the host state (project_back and checkpoints read it);
//   the unit's other parameters (norm gains) cross as they are, and the host step scales them.
// So the host step runs the same operations on the same values as GaLore without offload: the
// scale before the refresh and the projection, the refresh from the scaled gradient.
// Device memory: the projectors' copies, and the covered units' gradient shards until the step.
// The device projectors follow the host's after a checkpoint is loaded (publish).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "optim/shard_optimizer.h"

namespace llm {

class Communicator;

class LowRankGradients {
 public:
  // landing: every unit's host landing buffer (the optimizer's gradient shards). Covers the units
  // with a GaLore matrix; their matrices' host inputs are set here. across: the device tensors'
  // communicator over the ranks that shard the units (nullptr: whole on each rank).
  LowRankGradients(ShardOptimizer& optimizer, const std::vector<at::Tensor>& landing, c10::Device device,
                   Communicator* across);

  bool covers(size_t unit) const { return !matrices_.at(unit).empty(); }
  // The device half of the unit's step t (after begin_step), on the current stream: scale, refresh,
  // project. Returns the copies to make, (host destination, device source), in order: each GaLore
  // matrix's low-rank gradient (and its projector at a refresh), then each other parameter's gradient.
  std::vector<std::pair<at::Tensor, at::Tensor>> prepare(size_t unit, const at::Tensor& device_gradient,
                                                         double gradient_scale);
  // The unit's device projectors from the host state (after a checkpoint's state was loaded).
  void publish(size_t unit);
  int64_t device_bytes() const;  // the projectors' copies

 private:
  struct Matrix {
    size_t parameter = 0;        // its index in the unit's ParameterStates
    ParameterState on_device;    // the host's, with the device gradient view and projector copy
  };
  ShardOptimizer& optimizer_;
  const OptimizerSettings& settings_;
  Communicator* across_;
  std::vector<std::vector<Matrix>> matrices_;  // per unit
  std::vector<at::Tensor> landing_;
};

}  // namespace llm
