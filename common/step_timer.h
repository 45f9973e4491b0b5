// Where a training step's time goes: forward, backward, collectives, optimizer, and the rest (data,
// logging). One clock per rank that the step switches between phases as it runs, so the phases
// partition the step and add up to its time.
//
// On a CPU rank a switch reads the steady clock. On a CUDA rank a switch records an event on the
// current (compute) stream, and the intervals are read a step late: end_step() returns the step
// before's phases, whose events the stream has long passed (the step's own loss read waited for
// them), so reading them never waits for the GPU and the host goes on queuing the next step's work
// while the optimizer's kernels still run; flush() reads the last step's. Each phase is the time the
// compute stream spent in it, with no host synchronisation inside the step or at its end. An all-gather prefetched on the gather stream overlaps compute and shows only as the wait it
// causes (under collectives): the exposed communication, which is what a user can act on.
//
// The host clock is read at every switch on a CUDA rank too (host_seconds()): the stream's phases
// do not show what the host does beside the stream (offload's host step, its waits, a read that
// drains the queue), and the two side by side say whether a step is bound by the GPU or the host.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <c10/core/Device.h>

namespace llm {

// Wall-clock seconds since `started` (the host's steady clock).
inline double seconds_since(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

enum class StepPhase { forward, backward, collectives, optimizer, other };
constexpr int kStepPhases = 5;
const char* to_string(StepPhase phase);

using PhaseSeconds = std::array<double, kStepPhases>;

class StepTimer {
 public:
  // read_late: the phases a step late (default: on CUDA; a CPU timer reads late only when asked, for tests).
  explicit StepTimer(c10::Device device);
  StepTimer(c10::Device device, bool read_late);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  void begin_step();  // the step starts, in phase "other"
  // Time from now on counts to `phase`; returns the phase it counted to until now. Outside a step
  // (evaluation, checkpoints) switches are ignored.
  StepPhase switch_to(StepPhase phase);
  // Seconds per phase of the step that ended (the compute stream's on CUDA), or, reading late, of the
  // step before it (nothing after the first step).
  std::optional<PhaseSeconds> end_step();
  // Reading late: the last ended step's phases, not yet returned (waits for its events); then nothing.
  std::optional<PhaseSeconds> flush();
  bool reads_late() const { return read_late_; }
  // The last ended step's phases by the host clock (the same as end_step()'s on a CPU rank).
  const PhaseSeconds& host_seconds() const { return host_seconds_; }

  // Counts to `phase` until the scope ends, then to the phase before.
  class Scope {
   public:
    Scope(StepTimer* timer, StepPhase phase) : timer_(timer), previous_(timer ? timer->switch_to(phase) : phase) {}
    ~Scope() {
      if (timer_) timer_->switch_to(previous_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepTimer* timer_;
    StepPhase previous_;
  };

 private:
  struct Marks;  // the clock readings or CUDA events of the step (step_timer.cpp)
  PhaseSeconds read(const Marks& marks) const;  // the intervals between a step's marks
  c10::Device device_;
  bool read_late_ = false;
  bool in_step_ = false;
  StepPhase current_ = StepPhase::other;
  std::unique_ptr<Marks> marks_;    // the step being timed
  std::unique_ptr<Marks> pending_;  // reading late: the last ended step's, not yet read
  PhaseSeconds host_seconds_{};
};

}  // namespace llm
