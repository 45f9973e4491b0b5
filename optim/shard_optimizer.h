// The optimizer on a rank's flat shards, unit by unit: the one optimizer the training loop sees.
//
// It is given the units as the sharding lays them out: each unit's flat fp32 master and gradient
// shards, their layout (sharding/flat_layout.h: this rank's whole rows of every parameter, padded
// with zero rows up to rows_per_rank), and an update rule per parameter (optim/update_rules.h).
// Whole rows are what let the row-wise statistics of subset-norm and the projections of GaLore run
// on a shard and still equal the unsharded result; the few quantities that span ranks (a wide
// matrix's column norms, a subset crossing a shard boundary, GaLore's low-rank gradient of a
// left-projected matrix, a projector) go through the Communicator, so N ranks give one rank's
// numbers (docs/optimizers.md has each rule's maths and its collectives).
//
// Each unit's state lives in three flat buffers of its own, one per kind, with the parameters'
// parts one after another in layout order:
//   exp_avg     the first moment: laid out exactly like the shard under adamw, adam_hf and
//               subset_norm; GaLore's low-rank moment under galore; nothing with beta1 = 0 (HF rules)
//   exp_avg_sq  the second moment: like the shard (adamw, adam_hf), one entry per subset
//               (subset_norm), low-rank (galore)
//   projector   GaLore's projectors
// So a unit's state is three allocations, made when the optimizer is built.
//
//   begin_step()          the next step: every unit's update until the next begin_step is step t
//   step_unit(u, lr)      updates unit u's master shard from its gradient shard (collective where a
//                         rule needs it: every rank calls it for the same units in the same order)
//   step_unit(u, lr, out) the same, and the updated master rounded into `out` (shard_numel, the
//                         compute dtype): CPU offload's copy for the device, written by AdamW's host
//                         kernel in its one pass
//   step(lr)              begin_step(), then step_unit for every unit in order
// gradient_scale (the clip coefficient, 1: none) multiplies the gradient first: the AdamW rule in
// its kernel's one pass (optim/adamw_functor.h), the other rules' gradients in place before they
// read them; either way the bits of scaling the whole shard first.
//
// Full (unsharded) state tensors are "NAME.exp_avg", "NAME.exp_avg_sq", "NAME.projector" and "step"
// (full_state_dict, collective); a sharded checkpoint stores each rank's part of them (state_pieces)
// and reads back the parts a rank of any world size needs (load_state_pieces), so a run resumes at
// any world size without any rank holding the full state.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/owned_bytes.h"
#include "optim/optimizer_settings.h"
#include "optim/update_rules.h"
#include "sharding/flat_layout.h"

namespace llm {

class Communicator;

// One unit as the optimizer sees it.
struct UnitShard {
  FlatShardLayout layout;          // the unit's parameters: rows held, offsets, weight decay
  at::Tensor master;               // (shard_numel) fp32, updated in place
  at::Tensor gradient;             // (shard_numel) fp32, read by step_unit
  std::vector<UpdateRule> rules;   // one per layout.parameters
};

// One parameter as a unit of its own, for tests and benchmarks: the layout that `rank` of `world`
// ranks holds of a tensor of full_shape (world 1: the whole tensor), over the given flat master and
// gradient (this rank's rows_per_rank * cols elements each, used in place).
UnitShard single_parameter_unit(const std::string& name, const std::vector<int64_t>& full_shape,
                                at::Tensor master, at::Tensor gradient, UpdateRule rule, bool decay,
                                int rank = 0, int world = 1);

class ShardOptimizer {
 public:
  // across: the communicator the units are sharded over, or nullptr when this rank holds whole
  // parameters (one rank, or no_shard). Allocates every unit's state (zeros).
  ShardOptimizer(const OptimizerSettings& settings, std::vector<UnitShard> units, Communicator* across);
  ~ShardOptimizer();
  ShardOptimizer(const ShardOptimizer&) = delete;
  ShardOptimizer& operator=(const ShardOptimizer&) = delete;

  void begin_step();
  void step_unit(size_t unit, double lr, double gradient_scale = 1.0);
  // compute_out: (shard_numel) contiguous on the master's device; its padding rows are not written.
  void step_unit(size_t unit, double lr, at::Tensor& compute_out, double gradient_scale = 1.0);
  void step(double lr);
  // Points a unit's parameters at another gradient shard (shard_numel fp32, laid out as the one the
  // optimizer was built over), or at none (an undefined tensor: nothing keeps a freed shard alive).
  // For gradient shards that live only from their reduction to their step (the step fused into
  // backward).
  void set_unit_gradient(size_t unit, const at::Tensor& gradient);

  // What a unit's step writes: its flat master and its three state buffers (offload's speculative
  // step runs on a copy of them and keeps these until the global norm decides,
  // offload/optimizer_offload.h).
  struct UnitBuffers {
    at::Tensor master, exp_avg, exp_avg_sq, projector;
    // Each buffer from `from`'s (a set laid out alike; non_blocking as copy_'s).
    void copy_from(const UnitBuffers& from, bool non_blocking = false) const {
      master.copy_(from.master, non_blocking);
      exp_avg.copy_(from.exp_avg, non_blocking);
      exp_avg_sq.copy_(from.exp_avg_sq, non_blocking);
      projector.copy_(from.projector, non_blocking);
    }
  };
  UnitBuffers unit_buffers(size_t unit) const;
  // Points the unit's parameters at other buffers of the same sizes and dtypes, on any device (each
  // view at its same offset; offload's device step points them at device windows for its call), and
  // returns the ones they pointed at. Changes no value.
  UnitBuffers rebind_unit(size_t unit, const UnitBuffers& buffers);
  // step_unit with the master and state read from `from` (buffers like the unit's, which keep their
  // values) and written to the unit's own: out of place for a unit of AdamW rules (their kernel reads
  // one and writes the other in its one pass), else `from` copied in first. The same bits as
  // copying `from` in and stepping in place.
  void step_unit_from(size_t unit, const UnitBuffers& from, double lr, at::Tensor& compute_out,
                      double gradient_scale = 1.0);

  size_t unit_count() const { return units_.size(); }
  // Whether step_unit(unit) may communicate: a rule with sums across ranks (subset-norm, GaLore)
  // on units sharded across ranks. Element-wise rules never do.
  bool unit_needs_collectives(size_t unit) const;
  int64_t steps_taken() const { return step_; }
  // Bytes of optimizer state this rank holds (moments, subset norms, projectors).
  int64_t state_bytes() const { return state_bytes_; }
  OwnedBytes owned_bytes() const;
  // Seconds spent recomputing GaLore projectors since the last begin_step (0 for the other rules).
  double last_projector_seconds() const { return projector_seconds_.load(); }
  const OptimizerSettings& settings() const { return settings_; }

  // Full tensors, the same at any world size. Collective. load_full_state_dict checks every key and
  // shape, lists every problem in one UserError, and changes nothing unless the whole dict fits.
  std::map<std::string, at::Tensor> full_state_dict();
  void load_full_state_dict(const std::map<std::string, at::Tensor>& state);
  // The keys and shapes of the full state (without "step").
  std::map<std::string, FullStateShape> full_state_shapes() const;

  // Sharded checkpoints: the parts of the full tensors this rank owns (StateSpan), as views of its
  // buffers, without communication; and back, at any world size: `read(key, begin, destination)`
  // fills `destination` with the full tensor's elements [begin, begin + destination.numel()), for
  // every part this rank needs, and the rest of each buffer is zeroed. The caller checks the keys
  // and shapes (full_state_shapes) before anything is read.
  std::vector<StatePiece> state_pieces() const;
  using ReadPiece = std::function<void(const std::string& key, int64_t begin, const at::Tensor& destination)>;
  void load_state_pieces(const ReadPiece& read, int64_t step);

 // A unit's state: its three flat buffers (what offload moves as three blocks) and each
  // parameter's views into them.
  struct UnitState {
    at::Tensor master;  // (shard_numel) fp32: the unit's master shard, which the parameters' masters view
    at::Tensor exp_avg, exp_avg_sq, projector;  // (elements of that kind) fp32 (the moments bf16 under
                                                // --optimizer_state_dtype bfloat16), on the master's device
    std::vector<ParameterState> parameters;
  };
  const UnitState& unit_state(size_t unit) const { return units_.at(unit); }
  // A parameter's moment input made elsewhere (ParameterState::precomputed_input): offload's GaLore
  // projection on the device (offload/lowrank_gradients.h). Undefined: the rule makes it.
  void set_precomputed_input(size_t unit, size_t parameter, const at::Tensor& input) {
    units_.at(unit).parameters.at(parameter).precomputed_input = input;
  }

 private:

  OptimizerSettings settings_;
  std::vector<UnitState> units_;
  Communicator* across_;
  int64_t step_ = 0;
  // Atomic: offload's worker steps units (and refreshes their projectors) while a record reads it.
  std::atomic<double> projector_seconds_ = 0;
  // The state's bytes, counted once built: the buffers keep their sizes, and offload's worker points
  // a unit at other buffers (rebind_unit) while the ledger reads this.
  int64_t state_bytes_ = 0;
};

// Optimizer-state bytes one rank holds for one parameter under `rule`, from the geometry alone (the
// same figure state_bytes() counts once the optimizer is built; docs/optimizers.md derives each).
int64_t optimizer_state_bytes(const OptimizerSettings& settings, const ShardedParameter& parameter,
                              UpdateRule rule, int world_size);

}  // namespace llm
