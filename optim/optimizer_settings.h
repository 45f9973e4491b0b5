// The optimizer's settings: which optimizer (--optimizer) and every hyper-parameter of its rules
// (the trainer fills them from the command line, config/optimizer_setup.h).
#pragma once

#include <cstdint>
#include <string>

namespace llm {

struct OptimizerSettings {
  std::string kind = "adamw";  // adamw | adamw_sn | galore_adamw (names the run; rules do the work)
  double beta1 = 0.9;          // 0: no first moment (RMSProp-SN for subset_norm)
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // subset_norm: 0 = per matrix (one entry per row or column, along the smaller dimension; 1-D
  // tensors use the general rule with -2); k > 0: contiguous subsets of the largest divisor of numel
  // <= k; k < 0: of the largest divisor <= floor(sqrt(numel) / |k|) (adamw_sng's rule).
  int64_t subset_size = 0;
  // galore
  int64_t galore_rank = 128;
  int64_t update_proj_gap = 50;
  double galore_scale = 1.0;
  std::string proj_type = "std";  // std | reverse_std | left | right
  // false: every projector is recomputed at steps 1, T + 1, 2T + 1, ... (the reference: all SVDs of
  // the model in one step). true: after step 1, matrix k of K refreshes at steps 1 + k T / K + j T,
  // so each step recomputes about K / T projectors instead of K every T steps.
  bool stagger_projectors = false;
  // "svd": the reference's thin SVD of the full gradient (gathered for the refresh). "subspace":
  // block power iteration on G^T G from the row shards (all-reduces of n x r and r x r only, no
  // gathered gradient), warm-started from the previous projector, with the new basis's signs
  // aligned to the old one so the carried moments keep their meaning.
  std::string projector_method = "svd";
  int64_t subspace_iterations = 2;  // per refresh after the first (the first runs 3x as many)
  // The moments' dtype (--optimizer_state_dtype): "float32", or "bfloat16" (Adam's moments, AdamwSN's
  // moment and subset state, GaLore's low-rank moments; GaLore's projectors and the masters stay
  // fp32). bf16 state is read exactly, stepped in fp32 and stored with stochastic rounding whose bits
  // come from state_rounding_seed (the run's --seed; optim/state_rounding.h).
  std::string state_dtype = "float32";
  uint64_t state_rounding_seed = 0;
  bool state_is_bf16() const { return state_dtype == "bfloat16"; }
};

// Throws UserError naming the flag for a setting out of its range.
void check_optimizer_settings(const OptimizerSettings& settings);

}  // namespace llm
