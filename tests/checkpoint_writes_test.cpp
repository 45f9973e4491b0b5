// Writing checkpoints (issue 13), through the trainer binary on CPU: a save that cannot be written,
// on one rank or on all, is an error naming the file that leaves the previous checkpoint the newest;
// --keep_last removes only this run's oldest step folders; a save fsyncs every file and folder it
// writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/checkpoint_test_util.h"
#include "tests/test_util.h"

namespace llm::checkpoint_writes_test {
namespace {

namespace fs = std::filesystem;
using testing::entries;
using testing::entries_but_the_lock;
using testing::manifest;
using testing::mentions;
using testing::read_file;
using testing::run_command;
using testing::ScratchDir;
using testing::trainer_arguments;
using testing::trainer_command;

// --- a save that cannot be written ---------------------------------------------------------------

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

}  // namespace
}  // namespace llm::checkpoint_writes_test
