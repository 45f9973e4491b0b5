#include "trainer/preemption.h"

#include <time.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>

#include "sharding/communicator.h"
#include "common/errors.h"

namespace llm {
namespace {

// SIGHUP too: the terminal or ssh session of an interactive run went away, and launch/mpirun.sh treats
// it as a preemption; its default action ended a run without saving (exit 129).
constexpr std::array<int, 4> kPreemptionSignals = {SIGINT, SIGUSR1, SIGHUP, SIGTERM};
std::atomic<int> received_signal{0};
std::atomic<int64_t> received_at_ns{0};  // CLOCK_MONOTONIC when the first signal came
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

extern "C" void record_preemption_signal(int signal) {
  int none = 0;
  if (received_signal.compare_exchange_strong(none, signal)) {  // the first one counts
    received_at_ns.store(monotonic_ns());
    return;
  }
  // A second Ctrl-C at a terminal means "stop now": end at once (write and _exit are async-signal-safe).
  // A second SIGTERM, SIGUSR1 or SIGHUP (a scheduler repeating its notice) changes nothing.
  if (signal == SIGINT) {
    static const char message[] = "\nsecond SIGINT: stopping at once, without waiting for the step or the save\n";
    const ssize_t ignored = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    (void)ignored;
    ::_exit(128 + SIGINT);
  }
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction action = {};
  action.sa_handler = record_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a rank waiting in a collective or a write carries on
  for (int signal : kPreemptionSignals) sigaction(signal, &action, nullptr);
}

void restore_default_signal_actions() {
  for (int signal : kPreemptionSignals) std::signal(signal, SIG_DFL);
  if (const int received = received_signal.load(); received != 0) std::raise(received);
}

void start_preemption_deadline(double grace_seconds) {
  if (!(grace_seconds > 0)) return;
  static std::once_flag started;
  std::call_once(started, [grace_seconds] {
    std::thread([grace_seconds] {
      const auto grace_ns = static_cast<int64_t>(grace_seconds * 1e9);
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const int signal = received_signal.load();
        const int64_t at = received_at_ns.load();
        if (signal == 0 || at == 0 || monotonic_ns() - at < grace_ns) continue;
        std::fprintf(stderr,
                     "[rank %d] error: preempted by %s, and the step and its checkpoint did not finish within "
                     "--preemption_grace_seconds %g: ending now (exit status %d) before the job is killed. A "
                     "checkpoint being written is not completed (its step_<N>.tmp folder is not a checkpoint); "
                     "the newest complete step_<N> folder is the one to resume from\n",
                     process_identity().rank, signal_name(signal), grace_seconds, 128 + signal);
        std::fflush(stderr);
        std::fflush(stdout);
        std::_Exit(128 + signal);
      }
    }).detach();
  });
}

int preemption_signal_received() { return received_signal.load(); }

int preemption_agreed(Communicator& communicator, bool* written, bool* write_failed, bool* time_up) {
  const int mine = preemption_signal_received();
  // One slot per signal, summed over ranks: which signals any rank has seen; then, with `written`,
  // how many ranks have not written their files yet; with `write_failed`, how many could not write a
  // run file; with `time_up`, how many found --max_runtime reached.
  const int64_t signals = static_cast<int64_t>(kPreemptionSignals.size());
  const int64_t written_slot = signals;
  const int64_t failed_slot = written_slot + (written ? 1 : 0);
  const int64_t time_slot = failed_slot + (write_failed ? 1 : 0);
  at::Tensor seen = at::zeros({time_slot + (time_up ? 1 : 0)}, at::kLong);
  for (size_t i = 0; i < kPreemptionSignals.size(); ++i)
    if (mine == kPreemptionSignals[i]) seen[static_cast<int64_t>(i)] = 1;
  if (written) seen[written_slot] = *written ? 0 : 1;
  if (write_failed) seen[failed_slot] = *write_failed ? 1 : 0;
  if (time_up) seen[time_slot] = *time_up ? 1 : 0;
  if (communicator.world_size() > 1) {
    seen = seen.to(communicator.device());
    communicator.all_reduce(seen, ReduceOp::sum);
    seen = seen.to(at::kCPU);
  }
  if (written) *written = seen[written_slot].item<int64_t>() == 0;
  if (write_failed) *write_failed = seen[failed_slot].item<int64_t>() != 0;
  if (time_up) *time_up = seen[time_slot].item<int64_t>() != 0;
  for (size_t i = 0; i < kPreemptionSignals.size(); ++i)
    if (seen[static_cast<int64_t>(i)].item<int64_t>() > 0) return kPreemptionSignals[i];
  return 0;
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

}  // namespace llm
