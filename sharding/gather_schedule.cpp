#include "sharding/gather_schedule.h"

#include <stdexcept>
#include <string>

namespace llm {

const char* to_string(GatherOp op) {
  switch (op) {
    case GatherOp::gather: return "gather";
    case GatherOp::prefetch: return "prefetch";
    case GatherOp::wait: return "wait";
    case GatherOp::release: return "release";
  }
  return "?";
}

GatherSchedule::GatherSchedule(int64_t unit_count, ShardingStrategy strategy, bool prefetch)
    : strategy_(strategy), prefetch_(prefetch) {
  if (unit_count < 0)
    throw std::invalid_argument("GatherSchedule: unit_count must be >= 0, got " +
                                std::to_string(unit_count));
  // ShardedUnit frees a sharded unit's parameters as soon as it is built; no_shard keeps them.
  const bool replicated = strategy_ == ShardingStrategy::no_shard;
  states_.assign(static_cast<size_t>(unit_count),
                 replicated ? UnitState::gathered : UnitState::released);
  gathered_units_ = replicated ? unit_count : 0;
  peak_gathered_units_ = gathered_units_;
}

std::vector<GatherAction> GatherSchedule::before_forward(int64_t unit) {
  check_unit("before_forward", unit);
  std::vector<GatherAction> actions;
  make_usable(unit, actions);
  // After make_usable: the next unit's all-gather may overlap this unit's compute, but it is never
  // issued before this one is usable (that order is what keeps full_shard at two).
  prefetch_unit(unit + 1, actions);
  return actions;
}

std::vector<GatherAction> GatherSchedule::after_forward(int64_t unit) {
  check_unit("after_forward", unit);
  std::vector<GatherAction> actions;
  if (strategy_ == ShardingStrategy::full_shard) release_unit(unit, actions);
  return actions;
}

std::vector<GatherAction> GatherSchedule::before_backward(int64_t unit) {
  check_unit("before_backward", unit);
  std::vector<GatherAction> actions;
  make_usable(unit, actions);
  prefetch_unit(unit - 1, actions);
  return actions;
}

std::vector<GatherAction> GatherSchedule::after_backward(int64_t unit) {
  check_unit("after_backward", unit);
  std::vector<GatherAction> actions;
  if (strategy_ != ShardingStrategy::no_shard) release_unit(unit, actions);
  return actions;
}

std::vector<GatherAction> GatherSchedule::release_all() {
  std::vector<GatherAction> actions;
  if (strategy_ == ShardingStrategy::no_shard) return actions;
  for (int64_t unit = 0; unit < unit_count(); ++unit) release_unit(unit, actions);
  return actions;
}

GatherSchedule::UnitState GatherSchedule::state(int64_t unit) const {
  check_unit("state", unit);
  return states_[static_cast<size_t>(unit)];
}

void GatherSchedule::check_unit(const char* call, int64_t unit) const {
  if (unit < 0 || unit >= unit_count())
    throw std::out_of_range(std::string("GatherSchedule::") + call + ": unit " +
                            std::to_string(unit) + " is not in [0, " +
                            std::to_string(unit_count()) + ")");
}

void GatherSchedule::make_usable(int64_t unit, std::vector<GatherAction>& actions) {
  switch (states_[static_cast<size_t>(unit)]) {
    case UnitState::gathered: return;
    case UnitState::prefetching: actions.push_back({GatherOp::wait, unit}); break;
    case UnitState::released:
      actions.push_back({GatherOp::gather, unit});
      ++inline_gathers_;
      break;
  }
  set_state(unit, UnitState::gathered);
}

void GatherSchedule::prefetch_unit(int64_t unit, std::vector<GatherAction>& actions) {
  if (!prefetch_ || unit < 0 || unit >= unit_count()) return;
  if (states_[static_cast<size_t>(unit)] != UnitState::released) return;
  actions.push_back({GatherOp::prefetch, unit});
  ++prefetches_;
  set_state(unit, UnitState::prefetching);
}

void GatherSchedule::release_unit(int64_t unit, std::vector<GatherAction>& actions) {
  if (states_[static_cast<size_t>(unit)] == UnitState::released) return;
  actions.push_back({GatherOp::release, unit});
  set_state(unit, UnitState::released);
}

void GatherSchedule::set_state(int64_t unit, UnitState state) {
  UnitState& current = states_[static_cast<size_t>(unit)];
  const bool was_held = current != UnitState::released, held = state != UnitState::released;
  gathered_units_ += static_cast<int64_t>(held) - static_cast<int64_t>(was_held);
  if (gathered_units_ > peak_gathered_units_) peak_gathered_units_ = gathered_units_;
  current = state;
}

}  // namespace llm
