// Stopping before the end on purpose (trainer/train_loop.cpp): --stop_at_step N saves step N and exits
// 0, and the resumed run ends where the uninterrupted one does; --max_runtime stops at the first step
// boundary where one more step and a save would pass it, saves and exits 0, on every rank together.
#include <chrono>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "run_comparison.h"
#include "test_util.h"

namespace llm::run_limits_test {
namespace {
namespace fs = std::filesystem;

std::string micro_flags(int ranks) {
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --max_length 16 --total_batch_size 4 --batch_size " + std::to_string(4 / ranks) +
         " --eval_every 0 --eval_batches 1 --warmup_steps 2 --lr 1e-2";
}

// step -> (loss, lr) of the last train record of each step (a resumed run's where it trained twice).
std::map<int64_t, std::pair<double, double>> losses(const fs::path& run_dir) {
  std::map<int64_t, std::pair<double, double>> by_step;
  for (const auto& record : testing::read_metrics_events(run_dir, "train"))
    by_step[record.at("step").get<int64_t>()] = {record.at("loss").get<double>(), record.at("lr").get<double>()};
  return by_step;
}

TEST(RunLimits, StopAtStepSavesExitsZeroAndTheResumeEndsAsTheUninterruptedRun) {
  testing::ScratchDir dir("stop_at_step");
  const std::string base = testing::trainer_launcher(1) + micro_flags(1) + " --num_training_steps 8";
  const auto straight = testing::run_command(base + " --run_dir " + (dir / "straight").string());
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string stopped_flags = base + " --run_dir " + (dir / "stopped").string() + " --save_dir " + (dir / "ckpt").string();
  const auto stopped = testing::run_command(stopped_flags + " --stop_at_step 5");
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_NE(stopped.output.find("stopped after step 5 of 8 (--stop_at_step)"), std::string::npos) << stopped.output;
  EXPECT_TRUE(fs::exists(dir / "ckpt" / "step_5"));
  const auto ends = testing::read_metrics_events(dir / "stopped", "end");
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].at("steps"), 5);
  EXPECT_EQ(ends[0].at("stopped_by"), "--stop_at_step");
  // The same --stop_at_step again on the resume is refused: the run is already there.
  const auto again = testing::run_command(stopped_flags + " --stop_at_step 5 --continue_from " + (dir / "ckpt").string());
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("--stop_at_step"), std::string::npos) << again.output;
  const auto resumed = testing::run_command(stopped_flags + " --continue_from " + (dir / "ckpt").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  // The schedule was that of 8 steps all along: every step's loss and lr are the same bits.
  EXPECT_EQ(losses(dir / "stopped"), losses(dir / "straight"));
  EXPECT_EQ(losses(dir / "straight").size(), 8u);
}

TEST(RunLimits, MaxRuntimeStopsBeforeTheLimitWithASaveOnEveryRank) {
  testing::ScratchDir dir("max_runtime");
  // 0.1 minutes: 6 s from the process's start, for a run that would take far longer (3 s left a
  // busy machine's ranks one step: their start-up takes the rest).
  const auto started = std::chrono::steady_clock::now();
  const auto run = testing::run_command(testing::trainer_launcher(2) + micro_flags(2) +
                                        " --num_training_steps 1000000 --max_runtime 0.1 --run_dir " + (dir / "run").string() +
                                        " --save_dir " + (dir / "ckpt").string());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("(--max_runtime): saved"), std::string::npos) << run.output;
  const auto ends = testing::read_metrics_events(dir / "run", "end");
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].at("stopped_by"), "--max_runtime");
  const int64_t steps = ends[0].at("steps").get<int64_t>();
  EXPECT_GT(steps, 1);
  EXPECT_TRUE(fs::exists(dir / "ckpt" / ("step_" + std::to_string(steps))));
  // mpirun's own start and end come on top of the 6 s the ranks had.
  EXPECT_LT(seconds, 6.0 + 5.0) << run.output;
}

TEST(RunLimits, ABadLimitIsExitTwoNamingTheFlag) {
  testing::ScratchDir dir("run_limits_bad");
  const std::string base = testing::trainer_launcher(1) + micro_flags(1) + " --num_training_steps 8 --run_dir " + (dir / "run").string();
  for (const std::string& flags : {std::string(" --stop_at_step 8"), std::string(" --stop_at_step -1"),
                                   std::string(" --max_runtime soon"), std::string(" --max_runtime 0"),
                                   std::string(" --max_runtime 2020-01-01T00:00")}) {
    const auto result = testing::run_command(base + flags);
    EXPECT_EQ(result.exit_code, 2) << flags << "\n" << result.output;
    const std::string flag = flags.substr(1, flags.find(' ', 1) - 1);
    EXPECT_NE(result.output.find(flag), std::string::npos) << result.output;
  }
}

}  // namespace
}  // namespace llm::run_limits_test
