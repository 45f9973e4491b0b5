// Checkpoints and run folders that lose nothing (issue 13), through the trainer binary on CPU:
// --save_dir and --run_dir are checked writable at start-up, before the model is built, and the check
// leaves nothing behind; a resumed run appends to its run folder's history, and a finished one says
// so; "newest" in --continue_from SAVE_DIR skips misnamed and broken step folders with a warning; a
// save_dir of another run or another model config is refused; a save that cannot be written is an
// error that leaves the previous checkpoint the newest; --keep_last removes only this run's oldest
// step folders; a save fsyncs every file and folder it writes. Nothing of the user's is removed or
// replaced (issue 25): a step_<N> or step_<N>.tmp the run did not write is refused where it would
// save; hand-edited, copied and linked step folders are named; a resume on other data is said.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "data/token_file.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::ScratchDir;

// llama_micro, a few cheap steps.
std::string trainer_arguments(const std::string& flags) {
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --warmup_steps 1 --batch_size 2 --max_length 16 --eval_every 0 " + flags;
}

std::string trainer_command(const std::string& flags) {
  return "OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + trainer_arguments(flags);
}

bool mentions(const std::string& output, const std::string& part) { return output.find(part) != std::string::npos; }

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> entries(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A save_dir's entries but the job lock (.trainer.lock, common/folder_lock.h), which a run leaves.
std::vector<std::string> entries_but_the_lock(const fs::path& folder) {
  std::vector<std::string> names = entries(folder);
  std::erase(names, ".trainer.lock");
  return names;
}

nlohmann::json manifest(const fs::path& checkpoint) {
  return nlohmann::json::parse(read_file(checkpoint / "manifest.json"));
}

// A folder made read-only with chmod 0555; writable anyway when the tests run as root (CAP_DAC_OVERRIDE),
// which writable() says.
struct ReadOnlyFolder {
  explicit ReadOnlyFolder(const fs::path& path) : path(path) {
    fs::create_directories(path);
    ::chmod(path.c_str(), 0555);
  }
  ~ReadOnlyFolder() { ::chmod(path.c_str(), 0755); }
  bool writable() const {
    const fs::path probe = path / "probe";
    const bool created = std::ofstream(probe).good();
    fs::remove(probe);
    return created;
  }
  fs::path path;
};

// --- start-up checks of the folders -----------------------------------------------------------

constexpr const char* kRootSkip =
    "running as root, and setpriv cannot drop the capabilities that let root write into a 0555 folder here";

// The trainer command for a test of a read-only folder: as it is for a user; as root (CI), under
// setpriv without the capabilities that let root ignore chmod 0555, so the refusal is tested for real.
// "" when neither makes the folder read-only to the trainer.
std::string read_only_trainer_command(const ReadOnlyFolder& folder, const std::string& flags) {
  if (!folder.writable()) return trainer_command(flags);
  const std::string setpriv =
      "setpriv --bounding-set=-dac_override,-dac_read_search --inh-caps=-dac_override,-dac_read_search ";
  const fs::path probe = folder.path / "probe";
  const auto touched = run_command(setpriv + "sh -c 'touch " + probe.string() + "' 2>&1");
  std::error_code ignored;
  const bool refused = touched.exit_code != 0 && !fs::exists(probe, ignored);
  fs::remove(probe, ignored);
  if (!refused) return "";
  return "OMP_NUM_THREADS=1 " + setpriv + testing::trainer_binary().string() + trainer_arguments(flags);
}

TEST(StartupChecks, ReadOnlySaveDirIsRefusedBeforeTheModelIsBuilt) {
  ScratchDir dir("ro_save_dir");
  ReadOnlyFolder read_only(dir / "ckpt");
  if (read_only_trainer_command(read_only, "").empty()) GTEST_SKIP() << kRootSkip;
  // The folder itself, and a folder to be created inside it.
  for (const fs::path& save_dir : {dir / "ckpt", dir / "ckpt/below"}) {
    auto result = run_command(read_only_trainer_command(
        read_only, "--num_training_steps 2 --save_dir " + save_dir.string() + " --run_dir " + (dir / "run").string()));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(mentions(result.output, "--save_dir")) << result.output;
    EXPECT_TRUE(mentions(result.output, "cannot write into \"" + (dir / "ckpt").string() + "\"")) << result.output;
    EXPECT_FALSE(fs::exists(dir / "run/metrics.jsonl")) << "refused before the model was built";
  }
  EXPECT_TRUE(entries(dir / "ckpt").empty()) << "nothing left in the folder";
}

TEST(StartupChecks, ReadOnlyRunDirIsRefusedBeforeTheModelIsBuilt) {
  ScratchDir dir("ro_run_dir");
  ReadOnlyFolder read_only(dir / "run");
  if (read_only_trainer_command(read_only, "").empty()) GTEST_SKIP() << kRootSkip;
  auto result =
      run_command(read_only_trainer_command(read_only, "--num_training_steps 2 --run_dir " + (dir / "run").string()));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(mentions(result.output, "--run_dir: cannot write into \"" + (dir / "run").string() + "\"")) << result.output;
  EXPECT_TRUE(entries(dir / "run").empty()) << "nothing left in the folder";
}

// A file system that refuses new files even to root (sysfs): the probe finds it where access() would not.
TEST(StartupChecks, SaveDirOnAFileSystemThatRefusesWritesIsRefused) {
  if (!fs::is_directory("/sys") || std::ofstream("/sys/trainer_write_probe").good())
    GTEST_SKIP() << "no /sys refusing new files here";
  ScratchDir dir("sys_save_dir");
  auto result = run_command(trainer_command("--num_training_steps 2 --save_dir /sys/trainer_test_checkpoints --run_dir " +
                                            (dir / "run").string()));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(mentions(result.output, "--save_dir: cannot create \"/sys/trainer_test_checkpoints\": cannot write into \"/sys\""))
      << result.output;
  EXPECT_FALSE(fs::exists(dir / "run/metrics.jsonl")) << "refused before the model was built";
}

TEST(StartupChecks, FoldersUnderAFileAreRefusedBeforeTheModelIsBuilt) {
  ScratchDir dir("under_file");
  std::ofstream(dir / "afile") << "x";
  auto save = run_command(trainer_command("--num_training_steps 2 --save_dir " + (dir / "afile/ckpt").string() +
                                          " --run_dir " + (dir / "run").string()));
  EXPECT_EQ(save.exit_code, 2) << save.output;
  EXPECT_TRUE(mentions(save.output, "--save_dir: ")) << save.output;
  EXPECT_FALSE(fs::exists(dir / "run/metrics.jsonl")) << "refused before the model was built";
  auto run = run_command(trainer_command("--num_training_steps 2 --run_dir " + (dir / "afile/run").string()));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(mentions(run.output, "--run_dir: ")) << run.output;
  EXPECT_EQ(read_file(dir / "afile"), "x");
}

TEST(StartupChecks, TheWriteProbeLeavesNothingBehind) {
  ScratchDir dir("probe_clean");
  fs::create_directories(dir / "ckpt");
  auto result = run_command(trainer_command("--num_training_steps 2 --save_dir " + (dir / "ckpt").string() +
                                            " --run_dir " + (dir / "run").string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(entries_but_the_lock(dir / "ckpt"), std::vector<std::string>{"step_2"});
  for (const std::string& name : entries(dir / "run")) EXPECT_EQ(name.find("probe"), std::string::npos) << name;
}

// --- the run's history --------------------------------------------------------------------------

TEST(RunHistory, ResumingIntoTheSameRunDirAppendsAndAFreshRunStartsOver) {
  ScratchDir dir("history");
  const std::string flags = "--num_training_steps 6 --save_every 3 --save_dir " + (dir / "ckpt").string() +
                            " --run_dir " + (dir / "run").string();
  ASSERT_EQ(run_command(trainer_command(flags)).exit_code, 0);
  const auto first_steps = testing::read_metrics_events(dir / "run", "train");
  ASSERT_EQ(first_steps.size(), 6u);
  // As after a crash at step 6 with the last checkpoint at step 3: resume from it into the same run_dir.
  auto resumed = run_command(trainer_command(flags + " --continue_from " + (dir / "ckpt/step_3").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto starts = testing::read_metrics_events(dir / "run", "start");
  ASSERT_EQ(starts.size(), 2u) << "the first part of the history is kept";
  EXPECT_EQ(starts[1].at("start_step"), 3);
  EXPECT_EQ(starts[1].at("run_id"), starts[0].at("run_id")) << "a resumed run keeps its run id";
  EXPECT_EQ(starts[1].at("resumed_from"), (dir / "ckpt/step_3").string());
  const auto steps = testing::read_metrics_events(dir / "run", "train");
  ASSERT_EQ(steps.size(), 9u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(steps[i], first_steps[i]) << "step " << i + 1 << " unchanged";
  for (size_t i = 6; i < 9; ++i) {
    EXPECT_EQ(steps[i].at("step"), first_steps[i - 3].at("step"));
    EXPECT_EQ(steps[i].at("loss").get<double>(), first_steps[i - 3].at("loss").get<double>()) << "bitwise on CPU";
  }
  EXPECT_EQ(testing::read_metrics_events(dir / "run", "end").size(), 2u);
  EXPECT_EQ(manifest(dir / "ckpt/step_6").at("run_id"), starts[0].at("run_id"));

  // `trainer report` reads the appended folder: the last start record's settings and the last final loss.
  auto report = run_command(testing::trainer_binary().string() + " report " + (dir / "run").string() + " --out " +
                            (dir / "report").string());
  ASSERT_EQ(report.exit_code, 0) << report.output;
  const std::string markdown = read_file(dir / "report/memory_report.md");
  EXPECT_TRUE(mentions(markdown, "6 step(s)")) << markdown;

  // A fresh run (no --continue_from) starts the history over.
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 2 --run_dir " + (dir / "run").string())).exit_code, 0);
  EXPECT_EQ(testing::read_metrics_events(dir / "run", "start").size(), 1u);
  EXPECT_EQ(testing::read_metrics_events(dir / "run", "train").size(), 2u);
}

// The memory ledgers keep both segments, and `trainer report` reads the folder: the timeline of the
// peak step is one segment's (not the points of both runs of a repeated step).
TEST(RunHistory, ResumingAppendsToTheMemoryLedgers) {
  ScratchDir dir("history_ledger");
  const std::string flags = "--num_training_steps 4 --save_every 2 --save_dir " + (dir / "ckpt").string() +
                            " --run_dir " + (dir / "run").string();
  ASSERT_EQ(run_command(trainer_command(flags)).exit_code, 0);
  ASSERT_EQ(run_command(trainer_command(flags + " --continue_from " + (dir / "ckpt/step_2").string())).exit_code, 0);
  std::ifstream ledger(dir / "run/memory.rank0.jsonl");
  int starts = 0;
  for (std::string line; std::getline(ledger, line);)
    starts += nlohmann::json::parse(line).at("event") == "start" ? 1 : 0;
  EXPECT_EQ(starts, 2) << "both parts of the run in rank 0's ledger";
  const auto report = run_command(testing::trainer_binary().string() + " report " + (dir / "run").string() +
                                  " --out " + (dir / "report").string());
  ASSERT_EQ(report.exit_code, 0) << report.output;
  // Each training point of the peak step once: one segment's, not both runs of a repeated step.
  const std::string timeline = read_file(dir / "report/memory/run_timeline.svg");
  size_t first_block = 0;
  for (size_t at = timeline.find(">forward:layer.0<"); at != std::string::npos; at = timeline.find(">forward:layer.0<", at + 1))
    ++first_block;
  EXPECT_EQ(first_block, 1u) << timeline.substr(0, 3000);
}

// Exit 0: a requeued job that always passes --continue_from has nothing left to do, which is success.
TEST(RunHistory, ResumingAFinishedRunSaysSoAndChangesNothing) {
  ScratchDir dir("finished");
  const std::string flags = "--save_every 2 --save_dir " + (dir / "ckpt").string() + " --run_dir " + (dir / "run").string();
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 4 " + flags)).exit_code, 0);
  const std::string history = read_file(dir / "run/metrics.jsonl");
  auto again = run_command(trainer_command("--num_training_steps 4 " + flags + " --continue_from " + (dir / "ckpt").string()));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(mentions(again.output, "already finished at step 4; nothing to do")) << again.output;
  EXPECT_EQ(read_file(dir / "run/metrics.jsonl"), history);
  // Fewer steps than the checkpoint has: a mistake, named.
  auto fewer = run_command(trainer_command("--num_training_steps 3 " + flags + " --continue_from " + (dir / "ckpt").string()));
  EXPECT_EQ(fewer.exit_code, 2) << fewer.output;
  EXPECT_TRUE(mentions(fewer.output, "--num_training_steps: the checkpoint " + (dir / "ckpt/step_4").string() +
                                         " is at step 4, beyond the 3 steps asked for"))
      << fewer.output;
  EXPECT_EQ(read_file(dir / "run/metrics.jsonl"), history);
}

// --- which checkpoint is the newest, and whose ----------------------------------------------------

TEST(NewestCheckpoint, MisnamedAndBrokenFoldersAreSkipped) {
  ScratchDir dir("newest");
  const fs::path ckpt = dir / "ckpt";
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 4 --save_every 2 --save_dir " + ckpt.string() +
                                        " --run_dir " + (dir / "a").string()))
                .exit_code,
            0);
  // Intact copies under names that are not step_<N>: never picked.
  for (const char* name : {"step_20.broken", "step_20.tmp", "step_x", "step_", "step_-7", "step_30x"})
    fs::copy(ckpt / "step_4", ckpt / name, fs::copy_options::recursive);
  // Newer than step_4 and broken: a truncated manifest, a manifest without samples_consumed, a missing
  // shard, a shard of another size than its manifest lists, no manifest (a save killed before it).
  fs::copy(ckpt / "step_4", ckpt / "step_10", fs::copy_options::recursive);
  std::ofstream(ckpt / "step_10/manifest.json", std::ios::trunc) << "{\"step\": 10, ";
  fs::copy(ckpt / "step_4", ckpt / "step_8", fs::copy_options::recursive);
  nlohmann::json state = manifest(ckpt / "step_4");
  state["step"] = 8;
  state.erase("samples_consumed");
  std::ofstream(ckpt / "step_8/manifest.json", std::ios::trunc) << state.dump();
  fs::copy(ckpt / "step_4", ckpt / "step_6", fs::copy_options::recursive);
  fs::remove(ckpt / "step_6/rank0.safetensors");
  fs::copy(ckpt / "step_4", ckpt / "step_5", fs::copy_options::recursive);
  std::ofstream(ckpt / "step_5/rank0.safetensors", std::ios::app) << "x";
  fs::copy(ckpt / "step_4", ckpt / "step_9", fs::copy_options::recursive);
  fs::remove(ckpt / "step_9/manifest.json");

  auto resumed = run_command(trainer_command("--num_training_steps 6 --continue_from " + ckpt.string() + " --run_dir " +
                                             (dir / "b").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "resumed from " + (ckpt / "step_4").string() + " at step 4")) << resumed.output;
  for (const char* broken : {"step_10: ", "step_9: ", "step_8: manifest.json: samples_consumed",
                             "step_6: rank0.safetensors: missing (listed in manifest.json)",
                             "step_5: rank0.safetensors: "})
    EXPECT_TRUE(mentions(resumed.output, "--continue_from: skipping " + (ckpt / broken).string())) << broken << "\n"
                                                                                                 << resumed.output;
  EXPECT_FALSE(mentions(resumed.output, "step_20")) << resumed.output;
  const auto steps = testing::read_metrics_events(dir / "b", "train");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps.front().at("step"), 5);

  // Nothing intact at all: a clear error naming the newest folder's problem.
  ScratchDir empty("newest_none");
  fs::copy(ckpt / "step_10", empty / "step_10", fs::copy_options::recursive);
  auto none = run_command(trainer_command("--num_training_steps 6 --continue_from " + empty.path().string() +
                                          " --run_dir " + (dir / "c").string()));
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_TRUE(mentions(none.output, "none of its 1 step_<N> folder(s) is an intact checkpoint")) << none.output;
}

TEST(NewestCheckpoint, AnotherRunsSaveDirIsRefusedUnlessNamed) {
  ScratchDir dir("foreign");
  const fs::path ckpt = dir / "ckpt";
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 4 --save_every 2 --save_dir " + ckpt.string() +
                                        " --run_dir " + (dir / "a").string()))
                .exit_code,
            0);
  const std::string run_id = manifest(ckpt / "step_4").at("run_id");
  EXPECT_EQ(run_id.size(), 16u);
  // A fresh run into it: refused at start-up, naming the other run.
  auto fresh = run_command(trainer_command("--num_training_steps 6 --save_dir " + ckpt.string() + " --run_dir " +
                                           (dir / "b").string()));
  EXPECT_EQ(fresh.exit_code, 2) << fresh.output;
  EXPECT_TRUE(mentions(fresh.output, "--save_dir: \"" + ckpt.string() + "\" holds checkpoints of another run (step_4, run " +
                                         run_id + ")"))
      << fresh.output;
  EXPECT_FALSE(fs::exists(dir / "b/metrics.jsonl")) << "refused before the model was built";
  EXPECT_EQ(entries_but_the_lock(ckpt), (std::vector<std::string>{"step_2", "step_4"}));
  // Resuming another run's checkpoint into it: refused too.
  ScratchDir other("foreign_other");
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 2 --save_dir " + (other / "ckpt").string() + " --run_dir " +
                                        (other / "run").string()))
                .exit_code,
            0);
  auto mixed = run_command(trainer_command("--num_training_steps 6 --save_dir " + ckpt.string() + " --continue_from " +
                                           (other / "ckpt/step_2").string() + " --run_dir " + (dir / "c").string()));
  EXPECT_EQ(mixed.exit_code, 2) << mixed.output;
  EXPECT_TRUE(mentions(mixed.output, "holds checkpoints of another run")) << mixed.output;
  // --continue_from naming the save_dir: its run goes on, under its run id.
  auto named = run_command(trainer_command("--num_training_steps 6 --save_dir " + ckpt.string() + " --continue_from " +
                                           ckpt.string() + " --run_dir " + (dir / "d").string()));
  ASSERT_EQ(named.exit_code, 0) << named.output;
  EXPECT_EQ(manifest(ckpt / "step_6").at("run_id"), run_id);
  // Resuming one of its own step folders into it is that run too.
  auto own = run_command(trainer_command("--num_training_steps 8 --save_dir " + ckpt.string() + " --continue_from " +
                                         (ckpt / "step_6").string() + " --run_dir " + (dir / "e").string()));
  ASSERT_EQ(own.exit_code, 0) << own.output;
  EXPECT_EQ(manifest(ckpt / "step_8").at("run_id"), run_id);
}

TEST(NewestCheckpoint, AnotherModelConfigIsRefusedNamingTheDifference) {
  ScratchDir dir("other_model");
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 2 --save_dir " + (dir / "ckpt").string() + " --run_dir " +
                                        (dir / "a").string()))
                .exit_code,
            0);
  nlohmann::json config = nlohmann::json::parse(read_file(testing::source_dir() / "configs/llama_micro.json"));
  config["intermediate_size"] = 96;
  std::ofstream(dir / "wider.json") << config.dump(2);
  auto result = run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                            (dir / "wider.json").string() +
                            " --device cpu --num_training_steps 4 --batch_size 2 --max_length 16 --continue_from " +
                            (dir / "ckpt").string() + " --run_dir " + (dir / "b").string());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(mentions(result.output, (dir / "ckpt/step_2").string() + ": manifest.json: model: the checkpoint was "
                                                                        "made for another model config (intermediate_size "
                                                                        "88 there, 96 here)"))
      << result.output;
  EXPECT_FALSE(fs::exists(dir / "b/metrics.jsonl")) << "refused before the model was built";
}

// A save that cannot be written (here: a file size limit, as a full disk): exit 2 naming the file, no
// step folder and no .tmp left, and the previous checkpoint is still the newest and resumes.
TEST(NewestCheckpoint, AFailedSaveLeavesThePreviousCheckpointTheNewest) {
  ScratchDir dir("failed_save");
  const fs::path ckpt = dir / "ckpt";
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 2 --save_dir " + ckpt.string() + " --run_dir " +
                                        (dir / "a").string()))
                .exit_code,
            0);
  // The token file the first run generated, so the resumed run writes no corpus. A limit of 200
  // blocks (100 KiB in dash's 512-byte blocks, 200 KiB in bash's) fits the logs and not the
  // checkpoint's rank0.safetensors (about 420 KiB); SIGXFSZ ignored, so the write fails with EFBIG. Under
  // mpirun, whose daemon (not limited) makes the shared-memory files a singleton's MPI_Init would.
  const std::string data = " --data " + (dir / "a/synthetic.rank0.tok").string();
  const std::string flags = " --num_training_steps 4 --save_every 2 --save_dir " + ckpt.string() + data;
  auto failed = run_command(testing::mpirun(1) + "sh -c \"trap '' XFSZ; ulimit -f 200; exec " +
                            testing::trainer_binary().string() +
                            trainer_arguments(flags + " --continue_from " + ckpt.string() + " --run_dir " +
                                              (dir / "b").string()) +
                            "\"");
  EXPECT_EQ(failed.exit_code, 2) << failed.output;
  EXPECT_TRUE(mentions(failed.output, (ckpt / "step_4.tmp").string())) << failed.output;
  EXPECT_TRUE(mentions(failed.output, "could not be written")) << failed.output;
  EXPECT_TRUE(mentions(failed.output, "the newest complete one is still the previous step_<N> folder")) << failed.output;
  EXPECT_FALSE(mentions(failed.output, "saved checkpoint")) << failed.output;
  EXPECT_EQ(entries_but_the_lock(ckpt), std::vector<std::string>{"step_2"});
  auto resumed = run_command(trainer_command(flags + " --continue_from " + ckpt.string() + " --run_dir " +
                                             (dir / "c").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "resumed from " + (ckpt / "step_2").string())) << resumed.output;
  EXPECT_TRUE(fs::exists(ckpt / "step_4/manifest.json"));
}

// One rank cannot write its part (a file size limit on rank 1 only): the job ends with exit 2 and
// rank 1's message naming its file (the other ranks wait for it), and no step folder and no .tmp is
// left.
TEST(NewestCheckpoint, AFailedSaveOnOneRankStopsEveryRank) {
  ScratchDir dir("failed_save_rank");
  const fs::path ckpt = dir / "ckpt";
  // A token file made beforehand, so that no rank writes a corpus under the limit.
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 1 --run_dir " + (dir / "a").string())).exit_code, 0);
  // 200 blocks of dash's 512 bytes: rank 1's logs fit, its rank1.safetensors (about 145 KiB) does not.
  // The same with --async_save: the write fails on rank 1's background thread, and every rank stops
  // at the boundary where the save completes.
  for (const std::string async : {"", " --async_save"}) {
    SCOPED_TRACE(async);
    const std::string flags = " --num_training_steps 4 --save_every 2 --save_dir " + ckpt.string() + " --run_dir " +
                              (dir / (async.empty() ? "run" : "run_async")).string() + " --data " +
                              (dir / "a/synthetic.rank0.tok").string();
    auto failed = run_command(testing::mpirun(2) + "sh -c \"trap '' XFSZ; [ \\$OMPI_COMM_WORLD_RANK = 1 ] && ulimit -f 200; exec " +
                              testing::trainer_binary().string() + trainer_arguments(flags + async) + "\"");
    EXPECT_EQ(failed.exit_code, 2) << failed.output;
    EXPECT_TRUE(mentions(failed.output, (ckpt / "step_2.tmp/rank1.safetensors.tmp").string() + ": could not be written"))
        << failed.output;
    EXPECT_FALSE(mentions(failed.output, "saved checkpoint")) << failed.output;
    EXPECT_TRUE(entries_but_the_lock(ckpt).empty()) << "no step folder, no .tmp";
  }
}

// A checkpoint damaged after it was written: each case is exit 2 naming the file (and the tensor
// where one is damaged), before any step, and nothing in the checkpoint is changed.
TEST(DamagedCheckpoint, EachDamageIsAClearErrorNamingTheFile) {
  ScratchDir dir("damaged");
  ASSERT_EQ(run_command(testing::mpirun(2) + testing::trainer_binary().string() +
                        trainer_arguments("--num_training_steps 2 --save_dir " + (dir / "ckpt").string() +
                                          " --run_dir " + (dir / "a").string()))
                .exit_code,
            0);
  const fs::path intact = dir / "ckpt/step_2";
  struct Damage {
    std::string name;
    std::function<void(const fs::path&)> apply;
    std::vector<std::string> expected;
  };
  const auto flip_last_byte = [](const fs::path& file) {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-1, std::ios::end);
    const char byte = static_cast<char>(io.get() ^ 0x01);
    io.seekp(-1, std::ios::end);
    io.put(byte);
  };
  const std::vector<Damage> damages = {
      {"a byte of a part", [&](const fs::path& c) { flip_last_byte(c / "rank1.safetensors"); },
       {"rank1.safetensors: ", ": its bytes have CRC-32C ", "the file is damaged"}},
      {"a byte of an index", [&](const fs::path& c) { flip_last_byte(c / "rank0.json"); },
       {"rank0.json: its CRC-32C is ", "manifest.json lists"}},
      {"a missing part", [](const fs::path& c) { fs::remove(c / "rank1.safetensors"); },
       {"not a complete checkpoint: rank1.safetensors: missing (listed in manifest.json)"}},
      {"a truncated part", [](const fs::path& c) { fs::resize_file(c / "rank0.safetensors", 100); },
       {"not a complete checkpoint: rank0.safetensors: 100 bytes, but manifest.json lists"}},
      {"a missing manifest", [](const fs::path& c) { fs::remove(c / "manifest.json"); },
       {"--continue_from: ", "neither a checkpoint (no manifest.json) nor a folder of step_<N> checkpoints"}},
      {"a manifest that is not JSON", [](const fs::path& c) { std::ofstream(c / "manifest.json", std::ios::trunc) << "{"; },
       {"manifest.json: not valid JSON"}},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    const fs::path checkpoint = dir / ("damaged_" + std::to_string(&damage - damages.data())) / "step_2";
    fs::create_directories(checkpoint.parent_path());
    fs::copy(intact, checkpoint);
    damage.apply(checkpoint);
    std::map<std::string, std::string> before;
    for (const std::string& name : entries(checkpoint)) before[name] = read_file(checkpoint / name);
    const fs::path run_dir = checkpoint.parent_path() / "run";
    auto result = run_command(testing::mpirun(2) + testing::trainer_binary().string() +
                              trainer_arguments("--num_training_steps 4 --continue_from " + checkpoint.string() +
                                                " --save_dir " + checkpoint.parent_path().string() + " --run_dir " +
                                                run_dir.string()));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    for (const std::string& part : damage.expected) EXPECT_TRUE(mentions(result.output, part)) << part << "\n" << result.output;
    EXPECT_FALSE(mentions(result.output, "frame #")) << "no C++ stack trace:\n" << result.output;
    EXPECT_TRUE(testing::read_metrics_events(run_dir, "train").empty()) << "stopped before any step";
    std::map<std::string, std::string> after;
    for (const std::string& name : entries(checkpoint)) after[name] = read_file(checkpoint / name);
    EXPECT_EQ(after, before) << "the checkpoint is left as it was";
  }
}

// --- --keep_last and durability ------------------------------------------------------------------

TEST(KeepLast, KeepsTheNewestStepFoldersOfTheRun) {
  ScratchDir dir("keep_last");
  const fs::path ckpt = dir / "ckpt";
  auto result = run_command(trainer_command("--num_training_steps 5 --save_every 1 --keep_last 2 --save_dir " +
                                            ckpt.string() + " --run_dir " + (dir / "run").string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(entries_but_the_lock(ckpt), (std::vector<std::string>{"step_4", "step_5"}));
  for (const char* removed : {"step_1", "step_2", "step_3"})
    EXPECT_TRUE(mentions(result.output, "removed checkpoint " + (ckpt / removed).string() + " (--keep_last 2)"))
        << removed << "\n"
        << result.output;
  // What is kept resumes.
  auto resumed = run_command(trainer_command("--num_training_steps 6 --save_every 1 --keep_last 2 --save_dir " +
                                             ckpt.string() + " --continue_from " + ckpt.string() + " --run_dir " +
                                             (dir / "run2").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "resumed from " + (ckpt / "step_5").string())) << resumed.output;
  EXPECT_EQ(entries_but_the_lock(ckpt), (std::vector<std::string>{"step_5", "step_6"}));
}

// A save_dir may hold another run's checkpoints only when --continue_from names it (the start-up
// check refuses it otherwise), and then the run resumed is the newest intact one's: the other run's
// folders are the lower steps. --keep_last counts and removes this run's intact step_<N> folders only.
TEST(KeepLast, NeverRemovesAnotherRunsOrMisnamedFolders) {
  ScratchDir dir("keep_last_foreign");
  const fs::path ckpt = dir / "ckpt";
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 3 --save_every 3 --save_dir " + ckpt.string() +
                                        " --run_dir " + (dir / "a").string()))
                .exit_code,
            0);
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 2 --save_every 1 --save_dir " + (dir / "other").string() +
                                        " --run_dir " + (dir / "b").string()))
                .exit_code,
            0);
  const std::string run_id = manifest(ckpt / "step_3").at("run_id");
  const std::string other_id = manifest(dir / "other/step_2").at("run_id");
  ASSERT_NE(run_id, other_id);
  for (const char* name : {"step_1", "step_2"}) fs::copy(dir / "other" / name, ckpt / name, fs::copy_options::recursive);
  // This run's own checkpoint under names that are not step_<N>: never removed.
  for (const char* name : {"step_3.bak", "step_03x"}) fs::copy(ckpt / "step_3", ckpt / name, fs::copy_options::recursive);

  auto resumed = run_command(trainer_command("--num_training_steps 6 --save_every 1 --keep_last 2 --save_dir " +
                                             ckpt.string() + " --continue_from " + ckpt.string() + " --run_dir " +
                                             (dir / "c").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "resumed from " + (ckpt / "step_3").string())) << resumed.output;
  EXPECT_EQ(entries_but_the_lock(ckpt), (std::vector<std::string>{"step_03x", "step_1", "step_2", "step_3.bak", "step_5", "step_6"}));
  for (const char* name : {"step_1", "step_2"}) EXPECT_EQ(manifest(ckpt / name).at("run_id"), other_id) << name;
  for (const char* name : {"step_5", "step_6"}) EXPECT_EQ(manifest(ckpt / name).at("run_id"), run_id) << name;
}

TEST(KeepLast, ANegativeCountIsRefused) {
  ScratchDir dir("keep_last_negative");
  auto result = run_command(trainer_command("--num_training_steps 2 --keep_last -1 --save_dir " +
                                            (dir / "ckpt").string() + " --run_dir " + (dir / "run").string()));
  EXPECT_EQ(result.exit_code, 2) << result.output;  // run_command records it (record_error_case)
  EXPECT_TRUE(mentions(result.output, "--keep_last: expected an integer >= 0 (0 = keep all) (got -1)")) << result.output;
  EXPECT_FALSE(fs::exists(dir / "run/metrics.jsonl")) << "refused before the model was built";
  EXPECT_FALSE(fs::exists(dir / "ckpt"));
}

// A save fsyncs each file, the staging folder before the rename, and after it the save_dir and the
// folders above it that the save created (here ckpt and new; dir existed), so a power loss after
// "saved" loses neither the step folder nor its files' bytes. Seen as the calls themselves: strace
// names each fsync's file (-y).
TEST(Durability, ASaveFsyncsEveryFileAndTheFolders) {
  if (run_command("command -v strace >/dev/null 2>&1").exit_code != 0) GTEST_SKIP() << "strace is not installed";
  ScratchDir dir("fsync");
  const fs::path ckpt = dir / "new/ckpt";
  const fs::path trace = dir / "trace.txt";
  auto result = run_command("OMP_NUM_THREADS=1 strace -f -y -e trace=fsync,fdatasync -o " + trace.string() + " " +
                            testing::trainer_binary().string() +
                            trainer_arguments("--num_training_steps 1 --save_dir " + ckpt.string() + " --run_dir " +
                                              (dir / "run").string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  if (!mentions(read_file(trace), "fsync(")) GTEST_SKIP() << "strace traced nothing here (ptrace not allowed?)";
  // The successful fsync calls into the scratch folder, in order, by the path strace shows for the
  // descriptor (the real path: the temp folder may be reached through a link).
  const fs::path root = fs::canonical(dir.path());
  std::vector<std::string> synced;
  std::ifstream in(trace);
  for (std::string line; std::getline(in, line);) {
    const size_t call = line.find("fsync(");
    const size_t open = line.find('<', call), close = line.find(">)", open);
    if (call == std::string::npos || open == std::string::npos || close == std::string::npos) continue;
    const std::string path = line.substr(open + 1, close - open - 1);
    if (line.find("= 0", close) != std::string::npos && path.rfind(root.string(), 0) == 0) synced.push_back(path);
  }
  const fs::path staging = root / "new/ckpt/step_1.tmp";
  // At start-up the save folder is made (and locked: common/folder_lock.h), its new entries synced up
  // to the first folder that was there; then the save's files, its folder and the rename; at the end
  // the run's memory report (written through a synced temporary, common/output_files.h).
  const std::vector<std::string> expected = {(root / "new").string(), root.string(),
                                             (staging / "rank0.safetensors.tmp").string(), (staging / "rank0.json").string(),
                                             (staging / "manifest.json").string(), staging.string(),
                                             (root / "new/ckpt").string(), (root / "run/memory_report.md.tmp").string()};
  EXPECT_EQ(synced, expected) << read_file(trace);
  EXPECT_EQ(entries(ckpt / "step_1"), (std::vector<std::string>{"manifest.json", "rank0.json", "rank0.safetensors"}));
}

// --- nothing of the user's removed or replaced (issue 25) ------------------------------------------

// A run's first saves, into `ckpt`: 4 steps, saved at 2 and 4.
void train_four_steps(const fs::path& ckpt, const fs::path& run_dir) {
  const auto trained = run_command(trainer_command("--num_training_steps 4 --save_every 2 --save_dir " + ckpt.string() +
                                                   " --run_dir " + run_dir.string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
}

// A step_<N> folder the run did not write (a user's notes) where the run would save step N: refused at
// start-up naming it (before: the step-4 save deleted it and put the checkpoint there).
TEST(NothingOfTheUsers, AFreshRunRefusesAStepFolderItDidNotWrite) {
  ScratchDir dir("users_step_folder");
  const fs::path ckpt = dir / "ckpt";
  fs::create_directories(ckpt / "step_4");
  std::ofstream(ckpt / "step_4/notes.txt") << "mine";
  auto result = run_command(trainer_command("--num_training_steps 4 --save_every 2 --save_dir " + ckpt.string() +
                                            " --run_dir " + (dir / "run").string()));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  for (const std::string& part : {"--save_dir: \"" + (ckpt / "step_4").string() + "\" is not an intact checkpoint",
                                  std::string("it holds notes.txt"), std::string("this run saves step 4 there"),
                                  std::string("Move it out of --save_dir, or pass another --save_dir")})
    EXPECT_TRUE(mentions(result.output, part)) << part << "\n" << result.output;
  EXPECT_FALSE(fs::exists(dir / "run/metrics.jsonl")) << "refused before the model was built";
  EXPECT_EQ(read_file(ckpt / "step_4/notes.txt"), "mine");
  EXPECT_EQ(entries_but_the_lock(ckpt), std::vector<std::string>{"step_4"}) << "not even step_2 was written";
}

// An export written into save_dir/step_8, then a resumed run that would reach step 8: refused naming
// it (before: "skipping ... not an intact checkpoint", then the step-8 save deleted the export).
TEST(NothingOfTheUsers, AResumedRunRefusesAnExportWhereItWouldSave) {
  ScratchDir dir("users_export");
  const fs::path ckpt = dir / "ckpt";
  train_four_steps(ckpt, dir / "a");
  const auto exported = run_command(testing::trainer_binary().string() + " export --from " + ckpt.string() + " --to " +
                                    (ckpt / "step_8").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  auto resumed = run_command(trainer_command("--num_training_steps 8 --save_every 2 --save_dir " + ckpt.string() +
                                             " --continue_from " + ckpt.string() + " --run_dir " + (dir / "b").string()));
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "--save_dir: \"" + (ckpt / "step_8").string() +
                                           "\" is not an intact checkpoint (it holds config.json"))
      << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "this run saves step 8 there")) << resumed.output;
  EXPECT_TRUE(fs::exists(ckpt / "step_8/model.safetensors")) << "the export is left as it was";
  EXPECT_EQ(entries_but_the_lock(ckpt), (std::vector<std::string>{"step_2", "step_4", "step_8"}));
  // Fewer steps than 8: step_8 is not written, and the run goes on.
  auto shorter = run_command(trainer_command("--num_training_steps 6 --save_every 2 --save_dir " + ckpt.string() +
                                             " --continue_from " + ckpt.string() + " --run_dir " + (dir / "c").string()));
  ASSERT_EQ(shorter.exit_code, 0) << shorter.output;
  EXPECT_TRUE(mentions(shorter.output, "resumed from " + (ckpt / "step_4").string())) << shorter.output;
  EXPECT_TRUE(fs::exists(ckpt / "step_8/model.safetensors"));
}

// step_<N>.tmp holding only the files a save writes (what a killed save leaves) is wiped and the save
// goes on; holding anything else, it is refused naming the file, and left as it was.
TEST(NothingOfTheUsers, AStagingFolderIsWipedOnlyWhenItHoldsOnlyCheckpointFiles) {
  ScratchDir dir("users_staging");
  const fs::path killed = dir / "killed", foreign = dir / "foreign";
  fs::create_directories(killed / "step_2.tmp");
  for (const char* name : {"rank0.safetensors.tmp", "rank0.json", "manifest.json"})
    std::ofstream(killed / "step_2.tmp" / name) << "partial";
  auto resumed = run_command(trainer_command("--num_training_steps 2 --save_dir " + killed.string() + " --run_dir " +
                                             (dir / "a").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(entries_but_the_lock(killed), std::vector<std::string>{"step_2"});

  fs::create_directories(foreign / "step_2.tmp");
  std::ofstream(foreign / "step_2.tmp/rank0.json") << "partial";
  std::ofstream(foreign / "step_2.tmp/notes.txt") << "mine";
  auto refused = run_command(trainer_command("--num_training_steps 2 --save_dir " + foreign.string() + " --run_dir " +
                                             (dir / "b").string()));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(mentions(refused.output, "--save_dir: \"" + (foreign / "step_2.tmp").string() +
                                           "\" holds notes.txt, which no save writes"))
      << refused.output;
  EXPECT_TRUE(mentions(refused.output, "Move it out of --save_dir")) << refused.output;
  EXPECT_EQ(entries(foreign / "step_2.tmp"), (std::vector<std::string>{"notes.txt", "rank0.json"}));
}

// What appears at step_<N> while the run trains (here during a background save held back 2 s) is
// left as it is: the save stops the run, exit 2, with the checkpoint complete in step_<N>.tmp, and
// the message's recipe (move it away, rename the .tmp) gives a checkpoint that resumes.
TEST(NothingOfTheUsers, AFolderThatAppearsDuringTheRunIsNeverReplaced) {
  ScratchDir dir("users_appears");
  const fs::path ckpt = dir / "ckpt";
  const std::string trainer = "LLM_DEBUG_SAVE_DELAY_SECONDS=2 " +
                              trainer_command("--num_training_steps 3 --save_every 2 --async_save --save_dir " +
                                              ckpt.string() + " --run_dir " + (dir / "a").string());
  const std::string staging = (ckpt / "step_2.tmp").string(), final_path = (ckpt / "step_2").string();
  auto result = run_command("sh -c '" + trainer + " & pid=$!; while [ ! -d " + staging +
                            " ]; do sleep 0.05; done; mkdir " + final_path + "; echo mine > " + final_path +
                            "/notes.txt; wait $pid'");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(mentions(result.output, final_path + ": --save_dir: is not an intact checkpoint (it holds notes.txt"))
      << result.output;
  EXPECT_TRUE(mentions(result.output, "This step's checkpoint is complete in " + staging)) << result.output;
  EXPECT_EQ(read_file(ckpt / "step_2/notes.txt"), "mine\n");
  ASSERT_TRUE(fs::exists(ckpt / "step_2.tmp/manifest.json")) << result.output;
  fs::rename(ckpt / "step_2", dir / "notes_folder");
  fs::rename(ckpt / "step_2.tmp", ckpt / "step_2");
  auto resumed = run_command(trainer_command("--num_training_steps 3 --continue_from " + ckpt.string() + " --run_dir " +
                                             (dir / "b").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "resumed from " + final_path + " at step 2")) << resumed.output;
}

// A step_<N> that is a file, or a link, where the run would save: refused naming what it is.
TEST(NothingOfTheUsers, AStepPathOfTheWrongKindIsRefused) {
  ScratchDir dir("users_wrong_kind");
  const fs::path ckpt = dir / "ckpt";
  fs::create_directories(ckpt);
  std::ofstream(ckpt / "step_2") << "a file";
  auto file = run_command(trainer_command("--num_training_steps 2 --save_dir " + ckpt.string() + " --run_dir " +
                                          (dir / "a").string()));
  EXPECT_EQ(file.exit_code, 2) << file.output;
  EXPECT_TRUE(mentions(file.output, "--save_dir: \"" + (ckpt / "step_2").string() + "\" is a regular file: this run "
                                                                                    "saves step 2 there"))
      << file.output;
  EXPECT_EQ(read_file(ckpt / "step_2"), "a file");
  auto device = run_command(trainer_command("--num_training_steps 2 --save_dir /dev/null --run_dir " +
                                            (dir / "b").string()));
  EXPECT_EQ(device.exit_code, 2) << device.output;
  EXPECT_TRUE(mentions(device.output, "--save_dir")) << device.output;
  EXPECT_TRUE(mentions(device.output, "/dev/null")) << device.output;
}

// --- hand-edited and copied checkpoints (issue 25) ---------------------------------------------------

// Each hand edit is exit 2 naming the folder, manifest.json and the key, before any step.
TEST(HandEditedManifest, EachBadFieldIsNamedWithItsKey) {
  ScratchDir dir("hand_edited");
  train_four_steps(dir / "ckpt", dir / "a");
  struct Edit {
    std::string name;
    std::function<void(const fs::path&)> apply;
    std::string expected;
  };
  const auto set = [](const char* key, nlohmann::json value) {
    return [key, value](const fs::path& folder) {
      nlohmann::json edited = manifest(folder);
      edited[key] = value;
      std::ofstream(folder / "manifest.json", std::ios::trunc) << edited.dump();
    };
  };
  const std::vector<Edit> edits = {
      {"a negative step", set("step", -5), "manifest.json: step: expected an integer >= 0 (got -5)"},
      {"world_size 0", set("world_size", 0), "manifest.json: world_size: expected an integer >= 1 (got 0)"},
      {"a seed that is not a count", set("seed", "x"), "manifest.json: seed: expected an integer >= 0 (got \"x\")"},
      {"manifest.json a folder",
       [](const fs::path& folder) {
         fs::remove(folder / "manifest.json");
         fs::create_directories(folder / "manifest.json");
       },
       "manifest.json: is a folder, not a file"},
  };
  for (const Edit& edit : edits) {
    SCOPED_TRACE(edit.name);
    const fs::path checkpoint = dir / ("edited_" + std::to_string(&edit - edits.data())) / "step_4";
    fs::create_directories(checkpoint.parent_path());
    fs::copy(dir / "ckpt/step_4", checkpoint, fs::copy_options::recursive);
    edit.apply(checkpoint);
    const fs::path run_dir = checkpoint.parent_path() / "run";
    auto result = run_command(trainer_command("--num_training_steps 6 --continue_from " + checkpoint.string() +
                                              " --run_dir " + run_dir.string()));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(mentions(result.output, checkpoint.string())) << result.output;
    EXPECT_TRUE(mentions(result.output, edit.expected)) << result.output;
    EXPECT_FALSE(mentions(result.output, "basic_filebuf")) << result.output;
    EXPECT_FALSE(fs::exists(run_dir / "metrics.jsonl")) << "stopped before the model was built";
    // In a save_dir, the same folder is skipped with the same reason, and the older one resumes.
    fs::copy(dir / "ckpt/step_2", checkpoint.parent_path() / "step_2", fs::copy_options::recursive);
    auto skipped = run_command(trainer_command("--num_training_steps 3 --continue_from " +
                                               checkpoint.parent_path().string() + " --run_dir " + run_dir.string()));
    EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
    EXPECT_TRUE(mentions(skipped.output, "--continue_from: skipping " + checkpoint.string() + ": ")) << skipped.output;
    EXPECT_TRUE(mentions(skipped.output, edit.expected)) << skipped.output;
  }
}

// `cp -r step_2 step_10`: not a checkpoint of step 10. In a save_dir it is skipped naming both
// numbers (before: resumed at step 2 as the newest, so a requeued job redid steps 3-4 forever); named
// directly it is refused, saying to rename it; as a folder this run would save, refused.
TEST(NewestCheckpoint, ACopiedStepFolderIsNotTheStepItsNameSays) {
  ScratchDir dir("copied_step");
  const fs::path ckpt = dir / "ckpt";
  train_four_steps(ckpt, dir / "a");
  fs::copy(ckpt / "step_2", ckpt / "step_10", fs::copy_options::recursive);
  auto resumed = run_command(trainer_command("--num_training_steps 5 --continue_from " + ckpt.string() + " --run_dir " +
                                             (dir / "b").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "--continue_from: skipping " + (ckpt / "step_10").string() +
                                           ": manifest.json: step: 2, but the folder is named step_10"))
      << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "resumed from " + (ckpt / "step_4").string() + " at step 4")) << resumed.output;
  auto direct = run_command(trainer_command("--num_training_steps 12 --continue_from " + (ckpt / "step_10").string() +
                                            " --run_dir " + (dir / "c").string()));
  EXPECT_EQ(direct.exit_code, 2) << direct.output;
  EXPECT_TRUE(mentions(direct.output, "--continue_from: " + (ckpt / "step_10").string() +
                                          ": manifest.json: step: 2, but the folder is named step_10"))
      << direct.output;
  EXPECT_TRUE(mentions(direct.output, "Rename it to step_2")) << direct.output;
  auto saving = run_command(trainer_command("--num_training_steps 12 --save_every 2 --save_dir " + ckpt.string() +
                                            " --continue_from " + ckpt.string() + " --run_dir " + (dir / "d").string()));
  EXPECT_EQ(saving.exit_code, 2) << saving.output;
  EXPECT_TRUE(mentions(saving.output, "--save_dir: \"" + (ckpt / "step_10").string() + "\" is not an intact checkpoint"))
      << saving.output;
}

// A step_<N> that is a symbolic link to another run's folder: never adopted as this save_dir's newest
// (skipped naming the link and its target), and refused where this run would save.
TEST(NewestCheckpoint, AStepFolderThatIsALinkIsNotAdopted) {
  ScratchDir dir("linked_step");
  const fs::path ckpt = dir / "ckpt", other = dir / "other";
  train_four_steps(ckpt, dir / "a");
  ASSERT_EQ(run_command(trainer_command("--num_training_steps 6 --save_every 6 --save_dir " + other.string() +
                                        " --run_dir " + (dir / "b").string()))
                .exit_code,
            0);
  fs::create_directory_symlink(other / "step_6", ckpt / "step_6");
  auto resumed = run_command(trainer_command("--num_training_steps 5 --continue_from " + ckpt.string() + " --run_dir " +
                                             (dir / "c").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "--continue_from: skipping " + (ckpt / "step_6").string() +
                                           ": a symbolic link to " + (other / "step_6").string() + ", not adopted"))
      << resumed.output;
  EXPECT_TRUE(mentions(resumed.output, "resumed from " + (ckpt / "step_4").string())) << resumed.output;
  auto saving = run_command(trainer_command("--num_training_steps 6 --save_every 2 --save_dir " + ckpt.string() +
                                            " --continue_from " + ckpt.string() + " --run_dir " + (dir / "d").string()));
  EXPECT_EQ(saving.exit_code, 2) << saving.output;
  EXPECT_TRUE(mentions(saving.output, "--save_dir: \"" + (ckpt / "step_6").string() + "\" is a symbolic link to " +
                                          (other / "step_6").string()))
      << saving.output;
  EXPECT_TRUE(fs::exists(other / "step_6/manifest.json")) << "the other run's folder is untouched";
}

// --- resuming on other data (issue 25) ------------------------------------------------------------

// Another --data than the checkpoint's, or its file changed in place since: a warning naming both
// and saying that the sampler position carries over (a deliberate change of data goes on, exit 0).
TEST(ResumeData, AnotherOrAChangedDataFileIsSaid) {
  ScratchDir dir("resume_data");
  const fs::path first = dir / "first.tok", second = dir / "second.tok", ckpt = dir / "ckpt";
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 4000; ++i) tokens.push_back((i * 31 + 7) % 128);
  write_token_file(first.string(), tokens, 128);
  tokens.resize(3000);
  write_token_file(second.string(), tokens, 128);
  const std::string flags = "--num_training_steps 3 --continue_from " + ckpt.string();
  const auto trained = run_command(trainer_command("--num_training_steps 2 --save_dir " + ckpt.string() + " --data " +
                                                   first.string() + " --run_dir " + (dir / "a").string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const uintmax_t first_bytes = fs::file_size(first), second_bytes = fs::file_size(second);
  EXPECT_EQ(manifest(ckpt / "step_2").at("data_file").at("bytes"), first_bytes);
  auto other = run_command(trainer_command(flags + " --data " + second.string() + " --run_dir " + (dir / "b").string()));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  for (const std::string& part :
       {"--data: the checkpoint " + (ckpt / "step_2").string() + " was trained on " + first.string(),
        "this run reads " + second.string(), std::string("the sampler goes on from the checkpoint's position (4 samples"),
        "If that is not meant, resume with --data " + first.string()})
    EXPECT_TRUE(mentions(other.output, part)) << part << "\n" << other.output;
  auto same = run_command(trainer_command(flags + " --data " + first.string() + " --run_dir " + (dir / "c").string()));
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_FALSE(mentions(same.output, "--data:")) << same.output;
  fs::copy_file(second, first, fs::copy_options::overwrite_existing);  // `trainer prepare` again, in place
  auto changed = run_command(trainer_command(flags + " --data " + first.string() + " --run_dir " + (dir / "d").string()));
  ASSERT_EQ(changed.exit_code, 0) << changed.output;
  EXPECT_TRUE(mentions(changed.output, "--data: " + first.string() + " has changed since the checkpoint " +
                                           (ckpt / "step_2").string() + " was saved (" +
                                           std::to_string(first_bytes) + " bytes then, " +
                                           std::to_string(second_bytes) + " now"))
      << changed.output;
  EXPECT_TRUE(mentions(changed.output, "the resume is not exact")) << changed.output;
}

}  // namespace
}  // namespace llm
