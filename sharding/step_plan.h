// The order of one training step, unit by unit, as a list of actions: the one statement of "what
// happens to which unit when" that both the runtime (sharding/sharded_model.h executes it) and the
// memory estimate (memory/estimate_simulation.cpp replays it, counting bytes instead of moving them)
// read. A feature that acts per unit (offload's copies, recomputation for activation
// checkpointing, an optimizer step fused into backward) adds its action here once, and each of the
// two then says what the action does: run it, or count it.
//
//   forward pass,  u = 0 .. n-1:  [gather u | wait u] [prefetch u+1] forward u [release u: full_shard]
//   backward pass, u = n-1 .. 0:  [gather u | wait u] [prefetch u-1] [recompute u: checkpointed]
//                                 backward u
//                                 [reduce_gradients u: the last micro-batch of a step] [release u]
//
// Activation checkpointing: a recomputed unit's training forward keeps no autograd graph (nothing
// but its input, the boundary the previous unit's output already is, and its output); its backward
// first runs its forward again from that input, with the graph, after the gather the backward needs
// anyway (full_shard gathers again; shard_grad_op and resident units still hold the parameters).
//   optimizer pass, u = 0 .. n-1: optimizer_step u
//
// The gather actions come from the GatherSchedule (sharding/gather_schedule.h), which tracks which
// units are gathered between calls; like it, the plan assumes each list is carried out, in full,
// before the next is asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "sharding/gather_schedule.h"
#include "sharding/strategy.h"

namespace llm {

enum class UnitOp {
  gather,            // all-gather the unit's compute shard into its parameters, now
  prefetch,          // the same, started on the gather stream (in line where there is none)
  wait,              // order the compute stream after the unit's prefetch
  release,           // free the unit's gathered parameters
  forward,           // run the unit's forward
  recompute,         // activation checkpointing: run the unit's forward again, with its graph
  backward,          // run the unit's part of the backward
  reduce_gradients,  // full gradients -> the unit's gradient shard (its "gradient shard ready")
  optimizer_step,    // update the unit's master shard from its gradient shard
};
const char* to_string(UnitOp op);

struct UnitAction {
  UnitOp op = UnitOp::forward;
  int64_t unit = 0;
  // Gather actions: how many units the plan counts as gathered once this one is done (a list is
  // made a whole pass ahead, so the executor checks itself against this, not the schedule's state).
  int64_t gathered_units = 0;
  bool operator==(const UnitAction&) const = default;
};

class StepPlan {
 public:
  StepPlan() = default;  // no units
  StepPlan(int64_t unit_count, ShardingStrategy strategy, bool prefetch);

  // Every unit's forward, with the gathers around it (training and evaluation alike).
  std::vector<UnitAction> forward_pass();
  // Every unit's backward in reverse order; reduce: this micro-batch ends the step, so each unit's
  // gradients are reduced into its shard as soon as its backward is done.
  std::vector<UnitAction> backward_pass(bool reduce);
  // Every unit's optimizer step.
  std::vector<UnitAction> optimizer_pass() const;
  // After a forward that no backward follows (evaluation): free whatever is gathered.
  std::vector<UnitAction> release_all();

  // Activation checkpointing: which units' backward recomputes their forward (one flag per unit;
  // fewer flags than units: the rest are not recomputed).
  void set_recomputed(std::vector<bool> units) { recomputed_ = std::move(units); }
  bool recomputed(int64_t unit) const {
    return unit >= 0 && static_cast<size_t>(unit) < recomputed_.size() && recomputed_[static_cast<size_t>(unit)];
  }

  int64_t unit_count() const { return gathers_.unit_count(); }
  const GatherSchedule& gathers() const { return gathers_; }

 private:
  void append(std::vector<UnitAction>& actions, const std::vector<GatherAction>& gathers);

  GatherSchedule gathers_;
  std::vector<bool> recomputed_;
};

}  // namespace llm
