// The optimizer step fused into backward (--fuse_optimizer_with_backward) through the trainer binary
// on CPU: without clipping it equals the unfused run bitwise (losses, gradient norms, evaluation
// losses, final parameters and optimizer state) for each strategy, precision and optimizer, with
// gradient accumulation; the gradient category's largest value falls, as the estimate says; the
// combination with clipping (and with offload) is refused at start-up with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "trainer/checkpoint.h"

namespace llm {
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

std::string run_flags(const FusedCase& c, const std::filesystem::path& dir) {
  constexpr int kGlobalBatch = 8;
  return " --config " + (testing::source_dir() / "configs/llama_tiny.json").string() +
         " --device cpu --num_training_steps 4 --warmup_steps 1 --max_length 32 --eval_every 2 --eval_batches 1"
         " --weight_decay 0.1 --grad_clipping 0 --lr 1e-2 --total_batch_size " + std::to_string(kGlobalBatch) +
         " --batch_size " + std::to_string(kGlobalBatch / c.ranks / 2) + " " + c.flags + " --save_dir " +
         (dir / "ckpt").string() + " --run_dir " + (dir / "run").string();
}

std::string launcher(int ranks) {
  return ranks == 1 ? "OMP_NUM_THREADS=1 " + testing::trainer_binary().string()
                    : testing::mpirun(ranks) + testing::trainer_binary().string();
}

// The end summary's largest value of a category on rank `rank`.
int64_t summary_max(const std::filesystem::path& run_dir, int rank, const char* category) {
  std::ifstream in(run_dir / ("memory.rank" + std::to_string(rank) + ".jsonl"));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.at("event") == "end") return record.at("summary").at("max").at(category).get<int64_t>();
  }
  return -1;
}

class FusedStep : public ::testing::TestWithParam<FusedCase> {};

TEST_P(FusedStep, EqualsTheUnfusedStepBitwiseWithoutClipping) {
  const FusedCase& c = GetParam();
  ScratchDir plain_dir("fused_off_" + c.name), fused_dir("fused_on_" + c.name);
  auto plain = run_command(launcher(c.ranks) + run_flags(c, plain_dir.path()));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  auto fused = run_command(launcher(c.ranks) + run_flags(c, fused_dir.path()) + " --fuse_optimizer_with_backward");
  ASSERT_EQ(fused.exit_code, 0) << fused.output;

  const auto plain_steps = testing::read_metrics_events(plain_dir / "run", "train");
  const auto steps = testing::read_metrics_events(fused_dir / "run", "train");
  ASSERT_EQ(plain_steps.size(), 4u);
  ASSERT_EQ(steps.size(), plain_steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].at("loss").get<double>(), plain_steps[i].at("loss").get<double>()) << "step " << i + 1;
    EXPECT_EQ(steps[i].at("grad_norm").get<double>(), plain_steps[i].at("grad_norm").get<double>()) << "step " << i + 1;
    EXPECT_EQ(steps[i].at("lr").get<double>(), plain_steps[i].at("lr").get<double>()) << "step " << i + 1;
  }
  const auto plain_eval = testing::read_metrics_events(plain_dir / "run", "eval");
  const auto eval = testing::read_metrics_events(fused_dir / "run", "eval");
  ASSERT_EQ(eval.size(), plain_eval.size());
  for (size_t i = 0; i < eval.size(); ++i)
    EXPECT_EQ(eval[i].at("eval_loss").get<double>(), plain_eval[i].at("eval_loss").get<double>());
  const Checkpoint expected = load_checkpoint((plain_dir / "ckpt/step_4").string());
  const Checkpoint actual = load_checkpoint((fused_dir / "ckpt/step_4").string());
  ASSERT_EQ(actual.model.size(), expected.model.size());
  for (const auto& [name, tensor] : expected.model)
    EXPECT_TRUE(at::equal(actual.model.at(name), tensor)) << "parameter " << name;
  ASSERT_EQ(actual.optimizer.size(), expected.optimizer.size());
  for (const auto& [key, tensor] : expected.optimizer)
    EXPECT_TRUE(at::equal(actual.optimizer.at(key), tensor)) << "optimizer " << key;

  // The gradient shards of all units never coexist: the category's largest value falls.
  for (int r = 0; r < c.ranks; ++r) {
    const int64_t fused_max = summary_max(fused_dir / "run", r, "gradients");
    const int64_t plain_max = summary_max(plain_dir / "run", r, "gradients");
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
}  // namespace llm
