// The family of small runs the world-size tests share: N ranks against one (tests/sharding_test.cpp,
// for each strategy and each optimizer), resuming at the same and at other world sizes
// (tests/sharded_checkpoint_test.cpp), saving without gathering, bf16 moments in checkpoints. Each
// (case, ranks) run is recorded once (testing::recorded_run) and read by every test that needs it.
//
// llama_micro: q/k/v/o 32x32, gate/up 88x32, down 32x88, embed and lm_head 128x32. At 3 ranks every
// matrix pads a row; -2 subsets of gate/up (s = 22) cross rows and ranks; GaLore's left projection
// keeps its moments in flat chunks, its right one a projector every rank holds, refreshed at steps 1
// and 5 (gap 4): after a resume at step 3.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace llm::testing {

// 6 steps of 12 sequences of 32 tokens: 12 / ranks / 2 a micro-batch (accumulation 2; at 4 ranks 3
// and no accumulation), 2 warm-up steps, weight decay, clipping at 0.5 (which fires), evaluation and a
// checkpoint at steps 3 and 6. `extra`: the optimizer and whatever else the case sets.
constexpr int kMicroSteps = 6, kMicroSaveAt = 3;
constexpr double kMicroClipping = 0.5;
inline std::string micro_run_flags(int ranks, const std::string& extra) {
  constexpr int kGlobalBatch = 12;
  return "--config " + (source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --num_training_steps 6 --warmup_steps 2 --max_length 32 --eval_every 3 --eval_batches 1"
         " --weight_decay 0.1 --grad_clipping 0.5 --save_every 3 --total_batch_size " + std::to_string(kGlobalBatch) +
         " --batch_size " + std::to_string(kGlobalBatch / ranks / (ranks == 4 ? 1 : 2)) + " " + extra;
}

struct MicroCase {
  std::string name;
  std::string flags;
  bool bf16_state = false;  // bf16 moments: compared against one rank only through a resume
};

// A case's flags with its `--sharding full_shard` (micro_strategies()[0]'s, which the optimizer cases
// take) replaced by `sharding`: the strategy and its flags (hybrid's group size, ...).
inline std::string with_sharding(std::string flags, const std::string& sharding) {
  const std::string full = "--sharding full_shard";
  const size_t at = flags.find(full);
  if (at != std::string::npos) flags.erase(at, full.size());
  return flags + " " + sharding;
}

// adamw: --adam_eps 1e-6 because sharding changes only the order of the cross-rank sums, so a
// gradient element differs by fp32 rounding (about 1e-10 on a sum that cancels), and Adam turns that
// into a weight difference of up to lr x 1e-10 / eps per step: 3e-5 with torch's eps 1e-8, which
// exceeds the 1e-4 x max|w| bound on one element of up_proj on AVX-512 hosts. With 1e-6 the
// comparison measures the sharding, not Adam's sensitivity to rounding near eps.
inline const std::vector<MicroCase>& micro_strategies() {
  static const std::vector<MicroCase> cases = {
      {"full_shard", "--optimizer adamw --lr 3e-3 --adam_eps 1e-6 --sharding full_shard"},
      {"shard_grad_op", "--optimizer adamw --lr 3e-3 --adam_eps 1e-6 --sharding shard_grad_op"},
      {"no_shard", "--optimizer adamw --lr 3e-3 --adam_eps 1e-6 --sharding no_shard"},
  };
  return cases;
}

inline const std::vector<MicroCase>& micro_optimizers() {
  static const std::vector<MicroCase> cases = {
      {"adamw", micro_strategies()[0].flags},
      {"adamw_sn_per_matrix", "--optimizer adamw_sn --lr 2e-2"},
      {"adamw_sn_general_all", "--optimizer adamw_sn --subset_size -2 --subset_norm_params all --lr 2e-2"},
      {"rmsprop_sn", "--optimizer adamw_sn --adam_beta1 0 --lr 1e-2"},
      {"galore_right", "--optimizer galore_adamw --rank 8 --update_proj_gap 4 --galore_scale 0.5 --lr 5e-3"},
      {"galore_left", "--optimizer galore_adamw --rank 8 --update_proj_gap 4 --proj_type left --lr 5e-3"},
      {"galore_subspace",
       "--optimizer galore_adamw --rank 8 --update_proj_gap 4 --galore_projector subspace --galore_stagger --lr 5e-3"},
      // bf16 moments (--optimizer_state_dtype): the fused AdamW kernel's and the ATen rules' rounding.
      {"adamw_bf16_state", "--optimizer adamw --lr 1e-2 --optimizer_state_dtype bfloat16", true},
      {"adamw_sn_bf16_state",
       "--optimizer adamw_sn --subset_size -2 --subset_norm_params all --lr 2e-2 --optimizer_state_dtype bfloat16", true},
  };
  return cases;
}

// The case of that name among the strategies' and the optimizers'.
inline const MicroCase& micro_case(const std::string& name) {
  for (const auto* cases : {&micro_strategies(), &micro_optimizers()})
    for (const MicroCase& c : *cases)
      if (c.name == name) return c;
  throw std::invalid_argument("no micro case named " + name);
}

}  // namespace llm::testing
