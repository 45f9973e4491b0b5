// The FSDP executor on its own (sharding/sharded_model.h, sharding/step_plan.h), in a world of one:
//   * the plan's action lists: the order of gathers, forwards, backwards, reductions and releases
//     for each strategy, and the optimizer pass;
//   * ShardedModel against the same toy model run without it: outputs, and gradient shards equal to
//     the plain gradients, for each strategy, with accumulation over micro-batches;
//   * its per-unit events, in order (before_shard_read, before_gather, after_forward, after_backward,
//     gradient_shard_ready), and gradient_shard_ready only on a reducing backward;
//   * pure bf16: the compute shard is the master rounded to bf16, gathered as bf16 (half the bytes),
//     refreshed by publish_shards(); the units report their own bytes;
//   * at one rank (the default, resident units) the parameters and gradients are views of the
//     shards and nothing is gathered; the gather path is tested with resident_when_whole off.
// The multi-rank behaviour (reduce-scatter across ranks) is tests/mpi/sharded_model_test.cpp's.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <string>
#include <vector>

#include "sharding/communicator.h"
#include "sharding/sharded_model.h"
#include "sharding/step_plan.h"

namespace llm::sharded_model_test {
namespace {

std::vector<std::string> trace(const std::vector<UnitAction>& actions) {
  std::vector<std::string> events;
  for (const UnitAction& action : actions) events.push_back(std::string(to_string(action.op)) + " " + std::to_string(action.unit));
  return events;
}

using Events = std::vector<std::string>;

TEST(StepPlan, FullShardStepInOrder) {
  StepPlan plan(3, ShardingStrategy::full_shard, /*prefetch=*/true);
  EXPECT_EQ(trace(plan.forward_pass()),
            (Events{"gather 0", "prefetch 1", "forward 0", "release 0", "wait 1", "prefetch 2", "forward 1",
                    "release 1", "wait 2", "forward 2", "release 2"}));
  EXPECT_EQ(trace(plan.backward_pass(/*reduce=*/true)),
            (Events{"gather 2", "prefetch 1", "backward 2", "reduce_gradients 2", "release 2", "wait 1", "prefetch 0",
                    "backward 1", "reduce_gradients 1", "release 1", "wait 0", "backward 0", "reduce_gradients 0",
                    "release 0"}));
  EXPECT_EQ(trace(plan.optimizer_pass()), (Events{"optimizer_step 0", "optimizer_step 1", "optimizer_step 2"}));
  EXPECT_EQ(plan.gathers().peak_gathered_units(), 2);
}

TEST(StepPlan, AccumulatingBackwardReducesNothing) {
  StepPlan plan(2, ShardingStrategy::shard_grad_op, /*prefetch=*/false);
  EXPECT_EQ(trace(plan.forward_pass()), (Events{"gather 0", "forward 0", "gather 1", "forward 1"}));
  EXPECT_EQ(trace(plan.backward_pass(/*reduce=*/false)),
            (Events{"backward 1", "release 1", "backward 0", "release 0"}));
}

TEST(StepPlan, NoShardOnlyComputesAndReduces) {
  StepPlan plan(2, ShardingStrategy::no_shard, /*prefetch=*/true);
  EXPECT_EQ(trace(plan.forward_pass()), (Events{"forward 0", "forward 1"}));
  EXPECT_EQ(trace(plan.backward_pass(true)), (Events{"backward 1", "reduce_gradients 1", "backward 0", "reduce_gradients 0"}));
  EXPECT_TRUE(plan.release_all().empty());
}

TEST(StepPlan, EvaluationReleasesWhatIsStillGathered) {
  StepPlan plan(2, ShardingStrategy::shard_grad_op, /*prefetch=*/false);
  plan.forward_pass();
  EXPECT_EQ(trace(plan.release_all()), (Events{"release 0", "release 1"}));
}

// A toy model of three units: a (5 x 4) linear map, a (3 x 5) map with a gain, a (2 x 3) head.
struct ToyModel {
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> units;

  explicit ToyModel(uint64_t seed) {
    at::manual_seed(static_cast<int64_t>(seed));
    units = {{{"a.weight", at::randn({5, 4})}},
             {{"b.weight", at::randn({3, 5})}, {"b.gain", at::randn({3})}},
             {{"head.weight", at::randn({2, 3})}}};
    for (auto& unit : units)
      for (auto& [name, tensor] : unit) tensor.requires_grad_(true);
  }
  // A deep copy (fresh leaves with the same values).
  ToyModel copy() const {
    ToyModel other(0);
    for (size_t u = 0; u < units.size(); ++u)
      for (size_t p = 0; p < units[u].size(); ++p)
        other.units[u][p].second = units[u][p].second.detach().clone().requires_grad_(true);
    return other;
  }
  static at::Tensor forward_unit(size_t u, const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                                 const at::Tensor& x) {
    if (u == 1) return at::tanh(at::matmul(x, parameters[0].second.t())) * parameters[1].second;
    return at::matmul(x, parameters[0].second.t());
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor y = x;
    for (size_t u = 0; u < units.size(); ++u) y = forward_unit(u, units[u], y);
    return y;
  }
};

at::Tensor loss_of(const at::Tensor& output) { return output.square().mean(); }

// The toy model wrapped by ShardedModel (world of one). The unit forwards read the module tensors,
// which the units gather into and release.
struct Wrapped {
  std::unique_ptr<Communicator> communicator = make_single_rank_communicator(c10::Device(c10::kCPU));
  ToyModel model;
  std::unique_ptr<ShardedModel> sharded;

  Wrapped(const ToyModel& source, ShardingOptions options) : model(source.copy()) {
    sharded = std::make_unique<ShardedModel>(*communicator, options);
    for (size_t u = 0; u < model.units.size(); ++u)
      sharded->add_unit("unit" + std::to_string(u), model.units[u], [this, u](const at::Tensor& x) {
        return ToyModel::forward_unit(u, model.units[u], x);
      });
  }
};

struct Setting {
  ShardingStrategy strategy;
  bool resident;  // ShardingOptions::resident_when_whole: at one rank, every unit stays resident
};

class ShardedModelStrategies : public ::testing::TestWithParam<Setting> {};

TEST_P(ShardedModelStrategies, EqualsThePlainModelWithAccumulation) {
  const ToyModel reference_model(3);
  ToyModel plain = reference_model.copy();
  const ShardingStrategy strategy = GetParam().strategy;
  Wrapped wrapped(reference_model, {strategy, /*prefetch=*/true, at::kFloat, GetParam().resident});
  const std::vector<at::Tensor> inputs = {at::randn({6, 4}), at::randn({6, 4})};

  for (size_t micro = 0; micro < inputs.size(); ++micro) {
    const at::Tensor expected = plain.forward(inputs[micro]);
    (loss_of(expected) / 2.0).backward();
    Activations boundaries = wrapped.sharded->forward(inputs[micro], Pass::train);
    ASSERT_EQ(boundaries.size(), 3u);
    EXPECT_TRUE(at::equal(boundaries.back().output, expected)) << "micro-batch " << micro;
    wrapped.sharded->backward(boundaries, loss_of(boundaries.back().output) / 2.0, micro + 1 == inputs.size());
  }
  // The gradient shard of each unit (a world of one holds every row) is the plain model's gradient.
  for (size_t u = 0; u < plain.units.size(); ++u) {
    const ShardedUnit& unit = wrapped.sharded->unit(u);
    for (size_t p = 0; p < plain.units[u].size(); ++p) {
      const ShardedParameter& parameter = unit.layout().parameters[p];
      const at::Tensor shard = unit.gradient_shard().narrow(0, parameter.shard_offset, parameter.shard_numel());
      EXPECT_TRUE(at::allclose(shard, plain.units[u][p].second.grad().reshape({-1}), 1e-6, 1e-7)) << parameter.name;
    }
    EXPECT_EQ(unit.full_gradient_bytes(), 0) << "the full gradients are freed once reduced";
  }
  const bool gathers = !GetParam().resident && strategy != ShardingStrategy::no_shard;
  for (size_t u = 0; u < 3; ++u)
    EXPECT_EQ(wrapped.sharded->unit(u).gathered(), !gathers) << "released after backward, or resident";
  EXPECT_LE(wrapped.sharded->peak_gathered_units(), gathers && strategy == ShardingStrategy::full_shard ? 2 : 3);
}

INSTANTIATE_TEST_SUITE_P(Strategies, ShardedModelStrategies,
                         ::testing::Values(Setting{ShardingStrategy::full_shard, false},
                                           Setting{ShardingStrategy::shard_grad_op, false},
                                           Setting{ShardingStrategy::no_shard, false},
                                           Setting{ShardingStrategy::full_shard, true},
                                           Setting{ShardingStrategy::no_shard, true}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.strategy)) + (info.param.resident ? "_resident" : "");
                         });

TEST(ShardedModel, AtOneRankUnitsAreTheirShards) {
  // The default: a unit that is its own whole shard keeps its parameters as views of the master and
  // (fp32) its gradients as views of the gradient shard; the plan has nothing to gather.
  Wrapped wrapped(ToyModel(4), {ShardingStrategy::full_shard, /*prefetch=*/true, at::kFloat});
  ShardedUnit& unit = wrapped.sharded->unit(1);
  ASSERT_TRUE(unit.resident());
  for (size_t p = 0; p < 2; ++p) {
    const ShardedParameter& row = unit.layout().parameters[p];
    const at::Tensor& parameter = wrapped.model.units[1][p].second;
    EXPECT_EQ(parameter.data_ptr<float>(), unit.master_shard().data_ptr<float>() + row.shard_offset);
    EXPECT_EQ(parameter.grad().data_ptr<float>(), unit.gradient_shard().data_ptr<float>() + row.shard_offset);
  }
  for (const UnitAction& action : StepPlan(wrapped.sharded->plan()).forward_pass())
    EXPECT_EQ(action.op, UnitOp::forward) << "nothing to gather";
  EXPECT_EQ(wrapped.sharded->owned_bytes().parameters, 4 * (20 + 18 + 6)) << "one copy of the weights";
  EXPECT_EQ(wrapped.sharded->owned_bytes().gradients, 4 * (20 + 18 + 6)) << "one copy of the gradients";
  // An update of the master is the parameters' update: nothing to publish.
  unit.master_shard().add_(1.0);
  EXPECT_TRUE(at::equal(wrapped.model.units[1][1].second.reshape({-1}),
                        unit.master_shard().narrow(0, unit.layout().parameters[1].shard_offset, 3)));
  // Two steps: the second starts from zeroed gradients, not the first's.
  const at::Tensor input = at::randn({2, 4});
  for (int step = 0; step < 2; ++step) {
    Activations boundaries = wrapped.sharded->forward(input, Pass::train);
    wrapped.sharded->backward(boundaries, loss_of(boundaries.back().output), /*reduce=*/true);
  }
  ToyModel plain = wrapped.model.copy();
  loss_of(plain.forward(input)).backward();
  EXPECT_TRUE(at::allclose(unit.gradient_shard().narrow(0, 0, 15), plain.units[1][0].second.grad().reshape({-1}), 1e-6, 1e-7));
}

TEST(ShardedModel, EventsComeInThePlansOrder) {
  Wrapped wrapped(ToyModel(5), {ShardingStrategy::full_shard, /*prefetch=*/false, at::kFloat, /*resident=*/false});
  std::vector<std::string> events;
  std::vector<size_t> reads;  // before_shard_read, apart: it comes before every gather and every forward
  wrapped.sharded->add_listener([&](UnitEvent event, size_t unit, Pass pass) {
    if (event == UnitEvent::before_shard_read) {
      reads.push_back(unit);
      return;
    }
    events.push_back(std::string(to_string(event)) + " " + std::to_string(unit) + (pass == Pass::eval ? " eval" : ""));
  });
  const at::Tensor input = at::randn({2, 4});
  Activations boundaries = wrapped.sharded->forward(input, Pass::train);
  EXPECT_EQ(reads, (std::vector<size_t>{0, 0, 1, 1, 2, 2})) << "before each gather and each forward";
  wrapped.sharded->backward(boundaries, loss_of(boundaries.back().output), /*reduce=*/false);
  EXPECT_EQ(reads, (std::vector<size_t>{0, 0, 1, 1, 2, 2, 2, 1, 0})) << "and before each gather of the backward";
  EXPECT_EQ(events, (Events{"before_gather 0", "after_forward 0", "before_gather 1", "after_forward 1", "before_gather 2",
                            "after_forward 2", "before_gather 2", "after_backward 2", "before_gather 1",
                            "after_backward 1", "before_gather 0", "after_backward 0"}))
      << "an accumulating backward reduces nothing";
  events.clear();
  boundaries = wrapped.sharded->forward(input, Pass::train);
  wrapped.sharded->backward(boundaries, loss_of(boundaries.back().output), /*reduce=*/true);
  EXPECT_EQ(Events(events.begin() + 6, events.end()),
            (Events{"before_gather 2", "after_backward 2", "gradient_shard_ready 2", "before_gather 1",
                    "after_backward 1", "gradient_shard_ready 1", "before_gather 0", "after_backward 0",
                    "gradient_shard_ready 0"}));
  events.clear();
  {
    at::NoGradGuard no_grad;
    wrapped.sharded->forward(input, Pass::eval);
  }
  wrapped.sharded->release_all();
  EXPECT_EQ(events.at(1), "after_forward 0 eval");
}

TEST(ShardedModel, PureBf16GathersTheRoundedMaster) {
  Wrapped wrapped(ToyModel(7), {ShardingStrategy::full_shard, /*prefetch=*/true, at::kBFloat16, /*resident=*/false});
  ShardedUnit& unit = wrapped.sharded->unit(1);
  EXPECT_EQ(unit.master_shard().scalar_type(), at::kFloat);
  EXPECT_FALSE(unit.compute_shard().defined()) << "a gathered bf16 unit keeps no second copy of its shard";
  // Owned bytes: the fp32 master only; nothing gathered between passes.
  const int64_t shard = unit.layout().shard_numel;
  EXPECT_EQ(unit.owned_bytes().parameters, 4 * shard);
  EXPECT_EQ(unit.owned_bytes().gradients, 4 * shard);

  // An update of the master reaches the next gather, rounded to bf16.
  unit.master_shard().add_(0.5);
  unit.gather();
  const at::Tensor gathered = wrapped.model.units[1][0].second.detach();
  EXPECT_EQ(gathered.scalar_type(), at::kBFloat16);
  const ShardedParameter& weight = unit.layout().parameters[0];
  EXPECT_TRUE(at::equal(gathered.reshape({-1}),
                        unit.master_shard().narrow(0, weight.shard_offset, weight.shard_numel()).to(at::kBFloat16)));
  EXPECT_EQ(unit.owned_bytes().parameters, 4 * shard + 2 * (15 + 3)) << "plus the gathered bf16 parameters";
  unit.release();
  EXPECT_EQ(unit.owned_bytes().parameters, 4 * shard);
}

TEST(ShardedModel, ResidentPureBf16ParametersViewTheirComputeShard) {
  Wrapped wrapped(ToyModel(7), {ShardingStrategy::full_shard, /*prefetch=*/true, at::kBFloat16, /*resident=*/true});
  ShardedUnit& unit = wrapped.sharded->unit(1);
  ASSERT_TRUE(unit.resident());
  EXPECT_EQ(unit.compute_shard().scalar_type(), at::kBFloat16);
  const int64_t shard = unit.layout().shard_numel;
  EXPECT_EQ(unit.owned_bytes().parameters, 4 * shard + 2 * shard) << "master and the bf16 weights, nothing gathered";
  unit.master_shard().add_(0.5);
  wrapped.sharded->publish_shards();
  EXPECT_TRUE(at::equal(unit.compute_shard(), unit.master_shard().to(at::kBFloat16)));
  const ShardedParameter& weight = unit.layout().parameters[0];
  EXPECT_TRUE(at::equal(wrapped.model.units[1][0].second.detach().reshape({-1}),
                        unit.compute_shard().narrow(0, weight.shard_offset, weight.shard_numel())))
      << "the parameters see the published shard";
}

TEST(ShardedModel, Fp32ComputeShardIsTheMaster) {
  Wrapped wrapped(ToyModel(9), {ShardingStrategy::full_shard, /*prefetch=*/false, at::kFloat, /*resident=*/false});
  ShardedUnit& unit = wrapped.sharded->unit(0);
  EXPECT_TRUE(unit.compute_shard().is_same(unit.master_shard())) << "no second buffer in fp32";
  EXPECT_EQ(wrapped.sharded->owned_bytes().parameters, 4 * (20 + 18 + 6)) << "counted once";
}

}  // namespace
}  // namespace llm::sharded_model_test
