// A rank slower than the others, watched at each logged step: in a synchronous job every rank's step
// takes the same time (the fast ones wait inside the collectives for the slow one), so what tells the
// slow rank apart is its compute time, the step's span less the time it spent inside the model's
// collectives (Communicator::take_traffic). A rank whose compute time stays above the others' (its
// median over the last logged steps) is named in the log and in the step record, as users of
// multi-node trainers ask (a slow rank nobody can find: pytorch RFC 71303).
#pragma once

#include <deque>
#include <optional>
#include <vector>

#include "sharding/communicator.h"

namespace llm {

struct Straggler {
  int rank = -1;
  double compute_seconds = 0;  // its median compute time over the window
  double median_seconds = 0;   // the median of the other ranks' medians
};

// A rank's compute time is a straggler's above this many times the others' (and at least 1 ms above).
constexpr double kStragglerRatio = 1.25;
// Over this many logged steps, and named from the third: one slow step (a page fault, a checkpoint's
// host copy, the scheduler on a shared node) is not a straggler.
constexpr size_t kStragglerWindow = 5;
constexpr size_t kStragglerMinSteps = 3;

class StragglerWatch {
 public:
  // Collective over `communicator`, every rank at the same steps: gathers each rank's compute seconds
  // for this step; returns the rank whose median over the window is above kStragglerRatio times the
  // median of the others' medians, else none. The same answer on every rank.
  std::optional<Straggler> observe(Communicator& communicator, double compute_seconds);

 private:
  std::deque<std::vector<double>> window_;  // per logged step, every rank's compute seconds
};

}  // namespace llm
