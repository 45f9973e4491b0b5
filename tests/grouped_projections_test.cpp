// --grouped_projections: each layer's q/k/v and gate/up as one GEMM (model/grouped_linear.h) over
// weights that lie one after another in memory. The node against the separate projections (fp32,
// pure bf16, bf16 autocast over fp32 weights; the outputs, the input's gradient, each weight's, and
// what under autocast it keeps); a gathered unit's parameters adjacent (sharding/fsdp_unit.cpp's
// block); runs with it against runs without at 1 to 4 ranks, each strategy and precision, offload,
// recompute and padding; the estimate against the ledger where it changes what autocast keeps.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/autocast.h"
#include "model/grouped_linear.h"
#include "tests/rounding_bounds.h"
#include "tests/run_comparison.h"
#include "tests/tensor_checks.h"
#include "tests/test_util.h"

namespace llm::grouped_projections_test {
namespace {

using testing::expect_all_close;

// Leaves of these shapes whose data are consecutive parts of one buffer (as set_data makes a resident
// unit's parameters views of its shard), in this order.
std::vector<at::Tensor> adjacent_leaves(const std::vector<std::vector<int64_t>>& shapes, at::ScalarType dtype,
                                        uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  int64_t total = 0;
  for (const auto& shape : shapes) total += shape[0] * shape[1];
  const at::Tensor buffer = (at::randn({total}) * 0.2).to(dtype);
  std::vector<at::Tensor> leaves;
  int64_t offset = 0;
  for (const auto& shape : shapes) {
    at::Tensor leaf = at::empty(shape, buffer.options()).requires_grad_(true);
    leaf.set_data(buffer.narrow(0, offset, shape[0] * shape[1]).view(shape));
    leaves.push_back(leaf);
    offset += shape[0] * shape[1];
  }
  return leaves;
}

// Within `tolerance` of the largest element (sums in another grouping round apart where terms cancel).
void expect_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance, const char* what) {
  const at::Tensor want = expected.to(at::kFloat);
  expect_all_close(actual.to(at::kFloat), want, tolerance * want.abs().max().item<double>(), 0.0, what);
}

struct Precision {
  std::string name;
  at::ScalarType weights;
  bool autocast;
  double tolerance;  // relative to the largest element
};

class GroupedLinear : public ::testing::TestWithParam<Precision> {};

TEST_P(GroupedLinear, EqualsTheSeparateProjectionsToRounding) {
  const Precision p = GetParam();
  // q, k and v of a GQA layer (64 wide, 2 of 4 heads for k and v), and gate/up of an odd width.
  for (const auto& shapes : {std::vector<std::vector<int64_t>>{{64, 64}, {32, 64}, {32, 64}},
                             std::vector<std::vector<int64_t>>{{85, 64}, {85, 64}}}) {
    SCOPED_TRACE(std::to_string(shapes.size()) + " weights");
    const std::vector<at::Tensor> weights = adjacent_leaves(shapes, p.weights, 11);
    ASSERT_TRUE(adjacent_weights(weights));
    std::vector<at::Tensor> separate;
    for (const at::Tensor& w : weights) separate.push_back(w.detach().clone().requires_grad_(true));
    const at::Tensor values = at::randn({3, 16, 64}).to(p.autocast ? at::kFloat : p.weights);
    at::Tensor x = values.clone().requires_grad_(true), x_separate = values.clone().requires_grad_(true);
    std::vector<at::Tensor> ours, reference;
    {
      AutocastRegion region(at::kCPU, at::kBFloat16, p.autocast);
      ours = grouped_linear(x, weights);
      for (const at::Tensor& w : separate) reference.push_back(at::linear(x_separate, w));
    }
    at::Tensor loss = at::zeros({}), reference_loss = at::zeros({});
    for (size_t i = 0; i < ours.size(); ++i) {
      ASSERT_EQ(ours[i].sizes(), reference[i].sizes());
      ASSERT_EQ(ours[i].scalar_type(), reference[i].scalar_type());
      expect_close(ours[i], reference[i], p.tolerance, "output");
      const at::Tensor upstream = at::randn(ours[i].sizes()).to(ours[i].scalar_type());
      loss = loss + (ours[i].to(at::kFloat) * upstream.to(at::kFloat)).sum();
      reference_loss = reference_loss + (reference[i].to(at::kFloat) * upstream.to(at::kFloat)).sum();
    }
    loss.backward();
    reference_loss.backward();
    ASSERT_EQ(x.grad().scalar_type(), x.scalar_type());
    expect_close(x.grad(), x_separate.grad(), p.tolerance, "d x");
    for (size_t i = 0; i < weights.size(); ++i) {
      ASSERT_EQ(weights[i].grad().scalar_type(), weights[i].scalar_type());
      ASSERT_EQ(weights[i].grad().sizes(), weights[i].sizes());
      expect_close(weights[i].grad(), separate[i].grad(), p.tolerance, "d w");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GroupedLinear,
                         ::testing::Values(Precision{"fp32", at::kFloat, false, 1e-5},
                                           Precision{"bf16_pure", at::kBFloat16, false, 2e-2},
                                           Precision{"bf16_autocast", at::kFloat, true, 2e-2}),
                         [](const auto& info) { return info.param.name; });

TEST(GroupedLinearWeights, OnlyAdjacentWeightsInOrderAreGrouped) {
  std::vector<at::Tensor> weights = adjacent_leaves({{8, 4}, {8, 4}, {8, 4}}, at::kFloat, 1);
  EXPECT_TRUE(adjacent_weights(weights));
  EXPECT_FALSE(adjacent_weights({weights[1], weights[0], weights[2]})) << "out of order";
  EXPECT_FALSE(adjacent_weights({weights[0], weights[2]})) << "a gap";
  EXPECT_FALSE(adjacent_weights({weights[0]})) << "one alone";
  const at::Tensor apart = at::randn({8, 4}).requires_grad_(true);
  EXPECT_FALSE(adjacent_weights({weights[0], apart}));
  EXPECT_THROW(grouped_linear(at::randn({2, 4}), {weights[0], apart}), std::logic_error)
      << "the model never falls back silently";
}

// The trainer's runs: with --grouped_projections against without, the same run to rounding (fp32: the
// input's gradient summed in another grouping; bf16: its rounding): every step's loss and gradient
// norm and the last checkpoint's weights and moments, by tests/rounding_bounds.h's bounds.
struct RunCase {
  std::string name;
  int ranks;
  std::string flags;
  testing::RoundingBounds bounds;
};

std::string run_flags(const RunCase& c, bool grouped) {
  return "--config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --num_training_steps 4 --warmup_steps 1 --max_length 32 --lr 1e-2 --grad_clipping 0.05"
         " --eval_every 0 --total_batch_size 8 --batch_size " + std::to_string(8 / c.ranks / 2) + " " + c.flags +
         (grouped ? " --grouped_projections" : "");
}

const testing::RecordedRun& run(const RunCase& c, bool grouped) { return testing::recorded_run(c.ranks, run_flags(c, grouped)); }

class GroupedRun : public ::testing::TestWithParam<RunCase> {};

TEST_P(GroupedRun, TrainsAsTheSeparateProjections) {
  const RunCase& c = GetParam();
  const testing::RecordedRun& plain = run(c, false);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const testing::RecordedRun& grouped = run(c, true);
  ASSERT_EQ(grouped.exit_code, 0) << grouped.output;
  const std::vector<std::string> differences = testing::rounding_differences(
      testing::read_run(plain.run_dir(), plain.save_dir() / "step_4"),
      testing::read_run(grouped.run_dir(), grouped.save_dir() / "step_4"), c.bounds, /*grad_clipping=*/0.05);
  EXPECT_TRUE(differences.empty()) << testing::joined_lines(differences);
  const auto start = testing::read_metrics_events(grouped.run_dir(), "start");
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start.at(0).at("grouped_projections"), true);
}

const RunCase kRunCases[] = {
    {"fp32_1rank_resident", 1, "", testing::fp32_bounds()},
    {"fp32_full_shard_4ranks", 4, "", testing::fp32_bounds()},
    {"bf16_mixed_2ranks", 2, "--dtype bfloat16 --precision mixed", testing::bf16_bounds()},
    {"bf16_pure_shard_grad_op_2ranks", 2, "--dtype bfloat16 --precision pure --sharding shard_grad_op", testing::bf16_bounds()},
    {"galore_no_shard_2ranks", 2, "--optimizer galore_adamw --rank 8 --update_proj_gap 2 --sharding no_shard",
     testing::galore_bounds(testing::fp32_bounds())},
    {"offload_parameters_recompute_2ranks", 2, "--offload optimizer,parameters --recompute norm,swiglu,attention",
     testing::fp32_bounds()},
    {"padded_bf16_pure_1rank", 1, "--dtype bfloat16 --precision pure --pad_matmul_dims on --recompute mlp",
     testing::bf16_bounds()},
};

INSTANTIATE_TEST_SUITE_P(Cases, GroupedRun, ::testing::ValuesIn(kRunCases), [](const auto& info) { return info.param.name; });

// Under autocast the grouped layer keeps one bf16 cast of its input for q/k/v and one for gate/up:
// the activations the ledger measures shrink by what trainer estimate says (6h bytes a token per
// layer), where the peak's 10 % tolerance (memory_estimate_test) would not notice the term.
TEST(GroupedEstimate, TheActivationsSavedAreWhatTheEstimateSubtracts) {
  const RunCase c = kRunCases[2];  // bf16 mixed at 2 ranks
  ASSERT_NE(c.flags.find("mixed"), std::string::npos);
  int64_t measured[2] = {0, 0}, estimated[2] = {0, 0};
  for (bool grouped : {false, true}) {
    const testing::RecordedRun& trained = run(c, grouped);
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    measured[grouped] = testing::ledger_summary_max(trained.run_dir(), 0, "activations");
    const auto estimate = testing::run_command(testing::trainer_binary().string() + " estimate " + run_flags(c, grouped) +
                                               " --world_size " + std::to_string(c.ranks) + " --json 2>/dev/null");
    ASSERT_EQ(estimate.exit_code, 0) << estimate.output;
    estimated[grouped] = nlohmann::json::parse(estimate.output).at("ranks")[0].at("max").at("activations");
  }
  const int64_t measured_saving = measured[0] - measured[1], estimated_saving = estimated[0] - estimated[1];
  EXPECT_GT(estimated_saving, 0);
  EXPECT_NEAR(static_cast<double>(measured_saving), static_cast<double>(estimated_saving), 0.1 * estimated_saving)
      << "activations measured " << measured[0] << " -> " << measured[1] << ", estimated " << estimated[0] << " -> "
      << estimated[1];
}

}  // namespace
}  // namespace llm::grouped_projections_test
