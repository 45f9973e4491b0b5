// AdamwSN and GaLoreAdamW on shards against their Python references, at every world size mpirun
// gives this binary (ctest runs it at 1, 2, 3 and 4 ranks): each rank holds its whole rows of every
// parameter (sharding/flat_layout.h's rule, so 3 ranks pad), steps the sharded optimizer with its
// rows of the golden gradients, and the full parameters and state assembled afterwards must equal
// the reference's element-wise.
//   tests/golden/adamw_sn_golden.pt  tests/golden/make_adamw_sn_golden.py, the published algorithm
//                                    written step by step (tests/golden/reference_adamw_sn.py)
//   tests/golden/galore_golden.pt    tests/golden/make_galore_golden.py, galore_torch.GaLoreAdamW
// The cases are tall, wide, square and 1-D, with sizes that hit vector tails (7, 37, 1023), subsets
// that straddle rows and shard boundaries, beta1 = 0 (RMSProp-SN), GaLore's four projection types,
// a rank above the smaller dimension, and projector refreshes at steps 1, 6 and 11 with the moments
// carried across them.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "optim/shard_optimizer.h"
#include "optim/shard_state.h"
#include "sharding/communicator.h"
#include "sharding/world.h"
#include "tests/tensor_checks.h"

namespace llm {
namespace {

using testing::expect_all_close;

struct Sharded {
  std::unique_ptr<Communicator> communicator;
  Communicator* across = nullptr;
  int rank = 0;
  int world = 1;
};

Sharded shard_group() {
  Sharded group;
  const World& world = current_world();
  group.rank = world.rank;
  group.world = world.world_size;
  if (world.world_size > 1) {
    group.communicator = make_mpi_communicator(world);
    group.across = group.communicator.get();
  }
  return group;
}

// This rank's rows of a full tensor as a unit of its own, as the flat layout cuts them.
UnitShard shard_of(const std::string& name, const at::Tensor& full, UpdateRule rule, bool decay,
                   const Sharded& group) {
  const FlatShardLayout layout = FlatShardLayout::build(name, {{name, full}}, group.rank, group.world);
  const at::Tensor rows = layout.take_rows(layout.parameters.front(), full);
  return single_parameter_unit(name, full.sizes().vec(), rows, at::zeros_like(rows), rule, decay, group.rank,
                               group.world);
}

void set_gradient(UnitShard& unit, const at::Tensor& full_grad) {
  unit.gradient.copy_(unit.layout.take_rows(unit.layout.parameters.front(), full_grad));
}

at::Tensor full_param(const UnitShard& unit, Communicator* across) {
  const ShardedParameter& p = unit.layout.parameters.front();
  return assemble_rows(unit.master.view({p.rows_per_rank, p.cols}), p.rows, p.first_row, p.rows_held, across)
      .reshape(p.full_shape);
}

std::vector<std::string> case_names(const std::map<std::string, at::Tensor>& golden) {
  std::vector<std::string> names;
  for (const auto& [key, value] : golden)
    if (key.size() > 8 && key.substr(key.size() - 8) == ".initial") names.push_back(key.substr(0, key.size() - 8));
  return names;
}

TEST(AdamwSNReference, EveryFormEqualsThePublishedAlgorithmAtThisWorldSize) {
  const auto golden = testing::load_golden("adamw_sn_golden.pt");
  const Sharded group = shard_group();
  const at::Tensor lrs = golden.at("lrs");
  const std::vector<std::string> names = case_names(golden);
  ASSERT_EQ(names.size(), 12u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name + " at world size " + std::to_string(group.world));
    const int64_t form = golden.at(name + ".form").item<int64_t>();
    const at::Tensor betas = golden.at(name + ".betas");
    OptimizerSettings settings;
    settings.kind = "adamw_sn";
    settings.beta1 = betas[0].item<double>();
    settings.beta2 = betas[1].item<double>();
    settings.eps = golden.at("meta.eps").item<double>();
    settings.weight_decay = golden.at(name + ".weight_decay").item<double>();
    settings.subset_size = form == 2 ? golden.at(name + ".subset_size_arg").item<int64_t>() : 0;
    const UpdateRule rule = form == 0 ? UpdateRule::adam_hf : UpdateRule::subset_norm;
    UnitShard view = shard_of(name, golden.at(name + ".initial"), rule, settings.weight_decay > 0, group);
    // The optimizer's copy shares the master and gradient storage with `view`.
    auto optimizer = std::make_unique<ShardOptimizer>(settings, std::vector<UnitShard>{view}, group.across);
    const at::Tensor grads = golden.at(name + ".grads");
    for (int64_t step = 0; step < lrs.size(0); ++step) {
      set_gradient(view, grads[step]);
      optimizer->step(lrs[step].item<double>());
    }
    // fp32 on both sides in the same operation order; the subset sums and the cross-rank sums add in
    // another order (a few ulps of v), and ten steps compound it: 2e-6 relative, far below the
    // lr-sized (1e-3) error of a wrong subset, bias correction or decay.
    expect_all_close(full_param(view, group.across), golden.at(name + ".final"), 1e-7, 2e-6, "param");
    const auto state = optimizer->full_state_dict();
    expect_all_close(state.at(name + ".exp_avg_sq"), golden.at(name + ".exp_avg_sq"), 1e-12, 2e-6, "exp_avg_sq");
    if (golden.count(name + ".exp_avg"))
      expect_all_close(state.at(name + ".exp_avg"), golden.at(name + ".exp_avg"), 1e-9, 2e-6, "exp_avg");
    else
      EXPECT_EQ(state.count(name + ".exp_avg"), 0u) << "beta1 = 0 keeps no first moment";
  }
}

TEST(GaLoreReference, EveryProjectionEqualsGaLoreTorchAtThisWorldSize) {
  const auto golden = testing::load_golden("galore_golden.pt");
  const Sharded group = shard_group();
  const at::Tensor lrs = golden.at("lrs");
  const char* kProjTypes[] = {"std", "reverse_std", "left", "right"};
  const std::vector<std::string> names = case_names(golden);
  ASSERT_EQ(names.size(), 10u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name + " at world size " + std::to_string(group.world));
    const int64_t proj_type = golden.at(name + ".proj_type").item<int64_t>();
    OptimizerSettings settings;
    settings.kind = "galore_adamw";
    settings.beta1 = golden.at("meta.betas")[0].item<double>();
    settings.beta2 = golden.at("meta.betas")[1].item<double>();
    settings.eps = golden.at("meta.eps").item<double>();
    settings.weight_decay = golden.at(name + ".weight_decay").item<double>();
    settings.update_proj_gap = golden.at("meta.update_proj_gap").item<int64_t>();
    settings.galore_scale = golden.at("meta.scale").item<double>();
    if (proj_type >= 0) {
      settings.proj_type = kProjTypes[proj_type];
      settings.galore_rank = golden.at(name + ".rank").item<int64_t>();
    }
    const UpdateRule rule = proj_type >= 0 ? UpdateRule::galore : UpdateRule::adam_hf;
    UnitShard view = shard_of(name, golden.at(name + ".initial"), rule, settings.weight_decay > 0, group);
    auto optimizer = std::make_unique<ShardOptimizer>(settings, std::vector<UnitShard>{view}, group.across);
    const at::Tensor grads = golden.at(name + ".grads");
    for (int64_t step = 0; step < lrs.size(0); ++step) {
      set_gradient(view, grads[step]);
      optimizer->step(lrs[step].item<double>());
      if (step == 0 && rule == UpdateRule::galore) {
        // The same LAPACK thin SVD of the same fp32 gradient as the reference (the gradient is
        // reassembled from shards bit for bit): the first projector is identical up to rounding.
        expect_all_close(optimizer->full_state_dict().at(name + ".projector"),
                         golden.at(name + ".projector_step1"), 1e-6, 1e-5, "projector at step 1");
      }
    }
    // Projections are matmuls whose summation order differs from the reference's (and over ranks for
    // left projectors); the low-rank moments and the update inherit ~1e-6 relative. A sign flip of
    // one singular vector at a refresh (steps 6 and 11) would move param by 20-70 % of its change.
    expect_all_close(full_param(view, group.across), golden.at(name + ".final"), 1e-6, 1e-5, "param");
    const auto state = optimizer->full_state_dict();
    expect_all_close(state.at(name + ".exp_avg"), golden.at(name + ".exp_avg"), 1e-7, 1e-4, "exp_avg");
    expect_all_close(state.at(name + ".exp_avg_sq"), golden.at(name + ".exp_avg_sq"), 1e-10, 1e-4, "exp_avg_sq");
    if (rule == UpdateRule::galore)
      expect_all_close(state.at(name + ".projector"), golden.at(name + ".projector"), 1e-6, 1e-5, "projector");
  }
}

// The subspace projector (power iteration on the shards, no gathered gradient) against the SVD on
// the golden gradients of step 1: the fraction of the gradient's energy it captures, ||R||^2 over
// the top-r singular values' sum of squares. The golden spectra fall by 0.75 per index, so 6 cold
// iterations converge the top r = 8 to within (sigma_9 / sigma_8)^12 ~ 3 % per direction; the
// captured energy, dominated by the leading directions, is within 0.5 % of the SVD's.
TEST(GaLoreReference, SubspaceProjectorCapturesTheSvdsEnergyAtThisWorldSize) {
  const auto golden = testing::load_golden("galore_golden.pt");
  const Sharded group = shard_group();
  const char* kProjTypes[] = {"std", "reverse_std", "left", "right"};
  for (const std::string& name : case_names(golden)) {
    const int64_t proj_type = golden.at(name + ".proj_type").item<int64_t>();
    if (proj_type < 0) continue;
    SCOPED_TRACE(name + " at world size " + std::to_string(group.world));
    OptimizerSettings settings;
    settings.kind = "galore_adamw";
    settings.eps = 1e-6;
    settings.proj_type = kProjTypes[proj_type];
    settings.galore_rank = golden.at(name + ".rank").item<int64_t>();
    settings.projector_method = "subspace";
    UnitShard view = shard_of(name, golden.at(name + ".initial"), UpdateRule::galore, false, group);
    auto optimizer = std::make_unique<ShardOptimizer>(settings, std::vector<UnitShard>{view}, group.across);
    const at::Tensor grad = golden.at(name + ".grads")[0];
    set_gradient(view, grad);
    optimizer->step(1e-3);
    const at::Tensor projector = optimizer->full_state_dict().at(name + ".projector");
    const at::Tensor reference = golden.at(name + ".projector_step1");
    const bool reference_right = reference.size(1) == grad.size(1) && reference.size(0) != grad.size(0);
    ASSERT_EQ(projector.sizes(), reference.sizes());
    auto captured = [&](const at::Tensor& p) {
      const at::Tensor lowrank = reference_right ? at::matmul(grad, p.t()) : at::matmul(p.t(), grad);
      return lowrank.square().sum().item<double>();
    };
    const double ratio = captured(projector) / captured(reference);
    if (group.rank == 0) std::printf("[ subspace ] %-24s captured energy / SVD's = %.6f\n", name.c_str(), ratio);
    EXPECT_GE(ratio, 0.995) << "captured energy relative to the SVD's";
    EXPECT_LE(ratio, 1.0 + 1e-5) << "no basis captures more than the SVD's";
    // Orthonormal basis.
    const at::Tensor gram = reference_right ? at::matmul(projector, projector.t()) : at::matmul(projector.t(), projector);
    expect_all_close(gram, at::eye(gram.size(0)), 1e-4, 0, "P P^T");
  }
}

}  // namespace
}  // namespace llm
