// --tensorboard_dir: the event files the trainer writes, read by TensorBoard's own reader (the
// `tensorboard` package's EventAccumulator, tests/tensorboard_check.py) and checked against
// metrics.jsonl; a resumed run's curves without a duplicated or stale step; a 4-rank run's events
// from rank 0 alone.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/crc32c.h"
#include "run_comparison.h"
#include "test_util.h"
#include "trainer/tensorboard.h"

namespace llm::tensorboard_test {
namespace {
namespace fs = std::filesystem;

std::string micro_flags() {
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --max_length 16 --total_batch_size 4 --eval_batches 1 --warmup_steps 1 --lr 1e-2";
}

// The python that has the `tensorboard` package, or "" (the test skips).
std::string reader_python() {
  const fs::path python = testing::python();
  if (!fs::exists(python)) return "";
  if (testing::run_command(python.string() + " -c 'import tensorboard'").exit_code != 0) return "";
  return python.string();
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find("tfevents") != std::string::npos) files.push_back(entry.path());
  return files;
}

TEST(TensorBoard, ARecordIsFramedAsTensorFlowsWithMaskedCrcs) {
  const std::string record = tfrecord("abc");
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  const auto masked = [](uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; };
  const auto read32 = [&](size_t at) {
    uint32_t value = 0;
    for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(record[at + static_cast<size_t>(i)]);
    return value;
  };
  EXPECT_EQ(read32(8), masked(crc32c(record.data(), 8)));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(read32(15), masked(crc32c("abc", 3)));
}

TEST(TensorBoard, TheRealReaderSeesTheMetricsAndAResumeLeavesNoStaleStep) {
  const std::string python = reader_python();
  if (python.empty()) GTEST_SKIP() << "no `tensorboard` package in " << testing::python();
  testing::ScratchDir dir("tensorboard_resume");
  const fs::path run_dir = dir / "run", save_dir = dir / "checkpoints";
  // Six steps with a checkpoint at 4: then a resume from step 4, as after a preemption that came
  // two steps after the last save. Steps 5 and 6 of the first run are stale.
  const std::string common = testing::trainer_launcher(1) + micro_flags() + " --batch_size 4 --eval_every 3 --run_dir " +
                             run_dir.string() + " --tensorboard_dir";  // no value: RUN_DIR/tensorboard
  const auto first = testing::run_command(common + " --num_training_steps 6 --save_dir " + save_dir.string() +
                                          " --save_every 4 --name tb-test --tags a,b");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto resumed = testing::run_command(common + " --num_training_steps 8 --continue_from " +
                                            (save_dir / "step_4").string() + " --name tb-test --tags a,b");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(event_files(run_dir / "tensorboard").size(), 2u);  // one per start
  const auto checked = testing::run_command(python + " " + (testing::source_dir() / "tests/tensorboard_check.py").string() +
                                            " --run_dir " + run_dir.string() + " --steps 8 --resumed_at 4 --ranks 1" +
                                            " --proto " + (testing::source_dir() / "trainer/tensorboard.proto").string());
  EXPECT_EQ(checked.exit_code, 0) << checked.output;

  // Weights & Biases, offline: the same events into a W&B run, with --name and --tags.
  if (testing::run_command(python + " -c 'import wandb'").exit_code != 0) return;  // optional
  const auto synced = testing::run_command(
      "WANDB_MODE=offline WANDB_SILENT=true " + python + " " + (testing::source_dir() / "launch/tensorboard_to_wandb.py").string() +
      " " + (run_dir / "tensorboard").string() + " --dir " + dir.path().string());
  ASSERT_EQ(synced.exit_code, 0) << synced.output;
  const size_t brace = synced.output.rfind("{\"wandb_dir\"");
  ASSERT_NE(brace, std::string::npos) << synced.output;
  const nlohmann::json sent = nlohmann::json::parse(synced.output.substr(brace, synced.output.find('\n', brace) - brace));
  EXPECT_EQ(sent.at("name"), "tb-test");
  EXPECT_EQ(sent.at("tags"), nlohmann::json({"a", "b"}));
  EXPECT_EQ(sent.at("steps"), 8);
  // The offline run's record file holds the scalars' keys and the run's name.
  std::string records;
  for (const auto& entry : fs::recursive_directory_iterator(dir / "wandb"))
    if (entry.path().extension() == ".wandb") records += testing::read_text(entry.path());
  EXPECT_NE(records.find("train/loss"), std::string::npos);
  EXPECT_NE(records.find("memory/max_over_ranks/activations_bytes"), std::string::npos);
  EXPECT_NE(records.find("tb-test"), std::string::npos);
}

TEST(TensorBoard, FourRanksWriteOneFileFromRankZeroWithTheLargestMemoryOverRanks) {
  const std::string python = reader_python();
  if (python.empty()) GTEST_SKIP() << "no `tensorboard` package in " << testing::python();
  testing::ScratchDir dir("tensorboard_ranks");
  const fs::path run_dir = dir / "run";
  const auto run = testing::run_command(testing::trainer_launcher(4) + micro_flags() +
                                        " --batch_size 1 --eval_every 0 --num_training_steps 3 --run_dir " +
                                        run_dir.string() + " --tensorboard_dir " + (dir / "events").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(event_files(dir / "events").size(), 1u);
  // The step line names its memory figure's source and gives the MFU.
  EXPECT_NE(run.output.find("| mfu "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("| peak_rss "), std::string::npos) << run.output;
  // The end: a line per rank, where its peak was and the lever that lowers it most (the estimate's),
  // and the same in the memory record.
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(run.output.find("rank " + std::to_string(rank) + ": peak "), std::string::npos) << run.output;
  const auto memory = testing::read_metrics_events(run_dir, "memory");
  ASSERT_EQ(memory.size(), 1u);
  ASSERT_EQ(memory[0].at("ranks").size(), 4u);
  for (const auto& rank : memory[0].at("ranks")) {
    const auto& lever = rank.at("lowers_peak_most");
    EXPECT_FALSE(lever.at("flags").get<std::string>().empty()) << rank.dump();
    EXPECT_LT(lever.at("estimated_lowered_bytes").get<int64_t>(), lever.at("estimated_peak_bytes").get<int64_t>()) << rank.dump();
  }
  EXPECT_FALSE(fs::exists(run_dir / "tensorboard"));
  const auto checked = testing::run_command(python + " " + (testing::source_dir() / "tests/tensorboard_check.py").string() +
                                            " --run_dir " + run_dir.string() + " --events " + (dir / "events").string() +
                                            " --steps 3 --ranks 4");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

TEST(TensorBoard, ABadFolderOrPeakIsExitTwoNamingTheFlag) {
  testing::ScratchDir dir("tensorboard_bad");
  const fs::path file = dir / "a_file";
  testing::run_command("touch " + file.string());
  const std::string base = testing::trainer_launcher(1) + micro_flags() + " --batch_size 4 --eval_every 0 --num_training_steps 1 --run_dir " +
                           (dir / "run").string();
  const auto on_a_file = testing::run_command(base + " --tensorboard_dir " + file.string());
  EXPECT_EQ(on_a_file.exit_code, 2) << on_a_file.output;
  EXPECT_NE(on_a_file.output.find("--tensorboard_dir"), std::string::npos) << on_a_file.output;
  const auto negative = testing::run_command(base + " --peak_tflops -1");
  EXPECT_EQ(negative.exit_code, 2) << negative.output;
  EXPECT_NE(negative.output.find("--peak_tflops"), std::string::npos) << negative.output;
}

}  // namespace
}  // namespace llm::tensorboard_test
