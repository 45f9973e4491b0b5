// Stopping before the end on purpose (trainer/train_loop.cpp): --stop_at_step N saves step N and exits
// 0, and the resumed run ends where the uninterrupted one does; --max_runtime stops at the first step
// boundary where one more step and a save would pass it, saves and exits 0, on every rank together.
#include <chrono>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include <ctime>

#include "common/run_deadline.h"
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
  // A date that is not on the calendar is named with what is wrong, never said to have passed.
  const auto impossible = testing::run_command(base + " --max_runtime 2099-02-30T10:00");
  EXPECT_EQ(impossible.exit_code, 2) << impossible.output;
  EXPECT_NE(impossible.output.find("--max_runtime: expected minutes from the start"), std::string::npos) << impossible.output;
  EXPECT_NE(impossible.output.find("(got \"2099-02-30T10:00\": February 2099 has 28 days, so there is no day 30)"),
            std::string::npos)
      << impossible.output;
}

// --max_runtime's end times are read field by field against the calendar (issue 44: 2026-02-30 was
// taken as March 2, and other impossible times as another day or as passed): each impossible one is
// refused saying what is wrong; real ones are the local time they name.
TEST(RunDeadline, AnEndTimeIsOnTheCalendarOrRefusedSayingWhy) {
  const struct {
    const char* text;
    const char* why;  // nullptr: accepted
  } cases[] = {
      {"2099-02-30T10:00", "February 2099 has 28 days, so there is no day 30"},
      {"2100-02-29T10:00", "February 2100 has 28 days, so there is no day 29"},
      {"2096-02-29T10:00", nullptr},
      {"2099-04-31T10:00", "April 2099 has 30 days, so there is no day 31"},
      {"2099-13-01T10:00", "there is no month 13 (months are 01 to 12)"},
      {"2099-00-10T10:00", "there is no month 0"},
      {"2099-01-00T10:00", "January 2099 has 31 days, so there is no day 0"},
      {"2099-01-01T25:00", "there is no hour 25 (hours are 00 to 23)"},
      {"2099-01-01T24:00", "there is no hour 24"},
      {"2099-01-01T10:60", "there is no minute 60"},
      {"2099-01-01T10:00:60", "there is no second 60"},
      {"2099-06-15T12:34:56", nullptr},
      {"2099-1-01T10:00", "neither a number of minutes nor an end time"},
      {"2099-01-01T10:00Z", "neither a number of minutes nor an end time"},
      {"2099-01-01 10:00", "neither a number of minutes nor an end time"},
      {"2099-01-01T+1:00", "neither a number of minutes nor an end time"},
      {"nan", "minutes must be a finite number above 0"},
      {"-5", "minutes must be a finite number above 0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    std::string why;
    const std::optional<double> end = max_runtime_end_epoch(c.text, 1000.0, &why);
    if (c.why == nullptr) {
      ASSERT_TRUE(end.has_value()) << why;
      int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
      std::sscanf(c.text, "%d-%d-%dT%d:%d:%d", &year, &month, &day, &hour, &minute, &second);
      std::tm local{};
      const auto at = static_cast<std::time_t>(*end);
      localtime_r(&at, &local);
      EXPECT_EQ(local.tm_year + 1900, year);
      EXPECT_EQ(local.tm_mon + 1, month);
      EXPECT_EQ(local.tm_mday, day);
      EXPECT_EQ(local.tm_hour, hour);
      EXPECT_EQ(local.tm_min, minute);
      EXPECT_EQ(local.tm_sec, second);
    } else {
      EXPECT_FALSE(end.has_value()) << "read as " << *end;
      EXPECT_NE(why.find(c.why), std::string::npos) << why;
    }
  }
  EXPECT_EQ(max_runtime_end_epoch("1.5", 1000.0), 1000.0 + 90);  // minutes from the start
}

}  // namespace
}  // namespace llm::run_limits_test
