#include "trainer/preemption.h"

#include <unistd.h>

#include <csignal>

#include <array>
#include <atomic>

#include <ATen/ATen.h>

#include "sharding/communicator.h"

namespace llm {
namespace {

constexpr std::array<int, 3> kPreemptionSignals = {SIGINT, SIGUSR1, SIGTERM};
std::atomic<int> received_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free atomic");

extern "C" void record_preemption_signal(int signal) {
  int none = 0;
  if (received_signal.compare_exchange_strong(none, signal)) return;  // the first one counts
  // A second Ctrl-C at a terminal means "stop now": end at once (write and _exit are async-signal-safe).
  // A second SIGTERM or SIGUSR1 (a scheduler repeating its notice) changes nothing.
  if (signal == SIGINT) {
    static const char message[] = "\nsecond SIGINT: stopping at once, without waiting for the step or the save\n";
    const ssize_t ignored = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    (void)ignored;
    ::_exit(128 + SIGINT);
  }
}

}  // namespace

void install_preemption_handlers() {
  static const bool installed = [] {
    struct sigaction action = {};
    action.sa_handler = record_preemption_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a rank waiting in a collective or a write carries on
    for (int signal : kPreemptionSignals) sigaction(signal, &action, nullptr);
    return true;
  }();
  (void)installed;
}

int preemption_signal_received() { return received_signal.load(); }

int preemption_agreed(Communicator& communicator) {
  const int mine = preemption_signal_received();
  // One slot per signal, summed over ranks: which signals any rank has seen.
  at::Tensor seen = at::zeros({static_cast<int64_t>(kPreemptionSignals.size())}, at::kLong);
  for (size_t i = 0; i < kPreemptionSignals.size(); ++i)
    if (mine == kPreemptionSignals[i]) seen[static_cast<int64_t>(i)] = 1;
  if (communicator.world_size() > 1) {
    seen = seen.to(communicator.device());
    communicator.all_reduce(seen, ReduceOp::sum);
    seen = seen.to(at::kCPU);
  }
  for (size_t i = 0; i < kPreemptionSignals.size(); ++i)
    if (seen[static_cast<int64_t>(i)].item<int64_t>() > 0) return kPreemptionSignals[i];
  return 0;
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace llm
