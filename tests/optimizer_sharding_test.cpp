// The optimizers of issue 4 on flat shards: the optimizer-state bytes a rank holds equal the analytic
// figure of docs/optimizers.md for llama_350m at world size 1, and GaLore's staggered refreshes each
// recompute their share of the projectors. Through the trainer binary, each optimizer at 2, 3 and 4
// ranks equals one rank (tests/sharding_test.cpp, WorldSizes) and resumes at the same and at other
// world sizes (tests/sharded_checkpoint_test.cpp, Reshard).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "optim/shard_optimizer.h"
#include "tests/test_util.h"
#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "model/units.h"
#include "config/optimizer_setup.h"

namespace llm::optimizer_sharding_test {
namespace {

// llama_350m at world size 1, each optimizer's state as the buffers exist, against the figure
// derived by hand from the config (docs/optimizers.md): h 1024, I 2736, 24 layers, V 32000.
TEST(OptimizerStateBytes, Llama350mMatchesTheAnalyticFigure) {
  const ModelConfig model = load_model_config((testing::source_dir() / "configs/llama_350m.json").string());
  const int64_t h = 1024, I = 2736, L = 24, V = 32000, r = 128;
  ASSERT_EQ(model.hidden_size, h);
  ASSERT_EQ(model.intermediate_size, I);
  ASSERT_EQ(model.num_hidden_layers, L);
  ASSERT_EQ(model.vocab_size, V);
  const int64_t P = model.num_parameters();
  const int64_t embeddings = 2 * V * h, norms = (2 * L + 1) * h;
  // adamw: m and v per parameter.
  const int64_t adamw = 8 * P;
  // adamw_sn (per matrix, linear weights): m per parameter; v per element for the embedding and the
  // norms, one per row of q/k/v/o (h), gate/up (I) and lm_head (V), one per column of down (I).
  const int64_t adamw_sn = 4 * P + 4 * (V * h + norms + L * (4 * h + 3 * I) + V);
  // galore_adamw (rank 128, std): q/k/v/o h x h right-projected: P (r x h) + m, v (h x r);
  // gate/up I x h: P (r x h) + m, v (I x r); down h x I (wide) left: P (h x r) + m, v (r x I);
  // the embedding, lm_head and norms: m and v per parameter.
  const int64_t galore = 4 * (L * (4 * 3 * r * h + 2 * (r * h + 2 * I * r) + (h * r + 2 * r * I))) +
                         8 * (embeddings + norms);

  // The units of one rank holding everything, laid out as the trainer lays them out: shards allocated,
  // never touched (lazy pages).
  for (const auto& [optimizer, expected] :
       {std::pair<std::string, int64_t>{"adamw", adamw}, {"adamw_sn", adamw_sn}, {"galore_adamw", galore}}) {
    RunConfig run;
    run.optimizer.name = optimizer;
    run.optimizer.adam_eps = 1e-6;
    std::vector<UnitShard> units;
    int64_t counted = 0, predicted = 0;
    for (const UnitSpec& spec : describe_units(model)) {
      std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
      for (const ParameterSpec& parameter : spec.parameters) shapes.emplace_back(parameter.name, parameter.shape);
      UnitShard unit;
      unit.layout = FlatShardLayout::from_shapes(spec.name, shapes, 0, 1);
      unit.master = at::empty({unit.layout.shard_numel}, at::kFloat);
      unit.gradient = at::empty({unit.layout.shard_numel}, at::kFloat);
      unit.rules = update_rules_for(unit.layout, run);
      for (size_t i = 0; i < unit.rules.size(); ++i)
        predicted += optimizer_state_bytes(optimizer_settings(run), unit.layout.parameters[i], unit.rules[i], 1);
      counted += unit.layout.shard_numel;
      units.push_back(std::move(unit));
    }
    ASSERT_EQ(counted, P);
    ShardOptimizer built(optimizer_settings(run), std::move(units), nullptr);
    EXPECT_EQ(built.state_bytes(), expected) << optimizer;
    EXPECT_EQ(predicted, expected) << optimizer << " (optimizer_state_bytes, used by estimates)";
    std::printf("[ state bytes ] llama_350m %-13s %6.3f GB  (%.3f bytes per parameter)\n", optimizer.c_str(),
                expected / 1e9, static_cast<double>(expected) / static_cast<double>(P));
  }
}

// Staggered refreshes: every projector is computed at step 1; afterwards matrix k of K = 4 refreshes
// at steps 1 + kT/K + jT, so with T = 4 each of steps 2..5 recomputes exactly one projector and the
// reference schedule (all four at step 5) recomputes all at once.
TEST(GaLoreStagger, EachStepRecomputesItsShareOfProjectors) {
  for (const bool stagger : {false, true}) {
    OptimizerSettings settings;
    settings.kind = "galore_adamw";
    settings.galore_rank = 2;
    settings.update_proj_gap = 4;
    settings.stagger_projectors = stagger;
    std::vector<UnitShard> units;
    std::vector<at::Tensor> params, grads;
    for (int k = 0; k < 4; ++k) {
      params.push_back(at::randn({6, 5}));
      grads.push_back(at::zeros({6, 5}));
      units.push_back(single_parameter_unit("w" + std::to_string(k), {6, 5}, params.back(), grads.back(),
                                            UpdateRule::galore, false));
    }
    auto optimizer = std::make_unique<ShardOptimizer>(settings, std::move(units), nullptr);
    std::map<std::string, at::Tensor> previous;
    std::vector<int> refreshed_per_step;
    for (int step = 1; step <= 9; ++step) {
      for (auto& grad : grads) grad.copy_(at::randn({6, 5}));
      optimizer->step(1e-3);
      const auto state = optimizer->full_state_dict();
      int refreshed = 0;
      for (int k = 0; k < 4; ++k) {
        const std::string key = "w" + std::to_string(k) + ".projector";
        if (!previous.count(key) || !at::equal(previous.at(key), state.at(key))) ++refreshed;
        previous[key] = state.at(key).clone();
      }
      refreshed_per_step.push_back(refreshed);
    }
    const std::vector<int> expected = stagger ? std::vector<int>{4, 1, 1, 1, 1, 1, 1, 1, 1}
                                              : std::vector<int>{4, 0, 0, 0, 4, 0, 0, 0, 4};
    EXPECT_EQ(refreshed_per_step, expected) << (stagger ? "staggered" : "together");
  }
}

}  // namespace
}  // namespace llm::optimizer_sharding_test
