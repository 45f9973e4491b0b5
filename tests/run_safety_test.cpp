// Nothing lost, nothing hung (issue 25), through the trainer binary on CPU: one job per folder (a
// second one is refused naming the holder, a killed one leaves no stale lock); a run folder whose
// disk fills stops the run with the file named after a last checkpoint, or warns once under
// --on_write_error warn, and never leaves a line cut in half; a token file truncated or overwritten
// under a run is an error naming --data; the stall watchdog covers start-up and names the phase; a
// slow save is progress, not a stall; a signal during start-up stops the run before its first step
// with a message; outputs that are devices or fifos are refused, never replaced.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "data/token_file.h"

namespace llm::run_safety_test {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::run_command;
using testing::ScratchDir;

constexpr int kLongRun = 100000;  // far more steps than any of these tests lets pass

// The micro model on CPU; `ranks` 1 runs the binary alone, more under mpirun.
std::string trainer(int ranks, const std::string& flags) {
  const std::string launcher = ranks == 1 ? "OMP_NUM_THREADS=1 " : testing::mpirun(ranks);
  return launcher + testing::trainer_binary().string() + " --config " +
         (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --warmup_steps 2 --batch_size 2 --total_batch_size " + std::to_string(2 * ranks) +
         " --max_length 16 --eval_every 0 " + flags;
}

// A token file for the micro model (vocab 128) outside any run folder.
fs::path token_file(const ScratchDir& dir) {
  std::vector<int64_t> tokens(200000);
  std::mt19937 random(7);
  for (int64_t& id : tokens) id = static_cast<int64_t>(random() % 128);
  const fs::path path = dir / "data.tok";
  write_token_file(path.string(), tokens, 128);
  return path;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Every line of a JSONL file parses, and the file ends with a newline (no line cut in half).
void expect_whole_lines(const fs::path& path) {
  const std::string text = testing::read_text(path);
  ASSERT_FALSE(text.empty()) << path;
  EXPECT_EQ(text.back(), '\n') << path << " ends mid-line";
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    EXPECT_TRUE(nlohmann::json::accept(line)) << path << " line " << number << ": " << line;
  }
}

// --- one job per folder --------------------------------------------------------------------------

TEST(FolderLocks, ASecondJobOnTheRunOrSaveDirIsRefusedNamingTheHolderAndAKilledOneLeavesNoLock) {
  ScratchDir dir("locks");
  const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
  // No save before the end of the run (which never comes): the second jobs meet the lock alone.
  const fs::path tensorboard_dir = dir / "tensorboard";
  const std::string first = trainer(1, "--num_training_steps " + std::to_string(kLongRun) + " --run_dir " +
                                           run_dir.string() + " --save_dir " + save_dir.string() +
                                           " --save_every " + std::to_string(kLongRun) + " --tensorboard_dir " +
                                           tensorboard_dir.string());
  CommandResult second_run, second_save, second_tensorboard;
  pid_t holder = -1;
  const CommandResult first_result = testing::run_and_act(first, run_dir, [&] {
    holder = testing::find_process(testing::trainer_binary().string(), run_dir, 0);
    if (holder <= 0) return false;
    // Stopped, it still holds both locks and writes nothing more, however long the second jobs take
    // on a loaded machine (running, it once reached a save: "holds checkpoints of another run").
    ::kill(holder, SIGSTOP);
    // The same --run_dir; then another run folder with the same --save_dir.
    second_run = run_command(trainer(1, "--num_training_steps 2 --run_dir " + run_dir.string()));
    second_save = run_command(trainer(1, "--num_training_steps 2 --run_dir " + (dir / "other").string() +
                                             " --save_dir " + save_dir.string()));
    // Another run folder with the same --tensorboard_dir (issue 44: its event files mixed into the first's).
    second_tensorboard = run_command(trainer(1, "--num_training_steps 2 --run_dir " + (dir / "third").string() +
                                                    " --tensorboard_dir " + tensorboard_dir.string()));
    ::kill(holder, SIGKILL);  // as a node's OOM killer would: no chance to clean up
    return true;
  });
  EXPECT_EQ(first_result.exit_code, 128 + SIGKILL) << first_result.output;
  const std::string holder_text = ", process " + std::to_string(holder) + ", since ";
  EXPECT_EQ(second_run.exit_code, 2) << second_run.output;
  EXPECT_TRUE(contains(second_run.output, "--run_dir " + run_dir.string() + " is in use by another job (host "))
      << second_run.output;
  EXPECT_TRUE(contains(second_run.output, holder_text)) << second_run.output;
  EXPECT_EQ(second_save.exit_code, 2) << second_save.output;
  EXPECT_TRUE(contains(second_save.output, "--save_dir " + save_dir.string() + " is in use by another job (host "))
      << second_save.output;
  EXPECT_TRUE(contains(second_save.output, holder_text)) << second_save.output;
  EXPECT_EQ(second_tensorboard.exit_code, 2) << second_tensorboard.output;
  EXPECT_TRUE(contains(second_tensorboard.output,
                       "--tensorboard_dir " + tensorboard_dir.string() + " is in use by another job (host "))
      << second_tensorboard.output;
  EXPECT_FALSE(fs::exists(dir / "third/metrics.jsonl")) << "refused before the run started";
  // The refused jobs wrote nothing into the holder's run: its history has no second start.
  EXPECT_EQ(testing::read_metrics_events(run_dir, "start").size(), 1u);
  // The killed job's lock went with it: the folder is free at once.
  const CommandResult after = run_command(trainer(1, "--num_training_steps 2 --run_dir " + run_dir.string() +
                                                         " --save_dir " + save_dir.string() + " --tensorboard_dir " +
                                                         tensorboard_dir.string()));
  EXPECT_EQ(after.exit_code, 0) << after.output;
}

TEST(FolderLocks, TwoRanksOfOneJobShareTheirFolders) {
  ScratchDir dir("locks_ranks");
  const CommandResult result = run_command(trainer(2, "--num_training_steps 2 --run_dir " + (dir / "run").string() +
                                                          " --save_dir " + (dir / "run").string()));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(fs::exists(dir / "run/step_2/manifest.json"));
}

// --- checked writes ------------------------------------------------------------------------------

// A private mount namespace with a 256 KiB tmpfs on RUN_DIR: a real full disk for the run folder only.
// The command runs inside it, then the run folder is copied out (the mount goes with the namespace).
// "" where this machine cannot make one (no privileges).
std::string on_full_run_dir(const fs::path& run_dir, const fs::path& copy, const std::string& command) {
  const fs::path probe = run_dir.parent_path() / "mount_probe";
  fs::create_directories(probe);
  if (run_command("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs " + probe.string() + "' 2>/dev/null")
          .exit_code != 0)
    return "";
  fs::create_directories(run_dir);
  return "unshare -m sh -c 'mount -t tmpfs -o size=256k tmpfs " + run_dir.string() + " && " + command +
         "; status=$?; cp -r " + run_dir.string() + " " + copy.string() + "; exit $status'";
}

TEST(CheckedWrites, AFullRunDiskStopsTheRunNamingTheFileAfterALastCheckpoint) {
  ScratchDir dir("full_disk");
  const fs::path run_dir = dir / "run", copy = dir / "run_copy", save_dir = dir / "ckpt";
  const std::string command = on_full_run_dir(
      run_dir, copy,
      trainer(1, "--data " + token_file(dir).string() + " --num_training_steps 2000 --run_dir " + run_dir.string() +
                     " --save_dir " + save_dir.string() + " --save_every 1000"));
  if (command.empty()) GTEST_SKIP() << "no mount namespace here (needs root): a full disk cannot be made";
  const CommandResult result = run_command(command);
  ASSERT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output, "error: cannot write " + run_dir.string() + "/")) << result.output;
  EXPECT_TRUE(contains(result.output, "No space left on device")) << result.output;
  EXPECT_TRUE(contains(result.output, "--on_write_error warn")) << result.output;
  // The step it stopped after is saved in the save folder, which is elsewhere.
  const size_t at = result.output.find("stopped after step ");
  ASSERT_NE(at, std::string::npos) << result.output;
  const int64_t step = std::stoll(result.output.substr(at + 19));
  EXPECT_GT(step, 0);
  EXPECT_LT(step, 2000) << "the disk should fill long before the end";
  const fs::path checkpoint = save_dir / ("step_" + std::to_string(step));
  EXPECT_TRUE(contains(result.output, "is saved in " + checkpoint.string())) << result.output;
  EXPECT_TRUE(fs::exists(checkpoint / "manifest.json"));
  // What did reach the disk ends with whole lines.
  expect_whole_lines(copy / "metrics.jsonl");
  expect_whole_lines(copy / "memory.rank0.jsonl");
}

TEST(CheckedWrites, UnderWarnAFullRunDiskIsOneWarningPerFileAndTrainingGoesOn) {
  ScratchDir dir("full_disk_warn");
  const fs::path run_dir = dir / "run", copy = dir / "run_copy", save_dir = dir / "ckpt";
  const std::string command = on_full_run_dir(
      run_dir, copy,
      trainer(1, "--data " + token_file(dir).string() + " --num_training_steps 300 --run_dir " + run_dir.string() +
                     " --save_dir " + save_dir.string() + " --save_every 1000 --on_write_error warn"));
  if (command.empty()) GTEST_SKIP() << "no mount namespace here (needs root): a full disk cannot be made";
  const CommandResult result = run_command(command);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "done: 300 steps")) << result.output;
  EXPECT_TRUE(fs::exists(save_dir / "step_300/manifest.json"));
  for (const char* file : {"metrics.jsonl", "memory.rank0.jsonl"}) {
    const std::string warning = "cannot write " + (run_dir / file).string() + ": No space left on device; going on";
    const size_t first = result.output.find(warning);
    EXPECT_NE(first, std::string::npos) << result.output;
    EXPECT_EQ(result.output.find(warning, first + 1), std::string::npos) << "warned more than once: " << file;
    expect_whole_lines(copy / file);
  }
}

TEST(CheckedWrites, RunFilesAndOutputsThatAreNotRegularFilesAreRefused) {
  ScratchDir dir("not_regular");
  // A fifo where the run's metrics go: opening it would block, writing it would feed a reader.
  const fs::path run_dir = dir / "run";
  fs::create_directories(run_dir);
  ASSERT_EQ(::mkfifo((run_dir / "metrics.jsonl").c_str(), 0644), 0);
  const CommandResult fifo = run_command(trainer(1, "--num_training_steps 2 --run_dir " + run_dir.string()));
  EXPECT_EQ(fifo.exit_code, 2) << fifo.output;
  EXPECT_TRUE(contains(fifo.output, (run_dir / "metrics.jsonl").string() + " exists and is a fifo, not a regular file"))
      << fifo.output;
  // A device as prepare's output, even with --overwrite: it is never replaced by a regular file.
  std::ofstream(dir / "corpus.txt") << "some text to tokenize\n";
  const CommandResult device = run_command(testing::trainer_binary().string() + " prepare --input " +
                                           (dir / "corpus.txt").string() + " --vocab_size 64 --output /dev/null --overwrite");
  EXPECT_EQ(device.exit_code, 2) << device.output;
  EXPECT_TRUE(contains(device.output, "--output: /dev/null exists and is a character device, not a regular file"))
      << device.output;
  struct stat info {};
  ASSERT_EQ(::stat("/dev/null", &info), 0);
  EXPECT_TRUE(S_ISCHR(info.st_mode)) << "/dev/null was replaced";
}

// --- the token file changed under a run ----------------------------------------------------------

TEST(TokenFileChanged, TruncatedOrOverwrittenUnderARunIsAnErrorNamingData) {
  ScratchDir dir("data_changed");
  const fs::path data = token_file(dir);
  const uintmax_t size = fs::file_size(data);
  // A size change is seen as a change; an id out of range is seen as a bad id, as in a file that had it
  // from the start (ids are checked as windows are read, data/token_file.h).
  struct Case {
    const char* name;
    std::function<void()> change;
    std::string says;
    const char* what;
  };
  const std::string changed = "error: --data: " + data.string() + ": the file changed while this run reads it";
  const std::vector<Case> cases = {
      // Seen by the size check before a read ("... and has 1000 now (truncated)") or, when it comes
      // between that check and the read, by the read itself ("it ends before token N of M (truncated)").
      {"truncated", [&] { fs::resize_file(data, 1000); }, changed, "(truncated)"},
      {"overwritten", [&] {
         // In place (the same file, not a rename): every id from the header on becomes 65535.
         std::fstream out(data, std::ios::in | std::ios::out | std::ios::binary);
         out.seekp(64);
         const std::string ids(size - 64, '\xff');
         out.write(ids.data(), static_cast<std::streamsize>(ids.size()));
       }, "error: " + data.string() + ": token ", "id 65535 is not below the model's vocab_size 128"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path run_dir = dir / c.name;
    write_token_file(data.string(), std::vector<int64_t>(size / 2 - 32, 5), 128);  // fresh each case
    const CommandResult result = testing::run_and_act(
        trainer(1, "--data " + data.string() + " --num_training_steps " + std::to_string(kLongRun) + " --run_dir " +
                       run_dir.string()),
        run_dir, [&] { c.change(); return true; });
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(contains(result.output, c.says)) << result.output;
    EXPECT_TRUE(contains(result.output, c.what)) << result.output;
    EXPECT_FALSE(contains(result.output, "SIGBUS")) << result.output;
  }
}

// --- the watchdog from the first second ----------------------------------------------------------

class StartupStall : public ::testing::TestWithParam<const char*> {};

// Rank 1 stops itself (SIGSTOP) at a start-up phase; rank 0 waits for it in the next collective and
// must end the job naming rank 1 and the phase, instead of hanging (timeout 120 s: today's hang).
TEST_P(StartupStall, ARankStoppedDuringStartUpEndsTheJobNamingThePhase) {
  const std::string phase = GetParam();
  ScratchDir dir("startup_stall");
  const fs::path run_dir = dir / "run", save_dir = dir / "ckpt";
  std::string flags = "--collective_timeout 3 --run_dir " + run_dir.string();
  if (phase == "reading the checkpoint") {
    const CommandResult saved = run_command(trainer(2, "--num_training_steps 2 --run_dir " + (dir / "first").string() +
                                                           " --save_dir " + save_dir.string()));
    ASSERT_EQ(saved.exit_code, 0) << saved.output;
    flags += " --continue_from " + save_dir.string();
  }
  const auto started = std::chrono::steady_clock::now();
  const CommandResult result = run_command("LLM_DEBUG_STOP_AT='1:" + phase + "' timeout -s KILL 60 env " +
                                           trainer(2, "--num_training_steps 20 " + flags));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (const pid_t stopped = testing::find_process(testing::trainer_binary().string(), run_dir, 1); stopped > 0) {
    ::kill(stopped, SIGCONT);
    ::kill(stopped, SIGKILL);
  }
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 1 stops itself at \"start-up: " + phase)) << result.output;
  EXPECT_TRUE(contains(result.output, "stalled: no progress on this rank for")) << result.output;
  EXPECT_TRUE(contains(result.output, "Not responding: rank 1 (its heartbeat is")) << result.output;
  EXPECT_TRUE(contains(result.output, "last at step 0 start-up: " + phase)) << result.output;
  EXPECT_LT(seconds, 55) << "the job hung (killed at 60 s)";
}

INSTANTIATE_TEST_SUITE_P(Phases, StartupStall,
                         ::testing::Values("building the model", "reading the checkpoint",
                                           "starting the communicator"),
                         testing::TextParamName());

// Each rank's background write of step 3 held back 5 s with --collective_timeout 3: the loop waits
// for the write at the last step's save, longer than the timeout, and the write is progress, so the
// job goes on and every save lands.
TEST(SlowSave, ASaveLongerThanTheTimeoutIsProgressNotAStall) {
  ScratchDir dir("slow_save");
  const fs::path save_dir = dir / "ckpt";
  const CommandResult result = run_command(
      "LLM_DEBUG_SAVE_DELAY_SECONDS=5 " +
      trainer(2, "--num_training_steps 6 --collective_timeout 3 --async_save --save_every 3 --run_dir " +
                     (dir / "run").string() + " --save_dir " + save_dir.string()));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_FALSE(contains(result.output, "stalled")) << result.output;
  for (int step : {3, 6}) EXPECT_TRUE(fs::exists(save_dir / ("step_" + std::to_string(step)) / "manifest.json"));
  const auto saves = testing::read_metrics_events(dir / "run", "checkpoint");
  ASSERT_EQ(saves.size(), 2u) << result.output;
  EXPECT_EQ(saves[0].at("background"), true) << "the held-back save was the background one";
  EXPECT_EQ(saves[0].at("completed_at_step"), 6) << "the loop waited for it at the last step";
}

// --- a signal during start-up --------------------------------------------------------------------

// The process stops itself while its model is built; SIGTERM then, and it goes on: it must stop
// before its first step with a message (today: killed by the signal's default action, no word).
TEST(StartupSignal, ASigtermWhileTheModelIsBuiltStopsTheRunBeforeItsFirstStep) {
  ScratchDir dir("startup_signal");
  const fs::path run_dir = dir / "run";
  std::future<CommandResult> running = std::async(std::launch::async, [&] {
    return run_command("LLM_DEBUG_STOP_AT='0:building the model' " +
                       trainer(1, "--num_training_steps 50 --run_dir " + run_dir.string() + " --save_dir " +
                                      (dir / "ckpt").string()));
  });
  bool signalled = false;
  for (int attempt = 0; attempt < 6000 && !signalled; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const pid_t pid = testing::find_process(testing::trainer_binary().string(), run_dir, 0);
    if (pid <= 0) continue;
    const std::string stat = testing::read_text("/proc/" + std::to_string(pid) + "/stat");
    const size_t state = stat.rfind(')');
    if (state == std::string::npos || stat.substr(state + 2, 1) != "T") continue;  // not stopped yet
    ::kill(pid, SIGTERM);
    ::kill(pid, SIGCONT);
    signalled = true;
  }
  const CommandResult result = running.get();
  ASSERT_TRUE(signalled) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "preempted by SIGTERM during start-up, before step 1: nothing was trained"))
      << result.output;
  EXPECT_TRUE(testing::read_metrics_events(run_dir, "train").empty());
  const auto preempted = testing::read_metrics_events(run_dir, "preempted");
  ASSERT_EQ(preempted.size(), 1u);
  EXPECT_TRUE(preempted[0].at("before_first_step").get<bool>());
}

// SIGTERM to launch/mpirun.sh a moment after it starts (50 ms: well inside the ranks' start-up, which
// takes 0.3 s on this machine): whether the ranks had their handlers yet or not, the job ends with a
// message (never exit 138 and silence), and no rank trains on as if the signal had not come: while
// mpirun is still forking a rank, it drops what it forwards, so the script forwards again. (On a busy
// machine mpirun forwards late, and the ranks may have trained a few steps: then they save them.)
TEST(StartupSignal, SigtermToTheLauncherScriptWithinItsFirstSecondIsSaid) {
  constexpr int kSteps = 1000;  // a lost signal: every step is trained, and the run ends "done"
  ScratchDir dir("startup_script");
  const fs::path run_dir = dir / "run";
  std::string launched = trainer(2, "--num_training_steps " + std::to_string(kSteps) + " --run_dir " +
                                        run_dir.string() + " --save_dir " + (dir / "ckpt").string());
  const size_t at = launched.find(testing::mpiexec());
  ASSERT_NE(at, std::string::npos);
  launched.replace(at, testing::mpiexec().size(), "MPIEXEC=" + testing::mpiexec() + " exec bash " +
                                                      (testing::source_dir() / "launch/mpirun.sh").string());
  std::future<CommandResult> running = std::async(std::launch::async, [&] { return run_command(launched); });
  pid_t script = -1;
  for (int attempt = 0; attempt < 500 && script <= 0; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    script = testing::find_process("bash", run_dir, -1);
  }
  ASSERT_GT(script, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(script, SIGTERM);
  const CommandResult result = running.get();
  if (contains(result.output, "launch/mpirun.sh: SIGTERM came while the ranks were still starting, before they "
                              "could handle it")) {
    EXPECT_EQ(result.exit_code, 138) << result.output;
    EXPECT_TRUE(testing::read_metrics_events(run_dir, "train").empty()) << result.output;
    return;
  }
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const auto preempted = testing::read_metrics_events(run_dir, "preempted");
  ASSERT_EQ(preempted.size(), 1u) << "the signal was lost: " << result.output;
  const int64_t step = preempted[0].at("step");
  EXPECT_LT(step, kSteps) << result.output;
  if (preempted[0].value("before_first_step", false))
    EXPECT_TRUE(contains(result.output, "preempted by SIGUSR1 during start-up, before step 1")) << result.output;
  else
    EXPECT_TRUE(contains(result.output, "preempted by SIGUSR1 at step " + std::to_string(step) + ": saved"))
        << result.output;
}

}  // namespace
}  // namespace llm::run_safety_test
