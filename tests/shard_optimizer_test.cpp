// The per-unit optimizer on its own (optim/shard_optimizer.h), in one process:
//   * step(lr) is begin_step() and step_unit() over the units: stepping the units one at a time, in
//     any order, gives the same bits, and a unit's step touches only that unit;
//   * how parameters are grouped into units changes nothing, for every rule (GaLore numbers its
//     matrices across the model, so its SVD owners and staggering do not depend on the grouping);
//   * each unit's state is three flat buffers, laid out like the shard for the element-wise rules;
//   * one validator: a bad state dict is refused with every problem listed and nothing changed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "common/errors.h"
#include "optim/shard_optimizer.h"
#include "sharding/communicator.h"
#include "tests/test_util.h"

namespace llm::shard_optimizer_test {
namespace {

// Three parameters: a tall matrix, a wide matrix and a gain; the rules each optimizer gives them.
const std::vector<std::pair<std::string, std::vector<int64_t>>> kShapes = {
    {"tall", {6, 5}}, {"wide", {4, 7}}, {"gain", {5}}};

std::vector<UpdateRule> rules_for(const std::string& kind) {
  if (kind == "adamw") return {UpdateRule::adamw, UpdateRule::adamw, UpdateRule::adamw};
  if (kind == "adamw_sn") return {UpdateRule::subset_norm, UpdateRule::subset_norm, UpdateRule::adam_hf};
  return {UpdateRule::galore, UpdateRule::galore, UpdateRule::adam_hf};
}

OptimizerSettings settings_for(const std::string& kind) {
  OptimizerSettings settings;
  settings.kind = kind;
  settings.eps = 1e-6;
  settings.weight_decay = 0.1;
  settings.galore_rank = 2;
  settings.update_proj_gap = 2;
  settings.stagger_projectors = true;
  return settings;
}

// The parameters grouped into units: {{0, 1, 2}} is one unit of all three, {{0}, {1}, {2}} three.
struct Grouped {
  std::vector<UnitShard> units;
  // (unit, parameter index in it) of each of kShapes
  std::vector<std::pair<size_t, size_t>> where;

  Grouped(const std::vector<std::vector<size_t>>& groups, const std::string& kind) {
    where.resize(kShapes.size());
    for (const auto& group : groups) {
      std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
      std::vector<UpdateRule> rules;
      for (size_t i : group) {
        where[i] = {units.size(), shapes.size()};
        shapes.push_back(kShapes[i]);
        rules.push_back(rules_for(kind)[i]);
      }
      UnitShard unit;
      unit.layout = FlatShardLayout::from_shapes("unit" + std::to_string(units.size()), shapes, 0, 1);
      unit.layout.parameters.back().decay = true;  // decay on the gain too: every path is exercised
      unit.master = at::zeros({unit.layout.shard_numel});
      unit.gradient = at::zeros({unit.layout.shard_numel});
      unit.rules = rules;
      units.push_back(unit);
    }
  }
  at::Tensor view(const at::Tensor UnitShard::*buffer, size_t parameter) const {
    const auto [u, p] = where[parameter];
    const ShardedParameter& layout = units[u].layout.parameters[p];
    return (units[u].*buffer).narrow(0, layout.shard_offset, layout.shard_numel());
  }
  // The same values in every grouping: parameter i's and step t's are seeded by (i, t).
  void set(const at::Tensor UnitShard::*buffer, int64_t seed) {
    for (size_t i = 0; i < kShapes.size(); ++i) {
      at::manual_seed(seed * 10 + static_cast<int64_t>(i));
      view(buffer, i).copy_(at::randn({view(buffer, i).numel()}));
    }
  }
};

class PerUnit : public ::testing::TestWithParam<std::string> {};

TEST_P(PerUnit, GroupingAndUnitOrderChangeNothing) {
  const std::string kind = GetParam();
  Grouped together({{0, 1, 2}}, kind), apart({{0}, {1}, {2}}, kind), reversed({{2}, {0}, {1}}, kind);
  for (Grouped* grouped : {&together, &apart, &reversed}) grouped->set(&UnitShard::master, 1);
  ShardOptimizer one(settings_for(kind), together.units, nullptr);
  ShardOptimizer three(settings_for(kind), apart.units, nullptr);
  ShardOptimizer backwards(settings_for(kind), reversed.units, nullptr);
  for (int64_t step = 1; step <= 5; ++step) {  // projector refreshes at 1 and on the staggered steps
    for (Grouped* grouped : {&together, &apart, &reversed}) grouped->set(&UnitShard::gradient, 100 + step);
    one.step(1e-2);
    three.begin_step();
    for (size_t u = 0; u < 3; ++u) three.step_unit(u, 1e-2);
    backwards.begin_step();
    for (size_t u = 3; u-- > 0;) backwards.step_unit(u, 1e-2);
  }
  for (size_t i = 0; i < kShapes.size(); ++i) {
    EXPECT_TRUE(at::equal(together.view(&UnitShard::master, i), apart.view(&UnitShard::master, i))) << kShapes[i].first;
    EXPECT_TRUE(at::equal(together.view(&UnitShard::master, i), reversed.view(&UnitShard::master, i))) << kShapes[i].first;
  }
  const auto state_one = one.full_state_dict(), state_three = three.full_state_dict();
  ASSERT_EQ(state_one.size(), state_three.size());
  for (const auto& [key, tensor] : state_one) EXPECT_TRUE(at::equal(tensor, state_three.at(key))) << key;
  EXPECT_EQ(one.state_bytes(), three.state_bytes());
}

TEST_P(PerUnit, AUnitsStepTouchesOnlyThatUnit) {
  const std::string kind = GetParam();
  Grouped apart({{0}, {1}, {2}}, kind);
  apart.set(&UnitShard::master, 2);
  apart.set(&UnitShard::gradient, 3);
  ShardOptimizer optimizer(settings_for(kind), apart.units, nullptr);
  std::vector<at::Tensor> before;
  for (size_t i = 0; i < kShapes.size(); ++i) before.push_back(apart.view(&UnitShard::master, i).clone());
  optimizer.begin_step();
  optimizer.step_unit(1, 1e-2);
  EXPECT_TRUE(at::equal(apart.view(&UnitShard::master, 0), before[0]));
  EXPECT_FALSE(at::equal(apart.view(&UnitShard::master, 1), before[1]));
  EXPECT_TRUE(at::equal(apart.view(&UnitShard::master, 2), before[2]));
  EXPECT_EQ(optimizer.steps_taken(), 1);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PerUnit, ::testing::Values("adamw", "adamw_sn", "galore_adamw"),
                         testing::TextParamName());

TEST(PerUnitState, ElementwiseRulesKeepTheirMomentsLaidOutLikeTheShard) {
  for (const std::string kind : {"adamw", "galore_adamw"}) {
    Grouped together({{0, 1, 2}}, kind);
    together.set(&UnitShard::gradient, 4);
    ShardOptimizer optimizer(settings_for(kind), together.units, nullptr);
    optimizer.step(1e-3);
    const ShardOptimizer::UnitState& state = optimizer.unit_state(0);
    if (kind == "adamw") {
      // m after one step is (1 - beta1) g, element by element of the flat gradient shard.
      ASSERT_EQ(state.exp_avg.numel(), together.units[0].layout.shard_numel);
      EXPECT_TRUE(at::allclose(state.exp_avg, 0.1 * together.units[0].gradient, 1e-6, 1e-8));
      EXPECT_EQ(state.projector.numel(), 0);
      EXPECT_EQ(optimizer.state_bytes(), 8 * together.units[0].layout.shard_numel);
    } else {
      // GaLore: the gain's moments are its shard's; the matrices' are low-rank (rank 2): tall
      // (6 x 5) right-projected keeps (6 x 2), wide (4 x 7) left-projected keeps (2 x 7).
      const int64_t lowrank = 6 * 2 + 2 * 7, gain = 5;
      EXPECT_EQ(state.exp_avg.numel(), lowrank + gain);
      EXPECT_EQ(state.exp_avg_sq.numel(), lowrank + gain);
      EXPECT_EQ(state.projector.numel(), 2 * 5 + 4 * 2);
      // Each parameter's views sit in its unit's buffers, in layout order.
      EXPECT_EQ(state.parameters[2].exp_avg.data_ptr<float>(), state.exp_avg.data_ptr<float>() + lowrank);
    }
  }
}

TEST(PerUnitState, OneValidatorListsEveryProblemAndChangesNothing) {
  Grouped apart({{0}, {1}, {2}}, "adamw_sn");
  apart.set(&UnitShard::gradient, 5);
  ShardOptimizer optimizer(settings_for("adamw_sn"), apart.units, nullptr);
  optimizer.step(1e-2);
  const auto good = optimizer.full_state_dict();
  auto bad = good;
  bad.erase("gain.exp_avg");
  bad["wide.exp_avg_sq"] = at::zeros({4, 1});  // per column: (1, 7)
  bad["stray.exp_avg"] = at::zeros({2});
  try {
    optimizer.load_full_state_dict(bad);
    ADD_FAILURE() << "a bad state loaded";
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'gain.exp_avg' is missing"), std::string::npos) << message;
    EXPECT_NE(message.find("'wide.exp_avg_sq' has shape [4, 1] but the subset-norm state has shape [1, 7]"),
              std::string::npos) << message;
    EXPECT_NE(message.find("'stray.exp_avg' is unexpected"), std::string::npos) << message;
  }
  for (const auto& [key, tensor] : optimizer.full_state_dict()) EXPECT_TRUE(at::equal(tensor, good.at(key))) << key;
  optimizer.load_full_state_dict(good);  // the good one still loads
}


// A communicator that claims a GPU and carries nothing: what NCCL is to host tensors. The optimizer
// must refuse it at construction, on CPU, instead of at the first step's collective on GPUs
// (--offload optimizer with adamw_sn or GaLore at 2+ GPUs handed NCCL its host state).
class CommunicatorOfAnotherDevice final : public Communicator {
 public:
  CommunicatorOfAnotherDevice() : Communicator(0, 2, c10::Device(c10::kCUDA, 0)) {}
  std::string backend_name() const override { return "nccl (test)"; }

 protected:
  void run_all_gather(const at::Tensor&, const at::Tensor&, bool, CollectiveStream) override { ADD_FAILURE(); }
  void run_reduce_scatter(const at::Tensor&, const at::Tensor&, ReduceOp, CollectiveStream) override {
    ADD_FAILURE();
  }
  void run_all_reduce(const at::Tensor&, ReduceOp, CollectiveStream) override { ADD_FAILURE(); }
  void run_broadcast(const at::Tensor&, int, CollectiveStream) override { ADD_FAILURE(); }
  void run_barrier() override {}
  std::unique_ptr<Communicator> run_split(int, int, const std::vector<int>&) override {
    ADD_FAILURE();
    return nullptr;
  }
};

TEST(ShardOptimizerDevices, ACommunicatorOfAnotherDeviceIsRefusedAtConstruction) {
  for (const std::string kind : {"adamw", "adamw_sn", "galore_adamw"}) {
    SCOPED_TRACE(kind);
    CommunicatorOfAnotherDevice communicator;
    Grouped grouped({{0, 1, 2}}, kind);
    try {
      ShardOptimizer optimizer(settings_for(kind), grouped.units, &communicator);
      FAIL() << "accepted host state with a communicator on cuda:0";
    } catch (const UserError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("the state is on cpu"), std::string::npos) << message;
      EXPECT_NE(message.find("works on cuda:0"), std::string::npos) << message;
      EXPECT_NE(message.find("host communicator (MPI)"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace llm::shard_optimizer_test
