// The divergence rule (trainer/divergence.h) on its own: which sequences of (loss, gradient norm)
// stop a run, after how many steps, and what the reason says. And, through the trainer binary, what
// a run stopped by a non-finite loss or norm says of its weights (describe_weights_at_divergence).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "trainer/divergence.h"

namespace llm::divergence_test {
namespace {

constexpr int64_t kVocab = 128;
const double kUniform = std::log(128.0);  // 4.852

void expect_mentions(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* part : parts) EXPECT_NE(text.find(part), std::string::npos) << "no '" << part << "' in: " << text;
}

TEST(DivergenceWatch, ZeroGradientNormForPatienceStepsStops) {
  DivergenceWatch watch(/*patience=*/3, /*warmup=*/5, kVocab);
  // The collapsed model of a huge learning rate: uniform loss, a norm of exactly 0, during warmup too.
  EXPECT_FALSE(watch.observe(1, kUniform, 0.0));
  EXPECT_FALSE(watch.observe(2, kUniform, 0.0));
  const std::optional<std::string> reason = watch.observe(3, kUniform, 0.0);
  ASSERT_TRUE(reason);
  expect_mentions(*reason, {"exactly 0 for the last 3 steps", "1 to 3", "ln(128) = 4.85", "collapsed"});
}

TEST(DivergenceWatch, ANonzeroNormStartsTheCountAgain) {
  DivergenceWatch watch(3, 0, kVocab);
  EXPECT_FALSE(watch.observe(1, 2.0, 0.0));
  EXPECT_FALSE(watch.observe(2, 2.0, 0.0));
  EXPECT_FALSE(watch.observe(3, 2.0, 1e-30)) << "any nonzero norm is a live gradient";
  EXPECT_FALSE(watch.observe(4, 2.0, 0.0));
  EXPECT_FALSE(watch.observe(5, 2.0, 0.0));
  EXPECT_TRUE(watch.observe(6, 2.0, 0.0));
}

TEST(DivergenceWatch, LossAboveUniformPlusOneAfterWarmupStops) {
  DivergenceWatch watch(4, /*warmup=*/3, kVocab);
  EXPECT_DOUBLE_EQ(watch.loss_ceiling(), kUniform + 1.0);
  // During warmup a loss spike does not count.
  for (int64_t step = 1; step <= 3; ++step) EXPECT_FALSE(watch.observe(step, 1e4, 50.0)) << step;
  EXPECT_FALSE(watch.observe(4, 1e4, 50.0));
  EXPECT_FALSE(watch.observe(5, kUniform + 1.0, 50.0)) << "at the ceiling counts";
  EXPECT_FALSE(watch.observe(6, 300.0, 50.0));
  const std::optional<std::string> reason = watch.observe(7, 250.0, 50.0);
  ASSERT_TRUE(reason);
  expect_mentions(*reason, {"at or above ln(128) + 1 = 5.85", "last 4 steps after warmup", "4 to 7", "now 250"});
}

TEST(DivergenceWatch, ARecoveredLossOrAFreshModelNeverStops) {
  DivergenceWatch watch(3, 0, kVocab);
  // A spike that comes back below the ceiling within the patience.
  EXPECT_FALSE(watch.observe(1, 40.0, 9.0));
  EXPECT_FALSE(watch.observe(2, 40.0, 9.0));
  EXPECT_FALSE(watch.observe(3, kUniform + 0.99, 9.0));
  EXPECT_FALSE(watch.observe(4, 40.0, 9.0));
  EXPECT_FALSE(watch.observe(5, 40.0, 9.0));
  // A model that does not learn (a tiny lr) sits just above ln(vocab): below the ceiling.
  for (int64_t step = 6; step < 100; ++step) EXPECT_FALSE(watch.observe(step, kUniform + 0.05, 0.8));
}

TEST(DivergenceWatch, PatienceZeroTurnsItOff) {
  DivergenceWatch watch(0, 0, kVocab);
  for (int64_t step = 1; step < 50; ++step) EXPECT_FALSE(watch.observe(step, 1e6, 0.0));
}

// llama_micro with another initializer_range, trained for 2 steps: a run that stops at step 1 (exit 3).
testing::CommandResult run_with_initializer_range(const testing::ScratchDir& dir, double range) {
  std::ifstream in(testing::source_dir() / "configs/llama_micro.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["initializer_range"] = range;
  std::ofstream(dir / "config.json") << config.dump();
  return testing::run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                              (dir / "config.json").string() +
                              " --device cpu --warmup_steps 1 --batch_size 2 --max_length 16 --eval_every 0 "
                              "--num_training_steps 2 --run_dir " + (dir / "run").string());
}

// initializer_range 1e39 is inf in float32: every initialized weight is inf. The message names the
// first parameter holding one, and says that the weights, not --lr, are the cause (before: only
// "Lower --lr").
TEST(NonFiniteLoss, NamesTheFirstNonFiniteWeightTensor) {
  testing::ScratchDir dir("divergence_inf_init");
  const testing::CommandResult result = run_with_initializer_range(dir, 1e39);
  EXPECT_EQ(result.exit_code, 3) << result.output;
  expect_mentions(result.output, {"step 1: the loss is", "The weights were not finite before this step's update: "
                                  "model.embed_tokens.weight holds", "NaN or inf value(s)",
                                  "check initializer_range in --config", "which the flags named next cannot fix"});
}

// initializer_range 1e30: finite weights whose products overflow float32. The message names the
// largest weight and where it is.
TEST(NonFiniteLoss, NamesAnOutOfRangeWeightWhenAllAreFinite) {
  testing::ScratchDir dir("divergence_huge_init");
  const testing::CommandResult result = run_with_initializer_range(dir, 1e30);
  EXPECT_EQ(result.exit_code, 3) << result.output;
  expect_mentions(result.output, {"Every weight is finite, but the largest |weight| is ", "e+30, in ",
                                  "overflow float32 in the forward whatever the learning rate",
                                  "check initializer_range in --config, typically 0.02"});
}

}  // namespace
}  // namespace llm::divergence_test
