#include "common/step_timer.h"

#include <chrono>

#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace llm {

const char* to_string(StepPhase phase) {
  switch (phase) {
    case StepPhase::forward: return "forward";
    case StepPhase::backward: return "backward";
    case StepPhase::collectives: return "collectives";
    case StepPhase::optimizer: return "optimizer";
    case StepPhase::other: return "other";
  }
  return "?";
}

// Each mark opens `phase` at a point in time: a host clock reading, or (CUDA) an event recorded on
// the compute stream. Events are kept between steps and reused.
struct StepTimer::Marks {
  std::vector<StepPhase> phases;
  std::vector<std::chrono::steady_clock::time_point> host;
#ifdef TRAINER_HAVE_CUDA
  std::vector<std::unique_ptr<c10::cuda::CUDAEvent>> events;
#endif
  size_t count = 0;
};

StepTimer::StepTimer(c10::Device device) : StepTimer(device, device.is_cuda()) {}
StepTimer::StepTimer(c10::Device device, bool read_late)
    : device_(device), read_late_(read_late), marks_(std::make_unique<Marks>()) {}
StepTimer::~StepTimer() = default;

void StepTimer::begin_step() {
  marks_->count = 0;
  in_step_ = true;
  current_ = StepPhase::other;
  switch_to(StepPhase::other);
}

StepPhase StepTimer::switch_to(StepPhase phase) {
  const StepPhase previous = current_;
  if (!in_step_) return previous;
  current_ = phase;
  Marks& marks = *marks_;
  const size_t index = marks.count++;
  if (marks.phases.size() <= index) {
    marks.phases.resize(index + 1);
    marks.host.resize(index + 1);
  }
  marks.phases[index] = phase;
  marks.host[index] = std::chrono::steady_clock::now();
#ifdef TRAINER_HAVE_CUDA
  if (device_.is_cuda()) {
    if (marks.events.size() <= index)
      marks.events.push_back(std::make_unique<c10::cuda::CUDAEvent>(cudaEventDefault));  // timing on
    marks.events[index]->record(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
#endif
  return previous;
}

namespace {

// The host clock's intervals between a step's marks, by phase.
template <typename Marks>
PhaseSeconds host_phases(const Marks& marks) {
  PhaseSeconds seconds{};
  for (size_t i = 0; i + 1 < marks.count; ++i)
    seconds[static_cast<size_t>(marks.phases[i])] +=
        std::chrono::duration<double>(marks.host[i + 1] - marks.host[i]).count();
  return seconds;
}

}  // namespace

std::optional<PhaseSeconds> StepTimer::end_step() {
  switch_to(StepPhase::other);  // the closing mark
  in_step_ = false;
  const Marks& marks = *marks_;
  host_seconds_ = host_phases(marks);
  if (!read_late_) return read(marks);
  std::optional<PhaseSeconds> before = flush();
  // This step's marks wait; the step before's (read) are reused for the next.
  if (!pending_) pending_ = std::make_unique<Marks>();
  std::swap(marks_, pending_);
  return before;
}

std::optional<PhaseSeconds> StepTimer::flush() {
  if (!pending_ || pending_->count == 0) return std::nullopt;
  const PhaseSeconds seconds = read(*pending_);
  pending_->count = 0;
  return seconds;
}

PhaseSeconds StepTimer::read(const Marks& marks) const {
#ifdef TRAINER_HAVE_CUDA
  if (device_.is_cuda()) {
    PhaseSeconds seconds{};
    marks.events[marks.count - 1]->synchronize();  // reading late: long done
    for (size_t i = 0; i + 1 < marks.count; ++i)
      seconds[static_cast<size_t>(marks.phases[i])] += marks.events[i]->elapsed_time(*marks.events[i + 1]) / 1000.0;
    return seconds;
  }
#endif
  return host_phases(marks);
}

}  // namespace llm
