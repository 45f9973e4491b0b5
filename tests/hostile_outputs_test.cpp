// What the trainer writes, tried as a hostile user would (issue 51), through the binary on CPU:
//   - nothing it creates follows a symbolic link left under the name it writes (a folder's lock, an
//     output's lock beside it, a run file): each is refused naming the link, and the file the link
//     points to is untouched (before: truncated to the lock's text, exit 0);
//   - an output inside a checkpoint folder (export --to, prepare --output, report --out) is refused
//     (before: written, then deleted without a word by --keep_last or a save of that step);
//   - one report per --out (before: two both exited 0, one's markdown beside the other's plots);
//   - export --to a new nested folder is created (before: refused at its lock);
//   - a job killed during its first save is not refused at every requeue by launch/slurm.sbatch;
//   - a sharded prepare that did not finish is said by --data and replaced by --overwrite, and an
//     index.json edited to list a user's file never makes --overwrite delete it;
//   - a link under a save's file name in a staging folder is said to be a link.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/folder_lock.h"
#include "data/token_file.h"
#include "tests/checkpoint_test_util.h"
#include "tests/test_util.h"

namespace llm::hostile_outputs_test {
namespace {

namespace fs = std::filesystem;
using testing::mentions;
using testing::run_command;
using testing::ScratchDir;

const std::string kPrecious = "the user's own file: never overwritten\n";

std::string trainer() { return "OMP_NUM_THREADS=1 " + testing::trainer_binary().string(); }

// English-like lines for `trainer prepare`.
void write_text(const fs::path& path, int lines, uint64_t seed) {
  static const std::vector<std::string> words = {"the", "a", "cat", "dog", "sat", "on", "mat", "and", "ran", "to",
                                                 "house", "of", "little", "red", "big", "tree", "in", "garden"};
  std::mt19937_64 random(seed);
  std::ofstream out(path);
  for (int line = 0; line < lines; ++line) {
    for (int word = 0; word < 12; ++word) out << (word ? " " : "") << words[random() % words.size()];
    out << ".\n";
  }
}

// One training run with checkpoints at steps 2 and 4, a text file and a tokenizer trained on it:
// made once for the tests of this file.
struct Made {
  ScratchDir root{"hostile_outputs"};
  fs::path run = root / "run", ckpt = root / "ckpt", text = root / "text.txt", tokenizer = root / "words.tok.model";
  std::string output;
  Made() {
    const auto trained = run_command(testing::trainer_command("--num_training_steps 4 --save_every 2 --save_dir " +
                                                              ckpt.string() + " --run_dir " + run.string()));
    output = trained.output;
    write_text(text, 400, 1);
    const auto prepared = run_command(trainer() + " prepare --input " + text.string() + " --vocab_size 64 --output " +
                                      (root / "words.tok").string());
    output += prepared.output;
  }
  bool ready() const { return fs::exists(ckpt / "step_4" / "manifest.json") && fs::exists(tokenizer); }
};

const Made& made() {
  static Made* shared = new Made();  // kept for the whole test binary; its folder goes at exit
  static const bool cleanup = (std::atexit([] { delete shared; }), true);
  (void)cleanup;
  return *shared;
}

void expect_link_refused(const testing::CommandResult& result, const fs::path& link, const fs::path& target) {
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(mentions(result.output, link.string() + " is a symbolic link (to " + target.string() + ")"))
      << result.output;
  EXPECT_EQ(testing::read_file(target), kPrecious) << "the link's target was written through";
}

struct LinkCase {
  std::string name;
  // The link's path, and the command that would write through it, both in `dir`.
  std::function<fs::path(const fs::path& dir)> link;
  std::function<std::string(const fs::path& dir)> command;
};

class LinkedLock : public ::testing::TestWithParam<LinkCase> {};

TEST_P(LinkedLock, IsRefusedNamingItAndItsTargetIsKept) {
  ASSERT_TRUE(made().ready()) << made().output;
  const LinkCase& c = GetParam();
  ScratchDir dir("linked_" + c.name);
  const fs::path target = dir / "precious.txt";
  std::ofstream(target) << kPrecious;
  const fs::path link = c.link(dir.path());
  fs::create_directories(link.parent_path());
  fs::create_symlink(target, link);
  expect_link_refused(run_command(c.command(dir.path())), link, target);
  EXPECT_TRUE(fs::is_symlink(link)) << "the link is the user's: left as it is";
}

std::string train_into(const fs::path& dir, const std::string& flags) {
  return testing::trainer_command("--num_training_steps 1 --run_dir " + (dir / "run").string() + " " + flags);
}

INSTANTIATE_TEST_SUITE_P(
    Locks, LinkedLock,
    ::testing::Values(
        LinkCase{"run_dir", [](const fs::path& d) { return d / "run" / ".trainer.lock"; },
                 [](const fs::path& d) { return train_into(d, ""); }},
        LinkCase{"save_dir", [](const fs::path& d) { return d / "ckpt" / ".trainer.lock"; },
                 [](const fs::path& d) { return train_into(d, "--save_dir " + (d / "ckpt").string()); }},
        LinkCase{"tensorboard_dir", [](const fs::path& d) { return d / ".tensorboard.trainer.lock"; },
                 [](const fs::path& d) { return train_into(d, "--tensorboard_dir " + (d / "tensorboard").string()); }},
        LinkCase{"metrics_file", [](const fs::path& d) { return d / "run" / "metrics.jsonl"; },
                 [](const fs::path& d) { return train_into(d, ""); }},
        LinkCase{"prepare_output", [](const fs::path& d) { return d / ".out.tok.trainer.lock"; },
                 [](const fs::path& d) {
                   return trainer() + " prepare --input " + made().text.string() + " --tokenizer " +
                          made().tokenizer.string() + " --output " + (d / "out.tok").string();
                 }},
        LinkCase{"export_to", [](const fs::path& d) { return d / ".hf.trainer.lock"; },
                 [](const fs::path& d) {
                   return trainer() + " export --from " + made().ckpt.string() + " --to " + (d / "hf").string();
                 }},
        LinkCase{"report_out", [](const fs::path& d) { return d / ".report.trainer.lock"; },
                 [](const fs::path& d) {
                   return trainer() + " report " + made().run.string() + " --out " + (d / "report").string();
                 }}),
    [](const auto& info) { return info.param.name; });

// Outputs a save could delete: refused before anything is written into the checkpoint folder.
TEST(OutputsInsideCheckpoints, ExportPrepareAndReportIntoAStepFolderAreRefused) {
  ASSERT_TRUE(made().ready()) << made().output;
  const fs::path step = made().ckpt / "step_2";
  const std::vector<std::pair<std::string, fs::path>> outputs = {
      {trainer() + " export --from " + (made().ckpt / "step_4").string() + " --to " + (step / "hf").string(), step / "hf"},
      {trainer() + " prepare --input " + made().text.string() + " --tokenizer " + made().tokenizer.string() +
           " --output " + (step / "data.tok").string(),
       step / "data.tok"},
      {trainer() + " report " + made().run.string() + " --out " + (step / "report").string(), step / "report"}};
  for (const auto& [command, output] : outputs) {
    const auto refused = run_command(command);
    EXPECT_EQ(refused.exit_code, 2) << command << "\n" << refused.output;
    EXPECT_TRUE(mentions(refused.output, "is inside the checkpoint folder " + fs::canonical(step).string()))
        << refused.output;
    EXPECT_FALSE(fs::exists(output)) << output;
  }
  EXPECT_EQ(testing::entries(step), (std::vector<std::string>{"manifest.json", "rank0.json", "rank0.safetensors"}));
}

TEST(ReportLock, ASecondReportToOneOutIsRefusedNamingTheFirst) {
  ASSERT_TRUE(made().ready()) << made().output;
  ScratchDir dir("report_lock");
  const fs::path out = dir / "report";
  const std::unique_ptr<FolderLock> held = FolderLock::output(out, "--out");  // the first report, writing
  const auto second = run_command(trainer() + " report " + made().run.string() + " --out " + out.string());
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_TRUE(mentions(second.output, "is in use by another job (host ")) << second.output;
  EXPECT_FALSE(fs::exists(out / "memory_report.md"));
}

TEST(ExportTo, ANewNestedFolderIsCreated) {
  ASSERT_TRUE(made().ready()) << made().output;
  ScratchDir dir("export_nested");
  const fs::path to = dir / "a" / "b" / "hf";
  const auto exported = run_command(trainer() + " export --from " + made().ckpt.string() + " --to " + to.string());
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(fs::exists(to / "config.json"));
  EXPECT_TRUE(fs::exists(to / "model.safetensors"));
}

// launch/slurm.sbatch outside Slurm: srun runs the command it is given, squeue and scontrol answer
// nothing. A save_dir holding only a killed first save (step_3.tmp, with or without its manifest) is
// no checkpoint: the job starts afresh (before: --continue_from was added, the trainer refused, and
// every requeue failed the same way).
TEST(SlurmBatch, AJobKilledInItsFirstSaveStartsAfreshWhenRequeued) {
  ScratchDir dir("sbatch_killed_save");
  const fs::path bin = dir / "bin";
  fs::create_directories(bin);
  std::ofstream(bin / "srun") << "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in --*) shift ;; *) break ;; esac; done\n"
                                 "exec \"$@\"\n";
  std::ofstream(bin / "squeue") << "#!/bin/sh\nexit 0\n";
  std::ofstream(bin / "scontrol") << "#!/bin/sh\nexit 0\n";
  for (const char* tool : {"srun", "squeue", "scontrol"}) fs::permissions(bin / tool, fs::perms::owner_all);
  const fs::path save_dir = dir / "ckpt";
  fs::create_directories(save_dir / "step_3.tmp");
  std::ofstream(save_dir / "step_3.tmp" / "rank0.safetensors") << std::string(4096, 'x');
  std::ofstream(save_dir / "step_3.tmp" / "manifest.json") << "{}";  // killed between the manifest and the rename
  const auto job = run_command("cd " + testing::source_dir().string() + " && PATH=" + bin.string() + ":$PATH TRAINER=" +
                               testing::trainer_binary().string() + " OMP_NUM_THREADS=1 bash launch/slurm.sbatch" +
                               testing::trainer_arguments("--num_training_steps 2 --save_every 2 --save_dir " +
                                                          save_dir.string() + " --run_dir " + (dir / "run").string()));
  EXPECT_EQ(job.exit_code, 0) << job.output;
  EXPECT_FALSE(mentions(job.output, "--continue_from")) << job.output;
  EXPECT_TRUE(fs::exists(save_dir / "step_2" / "manifest.json")) << job.output;
}

// A sharded prepare that fails part-way (its second input has a bad byte past its first 64 KiB, found
// as it is read, after the first input's shards are written) leaves shards and no index.json: --data refuses the folder (before: trained
// on what was there without a word), a prepare without --overwrite says it did not finish, and one
// with --overwrite replaces it, leaving no shard of the unfinished one behind.
TEST(UnfinishedPrepare, IsRefusedByDataAndReplacedByOverwrite) {
  ASSERT_TRUE(made().ready()) << made().output;
  ScratchDir dir("unfinished_prepare");
  const fs::path bad = dir / "bad.txt", shards = dir / "shards";
  write_text(bad, 6000, 2);
  { std::ofstream(bad, std::ios::app) << "\xff\xfe not UTF-8\n"; }
  const std::string prepare = trainer() + " prepare --tokenizer " + made().tokenizer.string() + " --shard_tokens 2000 --output " +
                              shards.string() + " --input ";
  const auto failed = run_command(prepare + made().text.string() + " --input " + bad.string());
  ASSERT_EQ(failed.exit_code, 2) << failed.output;
  ASSERT_TRUE(fs::exists(shards / "shard_000001.tok")) << "the failure is meant to come after some shards";
  EXPECT_FALSE(fs::exists(shards / "index.json"));
  const auto trained = run_command(testing::trainer_command("--num_training_steps 1 --data " + shards.string() +
                                                            " --run_dir " + (dir / "run").string()));
  EXPECT_EQ(trained.exit_code, 2) << trained.output;
  EXPECT_TRUE(mentions(trained.output, "holds the shards of a `trainer prepare` that did not finish")) << trained.output;
  const auto again = run_command(prepare + made().text.string());
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_TRUE(mentions(again.output, "that did not finish")) << again.output;
  EXPECT_TRUE(mentions(again.output, "pass --overwrite")) << again.output;
  const auto replaced = run_command(prepare + made().text.string() + " --overwrite");
  ASSERT_EQ(replaced.exit_code, 0) << replaced.output;
  std::vector<std::string> listed = {"index.json"};
  const nlohmann::json index = nlohmann::json::parse(testing::read_file(shards / "index.json"));
  for (const nlohmann::json& shard : index.at("shards")) listed.push_back(shard.at("file").get<std::string>());
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(testing::entries(shards), listed) << "only the new prepare's shards and index";
  const auto trains = run_command(testing::trainer_command("--num_training_steps 1 --data " + shards.string() +
                                                           " --run_dir " + (dir / "run2").string()));
  EXPECT_EQ(trains.exit_code, 0) << trains.output;
}

// --overwrite removes the shards an earlier prepare's index.json lists: only names a prepare gives
// its shards (before: any plain name, so an edited index removed the user's file).
TEST(UnfinishedPrepare, AnIndexEditedToListAUsersFileNeverRemovesIt) {
  ASSERT_TRUE(made().ready()) << made().output;
  ScratchDir dir("edited_index");
  const fs::path shards = dir / "shards";
  const std::string prepare = trainer() + " prepare --tokenizer " + made().tokenizer.string() +
                              " --shard_tokens 2000 --output " + shards.string() + " --input " + made().text.string();
  ASSERT_EQ(run_command(prepare).exit_code, 0);
  std::ofstream(shards / "notes.txt") << kPrecious;
  std::ofstream(shards / "mine.tok") << kPrecious;
  nlohmann::json index = nlohmann::json::parse(testing::read_file(shards / "index.json"));
  index["shards"].push_back({{"file", "notes.txt"}, {"tokens", 1}});
  index["shards"].push_back({{"file", "mine.tok"}, {"tokens", 1}});
  std::ofstream(shards / "index.json", std::ios::trunc) << index.dump();
  const auto replaced = run_command(prepare + " --overwrite");
  ASSERT_EQ(replaced.exit_code, 0) << replaced.output;
  EXPECT_EQ(testing::read_file(shards / "notes.txt"), kPrecious);
  EXPECT_EQ(testing::read_file(shards / "mine.tok"), kPrecious);
}

// A tokenizer trained onto a full disk (a 64 KiB tmpfs in a mount namespace of its own): exit 2 with
// the system's reason, and no staging file left (before: "check that the folder exists and is
// writable", and out.tok.model.tmp stayed).
TEST(FullDisk, ATokenizerThatCannotBeWrittenSaysWhyAndLeavesNothing) {
  ASSERT_TRUE(made().ready()) << made().output;
  ScratchDir dir("tokenizer_full_disk");
  const fs::path full = dir / "full", listing = dir / "listing.txt";
  fs::create_directories(full);
  if (run_command("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs " + full.string() + "' 2>/dev/null").exit_code != 0)
    GTEST_SKIP() << "no mount namespace here (needs root): a full disk cannot be made";
  const auto result = run_command("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs " + full.string() + " && " +
                                  testing::trainer_binary().string() + " prepare --input " + made().text.string() +
                                  " --vocab_size 64 --output " + (full / "out.tok").string() +
                                  "; status=$?; ls -A " + full.string() + " > " + listing.string() + "; exit $status'");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(mentions(result.output, "cannot write " + (full / "out.tok.model").string() + ": No space left on device"))
      << result.output;
  EXPECT_EQ(testing::read_file(listing), "") << "left behind on the full disk";
}

// A link under a save's own file name in a staging folder is said to be a link (before: "a file no
// save writes", which it is named as).
TEST(StagingFolder, ALinkUnderASavesFileNameIsSaidToBeALink) {
  ScratchDir dir("staging_link");
  const fs::path ckpt = dir / "ckpt", target = dir / "precious.txt";
  std::ofstream(target) << kPrecious;
  fs::create_directories(ckpt / "step_2.tmp");
  fs::create_symlink(target, ckpt / "step_2.tmp" / "rank0.safetensors");
  const auto refused = run_command(testing::trainer_command("--num_training_steps 2 --save_every 2 --save_dir " +
                                                            ckpt.string() + " --run_dir " + (dir / "run").string()));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(mentions(refused.output, "holds rank0.safetensors, a symbolic link (to " + target.string() + ")"))
      << refused.output;
  EXPECT_EQ(testing::read_file(target), kPrecious);
}

}  // namespace
}  // namespace llm::hostile_outputs_test
