// GatherSchedule (sharding/gather_schedule.h): the exact order of gathers, prefetches, waits and
// releases for each strategy, with and without prefetch, and the number of units gathered at any
// moment: at most two for full_shard with prefetch, one without; every unit for shard_grad_op (held
// from forward to backward) and no_shard (never freed). Pure logic: no tensors.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "sharding/gather_schedule.h"

namespace llm::gather_schedule_test {
namespace {

// One forward and one backward over every unit, as ShardedModel drives them, written as a trace:
// "gather 0", "prefetch 1", "forward 0", "release 0", ... Also records the largest number of
// gathered units seen after any single action (not only at the call boundaries).
struct Trace {
  std::vector<std::string> events;
  int64_t most_gathered = 0;
};

void append(const std::vector<GatherAction>& actions, Trace& trace) {
  for (const GatherAction& action : actions)
    trace.events.push_back(std::string(to_string(action.op)) + " " + std::to_string(action.unit));
}

void note_running(GatherSchedule& schedule, const std::string& what, int64_t unit, Trace& trace) {
  // The unit that runs must be fully gathered, not merely prefetching.
  EXPECT_EQ(schedule.state(unit), GatherSchedule::UnitState::gathered) << what << " " << unit;
  trace.most_gathered = std::max(trace.most_gathered, schedule.gathered_units());
  trace.events.push_back(what + " " + std::to_string(unit));
}

void run_forward(GatherSchedule& schedule, Trace& trace) {
  for (int64_t u = 0; u < schedule.unit_count(); ++u) {
    append(schedule.before_forward(u), trace);
    note_running(schedule, "forward", u, trace);
    append(schedule.after_forward(u), trace);
  }
}

void run_backward(GatherSchedule& schedule, Trace& trace) {
  for (int64_t u = schedule.unit_count(); u-- > 0;) {
    append(schedule.before_backward(u), trace);
    note_running(schedule, "backward", u, trace);
    append(schedule.after_backward(u), trace);
  }
}

Trace one_step(ShardingStrategy strategy, bool prefetch, int64_t units) {
  GatherSchedule schedule(units, strategy, prefetch);
  Trace trace;
  run_forward(schedule, trace);
  trace.events.push_back("|");
  run_backward(schedule, trace);
  EXPECT_EQ(schedule.peak_gathered_units(), trace.most_gathered);
  return trace;
}

using Events = std::vector<std::string>;

TEST(GatherSchedule, FullShardWithPrefetchGathersTheNextUnitWhileOneRuns) {
  const Trace trace = one_step(ShardingStrategy::full_shard, true, 3);
  EXPECT_EQ(trace.events, (Events{
      "gather 0", "prefetch 1", "forward 0", "release 0",
      "wait 1", "prefetch 2", "forward 1", "release 1",
      "wait 2", "forward 2", "release 2", "|",
      "gather 2", "prefetch 1", "backward 2", "release 2",
      "wait 1", "prefetch 0", "backward 1", "release 1",
      "wait 0", "backward 0", "release 0"}));
  EXPECT_EQ(trace.most_gathered, 2);
}

TEST(GatherSchedule, FullShardWithoutPrefetchHoldsOneUnit) {
  const Trace trace = one_step(ShardingStrategy::full_shard, false, 3);
  EXPECT_EQ(trace.events, (Events{
      "gather 0", "forward 0", "release 0", "gather 1", "forward 1", "release 1",
      "gather 2", "forward 2", "release 2", "|",
      "gather 2", "backward 2", "release 2", "gather 1", "backward 1", "release 1",
      "gather 0", "backward 0", "release 0"}));
  EXPECT_EQ(trace.most_gathered, 1);
}

TEST(GatherSchedule, ShardGradOpKeepsUnitsFromForwardToBackward) {
  const Trace with = one_step(ShardingStrategy::shard_grad_op, true, 3);
  EXPECT_EQ(with.events, (Events{
      "gather 0", "prefetch 1", "forward 0", "wait 1", "prefetch 2", "forward 1",
      "wait 2", "forward 2", "|",
      "backward 2", "release 2", "backward 1", "release 1", "backward 0", "release 0"}));
  const Trace without = one_step(ShardingStrategy::shard_grad_op, false, 3);
  EXPECT_EQ(without.events, (Events{
      "gather 0", "forward 0", "gather 1", "forward 1", "gather 2", "forward 2", "|",
      "backward 2", "release 2", "backward 1", "release 1", "backward 0", "release 0"}));
  // Every unit is held at the end of forward either way: prefetch changes when, not how many.
  EXPECT_EQ(with.most_gathered, 3);
  EXPECT_EQ(without.most_gathered, 3);
}

TEST(GatherSchedule, NoShardNeverGathersOrReleases) {
  for (bool prefetch : {true, false}) {
    GatherSchedule schedule(3, ShardingStrategy::no_shard, prefetch);
    Trace trace;
    run_forward(schedule, trace);
    run_backward(schedule, trace);
    append(schedule.release_all(), trace);
    EXPECT_EQ(trace.events, (Events{"forward 0", "forward 1", "forward 2",
                                    "backward 2", "backward 1", "backward 0"}));
    EXPECT_EQ(schedule.peak_gathered_units(), 3) << "replicated: every unit, always";
    EXPECT_EQ(schedule.prefetches(), 0);
    EXPECT_EQ(schedule.inline_gathers(), 0);
  }
}

TEST(GatherSchedule, ManyStepsMicroBatchesAndEvaluationStayWithinTheBound) {
  // 10 units (embed, 8 layers, head), 3 steps of 2 micro-batches, an evaluation forward after each
  // step: the bound holds after every single action, and nothing stays gathered between steps.
  for (bool prefetch : {true, false}) {
    GatherSchedule schedule(10, ShardingStrategy::full_shard, prefetch);
    Trace trace;
    for (int step = 0; step < 3; ++step) {
      for (int micro = 0; micro < 2; ++micro) {
        run_forward(schedule, trace);
        EXPECT_EQ(schedule.gathered_units(), 0);
        run_backward(schedule, trace);
        EXPECT_EQ(schedule.gathered_units(), 0);
      }
      run_forward(schedule, trace);
      append(schedule.release_all(), trace);
      EXPECT_EQ(schedule.gathered_units(), 0);
    }
    EXPECT_EQ(schedule.peak_gathered_units(), prefetch ? 2 : 1);
    // Per pass: one in-line gather (the first unit) and 9 prefetches, or 10 in-line gathers.
    const int64_t passes = 3 * (2 * 2 + 1);
    EXPECT_EQ(schedule.prefetches(), prefetch ? passes * 9 : 0);
    EXPECT_EQ(schedule.inline_gathers(), prefetch ? passes : passes * 10);
  }
}

TEST(GatherSchedule, EvaluationReleasesShardGradOpUnits) {
  GatherSchedule schedule(4, ShardingStrategy::shard_grad_op, true);
  Trace trace;
  run_forward(schedule, trace);
  EXPECT_EQ(schedule.gathered_units(), 4);
  const std::vector<GatherAction> released = schedule.release_all();
  EXPECT_EQ(released.size(), 4u);
  for (int64_t u = 0; u < 4; ++u) EXPECT_EQ(released[u], (GatherAction{GatherOp::release, u}));
  EXPECT_EQ(schedule.gathered_units(), 0);
}

TEST(GatherSchedule, OneUnitHasNothingToPrefetch) {
  const Trace trace = one_step(ShardingStrategy::full_shard, true, 1);
  EXPECT_EQ(trace.events, (Events{"gather 0", "forward 0", "release 0", "|",
                                  "gather 0", "backward 0", "release 0"}));
  EXPECT_EQ(trace.most_gathered, 1);
}

TEST(GatherSchedule, UnitsOutsideTheRangeAreRefused) {
  GatherSchedule schedule(2, ShardingStrategy::full_shard, true);
  EXPECT_THROW(schedule.before_forward(2), std::out_of_range);
  EXPECT_THROW(schedule.before_backward(-1), std::out_of_range);
  EXPECT_THROW(schedule.state(5), std::out_of_range);
  EXPECT_THROW(GatherSchedule(-1, ShardingStrategy::full_shard, true), std::invalid_argument);
  EXPECT_EQ(GatherSchedule().unit_count(), 0);
}

}  // namespace
}  // namespace llm::gather_schedule_test
