// One evaluation reads the same held-out sequences at every world size and micro-batch (issue 27):
// --eval_sequences (and --eval_tokens) count the whole job's sequences, so eval losses compare across
// runs; --eval_batches keeps its per-rank meaning. Through the trainer binary on CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "tests/checkpoint_test_util.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::evaluation_test {
namespace {

namespace fs = std::filesystem;
using testing::mentions;
using testing::run_command;
using testing::ScratchDir;

// One step at a learning rate too small to move any weight (1e-30 against weights of 1e-2): the
// evaluation after it sees the initial weights at every world size, so any difference in its loss
// is a difference in what it read or how it counted.
testing::CommandResult evaluate(const fs::path& run_dir, int ranks, int batch_size, const std::string& eval_flags) {
  return run_command(testing::trainer_launcher(ranks) + " --config " +
                     (testing::source_dir() / "configs/llama_micro.json").string() +
                     " --device cpu --max_length 16 --num_training_steps 1 --lr 1e-30 --warmup_steps 0 --eval_every 0"
                     " --batch_size " + std::to_string(batch_size) + " " + eval_flags + " --run_dir " + run_dir.string());
}

nlohmann::json eval_record(const fs::path& run_dir) {
  const auto records = testing::read_metrics_events(run_dir, "eval");
  return records.empty() ? nlohmann::json() : records.back();
}

// 10 sequences: one full micro-batch at 1 rank x 10; partial last micro-steps elsewhere (1 x 3: 4
// steps, the last of 1 row; 2 x 2: 3 steps, rank 1 counts none in the last; 3 x 2: 2 steps, rank 2
// counts none in the second; 4 x 1: 3 steps).
TEST(Evaluation, ReadsTheSameSequencesAtEveryWorldSizeAndMicroBatch) {
  ScratchDir dir("eval_sequences");
  ASSERT_EQ(evaluate(dir / "reference", 1, 10, "--eval_sequences 10").exit_code, 0);
  const nlohmann::json reference = eval_record(dir / "reference");
  ASSERT_TRUE(reference.is_object());
  EXPECT_EQ(reference.at("eval_tokens"), 160);
  const double want = reference.at("eval_loss");
  for (const auto& [ranks, batch] : std::vector<std::pair<int, int>>{{1, 3}, {2, 2}, {3, 2}, {4, 1}}) {
    const fs::path run_dir = dir / ("r" + std::to_string(ranks) + "b" + std::to_string(batch));
    const auto result = evaluate(run_dir, ranks, batch, "--eval_sequences 10");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const nlohmann::json record = eval_record(run_dir);
    EXPECT_EQ(record.at("eval_tokens"), 160) << ranks << " x " << batch;
    // The same per-token losses summed in another order (and averaged over ranks in fp32).
    EXPECT_NEAR(record.at("eval_loss").get<double>(), want, 2e-6 * want) << ranks << " ranks x " << batch;
  }
  // Another 10 sequences would not agree: the loss is the first 10's, not any 10's.
  ASSERT_EQ(evaluate(dir / "eleven", 1, 11, "--eval_sequences 11").exit_code, 0);
  EXPECT_GT(std::abs(eval_record(dir / "eleven").at("eval_loss").get<double>() - want), 1e-5);
}

// --eval_tokens rounds up to whole sequences: 150 tokens of 16 are the same 10 sequences.
TEST(Evaluation, TokensRoundUpToWholeSequences) {
  ScratchDir dir("eval_tokens");
  ASSERT_EQ(evaluate(dir / "sequences", 2, 3, "--eval_sequences 10").exit_code, 0);
  ASSERT_EQ(evaluate(dir / "tokens", 2, 3, "--eval_tokens 150").exit_code, 0);
  EXPECT_EQ(eval_record(dir / "tokens").at("eval_tokens"), 160);
  EXPECT_EQ(eval_record(dir / "tokens").at("eval_loss"), eval_record(dir / "sequences").at("eval_loss"));
}

// --eval_batches keeps its meaning, per rank: 2 ranks x 3 sequences x 2 micro-batches = 12 sequences.
// A job-wide count above the held-out windows reads each once, and says so.
TEST(Evaluation, EvalBatchesCountPerRankAndAJobWideCountStopsAtTheHeldOutWindows) {
  ScratchDir dir("eval_batches");
  ASSERT_EQ(evaluate(dir / "batches", 2, 3, "--eval_batches 2").exit_code, 0);
  ASSERT_EQ(evaluate(dir / "twelve", 1, 4, "--eval_sequences 12").exit_code, 0);
  EXPECT_EQ(eval_record(dir / "batches").at("eval_tokens"), 192);
  EXPECT_NEAR(eval_record(dir / "batches").at("eval_loss").get<double>(),
              eval_record(dir / "twelve").at("eval_loss").get<double>(), 2e-6);
  // 1000 tokens: 58 windows of 17, 5 % (2) held out.
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 1000; ++i) tokens.push_back((i * 37 + 11) % 128);
  write_token_file((dir / "small.tok").string(), tokens, 128);
  const auto capped = evaluate(dir / "capped", 1, 2, "--eval_sequences 64 --data " + (dir / "small.tok").string());
  ASSERT_EQ(capped.exit_code, 0) << capped.output;
  EXPECT_TRUE(mentions(capped.output, "evaluation: 64 sequences asked, the held-out split has 2: each evaluation reads all 2"))
      << capped.output;
  EXPECT_EQ(eval_record(dir / "capped").at("eval_tokens"), 32);
}

// Two ways of saying how much to evaluate is exit 2 naming both; a given 0 is refused too.
TEST(Evaluation, OneWayOfCountingAtATime) {
  ScratchDir dir("eval_flags");
  const auto both = evaluate(dir / "both", 1, 2, "--eval_sequences 10 --eval_tokens 100");
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_TRUE(mentions(both.output, "give one of --eval_sequences, --eval_tokens and --eval_batches, not "
                                    "--eval_sequences and --eval_tokens")) << both.output;
  const auto zero = evaluate(dir / "zero", 1, 2, "--eval_sequences 0");
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_TRUE(mentions(zero.output, "--eval_sequences: expected an integer >= 1 (got 0)")) << zero.output;
}

}  // namespace
}  // namespace llm::evaluation_test
