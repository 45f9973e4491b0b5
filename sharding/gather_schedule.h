// When each unit's compute parameters are gathered, prefetched and freed: the order of
// docs/sharding.md as pure bookkeeping (no tensors, no communicator), so that it can be tested on
// its own and the training loop only carries the actions out on its ShardedUnits.
//
//   forward,  u = 0 .. n-1:   before u: make u usable (gather, or wait for its prefetch), prefetch u+1
//                             after u:  full_shard releases u
//   backward, u = n-1 .. 0:   before u: make u usable, prefetch u-1
//                             after u:  full_shard and shard_grad_op release u
//   no_shard:                 every unit is always materialised; nothing is gathered or released.
//
// A unit counts as gathered from the moment its gather or prefetch is issued (its storage exists,
// even while the side stream still fills it) until it is released. Prefetching one unit ahead, and
// only after the running unit is usable, bounds full_shard at two gathered units: the running one
// and the next; one without prefetch. shard_grad_op keeps each unit from its forward to its
// backward, so its peak is every unit with or without prefetch (prefetch only changes when a unit
// arrives, not how many are held).
//
// The schedule assumes the actions it returns are carried out before the next call: each call
// both returns the actions and records their effect (ShardedModel checks the units agree).
#pragma once

#include <cstdint>
#include <vector>

#include "sharding/strategy.h"

namespace llm {

enum class GatherOp {
  gather,    // all-gather now, in line on the compute stream
  prefetch,  // start the all-gather on the gather stream (in line where there is none: CPU)
  wait,      // order the compute stream after a prefetch (no host wait)
  release,   // free the compute parameters' storage
};
const char* to_string(GatherOp op);

struct GatherAction {
  GatherOp op = GatherOp::gather;
  int64_t unit = 0;
  bool operator==(const GatherAction&) const = default;
};

class GatherSchedule {
 public:
  enum class UnitState { released, prefetching, gathered };

  GatherSchedule() = default;  // no units
  GatherSchedule(int64_t unit_count, ShardingStrategy strategy, bool prefetch);

  std::vector<GatherAction> before_forward(int64_t unit);
  std::vector<GatherAction> after_forward(int64_t unit);
  std::vector<GatherAction> before_backward(int64_t unit);
  std::vector<GatherAction> after_backward(int64_t unit);
  // After a forward that is not followed by a backward (evaluation): free whatever is gathered.
  std::vector<GatherAction> release_all();

  UnitState state(int64_t unit) const;
  bool materialised(int64_t unit) const { return state(unit) != UnitState::released; }
  int64_t gathered_units() const { return gathered_units_; }
  int64_t peak_gathered_units() const { return peak_gathered_units_; }
  int64_t inline_gathers() const { return inline_gathers_; }
  int64_t prefetches() const { return prefetches_; }

  int64_t unit_count() const { return static_cast<int64_t>(states_.size()); }
  ShardingStrategy strategy() const { return strategy_; }
  bool prefetch() const { return prefetch_; }

 private:
  void check_unit(const char* call, int64_t unit) const;
  // Gather or wait, so that `unit` can run on the compute stream.
  void make_usable(int64_t unit, std::vector<GatherAction>& actions);
  // Start `unit`'s gather ahead of time when prefetch is on and it is not gathered yet.
  void prefetch_unit(int64_t unit, std::vector<GatherAction>& actions);
  void release_unit(int64_t unit, std::vector<GatherAction>& actions);
  void set_state(int64_t unit, UnitState state);

  ShardingStrategy strategy_ = ShardingStrategy::full_shard;
  bool prefetch_ = false;
  std::vector<UnitState> states_;
  int64_t gathered_units_ = 0;
  int64_t peak_gathered_units_ = 0;
  int64_t inline_gathers_ = 0;
  int64_t prefetches_ = 0;
};

}  // namespace llm
