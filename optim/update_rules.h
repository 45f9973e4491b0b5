// The update rules, one class each: what state a parameter keeps under the rule (its sizes on this
// rank and its full, checkpointed shapes), which part of each full tensor a rank owns and needs
// (spans: what checkpoints and full state dicts are built from), and the update itself. The optimizer (optim/shard_optimizer.h), the
// checkpoints and the memory estimate all ask the rule; adding a rule is adding its class here and
// one line in rule_of().
//
//   adamw        torch.optim.AdamW: the fused host/CUDA kernel of optim/adamw.h
//   adam_hf      the HF-style AdamW of the GaLore and subset-norm references (eps outside the bias
//                correction, weight decay after the update)
//   subset_norm  adam_hf with one second-moment entry per subset (AdamwSN, optim/subset_norm.h)
//   galore       adam_hf in GaLore's low-rank space (GaLoreAdamW, optim/galore.h)
//
// A step of one unit runs in three phases so that the statistics a unit sums over ranks go in one
// all-reduce: refresh (GaLore's projector, when due), inputs (what the moments are fed; a rule may
// hand back partial sums to be summed over ranks), update (moments, parameter, weight decay).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/galore.h"
#include "optim/optimizer_settings.h"
#include "optim/shard_state.h"
#include "optim/state_rounding.h"
#include "optim/subset_norm.h"
#include "sharding/flat_layout.h"

namespace llm {

class Communicator;

enum class UpdateRule { adamw, adam_hf, subset_norm, galore };
const char* to_string(UpdateRule rule);

// The state one parameter keeps on this rank: each kind's local shape, or none.
struct StateShapes {
  std::optional<std::vector<int64_t>> exp_avg, exp_avg_sq, projector;
  static int64_t numel(const std::optional<std::vector<int64_t>>& shape);  // 0 for none
  int64_t total_numel() const { return numel(exp_avg) + numel(exp_avg_sq) + numel(projector); }
};



// Where this rank's part of one checkpointed state tensor lies in the full tensor, flattened: the
// elements it writes (owned: every element of the full tensor is owned by exactly one rank, so the
// ranks' parts tile it) and the elements it reads back on load (needed: they fill the first
// needed_count elements of its local tensor; the rest of the local tensor is padding, zero). They
// differ where a rank keeps a copy of what another rank owns: a replicated projector or column
// subset state (owned by the rank holding the parameter's first row, needed by all), a subset
// crossing a shard boundary (owned by the rank holding its first element, needed by both).
struct StateSpan {
  int64_t owned_begin = 0, owned_count = 0;
  int64_t owned_local = 0;  // where the owned elements start in the local tensor (flattened)
  int64_t needed_begin = 0, needed_count = 0;
};

// Where a parameter stands among the parameters of its rule (GaLore spreads its SVD owners and
// staggers its refreshes by it) and in the world.
struct RulePosition {
  int64_t index = 0;  // among the model's parameters with this rule, in unit order
  int64_t count = 1;  // parameters with this rule in the model
  int rank = 0;       // the parameter's shard rank (0 for a replicated parameter)
  int world = 1;      // ranks the parameter is sharded over (1: whole)
};

// One parameter inside the optimizer: its layout row, views of its unit's flat buffers, and the
// geometry its rule derived.
struct ParameterState {
  ShardedParameter parameter;
  UpdateRule rule = UpdateRule::adamw;
  at::Tensor master;      // (rows_per_rank * cols) fp32, a view of the unit's master shard
  at::Tensor gradient;    // (rows_per_rank * cols) fp32, a view of the unit's gradient shard
  at::Tensor exp_avg;     // views of the unit's state buffers, in the rule's local shapes; undefined
  at::Tensor exp_avg_sq;  // where the rule keeps none (exp_avg with beta1 = 0 under the HF rules)
  at::Tensor projector;
  SubsetGeometry subsets;      // subset_norm
  GaLoreGeometry galore;       // galore
  int64_t refresh_offset = 0;  // galore: steps after 1 + jT at which this projector is recomputed
  uint64_t projector_seed = 0; // galore subspace: the cold start's Gaussian
  // bf16 state: the parameter's index in the model (the same at any world size), and each moment's
  // stochastic-rounding bits for the current step (the key set by the step, the index base where
  // the rank's elements start in the full state tensor; optim/state_rounding.h).
  int64_t model_index = 0;
  StateRounding exp_avg_rounding, exp_avg_sq_rounding;
  // An out-of-place step in progress (ShardOptimizer::step_unit_from; the AdamW rule): the master and
  // moments before it, which it reads, writing the tensors above. Undefined otherwise.
  at::Tensor master_from, exp_avg_from, exp_avg_sq_from;
  // The moments' input for this step made elsewhere, already clipped (GaLore's low-rank gradient
  // projected on the device under offload, offload/lowrank_gradients.h): the step neither scales the
  // gradient, refreshes the projector nor calls inputs(). Undefined otherwise.
  at::Tensor precomputed_input;
};

// One step's scalars, the same for every parameter.
struct StepScalars {
  double lr = 0;
  int64_t t = 0;  // 1-based
  double step_size = 0;  // HF rules: lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  // The clip coefficient the gradient is multiplied by (1: none). The AdamW rule folds it into its
  // kernel; ShardOptimizer scales the other rules' gradients in place before their step.
  double gradient_scale = 1.0;
};

// What a parameter's moments are fed this step. second: the second-moment input when it is not
// first^2 (subset sums); sum_over_ranks: second holds this rank's partial sums at their global
// subset index, to be summed over ranks before update().
struct MomentInputs {
  at::Tensor first;
  at::Tensor second;
  bool sum_over_ranks = false;
};

class Rule {
 public:
  virtual ~Rule() = default;
  // Derives the rule's geometry into `state` and returns the state it keeps on this rank.
  virtual StateShapes plan(ParameterState& state, const OptimizerSettings& settings,
                           const RulePosition& position) const = 0;
  // The checkpoint's keys for this parameter: suffix (".exp_avg", ...) -> full shape.
  virtual std::map<std::string, FullStateShape> full_shapes(const ParameterState& state) const = 0;
  // Where this rank's part of each full tensor lies, by suffix (the keys of full_shapes): what a
  // sharded checkpoint writes and reads back at any world size, and what ShardOptimizer assembles
  // full tensors from.
  virtual std::map<std::string, StateSpan> spans(const ParameterState& state) const = 0;

  // The step's phases. refresh and inputs may be collective.
  virtual void refresh(ParameterState& state, const OptimizerSettings& settings, int64_t t,
                       Communicator* across, double* projector_seconds) const {}
  virtual MomentInputs inputs(ParameterState& state, Communicator* across) const {
    return {state.gradient, at::Tensor(), false};
  }
  virtual void update(ParameterState& state, const MomentInputs& inputs, const OptimizerSettings& settings,
                      const StepScalars& scalars, Communicator* across) const = 0;
  // update(), then the updated master rounded into compute_out (a flat view like state.master in the
  // compute dtype, on its device). A rule that can write both in one pass overrides it.
  virtual void update_and_round(ParameterState& state, const MomentInputs& inputs,
                                const OptimizerSettings& settings, const StepScalars& scalars,
                                Communicator* across, at::Tensor& compute_out) const {
    update(state, inputs, settings, scalars, across);
    compute_out.copy_(state.master);
  }
};

const Rule& rule_of(UpdateRule rule);
// Whether GaLore's refresh recomputes the parameter's projector at step t (1-based): at step 1, and
// at 1 + refresh_offset + j T (T = update_proj_gap).
bool galore_refreshes_at(const ParameterState& state, const OptimizerSettings& settings, int64_t t);

// bf16 state for the rules written in ATen operations (the HF rules): `values` (fp32, destination's
// numel, on its device) stored into `destination` (bf16) rounded stochastically, element j with the
// 16 random bits rounding_bits(rounding.key, rounding.index_base + j) gives (the high 16 when
// high_half, else the low 16): the bits AdamW's fused kernel gives (optim/state_rounding.h).
// destination contiguous. One pass of state_rounding.h's functions: on the host's threads, or a
// CUDA kernel (optim/adamw_cuda.cu) on the tensors' device.
void store_stochastically_rounded(const at::Tensor& destination, const at::Tensor& values,
                                  const StateRounding& rounding, bool high_half);

}  // namespace llm
