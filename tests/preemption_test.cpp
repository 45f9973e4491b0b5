// Preemption through the trainer binary on CPU (trainer/preemption.h): SIGTERM to one rank, at one,
// two ranks and hybrid 2x2, stops every rank after the same step, saves it and exits 0, and resuming from the
// save_dir ends with the same loss as the uninterrupted run, bit for bit; a second signal changes
// nothing; without --save_dir the exit status says the work is lost (128 + 15); a grace period too
// short for the step ends the job at its deadline; SIGUSR1 to mpirun reaches every rank, and so does
// SIGTERM or SIGINT to launch/mpirun.sh.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "common/watchdog.h"

namespace llm::preemption_test {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;

constexpr int kSteps = 60;  // far more than pass between the first step's record and the signal
// Through mpirun, a signal takes its time on a busy machine (mpirun's event loop): a run long enough
// never to end first. A lost signal still fails the test: the run then trains all its steps.
constexpr int kStepsThroughMpirun = 1000;

std::string command(int ranks, const std::string& flags, int steps = kSteps) {
  const std::string launcher = ranks == 1 ? "OMP_NUM_THREADS=1 " : testing::mpirun(ranks);
  return launcher + testing::trainer_binary().string() + " --config " +
         (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --num_training_steps " + std::to_string(steps) +
         " --warmup_steps 2 --batch_size 2 --total_batch_size 4 --max_length 16 --eval_every 0 " + flags;
}

std::string read_file(const fs::path& path) { return testing::read_text(path); }
using testing::find_process;

// Starts `command`, waits for its first `after_steps` train records in RUN_DIR/metrics.jsonl, then
// sends `signal` (`count` times, `gap` apart: a signal sent while the same one is pending is merged
// into it) to the process `find` returns. The command's result.
CommandResult run_and_signal(const std::string& command, const fs::path& run_dir, const std::function<pid_t()>& find,
                             int signal, int count = 1,
                             std::chrono::milliseconds gap = std::chrono::milliseconds(0), size_t after_steps = 1) {
  return testing::run_and_act(
      command, run_dir,
      [&] {
        const pid_t pid = find();
        if (pid <= 0) return false;
        for (int i = 0; i < count; ++i) {
          if (i > 0) std::this_thread::sleep_for(gap);
          ::kill(pid, signal);
        }
        return true;
      },
      after_steps);
}

// At one and two ranks, and hybrid 2x2, where the signalled rank (the last) is in the group that
// writes nothing: the writers of group 0 save the step all agreed on.
struct PreemptionCase {
  int ranks;
  std::string flags;
};

class Preemption : public ::testing::TestWithParam<PreemptionCase> {};

TEST_P(Preemption, SigtermToOneRankSavesTheStepAndResumingEqualsTheUninterruptedRun) {
  const int ranks = GetParam().ranks;
  const auto command = [&](int n, const std::string& flags) {
    return preemption_test::command(n, GetParam().flags + " " + flags);
  };
  ScratchDir dir("preempt" + std::to_string(ranks));
  auto uninterrupted = run_command(command(ranks, "--run_dir " + (dir / "full").string()));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  const auto full_steps = testing::read_metrics_events(dir / "full", "train");
  ASSERT_EQ(full_steps.size(), static_cast<size_t>(kSteps));

  // The last rank gets the signal (at two ranks, not the one that writes): every rank must stop.
  // Twice: the second arrives while the first is handled, and changes nothing.
  const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
  // A grace period far longer than the step and its save: it changes nothing.
  const std::string flags = "--save_dir " + save_dir.string() + " --run_dir " + run_dir.string() +
                            " --preemption_grace_seconds 300";
  auto preempted = run_and_signal(
      command(ranks, flags), run_dir,
      [&] { return find_process(testing::trainer_binary().string(), run_dir, ranks - 1); }, SIGTERM, 2);
  ASSERT_EQ(preempted.exit_code, 0) << preempted.output;
  const auto records = testing::read_metrics_events(run_dir, "preempted");
  ASSERT_EQ(records.size(), 1u) << preempted.output;
  const int64_t step = records[0].at("step");
  ASSERT_LT(step, kSteps) << "the run ended before the signal was handled";
  EXPECT_EQ(records[0].at("signal"), "SIGTERM");
  const fs::path checkpoint = save_dir / ("step_" + std::to_string(step));
  EXPECT_EQ(records[0].at("checkpoint"), checkpoint.string());
  EXPECT_NE(preempted.output.find("preempted by SIGTERM at step " + std::to_string(step) + ": saved " +
                                  checkpoint.string() + "; resume with the same flags and --continue_from " +
                                  save_dir.string()),
            std::string::npos)
      << preempted.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(checkpoint / "manifest.json")).at("step"), step);
  EXPECT_TRUE(testing::read_metrics_events(run_dir, "end").empty()) << "a preempted run has not ended";
  EXPECT_EQ(testing::read_metrics_events(run_dir, "train").size(), static_cast<size_t>(step));

  // The same command line again with --continue_from: the rest of the run, appended to its history.
  auto resumed = run_command(command(ranks, flags + " --continue_from " + save_dir.string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto steps = testing::read_metrics_events(run_dir, "train");
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].at("step"), full_steps[i].at("step"));
    // Same operations in the same order on CPU: the same bits.
    EXPECT_EQ(steps[i].at("loss").get<double>(), full_steps[i].at("loss").get<double>()) << "step " << i + 1;
  }
  const auto end = testing::read_metrics_events(run_dir, "end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].at("final_loss").get<double>(),
            testing::read_metrics_events(dir / "full", "end").at(0).at("final_loss").get<double>());
}

INSTANTIATE_TEST_SUITE_P(Ranks, Preemption,
                         ::testing::Values(PreemptionCase{1, ""}, PreemptionCase{2, ""},
                                           PreemptionCase{4, "--sharding hybrid_shard --shard_group_size 2 --batch_size 1"}),
                         [](const auto& info) {
                           return std::to_string(info.param.ranks) + "_ranks" + (info.param.flags.empty() ? "" : "_hybrid");
                         });

TEST(PreemptionWithoutSaveDir, ExitStatusSaysTheStepsAreLost) {
  ScratchDir dir("preempt_nosave");
  const fs::path run_dir = dir / "run";
  auto result = run_and_signal(
      command(1, "--run_dir " + run_dir.string()), run_dir,
      [&] { return find_process(testing::trainer_binary().string(), run_dir, 0); }, SIGTERM);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.output;
  EXPECT_NE(result.output.find("nothing was saved (no --save_dir), so the steps are lost"), std::string::npos)
      << result.output;
  const auto records = testing::read_metrics_events(run_dir, "preempted");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_TRUE(records[0].at("checkpoint").is_null());
}

// Ctrl-C twice at a terminal: the second SIGINT ends the process at once, before the step boundary.
// A grace period shorter than the step in progress (llama_9m, about half a second a step here): the
// process ends itself with 128 + 15 at the deadline, saying so, and leaves no checkpoint.
TEST(PreemptionGracePeriod, EndsTheJobWhenTheStepAndSaveDoNotFitInIt) {
  ScratchDir dir("preempt_grace");
  const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
  const std::string run = "OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                          (testing::source_dir() / "configs/llama_9m.json").string() +
                          " --device cpu --num_training_steps 40 --warmup_steps 2 --batch_size 4 --max_length 256"
                          " --eval_every 0 --preemption_grace_seconds 0.05 --save_dir " +
                          save_dir.string() + " --run_dir " + run_dir.string();
  const auto started = std::chrono::steady_clock::now();
  auto result = run_and_signal(run, run_dir, [&] { return find_process(testing::trainer_binary().string(), run_dir, -1); },
                               SIGTERM);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.output;
  EXPECT_NE(result.output.find("preempted by SIGTERM, and the step and its checkpoint did not finish within "
                               "--preemption_grace_seconds 0.05: ending now (exit status 143)"),
            std::string::npos)
      << result.output;
  EXPECT_TRUE(testing::read_metrics_events(run_dir, "preempted").empty()) << "it never reached the step boundary";
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(save_dir, error))
    EXPECT_FALSE(fs::exists(entry.path() / "manifest.json")) << entry.path() << ": no checkpoint was completed";
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(60));
}

TEST(PreemptionSecondSigint, StopsAtOnce) {
  ScratchDir dir("preempt_sigint_twice");
  const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
  // llama_20m's steps of 4 x 256 tokens last about a second: the second SIGINT, 100 ms after the
  // first, lands inside the step the first one interrupted.
  auto result = run_and_signal(
      command(1, "--config " + (testing::source_dir() / "configs/llama_20m.json").string() +
                     " --batch_size 4 --total_batch_size 4 --max_length 256 --save_dir " + save_dir.string() +
                     " --run_dir " + run_dir.string()),
      run_dir, [&] { return find_process(testing::trainer_binary().string(), run_dir, 0); }, SIGINT, 2,
      std::chrono::milliseconds(100));
  EXPECT_EQ(result.exit_code, 128 + SIGINT) << result.output;
  EXPECT_NE(result.output.find("second SIGINT: stopping at once"), std::string::npos) << result.output;
  EXPECT_TRUE(testing::read_metrics_events(run_dir, "preempted").empty()) << "it did not wait for the step";
}

// A preemption while an --async_save is in flight (each write held back 1 s, a save every step, so
// the signal always finds one): the save in flight completes, then the step is saved synchronously,
// and the run exits 0 with both checkpoints intact and no staging folder left.
TEST(PreemptionWithAsyncSave, TheSaveInFlightCompletesAndTheStepIsSaved) {
  ScratchDir dir("preempt_async");
  const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
  auto result = run_and_signal(
      "LLM_DEBUG_SAVE_DELAY_SECONDS=1 " +
          command(2, "--save_every 1 --async_save --save_dir " + save_dir.string() + " --run_dir " + run_dir.string()),
      // After step 2's record: a signal right after step 1's could be agreed on at step 1's end,
      // before any save was in flight.
      run_dir, [&] { return find_process(testing::trainer_binary().string(), run_dir, 1); }, SIGTERM, 1,
      std::chrono::milliseconds(0), 2);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto preempted = testing::read_metrics_events(run_dir, "preempted");
  ASSERT_EQ(preempted.size(), 1u) << result.output;
  const int64_t step = preempted[0].at("step");
  ASSERT_GE(step, 2) << result.output;
  ASSERT_LT(step, kSteps) << "the run ended before the signal was handled";
  const auto saves = testing::read_metrics_events(run_dir, "checkpoint");
  ASSERT_GE(saves.size(), 2u) << result.output;
  const nlohmann::json &in_flight = saves[saves.size() - 2], &last = saves.back();
  EXPECT_EQ(in_flight.at("step"), step - 1);
  EXPECT_EQ(in_flight.at("background"), true);
  EXPECT_EQ(in_flight.at("completed_at_step"), step);
  EXPECT_EQ(last.at("step"), step);
  EXPECT_EQ(last.at("background"), false);
  for (const int64_t saved : {step - 1, step})
    EXPECT_EQ(nlohmann::json::parse(read_file(save_dir / ("step_" + std::to_string(saved)) / "manifest.json")).at("step"),
              saved);
  for (const auto& entry : fs::directory_iterator(save_dir))  // no staging folder; the job's lock file stays
    if (entry.path().filename() != ".trainer.lock") {
      EXPECT_EQ(entry.path().extension(), "") << entry.path() << " left behind";
    }
}

// A save killed midway: every rank SIGKILLed while the --async_save of step 4 is in flight (each write
// held back 3 s; step 2's save completed). Its staging folder is left and is no checkpoint: step_2
// stays the newest, and resuming from the save_dir goes on from it with the uninterrupted run's
// losses, bit for bit.
TEST(KilledSave, LeavesThePreviousCheckpointTheNewestAndLoadable) {
  ScratchDir dir("killed_save");
  auto uninterrupted = run_command(command(2, "--run_dir " + (dir / "full").string()));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  const auto full_steps = testing::read_metrics_events(dir / "full", "train");
  ASSERT_EQ(full_steps.size(), static_cast<size_t>(kSteps));

  const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
  const std::string flags = "--save_every 2 --save_dir " + save_dir.string() + " --run_dir " + run_dir.string();
  std::future<CommandResult> running = std::async(std::launch::async, [&] {
    return run_command("LLM_DEBUG_SAVE_DELAY_SECONDS=3 " + command(2, flags + " --async_save"));
  });
  bool killed = false;
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
       !killed && std::chrono::steady_clock::now() < deadline;) {
    if (running.wait_for(std::chrono::milliseconds(20)) == std::future_status::ready) break;
    if (read_file(run_dir / "metrics.jsonl").find("\"event\":\"checkpoint\"") == std::string::npos) continue;
    if (!fs::exists(save_dir / "step_4.tmp")) continue;
    // Step 2's save is complete and step 4's is being written for the next 3 s.
    const pid_t rank0 = find_process(testing::trainer_binary().string(), run_dir, 0);
    const pid_t rank1 = find_process(testing::trainer_binary().string(), run_dir, 1);
    if (rank0 <= 0 || rank1 <= 0) continue;
    ::kill(rank0, SIGKILL);
    ::kill(rank1, SIGKILL);
    killed = true;
  }
  const CommandResult result = running.get();
  ASSERT_TRUE(killed) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(fs::exists(save_dir / "step_2/manifest.json"));
  EXPECT_FALSE(fs::exists(save_dir / "step_4")) << "the killed save completed";
  EXPECT_TRUE(fs::exists(save_dir / "step_4.tmp")) << "the kill came after the save";

  auto resumed = run_command(command(2, flags + " --continue_from " + save_dir.string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + (save_dir / "step_2").string() + " at step 2"), std::string::npos)
      << resumed.output;
  const auto steps = testing::read_metrics_events(run_dir, "train");
  ASSERT_GE(steps.size(), static_cast<size_t>(kSteps - 2));
  // The resumed run's records are the last kSteps - 2 (the killed run's steps come before them).
  for (size_t i = 0; i < static_cast<size_t>(kSteps - 2); ++i) {
    const nlohmann::json& step = steps[steps.size() - (kSteps - 2) + i];
    EXPECT_EQ(step.at("step"), full_steps[i + 2].at("step"));
    EXPECT_EQ(step.at("loss").get<double>(), full_steps[i + 2].at("loss").get<double>()) << "step " << i + 3;
  }
  EXPECT_FALSE(fs::exists(save_dir / "step_4.tmp")) << "the next save of step 4 replaces the leftover";
}

// Open MPI's mpirun forwards SIGUSR1 to every rank and lets the job end by itself; sent SIGTERM or
// SIGINT itself, it aborts the job (the ranks are killed about a second later, before a save can
// finish), which is why launch/mpirun.sh exists: it passes those signals on as SIGUSR1.
TEST(PreemptionUnderMpirun, SigusrToMpirunReachesEveryRank) {
  ScratchDir dir("preempt_mpirun");
  const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
  auto result = run_and_signal(
      command(2, "--save_dir " + save_dir.string() + " --run_dir " + run_dir.string(), kStepsThroughMpirun), run_dir,
      [&] { return find_process(testing::mpiexec(), run_dir, -1); }, SIGUSR1);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto records = testing::read_metrics_events(run_dir, "preempted");
  ASSERT_EQ(records.size(), 1u) << result.output;
  EXPECT_EQ(records[0].at("signal"), "SIGUSR1");
  const int64_t step = records[0].at("step");
  EXPECT_TRUE(fs::exists(save_dir / ("step_" + std::to_string(step)) / "manifest.json"));
}

// launch/mpirun.sh, sent SIGTERM (a scheduler) or SIGINT (Ctrl-C), passes it on to every rank as
// SIGUSR1 through mpirun: the step is saved and the job exits 0.
TEST(PreemptionUnderMpirun, SigtermOrSigintToTheLauncherScriptSavesAndExitsZero) {
  for (const int signal : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(strsignal(signal));
    ScratchDir dir("preempt_script" + std::to_string(signal));
    const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
    const std::string script = (testing::source_dir() / "launch/mpirun.sh").string();
    std::string launched =
        command(2, "--save_dir " + save_dir.string() + " --run_dir " + run_dir.string(), kStepsThroughMpirun);
    // testing::mpirun's "<env> MPIEXEC --oversubscribe": the script in MPIEXEC's place.
    const size_t at = launched.find(testing::mpiexec());
    ASSERT_NE(at, std::string::npos) << launched;
    launched.replace(at, testing::mpiexec().size(),
                     "MPIEXEC=" + testing::mpiexec() + " bash " + script);
    auto result = run_and_signal(launched, run_dir, [&] { return find_process("bash", run_dir, -1); }, signal);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find(std::string("launch/mpirun.sh: ") + (signal == SIGTERM ? "SIGTERM" : "SIGINT") +
                                 " passed to every rank as SIGUSR1"),
              std::string::npos)
        << result.output;
    const auto records = testing::read_metrics_events(run_dir, "preempted");
    ASSERT_EQ(records.size(), 1u) << result.output;
    EXPECT_EQ(records[0].at("signal"), "SIGUSR1");
    const int64_t step = records[0].at("step");
    EXPECT_TRUE(fs::exists(save_dir / ("step_" + std::to_string(step)) / "manifest.json"));
  }
}

// --- stalls (--collective_timeout, common/watchdog.h) -----------------------------------------

// A rank stopped with SIGSTOP (as a debugger or a frozen host would) no longer answers collectives: the
// other rank ends the job within the timeout, naming it, instead of waiting forever.
TEST(StallWatchdog, AStoppedRankIsNamedAndTheJobEnds) {
  ScratchDir dir("stall");
  const fs::path run_dir = dir / "run";
  pid_t stopped = -1;
  const auto started = std::chrono::steady_clock::now();
  // A watchdog that never fires would leave the job waiting on its stopped rank: killed at 60 s.
  auto result = run_and_signal(
      "timeout -s KILL 60 env " +
          command(2, "--num_training_steps 100000 --collective_timeout 5 --run_dir " + run_dir.string()),
      run_dir, [&] { return stopped = find_process(testing::trainer_binary().string(), run_dir, 1); }, SIGSTOP);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (stopped > 0) {  // mpirun ends it when the job ends; make sure, whatever the outcome
    ::kill(stopped, SIGCONT);
    ::kill(stopped, SIGKILL);
  }
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("stalled: no progress on this rank for"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("--collective_timeout 5"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("Not responding: rank 1 (its heartbeat is"), std::string::npos) << result.output;
  EXPECT_LT(seconds, 90) << "the job ended long after the timeout";
}

// The diagnosis from the heartbeat files: a stale one names its rank; a rank at an earlier step is the
// one the others wait for; otherwise every rank is listed at the same point.
TEST(StallWatchdog, DiagnosisReadsTheHeartbeats) {
  ScratchDir dir("stall_diagnosis");
  const double now = static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count()) / 1000.0;
  auto beat = [&](int rank, int64_t step, const char* phase, double age) {
    std::ofstream(dir / ("heartbeat.rank" + std::to_string(rank) + ".json"))
        << nlohmann::json{{"rank", rank}, {"step", step}, {"phase", phase}, {"unit", 2}, {"idle_s", 40.0},
                          {"written_unix_s", now - age}}
               .dump();
  };
  beat(0, 7, "backward", 0);
  beat(1, 7, "backward", 30);
  beat(2, 7, "backward", 0);
  std::string diagnosis = StallWatchdog::diagnose(dir.path().string(), 0, 3, 4);
  EXPECT_NE(diagnosis.find("Not responding: rank 1 (its heartbeat is 30 s old, last at step 7 backward (unit 2))"),
            std::string::npos) << diagnosis;
  EXPECT_EQ(diagnosis.find("rank 2 ("), std::string::npos) << diagnosis;

  beat(1, 6, "forward", 0);
  diagnosis = StallWatchdog::diagnose(dir.path().string(), 0, 3, 4);
  EXPECT_NE(diagnosis.find("Behind the others, which wait for it: rank 1 (at step 6 forward (unit 2)"),
            std::string::npos) << diagnosis;

  beat(1, 7, "backward", 0);
  diagnosis = StallWatchdog::diagnose(dir.path().string(), 0, 3, 4);
  EXPECT_NE(diagnosis.find("Every rank is alive and at the same point"), std::string::npos) << diagnosis;

  fs::remove(dir / "heartbeat.rank2.json");
  diagnosis = StallWatchdog::diagnose(dir.path().string(), 0, 3, 4);
  EXPECT_NE(diagnosis.find("rank 2 (no heartbeat file in"), std::string::npos) << diagnosis;

  // Nodes known, --run_dir not shared: ranks 2 and 3 on node b write where node a cannot read. They
  // are not called stale; the one holding the job up is among them, and node a says so by node.
  beat(1, 7, "backward", 0);
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  diagnosis = StallWatchdog::diagnose(dir.path().string(), 0, 4, 4, hosts);
  EXPECT_EQ(diagnosis.find("Not responding"), std::string::npos) << diagnosis;
  EXPECT_NE(diagnosis.find("Every rank on this node (a) that writes a heartbeat here is alive"), std::string::npos)
      << diagnosis;
  EXPECT_NE(diagnosis.find("on another node: b: ranks 2, 3. Their heartbeats are not readable from here"),
            std::string::npos)
      << diagnosis;
  // A rank of this node without a file is still named, and first.
  fs::remove(dir / "heartbeat.rank1.json");
  diagnosis = StallWatchdog::diagnose(dir.path().string(), 0, 4, 4, hosts);
  EXPECT_NE(diagnosis.find("Not responding: rank 1 (no heartbeat file in"), std::string::npos) << diagnosis;
  EXPECT_EQ(diagnosis.find("rank 2"), std::string::npos) << diagnosis;
}

// A run that ends normally leaves no heartbeat file; a bad --collective_timeout is exit 2.
TEST(StallWatchdog, HeartbeatsGoWithTheRunAndBadTimeoutsAreRefused) {
  ScratchDir dir("stall_clean");
  const fs::path run_dir = dir / "run";
  auto done = run_command(command(2, "--num_training_steps 3 --collective_timeout 30 --run_dir " + run_dir.string()));
  ASSERT_EQ(done.exit_code, 0) << done.output;
  for (const auto& entry : fs::directory_iterator(run_dir))
    EXPECT_EQ(entry.path().filename().string().rfind("heartbeat", 0), std::string::npos) << entry.path();
  // nan is refused where the flag is read (every number is read whole: trainer/flag_values.h), the others by
  // the range check.
  for (const auto& [bad, message] : std::vector<std::pair<std::string, std::string>>{
           {"-1", "--collective_timeout: expected a number of seconds >= 0"},
           {"nan", "--collective_timeout: expected a finite number (got nan)"},
           {"1e9", "--collective_timeout: expected a number of seconds >= 0"}}) {
    auto refused = run_command(command(1, "--collective_timeout " + bad + " --run_dir " + (dir / "refused").string()));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
  }
}

}  // namespace
}  // namespace llm::preemption_test
