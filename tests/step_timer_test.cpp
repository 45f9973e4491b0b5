// The step timer (common/step_timer.h): phases that partition a step, and on CUDA read a step late so
// the end of a step never waits for the GPU. The late reading is the same code on a CPU timer asked to
// read late (its marks are host clock readings): each step's phases come back one step later, equal
// to what the step itself measured, and flush() gives the last one.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "common/step_timer.h"

namespace llm::step_timer_test {
namespace {

PhaseSeconds run_step(StepTimer& timer, std::optional<PhaseSeconds>& returned, int forward_ms) {
  timer.begin_step();
  {
    StepTimer::Scope forward(&timer, StepPhase::forward);
    std::this_thread::sleep_for(std::chrono::milliseconds(forward_ms));
  }
  {
    StepTimer::Scope optimizer(&timer, StepPhase::optimizer);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  returned = timer.end_step();
  return timer.host_seconds();
}

TEST(StepTimer, ReadingLateGivesEachStepsPhasesOneStepLater) {
  StepTimer late(c10::Device(c10::kCPU), /*read_late=*/true);
  ASSERT_TRUE(late.reads_late());
  std::optional<PhaseSeconds> returned;
  const PhaseSeconds first = run_step(late, returned, 3);
  EXPECT_FALSE(returned.has_value()) << "nothing before the first step";
  const PhaseSeconds second = run_step(late, returned, 1);
  ASSERT_TRUE(returned.has_value());
  EXPECT_EQ(*returned, first) << "the first step's phases, as it measured them";
  EXPECT_GT((*returned)[static_cast<size_t>(StepPhase::forward)], 0.0);
  const PhaseSeconds third = run_step(late, returned, 2);
  ASSERT_TRUE(returned.has_value());
  EXPECT_EQ(*returned, second);
  const std::optional<PhaseSeconds> last = late.flush();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(*last, third) << "flush: the last step's";
  EXPECT_FALSE(late.flush().has_value()) << "each step's phases once";
}

TEST(StepTimer, ACpuTimerReadsEachStepAtItsEnd) {
  StepTimer timer(c10::Device(c10::kCPU));
  EXPECT_FALSE(timer.reads_late());
  std::optional<PhaseSeconds> returned;
  const PhaseSeconds measured = run_step(timer, returned, 1);
  ASSERT_TRUE(returned.has_value());
  EXPECT_EQ(*returned, measured);
  EXPECT_FALSE(timer.flush().has_value());
}

}  // namespace
}  // namespace llm::step_timer_test
