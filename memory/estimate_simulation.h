// The memory estimate's simulation of one rank's step (memory/estimate.h), shared by its files:
// the timeline the step's tensor lifetimes are replayed on (Timeline, recorded as a tape of
// TimelineOps for deep models: estimate_timeline.h), the sizes of those tensors (ModelShape:
// estimate_shapes.h), and the two ways of running the step:
//   estimate_simulation.cpp     simulate_layers: the step unit by unit, as the trainer runs it
//   estimate_extrapolation.cpp  simulate_rank: that, or for a deep model the step of its identical
//                               layers extrapolated from three small simulations
//   estimate.cpp                estimate_memory: each rank's phases into its RankEstimate
// Internal to the estimate: everything else reads memory/estimate.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "memory/categories.h"
#include "memory/estimate.h"
#include "memory/estimate_shapes.h"
#include "memory/estimate_timeline.h"
#include "model/units.h"

namespace llm {

// What a rank's simulation gives beside its timeline.
struct RankTotals {
  int64_t offload_host = 0, offload_pinned = 0;  // --offload optimizer's host memory
  bool async_save = false;                         // this rank keeps --async_save's host copy
  int64_t async_save_bytes = 0;
  int64_t gathered_units = 0;                      // the gather schedule's peak
};

// One rank's step: its phases (the windows closed at its points) and its totals.
struct SimulatedRank {
  std::vector<PhaseEstimate> phases;
  RankTotals totals;
};

// The step of `model` with `layers` decoder layers, simulated unit by unit (estimate_simulation.cpp).
// With a `tape`, every timeline operation is recorded to it and the phases are left empty.
SimulatedRank simulate_layers(const ModelShape& shape, const ModelConfig& model, int64_t layers, int world, int rank,
                              bool cuda, std::vector<TimelineOp>* tape);

// One rank's step: simulated unit by unit, or for a deep model extrapolated from a few layers
// (estimate_extrapolation.cpp).
SimulatedRank simulate_rank(const ModelShape& shape, const ModelConfig& model, const EstimateOptions& options, int rank,
                            bool cuda);

}  // namespace llm
