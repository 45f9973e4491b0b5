// ShardedUnit on its own (a world of one): the master and gradient shards are plain leaves with no
// autograd history, so the optimizer's in-place updates never build a graph; a transient gradient
// shard (CPU offload) holds the same bits as the persistent one and is gone between steps.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include <ATen/ATen.h>

#include "sharding/communicator.h"
#include "sharding/fsdp_unit.h"

namespace llm::fsdp_unit_test {
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

// A unit's gradient as a step makes it: two micro-batches accumulated, then reduced. `parameters`
// fixed by seed; the loss weights each element differently so every row of the shard matters.
struct TwoParameters {
  at::Tensor weight, gain;
  TwoParameters() {
    at::manual_seed(7);
    weight = at::randn({8, 5}).set_requires_grad(true);
    gain = at::randn({5}).set_requires_grad(true);
  }
};

void one_step(ShardedUnit& unit, at::Tensor& weight, at::Tensor& gain, int step) {
  unit.gather();
  for (int micro = 0; micro < 2; ++micro) {
    unit.prepare_gradients();
    const at::Tensor x = at::linspace(-1.0, 1.0 + step + micro, 40).reshape({8, 5});
    const at::Tensor loss = (weight.to(at::kFloat) * x).pow(2).sum() + (gain.to(at::kFloat) * x[micro]).sum();
    loss.backward();
  }
  unit.reduce_gradients();
  unit.release();
}

class TransientGradient : public ::testing::TestWithParam<std::tuple<at::ScalarType, bool>> {};

TEST_P(TransientGradient, HoldsThePersistentShardsBitsAndIsGoneBetweenSteps) {
  const auto [dtype, resident] = GetParam();
  auto communicator = make_single_rank_communicator(c10::Device(c10::kCPU));
  TwoParameters a, b;
  ShardedUnit persistent("persistent", {{"weight", a.weight}, {"gain", a.gain}}, *communicator,
                         ShardingStrategy::full_shard, dtype, resident);
  ShardedUnit transient("transient", {{"weight", b.weight}, {"gain", b.gain}}, *communicator,
                        ShardingStrategy::full_shard, dtype, resident);
  ASSERT_EQ(persistent.resident(), resident);
  transient.make_gradient_transient();
  EXPECT_FALSE(transient.gradient_shard().defined()) << "no gradient is held before the first step";
  EXPECT_EQ(transient.owned_bytes().gradients, 0);
  EXPECT_GT(persistent.owned_bytes().gradients, 0);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    one_step(persistent, a.weight, a.gain, step);
    one_step(transient, b.weight, b.gain, step);
    ASSERT_TRUE(transient.gradient_shard().defined());
    EXPECT_TRUE(at::equal(transient.gradient_squares(), persistent.gradient_squares()));
    EXPECT_TRUE(at::equal(transient.gradient_squares(),
                          at::dot(persistent.gradient_shard(), persistent.gradient_shard())));
    const at::Tensor shard = transient.take_gradient_shard();
    EXPECT_TRUE(at::equal(shard, persistent.gradient_shard()));
    EXPECT_EQ(shard.use_count(), 1) << "nothing else keeps the shard's storage: dropping it frees the memory";
    EXPECT_FALSE(transient.gradient_shard().defined());
    EXPECT_FALSE(b.weight.grad().defined()) << "no parameter gradient views the handed-over shard";
    EXPECT_FALSE(b.gain.grad().defined());
    EXPECT_EQ(transient.owned_bytes().gradients, 0);
    EXPECT_THROW(transient.take_gradient_shard(), std::logic_error) << "taken once per step";
  }
  EXPECT_THROW(persistent.take_gradient_shard(), std::logic_error) << "a persistent shard is not given away";
}

INSTANTIATE_TEST_SUITE_P(
    Units, TransientGradient,
    ::testing::Values(std::make_tuple(at::kFloat, true), std::make_tuple(at::kBFloat16, true),
                      std::make_tuple(at::kFloat, false), std::make_tuple(at::kBFloat16, false)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == at::kFloat ? "fp32" : "bf16") +
             (std::get<1>(info.param) ? "_resident" : "_gathered");
    });

}  // namespace
}  // namespace llm::fsdp_unit_test
