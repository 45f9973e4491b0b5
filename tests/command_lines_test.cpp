// Command lines users bring from GaLore's and AdamW-SN's torchrun_main.py, verbatim from their READMEs
// (jiaweizzhao/GaLore README.md; timmytonga/sn-sm examples.sh, which its README points to): each one
// either resolves to the settings it asks for, or stops with a message naming what differs and the
// nearest flags here. Where a reference default differs from ours, ours wins and a warning says so
// (README "Command lines from GaLore and AdamW-SN").
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "tests/test_util.h"
#include "trainer/cli.h"
#include "config/config.h"

namespace llm::command_lines_test {
namespace {

using testing::source_dir;

// The flags after `torchrun_main.py`, split as a shell would (no quoting in these lines; the
// README's line continuations dropped).
Command parse_line(const std::string& line) {
  std::vector<std::string> args = {"trainer"};
  std::istringstream words(line);
  for (std::string word; words >> word;)
    if (word != "\\") args.push_back(word);
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(const std::string& line) {
  try {
    parse_line(line);
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError for: " << line;
  return "";
}

void expect_mentions(const std::string& text, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    EXPECT_NE(text.find(part), std::string::npos) << "should mention \"" << part << "\":\n  " << text;
}

std::string all_warnings(const Command& command) {
  std::string all;
  for (const std::string& warning : command.warnings) all += warning + "\n";
  return all;
}

ModelConfig model(const std::string& name) {
  return load_model_config((source_dir() / "configs" / (name + ".json")).string());
}

// GaLore README, "LLaMA-60M, GaLore-Adam, 1 A100, 1 Node".
const char* kGaloreLlama60m =
    "--model_config configs/llama_60m.json \\ --lr 0.01 \\ --galore_scale 0.25 \\ --rank 128 \\ "
    "--update_proj_gap 200 \\ --batch_size 256 \\ --total_batch_size 512 \\ --num_training_steps 10000 \\ "
    "--warmup_steps 1000 \\ --weight_decay 0 \\ --dtype bfloat16 \\ --eval_every 1000 \\ "
    "--optimizer galore_adamw";
// GaLore README, "LLaMA-7B, 8-bit GaLore-Adam, single GPU, activation checkpointing".
const char* kGaloreLlama7bSingleGpu =
    "--model_config configs/llama_7b.json \\ --lr 0.005 \\ --galore_scale 0.25 \\ --rank 1024 \\ "
    "--update_proj_gap 500 \\ --batch_size 16 \\ --total_batch_size 512 \\ --activation_checkpointing \\ "
    "--num_training_steps 150000 \\ --warmup_steps 15000 \\ --weight_decay 0 \\ --grad_clipping 1.0 \\ "
    "--dtype bfloat16 \\ --eval_every 1000 \\ --single_gpu \\ --optimizer galore_adamw8bit_per_layer";

TEST(ReferenceCommandLines, GaloreLlama60mRunsWithOurPrecisionAndClippingAndSaysSo) {
  Command command = parse_line(kGaloreLlama60m);
  ASSERT_EQ(command.kind, Command::Kind::train);
  RunConfig& run = command.run;
  validate_run_config(run, model("llama_60m"), 1);
  EXPECT_EQ(run.config_path, "configs/llama_60m.json");
  EXPECT_DOUBLE_EQ(run.optimizer.lr, 0.01);
  EXPECT_EQ(run.optimizer.name, "galore_adamw");
  EXPECT_DOUBLE_EQ(run.optimizer.galore_scale, 0.25);
  EXPECT_EQ(run.optimizer.galore_rank, 128);
  EXPECT_EQ(run.optimizer.update_proj_gap, 200);
  EXPECT_EQ(run.data.batch_size, 256);
  EXPECT_EQ(run.data.total_batch_size, 512);
  EXPECT_EQ(run.data.gradient_accumulation, 2);
  EXPECT_EQ(run.num_training_steps, 10000);
  EXPECT_EQ(run.optimizer.warmup_steps, 1000);
  EXPECT_DOUBLE_EQ(run.optimizer.weight_decay, 0);
  EXPECT_EQ(run.data.eval_every, 1000);
  EXPECT_DOUBLE_EQ(run.optimizer.adam_eps, 1e-6);  // GaLoreAdamW's default
  // Our meanings win, each with a warning naming the flag that gives GaLore's.
  EXPECT_EQ(run.precision.dtype, DType::bfloat16);
  EXPECT_EQ(run.precision.mode, Precision::mixed);
  EXPECT_DOUBLE_EQ(run.optimizer.grad_clipping, 1.0);
  EXPECT_EQ(run.data.max_length, 128);
  ASSERT_EQ(command.warnings.size(), 3u) << all_warnings(command);
  expect_mentions(command.warnings[0], {"command line: --dtype bfloat16 without --precision: mixed here",
                                        "pure bf16", "add --precision pure"});
  expect_mentions(command.warnings[1], {"command line: --grad_clipping not given", "clipped to 1 here",
                                        "default to 0", "pass --grad_clipping 0"});
  expect_mentions(command.warnings[2], {"command line: --max_length not given: 128 here", "default to 256",
                                        "pass --max_length"});

  // With the flags the warnings name, GaLore's meaning, and no warning left.
  const Command galore_meaning =
      parse_line(std::string(kGaloreLlama60m) + " --precision pure --grad_clipping 0 --max_length 256");
  EXPECT_EQ(galore_meaning.run.precision.mode, Precision::pure);
  EXPECT_DOUBLE_EQ(galore_meaning.run.optimizer.grad_clipping, 0);
  EXPECT_TRUE(galore_meaning.warnings.empty()) << all_warnings(galore_meaning);
}

TEST(ReferenceCommandLines, GaloreLlama7bSingleGpuNamesTheMissingOptimizerAndTheNearest) {
  const std::string message = error_of(kGaloreLlama7bSingleGpu);
  EXPECT_EQ(message,
            "command line: --optimizer: expected one of adamw, adamw_sn, galore_adamw (got "
            "\"galore_adamw8bit_per_layer\"): GaLore's 8-bit GaLore-AdamW stepped per layer in backward is not "
            "built here (no 8-bit states); the nearest is --optimizer galore_adamw (32-bit states) with "
            "--fuse_optimizer_with_backward (each unit steps in backward, which needs --grad_clipping 0) (run "
            "`trainer --help` for the flags and their values)");

  // The nearest command line runs: activation checkpointing on every block, --single_gpu a no-op.
  std::string nearest = kGaloreLlama7bSingleGpu;
  nearest.replace(nearest.find("galore_adamw8bit_per_layer"), std::string("galore_adamw8bit_per_layer").size(),
                  "galore_adamw --fuse_optimizer_with_backward --precision pure");
  nearest.replace(nearest.find("--grad_clipping 1.0"), std::string("--grad_clipping 1.0").size(),
                  "--grad_clipping 0");
  Command command = parse_line(nearest);
  validate_run_config(command.run, model("llama_7b"), 1);
  EXPECT_EQ(command.run.activation_checkpointing_every, 1);
  EXPECT_TRUE(command.run.fuse_optimizer_with_backward);
  EXPECT_EQ(command.run.optimizer.galore_rank, 1024);
  EXPECT_EQ(command.run.data.gradient_accumulation, 32);  // 512 / (16 x 1 rank)
  ASSERT_EQ(command.warnings.size(), 2u) << all_warnings(command);
  expect_mentions(command.warnings[0], {"--single_gpu: accepted and ignored"});
  expect_mentions(command.warnings[1], {"--max_length not given"});
}

// timmytonga/sn-sm examples.sh (AdamW-SN's fork of GaLore's torchrun_main), line by line.
const char* kSnAdamSnHeuristics =
    "--model_config configs/llama_60m.json --lr 5e-2 --batch_size 128 --total_batch_size 512 "
    "--num_training_steps 10000 --weight_decay 0 --dtype bfloat16 --eval_every 1000 --optimizer adamw_sn "
    "--use_subset_norm_heuristics  --scheduler cosine --warmup_steps 1000 --grad_clipping 1.0 --single_gpu";
const char* kSnAdamSnSqrtHalf =
    "--model_config configs/llama_60m.json --lr 5e-2 --batch_size 128 --total_batch_size 512 "
    "--num_training_steps 10000 --weight_decay 0 --dtype bfloat16 --eval_every 1000 --optimizer adamw_sn  "
    "--scheduler cosine --warmup_steps 1000 --grad_clipping 1.0 --single_gpu";
const char* kSnAdamSnsm =
    "--model_config=configs/llama_60m.json --batch_size=128 --total_batch_size=512 "
    "--use_subset_norm_heuristics --num_training_steps=10000 --weight_decay=0 --dtype=bfloat16 "
    "--eval_every=1000 --warmup_steps=1000 --scheduler=cosine --optimizer=adamw_snsm --lr=0.05 "
    "--update_proj_gap 200 --proj_type svd --rank=128 --update_proj_gap=100  --single_gpu "
    "--grad_clipping=1.0 --seed=420";
const char* kSnAdam =
    "--model_config configs/llama_60m.json --lr 5e-3 --batch_size 128 --total_batch_size 512 "
    "--num_training_steps 10000 --weight_decay 0 --dtype bfloat16 --eval_every 1000 --optimizer adamw "
    "--single_gpu --scheduler cosine --warmup_steps 1000";
const char* kSnRmspropSn =
    "--model_config configs/llama_60m.json --beta1 0 --lr 1e-2 --batch_size 128 --total_batch_size 512 "
    "--num_training_steps 10000 --weight_decay 0 --dtype bfloat16 --eval_every 1000 --optimizer rmsprop_sn "
    "--use_subset_norm_heuristics  --scheduler cosine --warmup_steps 1000 --grad_clipping 1.0 --single_gpu";
const char* kSnAdagradSnsm =
    "--model_config=configs/llama_60m.json --batch_size=128 --total_batch_size=512 "
    "--use_subset_norm_heuristics --num_training_steps=10000 --weight_decay=0 --dtype=bfloat16 "
    "--eval_every=1000 --warmup_steps=1000 --scheduler=cosine --optimizer=adagrad_snsm --lr=1 "
    "--update_proj_gap 200 --proj_type svd --rank=128 --update_proj_gap=100  --single_gpu "
    "--grad_clipping=1.0 --seed=420";
const char* kSnAdamSnsmApproxSvd =
    "--lr=0.01 --rank=128 --update_proj_gap=200 --model_config=configs/llama_60m.json --batch_size=128 "
    "--total_batch_size=512 --num_training_steps=10000 --weight_decay=0 --dtype=bfloat16 --eval_every=1000 "
    "--warmup_steps=1000 --scheduler=cosine --proj_type=svd --optimizer=adamw_snsm --single_gpu "
    "--grad_clipping=1.0 --seed=420 --approx_svd --asvd_srht_srank_scale 3";
const char* kSnAdamSnsmSrht =
    "--lr=0.05 --rank=128 --update_proj_gap=200 --model_config=configs/llama_60m.json --batch_size=128 "
    "--total_batch_size=512 --num_training_steps=10000 --weight_decay=0 --dtype=bfloat16 --eval_every=1000 "
    "--warmup_steps=1000 --scheduler=cosine --proj_type=srht --optimizer=adamw_snsm --single_gpu "
    "--grad_clipping=1.0 --seed=420";

TEST(ReferenceCommandLines, AdamwSnHeuristicsRuns) {
  Command command = parse_line(kSnAdamSnHeuristics);
  validate_run_config(command.run, model("llama_60m"), 1);
  EXPECT_EQ(command.run.optimizer.name, "adamw_sn");
  EXPECT_EQ(command.run.optimizer.subset_size, 0);  // heuristics
  EXPECT_DOUBLE_EQ(command.run.optimizer.lr, 0.05);
  EXPECT_DOUBLE_EQ(command.run.optimizer.grad_clipping, 1.0);
  EXPECT_EQ(command.run.data.gradient_accumulation, 4);
  ASSERT_EQ(command.warnings.size(), 3u) << all_warnings(command);
  expect_mentions(all_warnings(command), {"--single_gpu", "--dtype bfloat16 without --precision", "--max_length"});
}

TEST(ReferenceCommandLines, AdamwSnWithoutASubsetSizeKeepsHeuristicsAndSaysTheirDefault) {
  Command command = parse_line(kSnAdamSnSqrtHalf);
  validate_run_config(command.run, model("llama_60m"), 1);
  EXPECT_EQ(command.run.optimizer.subset_size, 0);
  expect_mentions(all_warnings(command),
                  {"command line: --optimizer adamw_sn without --subset_size or --use_subset_norm_heuristics: "
                   "heuristics here", "pass --subset_size -2 for theirs"});
  EXPECT_EQ(parse_line(std::string(kSnAdamSnSqrtHalf) + " --subset_size -2").run.optimizer.subset_size, -2);
}

TEST(ReferenceCommandLines, AdamwBaselineRunsAndSaysItClips) {
  Command command = parse_line(kSnAdam);
  validate_run_config(command.run, model("llama_60m"), 1);
  EXPECT_EQ(command.run.optimizer.name, "adamw");
  EXPECT_DOUBLE_EQ(command.run.optimizer.lr, 5e-3);
  expect_mentions(all_warnings(command), {"--grad_clipping not given", "pass --grad_clipping 0"});
}

TEST(ReferenceCommandLines, OptimizersWeLackAreNamedWithTheNearest) {
  expect_mentions(error_of(kSnRmspropSn),
                  {"command line: --optimizer: expected one of adamw, adamw_sn, galore_adamw (got \"rmsprop_sn\")",
                   "no bias correction", "--optimizer adamw_sn --adam_beta1 0"});
  // The optimizer is the first thing said, before --proj_type svd or the unknown --approx_svd.
  for (const char* line : {kSnAdamSnsm, kSnAdamSnsmApproxSvd, kSnAdamSnsmSrht})
    expect_mentions(error_of(line), {"command line: --optimizer: expected one of adamw, adamw_sn, galore_adamw "
                                     "(got \"adamw_snsm\")", "the nearest is --optimizer adamw_sn"});
  expect_mentions(error_of(kSnAdagradSnsm), {"(got \"adagrad_snsm\")", "--optimizer adamw_sn"});
  expect_mentions(error_of("--config c --optimizer Adam"),
                  {"(got \"Adam\")", "torch.optim.Adam", "--optimizer adamw"});
  expect_mentions(error_of("--config c --optimizer GaLore_AdamW"), {"spell it in lower case, --optimizer galore_adamw"});
}

TEST(ReferenceFlags, ModelConfigAndBeta1AreOurFlagsUnderTheirNames) {
  const Command command = parse_line("--model_config configs/llama_9m.json --optimizer adamw_sn --beta1 0");
  EXPECT_EQ(command.run.config_path, "configs/llama_9m.json");
  EXPECT_DOUBLE_EQ(command.run.optimizer.adam_beta1, 0);
  EXPECT_DOUBLE_EQ(parse_line("--model_config a --config a --beta1 0.5 --adam_beta1 0.5").run.optimizer.adam_beta1, 0.5);
  EXPECT_EQ(error_of("--model_config a.json --config b.json"),
            "command line: --model_config / --config: the same setting given twice under two names, with "
            "different values; give one");
  expect_mentions(error_of("--config c --beta1 0 --adam_beta1 0.9"), {"--beta1 / --adam_beta1"});
  expect_mentions(error_of("--config c --optimizer adamw_sn --use_subset_norm_heuristics --subset_size 8"),
                  {"--use_subset_norm_heuristics / --subset_size"});
  expect_mentions(error_of("--config c --use_subset_norm_heuristics"),
                  {"--use_subset_norm_heuristics", "applies to --optimizer adamw_sn only"});
  expect_mentions(all_warnings(parse_line("--config c --optimizer galore_adamw --grad_clipping 1 --beta1 0.8")),
                  {"--beta1 is Adam's beta1 here", "galore_adamw keeps 0.9"});
  // Our own command lines get none of the reference warnings.
  EXPECT_TRUE(parse_line("--config c --optimizer adamw_sn").warnings.empty());
  EXPECT_TRUE(parse_line("--config c --dtype bfloat16 --precision mixed").warnings.empty());
  // Training flags: `trainer prepare` refuses them like ours.
  expect_mentions(error_of("--single_gpu prepare --input a --output o --vocab_size 100"),
                  {"--single_gpu", "training flag"});
}

TEST(ReferenceFlags, GradientAccumulationSetsTheTotalOrMustAgreeWithIt) {
  Command command = parse_line("--config c --batch_size 4 --gradient_accumulation 3");
  validate_run_config(command.run, model("llama_9m"), 2);
  EXPECT_EQ(command.run.data.total_batch_size, 24);  // 4 x 2 ranks x 3
  EXPECT_EQ(command.run.data.gradient_accumulation, 3);
  Command agreeing = parse_line("--config c --batch_size 4 --gradient_accumulation 3 --total_batch_size 24");
  validate_run_config(agreeing.run, model("llama_9m"), 2);
  EXPECT_EQ(agreeing.run.data.gradient_accumulation, 3);
  Command disagreeing = parse_line("--config c --batch_size 4 --gradient_accumulation 3 --total_batch_size 32");
  std::string message;
  try {
    validate_run_config(disagreeing.run, model("llama_9m"), 2);
  } catch (const UserError& error) {
    message = error.what();
  }
  EXPECT_EQ(message,
            "command line: --gradient_accumulation / --total_batch_size: disagree: --batch_size * world size * "
            "--gradient_accumulation = 4 * 2 * 3 = 24 sequences per step, but --total_batch_size is 32; give "
            "one of the two");
  expect_mentions(error_of("--config c --gradient_accumulation 0"), {"--gradient_accumulation", ">= 1", "got 0"});
}

TEST(ReferenceFlags, MaxTrainTokensSetsTheStepsInTokens) {
  Command command = parse_line("--config c --batch_size 4 --total_batch_size 8 --max_length 128 --max_train_tokens 1M");
  EXPECT_EQ(command.run.max_train_tokens, 1'000'000);
  validate_run_config(command.run, model("llama_9m"), 1);
  EXPECT_EQ(command.run.num_training_steps, 977);  // ceil(10^6 / (8 x 128))
  EXPECT_EQ(command.run.optimizer.warmup_steps, 20);
  expect_mentions(all_warnings(command), {"--max_train_tokens 1000000: --num_training_steps becomes ceil(",
                                          "GaLore's divides by total_batch_size only"});
  EXPECT_EQ(parse_line("--config c --max_train_tokens 2B").run.max_train_tokens, 2'000'000'000);
  EXPECT_EQ(parse_line("--config c --max_train_tokens 12345").run.max_train_tokens, 12345);
  expect_mentions(all_warnings(parse_line("--config c --num_training_steps 5 --max_train_tokens 1B")),
                  {"replacing the one given"});
  for (const char* bad : {"1.5B", "-1", "0", "lots", "1K", "B"})
    expect_mentions(error_of(std::string("--config c --max_train_tokens ") + bad),
                    {"command line: --max_train_tokens: expected a number of tokens >= 1", "100M"});
}

TEST(ReferenceFlags, NameAndTagsAreRecordedInTheRunSettings) {
  Command command = parse_line("--config c --name sweep-7 --tags galore,60m,bf16");
  EXPECT_EQ(command.run.logging.name, "sweep-7");
  EXPECT_EQ(command.run.logging.tags, (std::vector<std::string>{"galore", "60m", "bf16"}));
  const nlohmann::json json = command.run.to_json();  // metrics.jsonl's start record carries it
  EXPECT_EQ(json.at("name"), "sweep-7");
  EXPECT_EQ(json.at("tags"), nlohmann::json::array({"galore", "60m", "bf16"}));
  const RunConfig back = run_config_from_json(json, "metrics.jsonl");
  EXPECT_EQ(back.logging.name, "sweep-7");
  EXPECT_EQ(back.logging.tags, command.run.logging.tags);
  EXPECT_EQ(back.to_json(), json);
}

// End to end: the binary takes GaLore's 60M command line unchanged (up to --print_config).
TEST(ReferenceCommandLines, TrainerPrintsTheResolvedGaloreLlama60mRun) {
  std::string line = kGaloreLlama60m;  // one line for the shell, without the README's continuations
  for (size_t at; (at = line.find(" \\")) != std::string::npos;) line.erase(at, 2);
  const testing::CommandResult result = testing::run_command(
      "cd " + source_dir().string() + " && " + testing::trainer_binary().string() + " " + line +
      " --name galore-60m --print_config 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  expect_mentions(result.output, {"--dtype bfloat16 without --precision", "\"total_batch_size\": 512",
                                  "\"gradient_accumulation\": 2", "\"optimizer\": \"galore_adamw\"",
                                  "\"name\": \"galore-60m\""});
}

}  // namespace
}  // namespace llm::command_lines_test
