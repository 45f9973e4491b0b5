// The learning-rate schedule against its closed form (trainer/schedule.h documents it).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "trainer/schedule.h"

namespace llm::schedule_test {
namespace {

TEST(Schedule, WarmupIsLinearFromTheFirstStep) {
  // Update 1 already learns (GaLore's first update runs at lr 0; ours does not).
  EXPECT_DOUBLE_EQ(lr_multiplier(Scheduler::cosine, 1, 10, 100, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(lr_multiplier(Scheduler::cosine, 5, 10, 100, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(lr_multiplier(Scheduler::linear, 10, 10, 100, 0.1), 1.0);
}

TEST(Schedule, CosineEndsAtMinRatioAndPassesHalfwayAtTheMidpoint) {
  EXPECT_NEAR(lr_multiplier(Scheduler::cosine, 100, 10, 100, 0.1), 0.1, 1e-12);
  EXPECT_NEAR(lr_multiplier(Scheduler::cosine, 55, 10, 100, 0.1), 0.55, 1e-12);
  const double at_20 = 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 10.0 / 90.0));
  EXPECT_NEAR(lr_multiplier(Scheduler::cosine, 20, 10, 100, 0.1), at_20, 1e-12);
}

TEST(Schedule, LinearAndConstant) {
  EXPECT_NEAR(lr_multiplier(Scheduler::linear, 55, 10, 100, 0.0), 0.5, 1e-12);
  EXPECT_NEAR(lr_multiplier(Scheduler::linear, 100, 10, 100, 0.2), 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(lr_multiplier(Scheduler::constant, 77, 10, 100, 0.1), 1.0);
}

TEST(Schedule, NoWarmup) {
  EXPECT_NEAR(lr_multiplier(Scheduler::cosine, 1, 0, 100, 0.0),
              0.5 * (1 + std::cos(std::numbers::pi * 0.01)), 1e-12);
}

}  // namespace
}  // namespace llm::schedule_test
