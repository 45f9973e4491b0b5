// The optimizers of issue 4 through the trainer binary: for AdamwSN (both forms) and GaLore (both
// orientations), mpirun -np 2, 3, 4 on CPU gives one rank's losses and parameters after ten steps of
// llama_micro; a checkpoint resumes bit-identically at the same world size and reshards to another;
// the optimizer-state bytes a rank holds equal the analytic figure of docs/optimizers.md for
// llama_350m at world size 1; and a checkpoint of another optimizer is refused with a clear message.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "optim/shard_optimizer.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"
#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "model/units.h"
#include "config/optimizer_setup.h"

namespace llm {
namespace {

using testing::run_command;
using testing::ScratchDir;

struct OptimizerCase {
  std::string name;
  std::string flags;
};

// llama_micro: q/k/v/o 32x32 (square), gate/up 88x32 (tall), down 32x88 (wide), embed and lm_head
// 128x32. At 3 ranks every matrix pads a row; -2 subsets of gate/up (s = 22) cross rows and ranks.
const OptimizerCase kCases[] = {
    {"adamw_sn_per_matrix", "--optimizer adamw_sn --lr 2e-2"},
    {"adamw_sn_general_all", "--optimizer adamw_sn --subset_size -2 --subset_norm_params all --lr 2e-2"},
    {"rmsprop_sn", "--optimizer adamw_sn --adam_beta1 0 --lr 1e-2"},
    {"galore_std", "--optimizer galore_adamw --rank 8 --update_proj_gap 4 --galore_scale 0.5 --lr 5e-3"},
    {"galore_left", "--optimizer galore_adamw --rank 8 --update_proj_gap 4 --proj_type left --lr 5e-3"},
    {"galore_subspace", "--optimizer galore_adamw --rank 8 --update_proj_gap 4 --galore_projector subspace "
                        "--galore_stagger --lr 5e-3"},
};

std::string run_flags(const OptimizerCase& optimizer, const std::filesystem::path& dir, int ranks,
                      int steps = 10) {
  constexpr int kGlobalBatch = 12;
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --num_training_steps " + std::to_string(steps) +
         " --warmup_steps 2 --max_length 32 --eval_every 0 --weight_decay 0.1 --grad_clipping 0.5"
         " --total_batch_size " + std::to_string(kGlobalBatch) + " --batch_size " +
         std::to_string(kGlobalBatch / ranks / 2) + " " + optimizer.flags + " --save_dir " +
         (dir / "ckpt").string() + " --run_dir " + (dir / "run").string();
}

std::string launcher(int ranks) {
  return ranks == 1 ? "OMP_NUM_THREADS=1 " + testing::trainer_binary().string()
                    : testing::mpirun(ranks) + testing::trainer_binary().string();
}

void expect_same_parameters(const testing::Checkpoint& actual, const testing::Checkpoint& expected, const std::string& what) {
  ASSERT_EQ(actual.model.size(), expected.model.size());
  for (const auto& [name, tensor] : expected.model) {
    const double scale = tensor.abs().max().item<double>() + 1e-12;
    EXPECT_LE((actual.model.at(name) - tensor).abs().max().item<double>() / scale, 1e-4) << what << ": " << name;
  }
}

class OptimizerEquivalence : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(OptimizerEquivalence, NRanksEqualOneRank) {
  const OptimizerCase& optimizer = GetParam();
  ScratchDir reference_dir("opt_ref_" + optimizer.name);
  auto reference = run_command(launcher(1) + run_flags(optimizer, reference_dir.path(), 1));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto reference_steps = testing::read_metrics_events(reference_dir / "run", "train");
  ASSERT_EQ(reference_steps.size(), 10u);
  const testing::Checkpoint reference_final = testing::load_checkpoint((reference_dir / "ckpt/step_10").string());
  for (int ranks : {2, 3, 4}) {
    ScratchDir dir("opt_" + optimizer.name + std::to_string(ranks));
    auto result = run_command(launcher(ranks) + run_flags(optimizer, dir.path(), ranks));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto steps = testing::read_metrics_events(dir / "run", "train");
    ASSERT_EQ(steps.size(), 10u);
    for (size_t i = 0; i < steps.size(); ++i) {
      const double expected = reference_steps[i].at("loss"), actual = steps[i].at("loss");
      EXPECT_LE(std::abs(actual - expected) / std::abs(expected), 1e-5)
          << ranks << " ranks, step " << i + 1 << ": " << actual << " vs " << expected;
    }
    const testing::Checkpoint final_state = testing::load_checkpoint((dir / "ckpt/step_10").string());
    expect_same_parameters(final_state, reference_final, std::to_string(ranks) + " ranks");
    // The optimizer state, written in full, is the same too (GaLore's moments and projectors, the
    // subset norms): what resuming at another world size relies on.
    ASSERT_EQ(final_state.optimizer.size(), reference_final.optimizer.size());
    for (const auto& [key, tensor] : reference_final.optimizer) {
      if (key == "step") continue;
      const double scale = tensor.abs().max().item<double>() + 1e-12;
      EXPECT_LE((final_state.optimizer.at(key) - tensor).abs().max().item<double>() / scale, 1e-3)
          << ranks << " ranks: " << key;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerEquivalence, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

TEST(OptimizerResume, SameWorldSizeIsExactAndAnotherReshards) {
  for (const OptimizerCase& optimizer : {kCases[1], kCases[3], kCases[4]}) {
    SCOPED_TRACE(optimizer.name);
    ScratchDir dir("opt_resume_" + optimizer.name);
    // 12 steps on 2 ranks with a checkpoint at step 6 (GaLore refreshes at 1, 5, 9: after the resume).
    auto full = run_command(launcher(2) + run_flags(optimizer, dir / "full", 2, 12) + " --save_every 6");
    ASSERT_EQ(full.exit_code, 0) << full.output;
    const auto full_steps = testing::read_metrics_events(dir / "full/run", "train");
    for (int ranks : {2, 3}) {
      const auto resumed_dir = dir / ("resumed" + std::to_string(ranks));
      auto resumed = run_command(launcher(ranks) + run_flags(optimizer, resumed_dir, ranks, 12) +
                                 " --continue_from " + (dir / "full/ckpt/step_6").string());
      ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
      const auto steps = testing::read_metrics_events(resumed_dir / "run", "train");
      ASSERT_EQ(steps.size(), 6u);
      for (size_t i = 0; i < steps.size(); ++i) {
        const double expected = full_steps[i + 6].at("loss"), actual = steps[i].at("loss");
        if (ranks == 2)
          EXPECT_EQ(actual, expected) << "same world size, step " << i + 7 << ": bit-identical";
        else
          EXPECT_LE(std::abs(actual - expected) / std::abs(expected), 1e-5) << "resharded, step " << i + 7;
      }
      expect_same_parameters(testing::load_checkpoint((resumed_dir / "ckpt/step_12").string()),
                             testing::load_checkpoint((dir / "full/ckpt/step_12").string()),
                             "resumed on " + std::to_string(ranks) + " ranks");
    }
    // Resuming with another optimizer is refused, naming the one that wrote the checkpoint.
    auto other = run_command(launcher(1) + run_flags({"adamw", "--optimizer adamw"}, dir / "other", 1, 12) +
                             " --continue_from " + (dir / "full/ckpt/step_6").string());
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find("written by --optimizer"), std::string::npos) << other.output;
  }
}

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
}  // namespace llm
