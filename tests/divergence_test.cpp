// The divergence rule (trainer/divergence.h) on its own: which sequences of (loss, gradient norm)
// stop a run, after how many steps, and what the reason says.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>

#include "trainer/divergence.h"

namespace llm {
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

}  // namespace
}  // namespace llm
