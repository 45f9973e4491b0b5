// Resuming over sharded data (issue 27): a run saved at 4 ranks and resumed at 3 goes on over the
// same windows, across shard and epoch boundaries; the checkpoint records the corpus's identity
// (data/corpus_identity.h), so the same shards moved to another folder resume and other data is
// refused by name unless --allow_other_data says it is meant.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/corpus_identity.h"
#include "data/token_file.h"
#include "tests/checkpoint_test_util.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::data_resume_test {
namespace {

namespace fs = std::filesystem;
using testing::mentions;
using testing::run_command;
using testing::ScratchDir;

// Shards of llama_micro ids (vocab 128), each its own sequence so that a window's shard shows in it.
void write_shards(const fs::path& folder, int count, int64_t tokens_each, int64_t seed = 0) {
  fs::create_directories(folder);
  for (int s = 0; s < count; ++s) {
    std::vector<int64_t> tokens;
    for (int64_t i = 0; i < tokens_each; ++i) tokens.push_back((i * (7 + 2 * s) + 3 * s + seed) % 128);
    write_token_file((folder / ("shard_" + std::to_string(s) + ".tok")).string(), tokens, 128);
  }
}

std::string flags(const std::string& data, const fs::path& dir, const std::string& more) {
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --data '" + data + "' --max_length 16 --warmup_steps 1 --eval_every 0 --eval_batches 1" +
         " --save_dir " + (dir / "ckpt").string() + " --run_dir " + (dir / "run").string() + " " + more;
}

std::vector<double> losses(const fs::path& run_dir) {
  std::vector<double> values;
  for (const auto& step : testing::read_metrics_events(run_dir, "train")) values.push_back(step.at("loss"));
  return values;
}

// 5 shards of 200 tokens: 58 windows of 17 tokens, a quarter held out (one global micro-batch of
// evaluation needs 12), 44 trained on, spread over the shards by the window order; 6 steps of 12
// sequences pass an epoch's end (72 > 44) after the save at step 3.
TEST(DataResume, FourRanksResumedAtThreeAcrossShardAndEpochBoundariesRepeatTheStraightRun) {
  ScratchDir dir("data_resume_reshard");
  write_shards(dir / "data", 5, 200);
  const std::string data = (dir / "data" / "shard_*.tok").string();
  auto straight = run_command(testing::trainer_launcher(4) +
                              flags(data, dir / "straight", "--num_training_steps 6 --save_every 3 --total_batch_size 12 --batch_size 3 --eval_fraction 0.25"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::vector<double> expected = losses(dir / "straight" / "run");
  ASSERT_EQ(expected.size(), 6u);
  const nlohmann::json identity = testing::manifest(dir / "straight" / "ckpt" / "step_3").at("data_identity");
  ASSERT_EQ(identity.at("shards").size(), 5u);
  EXPECT_EQ(identity.at("tokens"), 1000);
  EXPECT_EQ(identity.at("shards")[2].at("file"), "shard_2.tok");
  EXPECT_EQ(identity.at("shards")[2].at("tokens"), 200);
  auto resumed = run_command(testing::trainer_launcher(3) +
                             flags(data, dir / "resumed",
                                   "--num_training_steps 6 --total_batch_size 12 --batch_size 4 --eval_fraction 0.25 --continue_from " +
                                       (dir / "straight" / "ckpt" / "step_3").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(mentions(resumed.output, "--data:")) << resumed.output;
  const std::vector<double> actual = losses(dir / "resumed" / "run");
  ASSERT_EQ(actual.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(std::abs(actual[i] - expected[3 + i]) / std::abs(expected[3 + i]), 1e-5)
        << "step " << 4 + i << ": " << actual[i] << " at 3 ranks, " << expected[3 + i] << " straight";
}

// The same shards copied to another folder (a new scratch file system) are the same corpus: the
// resume goes on, bit for bit, and says nothing.
TEST(DataResume, TheSameShardsInAnotherFolderResumeAsTheyWere) {
  ScratchDir dir("data_resume_moved");
  write_shards(dir / "data", 3, 300);
  const std::string run = "--num_training_steps 4 --save_every 2 --batch_size 2";
  auto straight = run_command(testing::trainer_launcher(1) + flags((dir / "data").string(), dir / "straight", run));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  fs::copy(dir / "data", dir / "moved");
  auto resumed = run_command(testing::trainer_launcher(1) +
                             flags((dir / "moved").string(), dir / "resumed",
                                   run + " --continue_from " + (dir / "straight" / "ckpt" / "step_2").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(mentions(resumed.output, "--data:")) << resumed.output;
  const std::vector<double> expected = losses(dir / "straight" / "run"), actual = losses(dir / "resumed" / "run");
  ASSERT_EQ(actual.size(), 2u);
  EXPECT_EQ(actual[0], expected[2]);
  EXPECT_EQ(actual[1], expected[3]);
}

// Other data is exit 2 before any step, naming the checkpoint, the difference and --allow_other_data;
// with the flag the run goes on from the checkpoint's position and says so.
TEST(DataResume, OtherDataIsRefusedNamingTheDifferenceUnlessAllowed) {
  ScratchDir dir("data_resume_other");
  write_shards(dir / "data", 3, 300);
  const std::string run = "--num_training_steps 3 --batch_size 2";
  auto trained = run_command(testing::trainer_launcher(1) +
                             flags((dir / "data").string(), dir / "a", "--num_training_steps 2 --save_every 2 --batch_size 2"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const fs::path step = dir / "a" / "ckpt" / "step_2";
  const std::string resume = run + " --continue_from " + step.string();
  auto resume_on = [&](const std::string& data, const std::string& tag, const std::string& more = "") {
    return run_command(testing::trainer_launcher(1) + flags(data, dir / tag, resume + " " + more));
  };
  const std::string refused = "the checkpoint " + step.string() + " was trained on other data than this run's (";

  write_shards(dir / "more", 4, 300);  // the same three shards and a fourth
  auto added = resume_on((dir / "more").string(), "b");
  EXPECT_EQ(added.exit_code, 2) << added.output;
  for (const std::string& part : {refused + "3 shard(s) then, 4 now (added: shard_3.tok)",
                                  std::string("pass --allow_other_data"), std::string("(4 samples consumed)")})
    EXPECT_TRUE(mentions(added.output, part)) << part << "\n" << added.output;
  EXPECT_TRUE(testing::read_metrics_events(dir / "b" / "run", "train").empty()) << "refused before any step";

  write_shards(dir / "remade", 3, 300, /*seed=*/5);  // the same names and sizes, other ids
  auto remade = resume_on((dir / "remade").string(), "c");
  EXPECT_EQ(remade.exit_code, 2) << remade.output;
  EXPECT_TRUE(mentions(remade.output, refused + "shard 1 of 3, shard_0.tok: the same size, but its first 4 KiB differ"))
      << remade.output;

  write_shards(dir / "shorter", 3, 250);
  auto shorter = resume_on((dir / "shorter").string(), "d");
  EXPECT_EQ(shorter.exit_code, 2) << shorter.output;
  EXPECT_TRUE(mentions(shorter.output, "shard 1 of 3, shard_0.tok: 300 tokens then, 250 now")) << shorter.output;

  auto synthetic = resume_on("synthetic", "e");
  EXPECT_EQ(synthetic.exit_code, 2) << synthetic.output;
  EXPECT_TRUE(mentions(synthetic.output, "it trained on token files, this run reads the synthetic corpus"))
      << synthetic.output;

  auto allowed = resume_on((dir / "more").string(), "f", "--allow_other_data");
  ASSERT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_TRUE(mentions(allowed.output, "--data: the checkpoint " + step.string() +
                                           " was trained on other data (3 shard(s) then, 4 now (added: shard_3.tok)"))
      << allowed.output;
  EXPECT_EQ(testing::read_metrics_events(dir / "f" / "run", "train").size(), 1u);
}

// In process: the first difference, in words, and none for a corpus identical but for its folder.
TEST(CorpusIdentity, NamesTheFirstDifference) {
  auto shard = [](const std::string& file, int64_t tokens, const std::string& crc = "00000001") {
    return nlohmann::json{{"file", file}, {"format", "trainer"}, {"tokens", tokens}, {"bytes", 2 * tokens + 32},
                          {"head_crc32c", crc}};
  };
  const nlohmann::json then = {{"tokens", 30}, {"shards", {shard("a.tok", 10), shard("b.tok", 20)}}, {"folders", {"/x"}}};
  nlohmann::json moved = then;
  moved["folders"] = {"/y"};
  EXPECT_EQ(identity_difference(then, moved), "");
  EXPECT_EQ(identity_difference(nlohmann::json(), then), "") << "a checkpoint from before identities";
  const nlohmann::json swapped = {{"shards", {shard("b.tok", 20), shard("a.tok", 10)}}};
  EXPECT_EQ(identity_difference(then, swapped), "shard 1 of 2, a.tok then, b.tok now (another file, or another order)");
  const nlohmann::json fewer = {{"shards", {shard("a.tok", 10)}}};
  EXPECT_EQ(identity_difference(then, fewer), "2 shard(s) then, 1 now (missing: b.tok)");
  const nlohmann::json remade = {{"shards", {shard("a.tok", 10), shard("b.tok", 20, "00000002")}}};
  EXPECT_EQ(identity_difference(then, remade), "shard 2 of 2, b.tok: the same size, but its first 4 KiB differ (made again?)");
}

}  // namespace
}  // namespace llm::data_resume_test
