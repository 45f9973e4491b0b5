// The optimizer step fused into backward (--fuse_optimizer_with_backward) through the trainer binary
// on CPU: without clipping it equals the unfused run bitwise (losses, gradient norms, evaluation
// losses, final parameters and optimizer state) for each strategy, precision and optimizer, with
// gradient accumulation; the gradient category's largest value falls, as the estimate says; the
// combination with clipping (and with offload) is refused at start-up with the reason.
#include <gtest/gtest.h>

#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::fused_step_test {
namespace {

using testing::run_command;
using testing::ScratchDir;

struct FusedCase {
  std::string name;
  int ranks;
  std::string flags;
  // Whether the gradient category's largest value must fall. Not for a resident fp32 unit (one rank
  // or no_shard) with accumulation: its parameters' gradients are its shard, and every unit's
  // accumulates over the step's micro-batches, so all of them exist at the last backward, fused or
  // not; the shards die at their step instead of at the optimizer pass, after the peak.
  bool gradient_peak_falls = true;
};

// llama_tiny, 4 steps of accumulation 2 (unless the case sets the micro-batch), no clipping: recorded.
const testing::RecordedRun& tiny_run(const FusedCase& c, const std::string& more = "") {
  constexpr int kGlobalBatch = 8;
  return testing::recorded_run(
      c.ranks, "--config " + (testing::source_dir() / "configs/llama_tiny.json").string() +
                   " --device cpu --num_training_steps 4 --warmup_steps 1 --max_length 32 --eval_every 2 --eval_batches 1"
                   " --weight_decay 0.1 --grad_clipping 0 --lr 1e-2 --total_batch_size " + std::to_string(kGlobalBatch) +
                   " --batch_size " + std::to_string(kGlobalBatch / c.ranks / 2) + " " + c.flags + more);
}

class FusedStep : public ::testing::TestWithParam<FusedCase> {};

TEST_P(FusedStep, EqualsTheUnfusedStepBitwiseWithoutClipping) {
  const FusedCase& c = GetParam();
  const testing::RecordedRun& plain = tiny_run(c);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const testing::RecordedRun& fused = tiny_run(c, " --fuse_optimizer_with_backward");
  ASSERT_EQ(fused.exit_code, 0) << fused.output;
  testing::expect_same_run(plain.dir, fused.dir, 4);

  // The gradient shards of all units never coexist: the category's largest value falls.
  for (int r = 0; r < c.ranks; ++r) {
    const int64_t fused_max = testing::ledger_summary_max(fused.run_dir(), r, "gradients");
    const int64_t plain_max = testing::ledger_summary_max(plain.run_dir(), r, "gradients");
    if (c.gradient_peak_falls)
      EXPECT_LT(fused_max, plain_max) << "rank " << r;
    else
      EXPECT_LE(fused_max, plain_max) << "rank " << r;
  }
}

const FusedCase kCases[] = {
    {"adamw_fp32_1rank", 1, "--batch_size 8"},  // no accumulation (the later --batch_size wins)
    {"adamw_fp32_1rank_accumulation", 1, "", false},
    {"adamw_fp32_full_shard_4ranks", 4, ""},
    {"adamw_fp32_shard_grad_op_2ranks", 2, "--sharding shard_grad_op"},
    {"adamw_fp32_no_shard_2ranks", 2, "--sharding no_shard", false},
    {"adamw_bf16_mixed_2ranks", 2, "--dtype bfloat16 --precision mixed"},
    {"adamw_bf16_pure_4ranks", 4, "--dtype bfloat16 --precision pure"},
    {"adamw_sn_2ranks", 2, "--optimizer adamw_sn"},
    {"galore_2ranks", 2, "--optimizer galore_adamw --rank 8 --update_proj_gap 2"},
    {"with_activation_checkpointing_2ranks", 2, "--activation_checkpointing"},
};

INSTANTIATE_TEST_SUITE_P(Cases, FusedStep, ::testing::ValuesIn(kCases), [](const auto& info) { return info.param.name; });

TEST(FusedStepFlags, ClippingAndOffloadAreRefusedWithTheReason) {
  const std::string base = testing::trainer_binary().string() + " --config " +
                           (testing::source_dir() / "configs/llama_tiny.json").string() +
                           " --device cpu --print_config --fuse_optimizer_with_backward";
  auto clipped = run_command(base);  // --grad_clipping defaults to 1.0
  EXPECT_EQ(clipped.exit_code, 2) << clipped.output;
  for (const char* part : {"--fuse_optimizer_with_backward: needs --grad_clipping 0 (got 1)", "global-norm clipping",
                           "Pass --grad_clipping 0"})
    EXPECT_NE(clipped.output.find(part), std::string::npos) << part << " in:\n" << clipped.output;
  auto offloaded = run_command(base + " --grad_clipping 0 --offload optimizer");
  EXPECT_EQ(offloaded.exit_code, 2) << offloaded.output;
  EXPECT_NE(offloaded.output.find("does not combine with --offload optimizer"), std::string::npos) << offloaded.output;
  auto accepted = run_command(base + " --grad_clipping 0");
  ASSERT_EQ(accepted.exit_code, 0) << accepted.output;
  EXPECT_NE(accepted.output.find("\"fuse_optimizer_with_backward\": true"), std::string::npos) << accepted.output;
}

TEST(FusedStepFlags, ANonFiniteLossStopsBeforeTheFusedBackwardUpdates) {
  ScratchDir dir("fused_diverge");
  auto result = run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                            (testing::source_dir() / "configs/llama_micro.json").string() +
                            " --device cpu --num_training_steps 10 --warmup_steps 0 --lr 1e30 --grad_clipping 0"
                            " --batch_size 2 --max_length 16 --eval_every 0 --fuse_optimizer_with_backward --run_dir " +
                            dir.path().string());
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("training stopped before the fused backward updated anything"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace llm::fused_step_test
