#include "sharding/step_plan.h"

namespace llm {

const char* to_string(UnitOp op) {
  switch (op) {
    case UnitOp::gather: return "gather";
    case UnitOp::prefetch: return "prefetch";
    case UnitOp::wait: return "wait";
    case UnitOp::release: return "release";
    case UnitOp::forward: return "forward";
    case UnitOp::recompute: return "recompute";
    case UnitOp::backward: return "backward";
    case UnitOp::reduce_gradients: return "reduce_gradients";
    case UnitOp::optimizer_step: return "optimizer_step";
  }
  return "?";
}

StepPlan::StepPlan(int64_t unit_count, ShardingStrategy strategy, bool prefetch)
    : gathers_(unit_count, strategy, prefetch) {}

void StepPlan::append(std::vector<UnitAction>& actions, const std::vector<GatherAction>& gathers) {
  // What each action does to the count of gathered units.
  auto change = [](GatherOp op) { return op == GatherOp::release ? -1 : op == GatherOp::wait ? 0 : 1; };
  // The schedule has already counted the whole batch: step back to the count before it, then forward.
  int64_t gathered = gathers_.gathered_units();
  for (const GatherAction& gather : gathers) gathered -= change(gather.op);
  for (const GatherAction& gather : gathers) {
    gathered += change(gather.op);
    UnitOp op = UnitOp::gather;
    switch (gather.op) {
      case GatherOp::gather: op = UnitOp::gather; break;
      case GatherOp::prefetch: op = UnitOp::prefetch; break;
      case GatherOp::wait: op = UnitOp::wait; break;
      case GatherOp::release: op = UnitOp::release; break;
    }
    actions.push_back({op, gather.unit, gathered});
  }
}

std::vector<UnitAction> StepPlan::forward_pass() {
  std::vector<UnitAction> actions;
  for (int64_t u = 0; u < unit_count(); ++u) {
    append(actions, gathers_.before_forward(u));  // gather u, prefetch u + 1
    actions.push_back({UnitOp::forward, u});
    append(actions, gathers_.after_forward(u));   // full_shard: release u
  }
  return actions;
}

std::vector<UnitAction> StepPlan::backward_pass(bool reduce) {
  std::vector<UnitAction> actions;
  for (int64_t u = unit_count(); u-- > 0;) {
    append(actions, gathers_.before_backward(u));  // gather u, prefetch u - 1
    if (recomputed(u)) actions.push_back({UnitOp::recompute, u});
    actions.push_back({UnitOp::backward, u});
    if (reduce) actions.push_back({UnitOp::reduce_gradients, u});
    append(actions, gathers_.after_backward(u));   // release u
  }
  return actions;
}

std::vector<UnitAction> StepPlan::optimizer_pass() const {
  std::vector<UnitAction> actions;
  for (int64_t u = 0; u < unit_count(); ++u) actions.push_back({UnitOp::optimizer_step, u});
  return actions;
}

std::vector<UnitAction> StepPlan::release_all() {
  std::vector<UnitAction> actions;
  append(actions, gathers_.release_all());
  return actions;
}

}  // namespace llm
