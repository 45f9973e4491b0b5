// ShardedModel (sharding/sharded_model.h) across the ranks mpirun gives (ctest runs 1 to 4), on CPU
// over MPI: each rank feeds its own micro-batches through a toy model of three units whose row
// counts (1, 7, 22, and a gain) pad at 2, 3 and 4 ranks; after the reducing backward each rank's
// gradient shard must hold its rows of the average over ranks of the plain model's gradients, and
// the forward must equal the plain model's (the gathers reassemble the weights exactly).
//
// Every rank makes the same collectives in the same order: checks are EXPECT_*, never ASSERT_*,
// once a collective has been made.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "sharding/communicator.h"
#include "sharding/sharded_model.h"
#include "sharding/world.h"

namespace mpi_sharded_model_test {
namespace {

using llm::Activations;
using llm::ShardingStrategy;
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Three units: (7 x 4), (22 x 7) with a (22) gain, (1 x 22). The same values on every rank.
std::vector<NamedTensors> toy_units() {
  at::manual_seed(11);
  std::vector<NamedTensors> units = {{{"a", at::randn({7, 4})}},
                                     {{"b", at::randn({22, 7}) * 0.3}, {"gain", at::randn({22})}},
                                     {{"head", at::randn({1, 22}) * 0.2}}};
  for (auto& unit : units)
    for (auto& [name, tensor] : unit) tensor.requires_grad_(true);
  return units;
}

at::Tensor forward_unit(size_t u, const NamedTensors& parameters, const at::Tensor& x) {
  if (u == 1) return at::tanh(at::matmul(x, parameters[0].second.t())) * parameters[1].second;
  return at::matmul(x, parameters[0].second.t());
}

class ShardedModelAcrossRanks : public ::testing::TestWithParam<ShardingStrategy> {};

TEST_P(ShardedModelAcrossRanks, GradientShardsHoldTheirRowsOfTheAverage) {
  const llm::World& world = llm::current_world();
  std::unique_ptr<llm::Communicator> communicator = llm::make_communicator(world, c10::Device(c10::kCPU));
  std::vector<NamedTensors> plain = toy_units();
  std::vector<NamedTensors> wrapped = toy_units();
  llm::ShardedModel model(*communicator, {GetParam(), /*prefetch=*/true, at::kFloat});
  for (size_t u = 0; u < wrapped.size(); ++u)
    model.add_unit("unit" + std::to_string(u), wrapped[u],
                   [&wrapped, u](const at::Tensor& x) { return forward_unit(u, wrapped[u], x); });

  at::manual_seed(100 + world.rank);  // each rank its own data
  for (int micro = 0; micro < 2; ++micro) {
    const at::Tensor input = at::randn({3, 4});
    at::Tensor expected = input;
    for (size_t u = 0; u < plain.size(); ++u) expected = forward_unit(u, plain[u], expected);
    (expected.square().mean() / 2.0).backward();

    Activations boundaries = model.forward(input, llm::Pass::train);
    EXPECT_TRUE(at::allclose(boundaries.back().output, expected, 1e-6, 1e-7)) << "micro-batch " << micro;
    model.backward(boundaries, boundaries.back().output.square().mean() / 2.0, /*reduce=*/micro == 1);
  }

  for (size_t u = 0; u < plain.size(); ++u) {
    const llm::ShardedUnit& unit = model.unit(u);
    for (size_t p = 0; p < plain[u].size(); ++p) {
      const llm::ShardedParameter& parameter = unit.layout().parameters[p];
      at::Tensor average = plain[u][p].second.grad().clone();
      if (world.world_size > 1) communicator->all_reduce(average, llm::ReduceOp::average);
      const at::Tensor expected = unit.layout().take_rows(parameter, average);
      const at::Tensor actual = unit.gradient_shard().narrow(0, parameter.shard_offset, parameter.shard_numel());
      EXPECT_TRUE(at::allclose(actual, expected, 1e-5, 1e-7))
          << parameter.name << " on rank " << world.rank << ": max |diff| " << (actual - expected).abs().max().item<double>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, ShardedModelAcrossRanks,
                         ::testing::Values(ShardingStrategy::full_shard, ShardingStrategy::shard_grad_op,
                                           ShardingStrategy::no_shard),
                         [](const auto& info) { return std::string(llm::to_string(info.param)); });

}  // namespace
}  // namespace mpi_sharded_model_test
