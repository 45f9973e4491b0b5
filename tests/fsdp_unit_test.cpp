// ShardedUnit on its own (a world of one): the master and gradient shards are plain leaves with no
// autograd history, so the optimizer's in-place updates never build a graph.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "sharding/communicator.h"
#include "sharding/fsdp_unit.h"

namespace llm {
namespace {

TEST(ShardedUnit, MasterShardHasNoAutogradHistory) {
  // The parameters require grad, as a model's do. Copying them into the shard under grad mode used to
  // leave the shard a non-leaf with a CopySlices grad_fn: every in-place update then extended the
  // graph, and adamw_sn's addcdiv_ kept its denominator alive each step (the memory ledger's
  // optimizer-point remainder grew by the subset-state size per step).
  auto communicator = make_single_rank_communicator(c10::Device(c10::kCPU));
  at::Tensor weight = at::randn({8, 4}).set_requires_grad(true);
  at::Tensor gain = at::ones({4}).set_requires_grad(true);
  ShardedUnit unit("unit", {{"weight", weight}, {"gain", gain}}, *communicator, ShardingStrategy::full_shard,
                   at::kFloat);
  EXPECT_FALSE(unit.master_shard().requires_grad());
  EXPECT_EQ(unit.master_shard().grad_fn(), nullptr);
  EXPECT_FALSE(unit.gradient_shard().requires_grad());
  // An in-place update of a parameter's view records nothing.
  at::Tensor view = unit.slice(unit.master_shard(), unit.layout().parameters[0]);
  view.add_(at::ones_like(view), 0.5);
  EXPECT_EQ(unit.master_shard().grad_fn(), nullptr);
}

}  // namespace
}  // namespace llm
