// Activation checkpointing (--activation_checkpointing, sharding/step_plan.h's recompute) through the
// trainer binary on CPU: with it the run equals the run without it bitwise (losses, gradient norms,
// evaluation losses, final parameters and optimizer state) for each sharding strategy and precision,
// with gradient accumulation, at 1 to 4 ranks, every block or every second one, with offload and
// with GaLore; and the ledger's activations at their largest fall.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::activation_checkpointing_test {
namespace {

using testing::run_command;

struct CheckpointingCase {
  std::string name;
  int ranks;
  std::string flags;  // the run's own; --activation_checkpointing(_every) is added to one side
  std::string checkpointing = "--activation_checkpointing";
};

// llama_tiny (4 blocks), 4 steps of accumulation 2, clipping that fires, weight decay: recorded, so the
// run without checkpointing is made once for the cases that share it (recomputation by operation and
// by block compare with the same plain runs as block checkpointing).
const testing::RecordedRun& tiny_run(const CheckpointingCase& c, const std::string& more = "") {
  constexpr int kGlobalBatch = 8;
  return testing::recorded_run(
      c.ranks, "--config " + (testing::source_dir() / "configs/llama_tiny.json").string() +
                   " --device cpu --num_training_steps 4 --warmup_steps 1 --max_length 32 --eval_every 2 --eval_batches 1"
                   " --weight_decay 0.1 --grad_clipping 0.05 --lr 1e-2 --total_batch_size " + std::to_string(kGlobalBatch) +
                   " --batch_size " + std::to_string(kGlobalBatch / c.ranks / 2) + " " + c.flags + more);
}

// The largest activation bytes any point of rank `rank`'s ledger recorded in training.
int64_t max_training_activations(const std::filesystem::path& run_dir, int rank) {
  std::ifstream in(run_dir / ("memory.rank" + std::to_string(rank) + ".jsonl"));
  int64_t largest = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.at("event") != "point") continue;
    const std::string phase = record.at("phase");
    if (phase == "forward" || phase == "backward") largest = std::max(largest, record.at("activations").get<int64_t>());
  }
  return largest;
}

class ActivationCheckpointing : public ::testing::TestWithParam<CheckpointingCase> {};

TEST_P(ActivationCheckpointing, EqualsTheRunWithoutItBitwise) {
  const CheckpointingCase& c = GetParam();
  const testing::RecordedRun& plain = tiny_run(c);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const testing::RecordedRun& recomputed = tiny_run(c, " " + c.checkpointing);
  ASSERT_EQ(recomputed.exit_code, 0) << recomputed.output;
  testing::expect_same_run(plain.dir, recomputed.dir, 4);

  // What it is for: the activations held at the ledger's points fall on every rank.
  for (int r = 0; r < c.ranks; ++r)
    EXPECT_LT(max_training_activations(recomputed.run_dir(), r), max_training_activations(plain.run_dir(), r))
        << "rank " << r;
}

const CheckpointingCase kCases[] = {
    {"fp32_1rank", 1, ""},
    {"fp32_full_shard_4ranks", 4, ""},
    {"fp32_shard_grad_op_2ranks", 2, "--sharding shard_grad_op"},
    {"fp32_no_shard_2ranks", 2, "--sharding no_shard"},
    {"bf16_mixed_2ranks", 2, "--dtype bfloat16 --precision mixed"},
    {"bf16_pure_4ranks", 4, "--dtype bfloat16 --precision pure"},
    {"every_second_block_2ranks", 2, "", "--activation_checkpointing_every 2"},
    {"offload_2ranks", 2, "--offload optimizer"},
    {"galore_1rank", 1, "--optimizer galore_adamw --rank 8 --update_proj_gap 2"},
    // Recompute by operation (--recompute, model/recompute.h): the same bits as none.
    {"recompute_norm_swiglu_fp32_1rank", 1, "", "--recompute norm,swiglu"},
    {"recompute_norm_fp32_2ranks", 2, "", "--recompute norm"},
    {"recompute_mlp_attention_fp32_4ranks", 4, "", "--recompute mlp,attention"},
    {"recompute_swiglu_mixed_2ranks", 2, "--dtype bfloat16 --precision mixed", "--recompute swiglu"},
    {"recompute_norm_mlp_attention_mixed_2ranks", 2, "--dtype bfloat16 --precision mixed", "--recompute norm,mlp,attention"},
    {"recompute_norm_swiglu_pure_2ranks", 2, "--dtype bfloat16 --precision pure", "--recompute norm,swiglu,attention"},
    {"recompute_norm_swiglu_offload_2ranks", 2, "--offload optimizer", "--recompute norm,swiglu"},
    {"recompute_norm_swiglu_galore_1rank", 1, "--optimizer galore_adamw --rank 8 --update_proj_gap 2", "--recompute norm,swiglu"},
    {"recompute_block_1rank", 1, "", "--recompute block"},
};

INSTANTIATE_TEST_SUITE_P(Cases, ActivationCheckpointing, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

TEST(ActivationCheckpointingFlags, BadValuesNameTheFlag) {
  const std::string base = testing::trainer_binary().string() + " --config " +
                           (testing::source_dir() / "configs/llama_tiny.json").string() + " --device cpu --print_config";
  auto zero = run_command(base + " --activation_checkpointing_every 0");
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_NE(zero.output.find("--activation_checkpointing_every: expected a number of blocks >= 1 (got 0)"),
            std::string::npos) << zero.output;
  auto too_many = run_command(base + " --activation_checkpointing_every 99");
  EXPECT_EQ(too_many.exit_code, 2) << too_many.output;
  EXPECT_NE(too_many.output.find("num_hidden_layers = 2"), std::string::npos) << too_many.output;
  auto on = run_command(base + " --activation_checkpointing");
  ASSERT_EQ(on.exit_code, 0) << on.output;
  EXPECT_NE(on.output.find("\"activation_checkpointing_every\": 1"), std::string::npos) << on.output;
}

}  // namespace
}  // namespace llm::activation_checkpointing_test
