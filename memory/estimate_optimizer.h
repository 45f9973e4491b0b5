// The estimate's optimizer-side bytes per unit (memory/estimate_simulation.cpp replays the step with
// them): the state, what offload's modes add (a speculative step's second set, the device step's
// windows, GaLore's device projectors) and one unit's step's temporaries.
#pragma once

#include <cstdint>
#include <vector>

#include "model/units.h"
#include "optim/optimizer_settings.h"
#include "optim/update_rules.h"
#include "sharding/flat_layout.h"

namespace llm {

// One unit as this rank holds it: the layout the runtime builds (sharding/flat_layout.h) and the
// rules the optimizer gives its parameters.
struct UnitGeometry {
  const UnitSpec* spec = nullptr;
  FlatShardLayout layout;        // this rank's rows of each parameter
  FlatShardLayout whole;         // the unsharded layout (a checkpoint's full tensors)
  std::vector<UpdateRule> rules;
  int64_t first_galore = 0;      // the model-wide index of the unit's first GaLore matrix
  int64_t numel = 0;             // P_u
  std::vector<int64_t> compute_numels;  // each parameter's module tensor (with the compute side's pads)
  int64_t compute_numel = 0;            // their sum: a gathered copy, the full gradients
  int64_t shard_numel = 0;       // S_u, padded rows
  int64_t gathered_numel = 0;    // world x S_u: the all-gather / reduce-scatter buffer
  int64_t backward_numel = 0;    // --backward_gather_size R: this rank's rows over its node (0: off)
};

// The state this rank holds for the units (ShardOptimizer::state_bytes).
int64_t estimate_optimizer_state(const std::vector<UnitGeometry>& units, const OptimizerSettings& settings, int world);
// Each unit's master and state (4 S_u + its state): the sum over the units whose step is not
// collective (a speculative step's second set), or the largest (one device step window).
int64_t estimate_masters_and_state(const std::vector<UnitGeometry>& units, const OptimizerSettings& settings, int world,
                                   bool largest);
// Whether the unit's step sums across ranks (ShardOptimizer::unit_needs_collectives).
bool unit_step_is_collective(const UnitGeometry& unit, int world);
// The unit's GaLore projectors, as this rank holds them (offload's device copies of them).
int64_t estimate_galore_projectors(const UnitGeometry& unit, const OptimizerSettings& settings, int world, int shard_rank);
// One unit's optimizer step's own temporaries (optim/update_rules.cpp; AdamW's fused kernel has
// none), and GaLore's projector refresh before them. They are gone before the next unit's step.
int64_t estimate_optimizer_transient(const UnitGeometry& unit, const OptimizerSettings& settings, int world,
                                     int shard_rank);

}  // namespace llm
