// --pad_matmul_dims: the MLP's intermediate dimension and the vocabulary padded with zeros on the
// compute side only. On a config whose intermediate size and vocabulary are odd
// (tests/fixtures/llama_micro_odd.json: 85 and 130, padded to 128 and 256), a padded run trains as the unpadded one does (the same losses to rounding) at 1 to 4 ranks,
// with each optimizer, strategy and precision; its checkpoints hold the same names and shapes; a
// checkpoint of one resumes in the other; the estimate counts the padded compute copies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "model/units.h"
#include "tests/rounding_bounds.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::matmul_padding_test {
namespace {

using testing::run_command;

std::string odd_config() { return (testing::source_dir() / "tests/fixtures/llama_micro_odd.json").string(); }

TEST(MatmulPadding, WhenEachChoicePads) {
  ModelConfig model = load_model_config(odd_config());
  EXPECT_EQ(with_matmul_padding(model, "auto", /*cuda=*/false).compute_intermediate(), 85) << "auto pads on a GPU only";
  EXPECT_EQ(with_matmul_padding(model, "auto", /*cuda=*/true).compute_intermediate(), 128);
  EXPECT_EQ(with_matmul_padding(model, "on", /*cuda=*/false).compute_intermediate(), 128);
  EXPECT_EQ(with_matmul_padding(model, "off", /*cuda=*/true).compute_intermediate(), 85);
  model.intermediate_size = 5461;  // llama_1b
  EXPECT_EQ(with_matmul_padding(model, "auto", true).compute_intermediate(), 5504);
  model.intermediate_size = 2736;  // llama_350m: a multiple of 8, left alone by auto
  EXPECT_EQ(with_matmul_padding(model, "auto", true).compute_intermediate(), 2736);
  EXPECT_EQ(with_matmul_padding(model, "on", true).compute_intermediate(), 2816);
  model.intermediate_size = 256;   // a multiple of 128: nothing to pad in the MLP
  EXPECT_EQ(with_matmul_padding(model, "on", true).compute_vocab(), 256) << "the fixture's 130 words";
  model.vocab_size = 32100;  // llama_100m: auto pads it on a GPU
  EXPECT_EQ(with_matmul_padding(model, "auto", true).compute_vocab(), 32128);
  EXPECT_EQ(with_matmul_padding(model, "auto", false).compute_vocab(), 32100);
  model.vocab_size = 32000;  // a multiple of 8: auto leaves it; on pads to 128's multiple, here itself
  EXPECT_FALSE(with_matmul_padding(model, "auto", true).matmul_padded());
  EXPECT_FALSE(with_matmul_padding(model, "on", true).matmul_padded());
}

TEST(MatmulPadding, OnlyTheMlpsAndTheVocabularysModuleTensorsArePadded) {
  const ModelConfig model = with_matmul_padding(load_model_config(odd_config()), "on", false);
  int padded = 0;
  for (const UnitSpec& unit : describe_units(model))
    for (const ParameterSpec& parameter : unit.parameters) {
      const bool mlp = parameter.name.find(".mlp.") != std::string::npos;
      const bool vocabulary = parameter.name == "model.embed_tokens.weight" || parameter.name == "lm_head.weight";
      EXPECT_EQ(parameter.padded(), mlp || vocabulary) << parameter.name;
      if (vocabulary) {
        EXPECT_EQ(parameter.shape, (std::vector<int64_t>{130, 32})) << parameter.name;
        EXPECT_EQ(parameter.compute_shape, (std::vector<int64_t>{256, 32})) << parameter.name;
      }
      if (!mlp) continue;
      ++padded;
      const bool down = parameter.name.find("down_proj") != std::string::npos;
      EXPECT_EQ(parameter.shape, (down ? std::vector<int64_t>{32, 85} : std::vector<int64_t>{85, 32})) << parameter.name;
      EXPECT_EQ(parameter.compute_shape, (down ? std::vector<int64_t>{32, 128} : std::vector<int64_t>{128, 32}))
          << parameter.name;
    }
  EXPECT_EQ(padded, 3 * model.num_hidden_layers);
  EXPECT_EQ(model.num_parameters(), load_model_config(odd_config()).num_parameters()) << "the count stays logical";
}

struct PaddingCase {
  std::string name;
  int ranks;
  std::string flags;
  // The pads add exact zeros: what changes is the blocking of the matmuls and the order of their sums
  // (fp32), or a bf16 rounding (bf16): tests/rounding_bounds.h's bounds, weights and moments included.
  testing::RoundingBounds bounds;
};

constexpr double kClipping = 0.05;  // every step clips (the odd config's norms are far above it)

// environment: LLM_DEBUG_PERTURB_UPDATE for a wrong run (PaddedRunBounds), "" for none.
const testing::RecordedRun& odd_run(const PaddingCase& c, const std::string& padding, const std::string& environment = "") {
  constexpr int kGlobalBatch = 8;
  return testing::recorded_run(
      c.ranks, "--config " + odd_config() +
                   " --device cpu --num_training_steps 4 --warmup_steps 1 --max_length 32 --eval_every 2 --eval_batches 1"
                   " --weight_decay 0.1 --grad_clipping 0.05 --lr 1e-2 --save_every 4 --total_batch_size " +
                   std::to_string(kGlobalBatch) + " --batch_size " + std::to_string(kGlobalBatch / c.ranks / 2) + " " +
                   c.flags + " --pad_matmul_dims " + padding,
      environment);
}

std::vector<std::string> differences(const PaddingCase& c, const testing::RecordedRun& want, const testing::RecordedRun& got) {
  return testing::rounding_differences(testing::read_run(want.run_dir(), want.save_dir() / "step_4"),
                                       testing::read_run(got.run_dir(), got.save_dir() / "step_4"), c.bounds, kClipping);
}

class PaddedRun : public ::testing::TestWithParam<PaddingCase> {};

TEST_P(PaddedRun, TrainsAsTheUnpaddedRunAndSavesTheSameTensors) {
  const PaddingCase& c = GetParam();
  const testing::RecordedRun& plain = odd_run(c, "off");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const testing::RecordedRun& padded = odd_run(c, "on");
  ASSERT_EQ(padded.exit_code, 0) << padded.output;
  // Every step's loss and gradient norm, and the checkpoints' tensors (the logical ones, by name and
  // shape), to the rounding bounds of the case's precision.
  const std::vector<std::string> found = differences(c, plain, padded);
  EXPECT_TRUE(found.empty()) << testing::joined_lines(found);
  const testing::Checkpoint want = testing::load_checkpoint((plain.save_dir() / "step_4").string());
  const testing::Checkpoint have = testing::load_checkpoint((padded.save_dir() / "step_4").string());
  ASSERT_EQ(want.optimizer.size(), have.optimizer.size());
  for (const auto& [name, tensor] : want.optimizer) {
    ASSERT_TRUE(have.optimizer.count(name)) << name;
    EXPECT_EQ(have.optimizer.at(name).sizes(), tensor.sizes()) << name;
  }
  // The start record says the width each computed at, and the attention kernel ATen picked.
  const auto plain_start = testing::read_metrics_events(plain.run_dir(), "start");
  const auto padded_start = testing::read_metrics_events(padded.run_dir(), "start");
  ASSERT_EQ(padded_start.size(), 1u);
  EXPECT_EQ(plain_start.at(0).at("mlp_compute_width"), 85);
  EXPECT_EQ(padded_start.at(0).at("mlp_compute_width"), 128);
  EXPECT_EQ(plain_start.at(0).at("vocab_compute_width"), 130);
  EXPECT_EQ(padded_start.at(0).at("vocab_compute_width"), 256);
  const std::string backend = padded_start.at(0).at("attention_backend");
  EXPECT_TRUE(backend == "flash_attention" || backend == "math") << backend << " (a CPU has these two)";
  // The compute copies are wider: the gathered parameters (the ledger's) grow, the optimizer's not.
  // (At one rank the unpadded units are resident, the padded ones gathered one or two at a time.)
  if (c.ranks > 1)
    EXPECT_GT(testing::ledger_summary_max(padded.run_dir(), 0, "parameters"),
              testing::ledger_summary_max(plain.run_dir(), 0, "parameters"));
  EXPECT_EQ(testing::ledger_summary_max(padded.run_dir(), 0, "optimizer_device"),
            testing::ledger_summary_max(plain.run_dir(), 0, "optimizer_device"));
}

// Each optimizer, strategy and precision, 1 to 4 ranks; fp32 to a few ulps of the sums (the pads
// add exact zeros, but the matmuls may block another way), bf16 to its rounding.
const PaddingCase kCases[] = {
    {"adamw_fp32_1rank", 1, "", testing::fp32_bounds()},
    {"adamw_fp32_full_shard_4ranks", 4, "", testing::fp32_bounds()},
    {"adamw_sn_fp32_shard_grad_op_2ranks", 2, "--optimizer adamw_sn --sharding shard_grad_op", testing::fp32_bounds()},
    {"galore_fp32_no_shard_2ranks", 2, "--optimizer galore_adamw --rank 8 --update_proj_gap 2 --sharding no_shard",
     testing::galore_bounds(testing::fp32_bounds())},
    {"adamw_bf16_mixed_2ranks", 2, "--dtype bfloat16 --precision mixed", testing::bf16_bounds()},
    {"adamw_sn_bf16_pure_4ranks", 4, "--dtype bfloat16 --precision pure --optimizer adamw_sn", testing::bf16_bounds()},
    {"galore_bf16_pure_1rank", 1, "--dtype bfloat16 --precision pure --optimizer galore_adamw --rank 8 --update_proj_gap 2",
     testing::galore_bounds(testing::bf16_bounds())},
    {"offload_optimizer_parameters_2ranks", 2, "--offload optimizer,parameters", testing::fp32_bounds()},
    {"recompute_and_checkpointing_2ranks", 2, "--recompute norm,swiglu", testing::fp32_bounds()},
};

INSTANTIATE_TEST_SUITE_P(Cases, PaddedRun, ::testing::ValuesIn(kCases), [](const auto& info) { return info.param.name; });

// The bounds can fail: a padded run whose first update is a little too large (fp32: 1 %, bf16: a
// quarter; LLM_DEBUG_PERTURB_UPDATE) breaks the weights' and the loss's (before issue 52 the checkpoint
// was compared to 0.1 absolute in bf16, where the weights move at most about 0.04).
TEST(PaddedRunBounds, AWrongUpdateInThePaddedRunBreaksThem) {
  for (const PaddingCase& c : {kCases[0], kCases[4]}) {
    SCOPED_TRACE(c.name);
    const testing::RecordedRun& plain = odd_run(c, "off");
    const testing::RecordedRun& wrong =
        odd_run(c, "on", std::string("LLM_DEBUG_PERTURB_UPDATE=") + (c.bounds.u > 1e-6 ? "1:1.25" : "1:1.01"));
    ASSERT_EQ(wrong.exit_code, 0) << wrong.output;
    const std::vector<std::string> found = differences(c, plain, wrong);
    for (const char* quantity : {"weights", "loss"})
      EXPECT_TRUE(testing::names_quantity(found, quantity)) << quantity << ":\n" << testing::joined_lines(found);
  }
}

// A checkpoint saved padded resumes unpadded, and the other way: the continued steps are those of
// the uninterrupted run of the other kind, to rounding.
TEST(PaddedCheckpoints, ResumeAcrossPaddedAndUnpadded) {
  for (const auto& [first, second] : {std::pair<std::string, std::string>{"on", "off"}, {"off", "on"}}) {
    SCOPED_TRACE(first + " then " + second);
    testing::ScratchDir dir("padding_resume_" + first);
    const std::string base = testing::trainer_launcher(2) + " --config " + odd_config() +
                             " --device cpu --warmup_steps 1 --max_length 32 --batch_size 2 --total_batch_size 8"
                             " --lr 1e-2 --save_every 2";
    const std::string saves = " --save_dir " + (dir / "ckpt").string();
    const auto saved = run_command(base + saves + " --num_training_steps 4 --stop_at_step 2 --pad_matmul_dims " + first + " --run_dir " +
                                   (dir / "a").string());
    ASSERT_EQ(saved.exit_code, 0) << saved.output;
    const auto resumed = run_command(base + saves + " --num_training_steps 4 --pad_matmul_dims " + second +
                                     " --run_dir " + (dir / "b").string() + " --continue_from " + (dir / "ckpt").string());
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const auto whole = run_command(base + " --num_training_steps 4 --pad_matmul_dims " + second + " --run_dir " +
                                   (dir / "c").string() + " --save_dir " + (dir / "ckpt_whole").string());
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const auto continued = testing::read_metrics_events(dir / "b", "train");
    const auto uninterrupted = testing::read_metrics_events(dir / "c", "train");
    ASSERT_EQ(uninterrupted.size(), 4u);
    ASSERT_EQ(continued.size(), 2u);
    // Steps 3 and 4, each to fp32's rounding bounds (tests/rounding_bounds.h): the loss to its floor
    // plus its movement's rounding, the gradient norm relatively.
    const testing::RoundingBounds fp32 = testing::fp32_bounds();
    for (size_t i = 0; i < 2; ++i) {
      const double want = uninterrupted[2 + i].at("loss"), have = continued[i].at("loss");
      EXPECT_NEAR(have, want, fp32.loss_floor + fp32.loss_k * fp32.u * std::abs(want - uninterrupted[0].at("loss").get<double>()))
          << "step " << 3 + i;
      const double want_norm = uninterrupted[2 + i].at("grad_norm"), norm = continued[i].at("grad_norm");
      EXPECT_NEAR(norm, want_norm, fp32.norm_k * fp32.u * want_norm) << "step " << 3 + i;
    }
  }
}

// trainer estimate counts the padded compute copies and activations: within the ledger's bound of
// the measured padded run (1 and 2 ranks), and above the unpadded estimate.
TEST(PaddedEstimate, CountsTheWiderComputeCopies) {
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const PaddingCase c{"estimate", ranks, "", 1e-5};
    const testing::RecordedRun& padded = odd_run(c, "on");
    ASSERT_EQ(padded.exit_code, 0) << padded.output;
    auto estimate_peak = [&](const std::string& padding) {
      const auto result = run_command(testing::trainer_binary().string() + " estimate --config " + odd_config() +
                                      " --device cpu --max_length 32 --batch_size " + std::to_string(8 / ranks / 2) +
                                      " --total_batch_size 8 --world_size " + std::to_string(ranks) +
                                      " --pad_matmul_dims " + padding + " --json");
      EXPECT_EQ(result.exit_code, 0) << result.output;
      return nlohmann::json::parse(result.output).at("ranks").at(0);
    };
    const nlohmann::json on = estimate_peak("on"), off = estimate_peak("off");
    EXPECT_GT(on.at("max").at("parameters").get<int64_t>(), off.at("max").at("parameters").get<int64_t>());
    EXPECT_EQ(on.at("max").at("parameters").get<int64_t>(), testing::ledger_summary_max(padded.run_dir(), 0, "parameters"));
    EXPECT_EQ(on.at("max").at("optimizer_device").get<int64_t>(),
              testing::ledger_summary_max(padded.run_dir(), 0, "optimizer_device"));
  }
}

TEST(MatmulPaddingFlag, BadValueIsNamed) {
  const auto result = run_command(testing::trainer_binary().string() + " --config " + odd_config() +
                                  " --device cpu --max_length 32 --num_training_steps 1 --pad_matmul_dims sometimes");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--pad_matmul_dims: expected auto"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace llm::matmul_padding_test
