// Prefetch through the trainer binary: `mpirun -np 2 trainer` with and without --no_prefetch gives
// the same losses and the same final parameters for each strategy, and the end-of-run
// gather_schedule record states how many units were gathered at once: at most 2 with prefetch and
// 1 without under full_shard; every unit under shard_grad_op (held from forward to backward) and
// no_shard (replicated). On CPU the prefetch is an in-line gather issued one unit early, so this
// checks the order of collectives (every rank must agree on it) and the bound, not any overlap.
#include <gtest/gtest.h>

#include <ATen/ops/equal.h>
#include <nlohmann/json.hpp>

#include "tests/run_comparison.h"
#include "tests/test_util.h"
#include "checkpoint/checkpoint.h"

namespace llm::prefetch_test {
namespace {

using testing::run_command;
using testing::ScratchDir;

constexpr int kRanks = 2;
constexpr int64_t kUnits = 4;  // llama_micro: embed, 2 layers, head

struct TrainedRun {
  std::vector<nlohmann::json> steps;
  nlohmann::json schedule;
  testing::Checkpoint final_state;
};

TrainedRun train(const ScratchDir& dir, const std::string& strategy, bool prefetch) {
  const std::string flags =
      " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
      " --device cpu --num_training_steps 6 --warmup_steps 1 --max_length 32 --batch_size 2"
      " --total_batch_size 8 --eval_every 3 --eval_batches 2 --lr 3e-3 --sharding " + strategy +
      (prefetch ? "" : " --no_prefetch") + " --save_dir " + (dir / "ckpt").string() +
      " --run_dir " + (dir / "run").string();
  auto result = run_command(testing::mpirun(kRanks) + testing::trainer_binary().string() + flags);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  TrainedRun run;
  run.steps = testing::read_metrics_events(dir / "run", "train");
  const auto schedules = testing::read_metrics_events(dir / "run", "gather_schedule");
  EXPECT_EQ(schedules.size(), 1u) << result.output;
  if (!schedules.empty()) run.schedule = schedules.front();
  if (std::filesystem::exists(dir / "ckpt/step_6"))
    run.final_state = testing::load_checkpoint((dir / "ckpt/step_6").string());
  return run;
}

class Prefetch : public ::testing::TestWithParam<std::string> {};

TEST_P(Prefetch, SameLossesAndParametersWithAndWithoutPrefetch) {
  const std::string strategy = GetParam();
  ScratchDir with_dir("prefetch_on_" + strategy), without_dir("prefetch_off_" + strategy);
  const TrainedRun with = train(with_dir, strategy, true);
  const TrainedRun without = train(without_dir, strategy, false);

  ASSERT_EQ(with.steps.size(), 6u);
  ASSERT_EQ(without.steps.size(), 6u);
  for (size_t i = 0; i < with.steps.size(); ++i) {
    // Bit-identical: a gather only copies, and prefetch changes when it happens, not what it does.
    EXPECT_EQ(static_cast<double>(with.steps[i].at("loss")),
              static_cast<double>(without.steps[i].at("loss"))) << "step " << i + 1;
    EXPECT_EQ(static_cast<double>(with.steps[i].at("grad_norm")),
              static_cast<double>(without.steps[i].at("grad_norm"))) << "step " << i + 1;
  }
  ASSERT_EQ(with.final_state.model.size(), without.final_state.model.size());
  ASSERT_FALSE(with.final_state.model.empty());
  for (const auto& [name, expected] : without.final_state.model)
    EXPECT_TRUE(at::equal(with.final_state.model.at(name), expected)) << name;

  EXPECT_EQ(with.schedule.at("prefetch"), true);
  EXPECT_EQ(without.schedule.at("prefetch"), false);
  EXPECT_EQ(with.schedule.at("side_stream"), false) << "CPU: no gather stream";
  for (const TrainedRun* run : {&with, &without}) {
    EXPECT_EQ(run->schedule.at("strategy"), strategy);
    EXPECT_EQ(run->schedule.at("units"), kUnits);
    // Measured from the units equals the schedule's own count.
    EXPECT_EQ(run->schedule.at("peak_gathered_units"), run->schedule.at("schedule_peak_gathered_units"));
  }
  const int64_t peak_with = with.schedule.at("peak_gathered_units");
  const int64_t peak_without = without.schedule.at("peak_gathered_units");
  if (strategy == "full_shard") {
    EXPECT_EQ(peak_with, 2);
    EXPECT_EQ(peak_without, 1);
  } else {
    EXPECT_EQ(peak_with, kUnits);
    EXPECT_EQ(peak_without, kUnits);
  }
  const int64_t prefetches = with.schedule.at("prefetches");
  EXPECT_EQ(without.schedule.at("prefetches"), 0);
  if (strategy == "no_shard")
    EXPECT_EQ(prefetches, 0) << "nothing is ever gathered";
  else
    EXPECT_GT(prefetches, 0);
}

INSTANTIATE_TEST_SUITE_P(Strategies, Prefetch,
                         ::testing::Values("full_shard", "shard_grad_op", "no_shard"), testing::TextParamName());

}  // namespace
}  // namespace llm::prefetch_test
