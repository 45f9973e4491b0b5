// Resuming from a checkpoint (issues 13 and 25), through the trainer binary on CPU: a resumed run
// appends to its run folder's history, and a finished one says so; "newest" in --continue_from
// SAVE_DIR skips misnamed, broken, copied and linked step folders with a warning; a save_dir of
// another run or another model config is refused; a damaged or hand-edited checkpoint is an error
// naming the file (and the key) before any step; a resume on other data is refused unless allowed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include "data/token_file.h"
#include "tests/checkpoint_test_util.h"
#include "tests/test_util.h"

namespace llm::checkpoint_resume_test {
namespace {

namespace fs = std::filesystem;
using testing::entries;
using testing::entries_but_the_lock;
using testing::manifest;
using testing::mentions;
using testing::read_file;
using testing::run_command;
using testing::ScratchDir;
using testing::train_four_steps;
using testing::trainer_arguments;
using testing::trainer_command;

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
  // A file outside the checkpoint of a size the manifest then lists.
  std::ofstream(dir / "outside.txt") << "not a checkpoint's";
  const auto list_file = [&](const std::string& name) {
    return [name, bytes = fs::file_size(dir / "outside.txt")](const fs::path& folder) {
      nlohmann::json edited = manifest(folder);
      edited["files"][name] = {{"bytes", bytes}};
      std::ofstream(folder / "manifest.json", std::ios::trunc) << edited.dump();
    };
  };
  const auto replace_file = [](const std::string& name, std::function<void(const fs::path&)> make) {
    return [name, make](const fs::path& folder) {
      fs::remove(folder / name);
      make(folder / name);
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
       "manifest.json: is a folder, not a regular file"},
      // A name in "files" is a plain name inside the folder (issue 44): before, a file outside it of
      // the listed size passed the verifier (stat'ed through ../ or an absolute path).
      {"a files entry out of the folder", list_file("../../outside.txt"),
       "manifest.json: files: \"../../outside.txt\" holds a '/': not a plain file name inside the folder"},
      {"a files entry that is an absolute path", list_file((dir / "outside.txt").string()),
       "manifest.json: files: \"" + (dir / "outside.txt").string() + "\" is an absolute path"},
      {"a files entry \"..\"", list_file(".."), "manifest.json: files: \"..\" is \"..\""},
      // A listed file that is not a regular one is said as what it is (before: "missing").
      {"rank0.json a fifo", replace_file("rank0.json", [](const fs::path& p) { ::mkfifo(p.c_str(), 0600); }),
       "rank0.json: is a fifo, not a regular file (listed in manifest.json)"},
      {"rank0.safetensors a link to /dev/zero",
       replace_file("rank0.safetensors", [](const fs::path& p) { fs::create_symlink("/dev/zero", p); }),
       "rank0.safetensors: is a symbolic link to /dev/zero, a character device, not a regular file"},
      {"rank0.json a link to nothing",
       replace_file("rank0.json", [](const fs::path& p) { fs::create_symlink(p.parent_path() / "gone.json", p); }),
       "rank0.json: is a symbolic link to nothing ("},
      {"rank0.json a loop of links", replace_file("rank0.json", [](const fs::path& p) { fs::create_symlink(p, p); }),
       "rank0.json: is a loop of symbolic links, not a regular file"},
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

// Another --data than the checkpoint's, or its file changed in place since: exit 2 before any step,
// naming both; --allow_other_data goes on and says that the sampler position carries over (sharded
// corpora: data_resume_test.cpp).
TEST(ResumeData, AnotherOrAChangedDataFileIsRefusedUnlessAllowed) {
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
  const nlohmann::json identity = manifest(ckpt / "step_2").at("data_identity");
  EXPECT_EQ(identity.at("shards").at(0).at("file"), "first.tok");
  EXPECT_EQ(identity.at("shards").at(0).at("bytes"), fs::file_size(first));
  const std::string refused = "the checkpoint " + (ckpt / "step_2").string() + " was trained on other data than this run's (";
  auto other = run_command(trainer_command(flags + " --data " + second.string() + " --run_dir " + (dir / "b").string()));
  EXPECT_EQ(other.exit_code, 2) << other.output;
  for (const std::string& part :
       {refused + "shard 1 of 1, first.tok then, second.tok now", "it read " + first.string(),
        std::string("Resume with the data it was trained on, or pass --allow_other_data")})
    EXPECT_TRUE(mentions(other.output, part)) << part << "\n" << other.output;
  auto allowed = run_command(trainer_command(flags + " --allow_other_data --data " + second.string() + " --run_dir " +
                                             (dir / "b2").string()));
  ASSERT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_TRUE(mentions(allowed.output, "the sampler goes on from the checkpoint's position (4 samples consumed)"))
      << allowed.output;
  auto same = run_command(trainer_command(flags + " --data " + first.string() + " --run_dir " + (dir / "c").string()));
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_FALSE(mentions(same.output, "--data:")) << same.output;
  fs::copy_file(second, first, fs::copy_options::overwrite_existing);  // `trainer prepare` again, in place
  auto changed = run_command(trainer_command(flags + " --data " + first.string() + " --run_dir " + (dir / "d").string()));
  EXPECT_EQ(changed.exit_code, 2) << changed.output;
  EXPECT_TRUE(mentions(changed.output, refused + "shard 1 of 1, first.tok: 4000 tokens then, 3000 now")) << changed.output;
}

}  // namespace
}  // namespace llm::checkpoint_resume_test
