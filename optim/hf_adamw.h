// The HF-style AdamW of the GaLore and subset-norm references, with a rule per parameter:
//   adam_hf      element-wise moments
//   subset_norm  one second-moment entry per subset (optim/subset_norm.h): AdamwSN
//   galore       moments in a rank-r projection of the gradient (optim/galore.h): GaLoreAdamW
// One step, as the references compute it (shared/reference/optimizers.md §1.1, §2.1, §2.2):
//   x = g (or its projection R);  u = x^2 (or the subset sums of g^2)
//   m = beta1 m + (1 - beta1) x        (no m at all when beta1 = 0: RMSProp-SN; the numerator is x)
//   v = beta2 v + (1 - beta2) u
//   N = m / (sqrt(v) + eps)            eps outside the bias correction
//   p = p - lr sqrt(1 - beta2^t) / (1 - beta1^t) * N   (N projected back and scaled for galore)
//   p = p - lr wd p                    decoupled decay after the update, at the plain lr
// The element work runs as ATen operations on the state's device (cpu or cuda); the cross-rank sums
// of a step's subset norms go in one all-reduce.
#pragma once

#include <memory>
#include <vector>

#include "optim/galore.h"
#include "optim/shard_optimizer.h"
#include "optim/subset_norm.h"

namespace llm {

class HfAdamW final : public ShardOptimizer {
 public:
  HfAdamW(const OptimizerSettings& settings, std::vector<ParameterShard> parameters, Communicator* across);

  void step(double lr) override;
  int64_t steps_taken() const override { return step_; }
  int64_t state_bytes() const override;
  double last_projector_seconds() const override { return projector_seconds_; }
  std::map<std::string, at::Tensor> full_state_dict() override;
  void load_full_state_dict(const std::map<std::string, at::Tensor>& state) override;

 private:
  struct Entry {
    ParameterShard parameter;
    at::Tensor exp_avg;      // undefined when beta1 == 0
    at::Tensor exp_avg_sq;
    SubsetGeometry subsets;  // subset_norm
    GaLoreGeometry galore;   // galore
    at::Tensor projector;    // galore, local projector shape
    int64_t refresh_offset = 0;  // galore: steps after 1 + jT at which this projector is recomputed
    uint64_t projector_seed = 0;  // galore subspace: the cold start's Gaussian
  };
  std::vector<int64_t> moment_shape(const Entry& entry) const;

  OptimizerSettings settings_;
  std::vector<Entry> entries_;
  Communicator* across_;
  int64_t step_ = 0;
  double projector_seconds_ = 0;
};

}  // namespace llm
