// The step timer (common/step_timer.h): phases that partition a step, and on CUDA read a step late so
// the end of a step never waits for the GPU. The late reading is the same code on a CPU timer asked to
// read late (its marks are host clock readings): each step's phases come back one step later, and
// flush() gives the last one. Each step's phases are checked against the test's own clock (issue 52:
// before, against the timer's own reading of the same marks): a phase is at least the time the test
// slept in it, and the phases together at most the span the test measured around the step.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "common/step_timer.h"

namespace llm::step_timer_test {
namespace {

// What the test measured of a step: the forward phase slept forward_ms, the optimizer 1 ms, and the
// whole step, from before begin_step to after end_step, took `total` seconds by the test's clock.
struct Span {
  double forward_slept = 0, optimizer_slept = 0.001, total = 0;
};

Span run_step(StepTimer& timer, std::optional<PhaseSeconds>& returned, int forward_ms) {
  const auto started = std::chrono::steady_clock::now();
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
  Span span;
  span.forward_slept = forward_ms / 1000.0;
  span.total = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return span;
}

// A step's phases against the test's clock (sleep_for sleeps at least its time; the timer's marks lie
// inside the test's span of the step).
void expect_phases_of(const PhaseSeconds& phases, const Span& span, const char* which) {
  double sum = 0;
  for (double seconds : phases) sum += seconds;
  EXPECT_GE(phases[static_cast<size_t>(StepPhase::forward)], span.forward_slept) << which;
  EXPECT_GE(phases[static_cast<size_t>(StepPhase::optimizer)], span.optimizer_slept) << which;
  EXPECT_LE(sum, span.total) << which;
}

TEST(StepTimer, ReadingLateGivesEachStepsPhasesOneStepLater) {
  StepTimer late(c10::Device(c10::kCPU), /*read_late=*/true);
  ASSERT_TRUE(late.reads_late());
  std::optional<PhaseSeconds> returned;
  const Span first = run_step(late, returned, 50);
  EXPECT_FALSE(returned.has_value()) << "nothing before the first step";
  const Span second = run_step(late, returned, 0);
  ASSERT_TRUE(returned.has_value());
  // The first step's 50 ms forward, returned at the second step's end (whose own forward slept 0 ms:
  // the second step's phases returned here would fail it).
  expect_phases_of(*returned, first, "step 1, read at step 2");
  const Span third = run_step(late, returned, 0);
  ASSERT_TRUE(returned.has_value());
  expect_phases_of(*returned, second, "step 2, read at step 3");
  EXPECT_LT((*returned)[static_cast<size_t>(StepPhase::forward)], first.forward_slept) << "not step 1's again";
  const std::optional<PhaseSeconds> last = late.flush();
  ASSERT_TRUE(last.has_value());
  expect_phases_of(*last, third, "flush: step 3");
  EXPECT_FALSE(late.flush().has_value()) << "each step's phases once";
}

TEST(StepTimer, ACpuTimerReadsEachStepAtItsEnd) {
  StepTimer timer(c10::Device(c10::kCPU));
  EXPECT_FALSE(timer.reads_late());
  std::optional<PhaseSeconds> returned;
  const Span measured = run_step(timer, returned, 20);
  ASSERT_TRUE(returned.has_value());
  expect_phases_of(*returned, measured, "step 1");
  EXPECT_EQ(*returned, timer.host_seconds()) << "a CPU rank's phases are its host clock's";
  EXPECT_FALSE(timer.flush().has_value());
}

}  // namespace
}  // namespace llm::step_timer_test
