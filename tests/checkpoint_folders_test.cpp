// The folders a run writes into, checked at start-up, and nothing of the user's removed or replaced
// (issues 13 and 25), through the trainer binary on CPU: --save_dir and --run_dir are checked
// writable before the model is built, and the check leaves nothing behind; a step_<N> or
// step_<N>.tmp the run did not write is refused where it would save, and one that appears while the
// run trains is never replaced. Resuming is tested in checkpoint_resume_test.cpp, saving in
// checkpoint_writes_test.cpp.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/checkpoint_test_util.h"
#include "tests/test_util.h"

namespace llm::checkpoint_folders_test {
namespace {

namespace fs = std::filesystem;
using testing::entries;
using testing::entries_but_the_lock;
using testing::mentions;
using testing::read_file;
using testing::run_command;
using testing::ScratchDir;
using testing::train_four_steps;
using testing::trainer_arguments;
using testing::trainer_command;

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

// A killed save's step_<N>.tmp (a checkpoint's size) is removed once a later save of the job
// completes (issue 44: it stayed forever); one holding a file no save writes is left, and said.
TEST(StaleStaging, AKilledSavesFolderGoesWhenALaterSaveCompletes) {
  ScratchDir dir("stale_staging");
  const fs::path ckpt = dir / "ckpt";
  fs::create_directories(ckpt / "step_1.tmp");
  std::ofstream(ckpt / "step_1.tmp" / "rank0.safetensors") << std::string(4096, 'x');  // a cut-short part
  auto first = run_command(trainer_command("--num_training_steps 2 --save_every 2 --save_dir " + ckpt.string() +
                                           " --run_dir " + (dir / "a").string()));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_FALSE(fs::exists(ckpt / "step_1.tmp"));
  EXPECT_NE(first.output.find("step_1.tmp: a killed save's staging folder, superseded by"), std::string::npos)
      << first.output;
  // Staging folders of earlier steps, one with the user's file in it, then a continued run's save.
  fs::create_directories(ckpt / "step_1.tmp");
  std::ofstream(ckpt / "step_1.tmp" / "notes.txt") << "mine";
  fs::create_directories(ckpt / "step_2.tmp");
  std::ofstream(ckpt / "step_2.tmp" / "rank0.json") << "{";
  auto second = run_command(trainer_command("--num_training_steps 4 --save_every 2 --save_dir " + ckpt.string() +
                                            " --run_dir " + (dir / "a").string() + " --continue_from " + ckpt.string()));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_FALSE(fs::exists(ckpt / "step_2.tmp"));
  EXPECT_TRUE(fs::exists(ckpt / "step_1.tmp" / "notes.txt")) << "never what a save did not write";
  EXPECT_NE(second.output.find("holds notes.txt, which no save writes: not removed"), std::string::npos)
      << second.output;
  EXPECT_TRUE(fs::exists(ckpt / "step_4" / "manifest.json"));
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

// --- nothing of the user's removed or replaced (issue 25) ------------------------------------------

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

// --run_dir or --tensorboard_dir inside a checkpoint folder (a step_<N> of --save_dir, there or not
// yet, or any step_<N> holding a manifest): exit 2 naming it, before anything is created (issue 44).
TEST(RunDirInCheckpoint, IsRefusedBeforeAnythingIsCreated) {
  ScratchDir dir("run_dir_in_checkpoint");
  const fs::path ckpt = dir / "ckpt";
  train_four_steps(ckpt, dir / "first");
  const std::vector<std::string> before = entries(ckpt / "step_2");
  const std::string resume = "--num_training_steps 6 --save_dir " + ckpt.string() + " --continue_from " + ckpt.string();
  struct Case {
    std::string flags, flag, folder;
    fs::path created;
  };
  const std::vector<Case> cases = {
      {resume + " --run_dir " + (ckpt / "step_2/run").string(), "--run_dir", (ckpt / "step_2").string(), ckpt / "step_2/run"},
      {resume + " --run_dir " + (ckpt / "step_6/run").string(), "--run_dir", (ckpt / "step_6").string(), ckpt / "step_6"},
      {resume + " --run_dir " + (dir / "run").string() + " --tensorboard_dir " + (ckpt / "step_4/tb").string(),
       "--tensorboard_dir", (ckpt / "step_4").string(), ckpt / "step_4/tb"},
      // Another save_dir's checkpoint (it holds a manifest), named through ./ and ..
      {"--num_training_steps 2 --run_dir " + (dir / "other/../ckpt/./step_2/x").string(), "--run_dir",
       (ckpt / "step_2").string(), ckpt / "step_2/x"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    const auto result = run_command(trainer_command(c.flags));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(mentions(result.output, c.flag + ": ")) << result.output;
    EXPECT_TRUE(mentions(result.output, "is inside the checkpoint folder " + c.folder)) << result.output;
    EXPECT_FALSE(fs::exists(c.created)) << "nothing created";
  }
  EXPECT_EQ(entries(ckpt / "step_2"), before);
  // Beside the step folders, in the save_dir itself, is fine (what the Slurm script does: RUN/checkpoints).
  const auto beside = run_command(trainer_command(resume + " --run_dir " + (ckpt / "run").string()));
  EXPECT_EQ(beside.exit_code, 0) << beside.output;
}

}  // namespace
}  // namespace llm::checkpoint_folders_test
