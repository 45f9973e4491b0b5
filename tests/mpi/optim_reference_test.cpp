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

namespace llm::mpi_optim_reference_test {
namespace {

using testing::expect_all_close;
using testing::expect_same_bits;

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
}  // namespace llm::mpi_optim_reference_test

namespace llm::mpi_optim_reference_test {
namespace {

// optim/state_rounding.h on a full fp32 tensor (element i of the flattened tensor takes index i).
at::Tensor rounded_like_the_spec(const at::Tensor& full, uint32_t key, bool high_half) {
  const at::Tensor values = full.to(at::kFloat).contiguous().view({-1});
  at::Tensor out = at::empty({values.numel()}, at::kBFloat16);
  const float* from = values.const_data_ptr<float>();
  auto* to = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  for (int64_t i = 0; i < values.numel(); ++i) {
    const uint32_t bits = rounding_bits(key, static_cast<uint32_t>(i));
    to[i] = stochastic_round_to_bfloat16(from[i], high_half ? bits >> 16 : bits & 0xFFFFu);
  }
  return out.view(full.sizes());
}

// AdamW with bf16 moments on shards against tests/golden/make_adamw_bf16_state_golden.py (NumPy,
// written from the specification of optim/state_rounding.h): the parameters and the bf16 moments
// bit for bit after ten steps, at this world size. One optimizer per group of cases, so a case's
// rounding key takes its index among the optimizer's parameters.
TEST(Bf16StateReference, AdamWEqualsTheNumpySpecificationBitwiseAtThisWorldSize) {
  const auto golden = testing::load_golden("adamw_bf16_state_golden.pt");
  const Sharded group = shard_group();
  const at::Tensor lrs = golden.at("lrs");
  const std::vector<std::string> names = case_names(golden);
  ASSERT_EQ(names.size(), 6u);
  const std::pair<double, double> kGroupBetas[] = {{0.9, 0.999}, {0.3, 0.95}};
  for (int64_t index = 0; index < 2; ++index) {
    SCOPED_TRACE("group " + std::to_string(index) + " at world size " + std::to_string(group.world));
    OptimizerSettings settings;
    settings.kind = "adamw";
    settings.beta1 = kGroupBetas[index].first;
    settings.beta2 = kGroupBetas[index].second;
    settings.eps = golden.at("meta.eps").item<double>();
    settings.weight_decay = golden.at("meta.weight_decay").item<double>();
    settings.state_dtype = "bfloat16";
    settings.state_rounding_seed = static_cast<uint64_t>(golden.at("meta.seed").item<int64_t>());
    std::vector<std::string> members;
    std::vector<UnitShard> units;
    for (const std::string& name : names) {
      if (golden.at(name + ".group").item<int64_t>() != index) continue;
      ASSERT_EQ(golden.at(name + ".parameter").item<int64_t>(), static_cast<int64_t>(members.size())) << name;
      members.push_back(name);
      units.push_back(shard_of(name, golden.at(name + ".initial"), UpdateRule::adamw,
                               golden.at(name + ".decay").item<int64_t>() != 0, group));
    }
    auto optimizer = std::make_unique<ShardOptimizer>(settings, units, group.across);
    EXPECT_EQ(optimizer->unit_state(0).exp_avg.scalar_type(), at::kBFloat16);
    for (int64_t step = 0; step < lrs.size(0); ++step) {
      for (size_t u = 0; u < units.size(); ++u) set_gradient(units[u], golden.at(members[u] + ".grads")[step]);
      optimizer->step(lrs[step].item<double>());
    }
    const auto state = optimizer->full_state_dict();
    for (size_t u = 0; u < units.size(); ++u) {
      const std::string& name = members[u];
      expect_same_bits(full_param(units[u], group.across), golden.at(name + ".final"), name + " param");
      expect_same_bits(state.at(name + ".exp_avg"), golden.at(name + ".exp_avg"), name + " exp_avg");
      expect_same_bits(state.at(name + ".exp_avg_sq"), golden.at(name + ".exp_avg_sq"), name + " exp_avg_sq");
    }
  }
}

// The rules written in ATen operations (AdamwSN's forms, GaLore's projections, the HF AdamW they
// share) with bf16 moments, at this world size: each step equals the same rule's fp32 step from the
// same state (the bf16 moments widened), with its moments then rounded as optim/state_rounding.h
// specifies for their index in the full state tensor; the parameter bit for bit (the update uses the
// fp32 moments). Three steps, GaLore's projector refreshed at the first.
TEST(Bf16StateReference, AtenRulesRoundTheFp32StepAsSpecifiedAtThisWorldSize) {
  const Sharded group = shard_group();
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    std::string kind;
    UpdateRule rule;
    double beta1;
    int64_t subset_size;
    std::string proj_type;
  };
  const std::vector<Case> cases = {
      {"hf_vec_1023", {1023}, "adamw_sn", UpdateRule::adam_hf, 0.9, 0, ""},
      {"sn_tall_48x20", {48, 20}, "adamw_sn", UpdateRule::subset_norm, 0.9, 0, ""},
      {"sn_wide_20x48", {20, 48}, "adamw_sn", UpdateRule::subset_norm, 0.9, 0, ""},
      {"sn_general_48x20", {48, 20}, "adamw_sn", UpdateRule::subset_norm, 0.9, -2, ""},
      {"sn_rmsprop_40x12", {40, 12}, "adamw_sn", UpdateRule::subset_norm, 0.0, 0, ""},
      {"galore_std_40x24", {40, 24}, "galore_adamw", UpdateRule::galore, 0.9, 0, "std"},
      {"galore_left_24x40", {24, 40}, "galore_adamw", UpdateRule::galore, 0.9, 0, "left"},
      {"galore_right_40x24", {40, 24}, "galore_adamw", UpdateRule::galore, 0.9, 0, "right"},
  };
  constexpr uint64_t kSeed = 99;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name + " at world size " + std::to_string(group.world));
    OptimizerSettings settings;
    settings.kind = c.kind;
    settings.beta1 = c.beta1;
    settings.weight_decay = 0.1;
    settings.eps = 1e-6;
    settings.subset_size = c.subset_size;
    settings.galore_rank = 6;
    if (!c.proj_type.empty()) settings.proj_type = c.proj_type;
    settings.state_rounding_seed = kSeed;
    OptimizerSettings bf16_settings = settings;
    bf16_settings.state_dtype = "bfloat16";
    at::manual_seed(7);  // the same full tensors on every rank
    const at::Tensor initial = at::randn(c.shape);
    UnitShard bf16_view = shard_of(c.name, initial, c.rule, true, group);
    UnitShard fp32_view = shard_of(c.name, initial, c.rule, true, group);
    ShardOptimizer bf16(bf16_settings, {bf16_view}, group.across);
    ShardOptimizer fp32(settings, {fp32_view}, group.across);
    for (int64_t t = 1; t <= 3; ++t) {
      const at::Tensor grad = at::randn(c.shape) * (t == 2 ? 10.0 : 0.1);
      set_gradient(bf16_view, grad);
      set_gradient(fp32_view, grad);
      fp32_view.master.copy_(bf16_view.master);
      fp32.load_full_state_dict(bf16.full_state_dict());
      bf16.step(1e-2);
      fp32.step(1e-2);
      expect_same_bits(full_param(bf16_view, group.across), full_param(fp32_view, group.across),
                       "param at step " + std::to_string(t));
      const uint32_t key = rounding_key(kSeed, t, 0);
      const auto bf16_state = bf16.full_state_dict();
      for (const auto& [name, moment] : fp32.full_state_dict()) {
        const bool first = name == c.name + ".exp_avg", second = name == c.name + ".exp_avg_sq";
        if (!first && !second) continue;
        expect_same_bits(bf16_state.at(name), rounded_like_the_spec(moment, key, second).to(at::kFloat),
                         name + " at step " + std::to_string(t));
      }
    }
  }
}

}  // namespace
}  // namespace llm::mpi_optim_reference_test
