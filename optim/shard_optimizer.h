// Optimizers on a rank's flat shard: the one interface the training loop sees.
//
// Every parameter reaches the optimizer as this rank's whole rows of it (sharding/flat_layout.h):
// rows [first_row, first_row + rows_held) of the full (rows x cols) matrix, padded with zero rows
// up to rows_per_rank. Whole rows are what let the row-wise statistics of subset-norm and the
// projections of GaLore run on a shard and still equal the unsharded result; the few quantities
// that span ranks (a wide matrix's column norms, a subset that crosses a shard boundary, GaLore's
// low-rank gradient of a left-projected matrix, a projector) go through the Communicator, so N
// ranks give one rank's numbers (docs/optimizers.md has each rule's maths and its collectives).
//
// Each parameter carries its update rule as data (chosen by the trainer from the parameter's name):
//   adamw        torch.optim.AdamW (fused host/CUDA kernel, optim/adamw.h)
//   adam_hf      the HF-style AdamW of the GaLore and subset-norm references (eps outside the bias
//                correction, weight decay after the update)
//   subset_norm  adam_hf with one second-moment entry per subset (AdamwSN, optim/subset_norm.h)
//   galore       adam_hf in GaLore's low-rank space (GaLoreAdamW, optim/galore.h)
//
// Checkpoints hold full (unsharded) tensors, so a run resumes at any world size.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace llm {

class Communicator;

enum class UpdateRule { adamw, adam_hf, subset_norm, galore };
const char* to_string(UpdateRule rule);

// One parameter as this rank holds it.
struct ParameterShard {
  std::string name;                 // HF name, keys the optimizer state
  at::Tensor param;                 // (rows_per_rank * cols) fp32 master, contiguous
  at::Tensor grad;                  // (rows_per_rank * cols) fp32; read at step time
  std::vector<int64_t> full_shape;  // unsharded shape
  int64_t rows = 0;                 // full_shape[0]
  int64_t cols = 1;                 // product of the other dims
  int64_t first_row = 0;            // global index of this rank's first row
  int64_t rows_held = 0;            // real rows held (the rest up to rows_per_rank is padding)
  int64_t rows_per_rank = 0;
  bool decay = true;                // weight decay applies
  UpdateRule rule = UpdateRule::adamw;

  // The whole, unsharded parameter (tests, single-rank use): rows_per_rank = rows.
  static ParameterShard whole(std::string name, at::Tensor param, at::Tensor grad, bool decay,
                              UpdateRule rule);
  int64_t numel() const { return rows * cols; }
};

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
};

class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;

  // One update at learning rate lr of every parameter (a collective when the parameters are sharded:
  // every rank calls it).
  virtual void step(double lr) = 0;
  virtual int64_t steps_taken() const = 0;
  // Bytes of optimizer state this rank holds (moments, subset norms, projectors), counted from the
  // buffers that exist. State is allocated when the optimizer is built.
  virtual int64_t state_bytes() const = 0;
  // Seconds spent recomputing GaLore projectors in the last step (0 for the other rules).
  virtual double last_projector_seconds() const { return 0; }

  // Full tensors "NAME.exp_avg", "NAME.exp_avg_sq", ("NAME.projector") and "step": the same at any
  // world size. Collective. load_full_state_dict checks every key and shape, lists every problem in
  // one UserError, and changes nothing unless the whole dict fits.
  virtual std::map<std::string, at::Tensor> full_state_dict() = 0;
  virtual void load_full_state_dict(const std::map<std::string, at::Tensor>& state) = 0;
};

// across: the communicator the parameters are sharded over, or nullptr when this rank holds whole
// parameters (one rank, or no_shard).
std::unique_ptr<ShardOptimizer> make_shard_optimizer(const OptimizerSettings& settings,
                                                     std::vector<ParameterShard> parameters,
                                                     Communicator* across);

// Optimizer-state bytes one rank holds for one parameter, from the geometry alone (the same figure
// state_bytes() counts once the optimizer is built; docs/optimizers.md derives each).
int64_t optimizer_state_bytes(const OptimizerSettings& settings, const ParameterShard& parameter,
                              int world_size);

}  // namespace llm
