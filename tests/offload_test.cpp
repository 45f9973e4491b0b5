// --offload optimizer through the trainer binary on CPU (offload/optimizer_offload.h): the host step on
// a worker thread, per unit, equals the step without offload bitwise (losses, gradient norms, final
// parameters and optimizer state) for each optimizer at 1 and 4 ranks, with gradient accumulation
// and with clipping that fires, in fp32 and in pure bf16; the device-side optimizer bytes are zero
// and no gradient shard outlives its step on the device;
// and a run saved with offload resumes exactly.
#include <gtest/gtest.h>

#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "tests/run_comparison.h"
#include "tests/test_util.h"
#include "checkpoint/checkpoint.h"

namespace llm {
namespace {

using testing::run_command;
using testing::ScratchDir;

struct OffloadCase {
  std::string name;
  int ranks;
  std::string flags;
};

// llama_micro, 6 steps, accumulation 2, clipping at 0.05 (it fires at every step here), weight decay.
std::string run_flags(const OffloadCase& c, const std::filesystem::path& dir, int steps = 6) {
  constexpr int kGlobalBatch = 8;
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --num_training_steps " + std::to_string(steps) +
         " --warmup_steps 1 --max_length 32 --eval_every 3 --eval_batches 1 --weight_decay 0.1 --grad_clipping 0.05"
         " --total_batch_size " + std::to_string(kGlobalBatch) + " --batch_size " +
         std::to_string(kGlobalBatch / c.ranks / 2) + " " + c.flags + " --save_dir " + (dir / "ckpt").string() +
         " --run_dir " + (dir / "run").string();
}

void expect_identical(const testing::Checkpoint& actual, const testing::Checkpoint& expected, const std::string& what) {
  ASSERT_EQ(actual.model.size(), expected.model.size()) << what;
  for (const auto& [name, tensor] : expected.model)
    EXPECT_TRUE(at::equal(actual.model.at(name), tensor)) << what << ": parameter " << name;
  ASSERT_EQ(actual.optimizer.size(), expected.optimizer.size()) << what;
  for (const auto& [key, tensor] : expected.optimizer)
    EXPECT_TRUE(at::equal(actual.optimizer.at(key), tensor)) << what << ": optimizer " << key;
}

class OffloadEquivalence : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(OffloadEquivalence, EqualsTheStepWithoutOffloadBitwise) {
  const OffloadCase& c = GetParam();
  ScratchDir plain_dir("offload_off_" + c.name), offload_dir("offload_on_" + c.name);
  auto plain = run_command(testing::trainer_launcher(c.ranks) + run_flags(c, plain_dir.path()));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  auto offloaded = run_command(testing::trainer_launcher(c.ranks) + run_flags(c, offload_dir.path()) +
                               " --offload optimizer");
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
  testing::expect_same_run(plain_dir.path(), offload_dir.path(), 6);
  bool clipped = false;
  for (const nlohmann::json& step : testing::read_metrics_events(plain_dir / "run", "train"))
    clipped = clipped || step.at("grad_norm").get<double>() > 0.05;
  EXPECT_TRUE(clipped) << "the case is meant to clip";

  // The ledger: no optimizer state on the device with offload, all of it (and the masters) on the host.
  for (int r = 0; r < c.ranks; ++r) {
    const auto points = testing::read_ledger_events(offload_dir / "run", r, "point");
    ASSERT_FALSE(points.empty());
    const auto plain_points = testing::read_ledger_events(plain_dir / "run", r, "point");
    for (const nlohmann::json& point : points) {
      EXPECT_EQ(point.at("optimizer_device").get<int64_t>(), 0) << "rank " << r << " " << point.at("phase");
      EXPECT_GT(point.at("optimizer_host").get<int64_t>(), plain_points.front().at("optimizer_device").get<int64_t>())
          << "rank " << r << ": the state plus the masters and gradient landing buffers";
      // Between steps the device holds no gradient: every unit's shard went to the host and was freed.
      if (point.at("phase") == "optimizer") {
        EXPECT_EQ(point.at("gradients").get<int64_t>(), 0) << "rank " << r;
      }
    }
  }
  const auto plain_state = testing::read_metrics_events(plain_dir / "run", "sharded_state").at(0).at("ranks");
  const auto offload_state = testing::read_metrics_events(offload_dir / "run", "sharded_state").at(0).at("ranks");
  for (int r = 0; r < c.ranks; ++r) {
    EXPECT_GT(plain_state[r].at("gradient_shard_bytes").get<int64_t>(), 0) << "rank " << r;
    EXPECT_EQ(offload_state[r].at("gradient_shard_bytes").get<int64_t>(), 0) << "rank " << r << ": transient";
  }
}

const OffloadCase kCases[] = {
    {"adamw_1rank", 1, "--optimizer adamw --lr 1e-2"},
    {"adamw_4ranks", 4, "--optimizer adamw --lr 1e-2"},
    {"adamw_sn_1rank", 1, "--optimizer adamw_sn --lr 2e-2"},
    {"adamw_sn_4ranks", 4, "--optimizer adamw_sn --lr 2e-2"},
    {"galore_1rank", 1, "--optimizer galore_adamw --rank 8 --update_proj_gap 2 --lr 5e-3"},
    {"galore_4ranks", 4, "--optimizer galore_adamw --rank 8 --update_proj_gap 2 --lr 5e-3"},
    {"adamw_pure_bf16_4ranks", 4, "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision pure"},
    {"adamw_mixed_bf16_shard_grad_op_4ranks", 4,
     "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision mixed --sharding shard_grad_op"},
    {"adamw_sn_no_shard_4ranks", 4, "--optimizer adamw_sn --lr 2e-2 --sharding no_shard"},
};

INSTANTIATE_TEST_SUITE_P(Cases, OffloadEquivalence, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

TEST(OffloadResume, ResumesExactlyFromAnOffloadedCheckpoint) {
  const OffloadCase c{"resume", 2, "--optimizer adamw --lr 1e-2 --offload optimizer --save_every 3"};
  ScratchDir whole("offload_whole"), split("offload_split");
  auto full = run_command(testing::trainer_launcher(2) + run_flags(c, whole.path()));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  auto resumed = run_command(testing::trainer_launcher(2) + run_flags(c, split.path()) + " --continue_from " +
                             (whole / "ckpt/step_3").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto whole_steps = testing::read_metrics_events(whole / "run", "train");
  const auto resumed_steps = testing::read_metrics_events(split / "run", "train");
  ASSERT_EQ(resumed_steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(resumed_steps[i].at("loss").get<double>(), whole_steps[i + 3].at("loss").get<double>()) << "step " << i + 4;
  expect_identical(testing::load_checkpoint((split / "ckpt/step_6").string()), testing::load_checkpoint((whole / "ckpt/step_6").string()),
                   "resumed");
}

}  // namespace
}  // namespace llm
