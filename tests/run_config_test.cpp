// Run config validation (validate_run_config): every run setting is range-checked, and a bad one is a
// UserError that says "command line" and names its flag; the settings that follow from others
// (gradient accumulation, the default warmup, each optimizer's Adam eps) are resolved; and --rank,
// --run_dir, --continue_from and --data are checked before training, in process and as exit status 2
// of the trainer binary.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "tests/config_test_util.h"
#include "tests/test_util.h"
#include "trainer/cli.h"

namespace llm::run_config_test {
namespace {

using testing::config_path;
using testing::expect_mentions;
using testing::parse;
using testing::ScratchDir;
using testing::user_error_of;

class ConfigRunValidation : public ::testing::Test {
 protected:
  ModelConfig model_ = load_model_config(config_path("llama_tiny"));  // max positions 256
  RunConfig valid() const {
    RunConfig run;
    run.config_path = config_path("llama_tiny");
    return run;
  }
  std::string error_with(const std::function<void(RunConfig&)>& change, int world_size = 1) {
    RunConfig run = valid();
    change(run);
    return user_error_of([&] { validate_run_config(run, model_, world_size); });
  }
};

TEST_F(ConfigRunValidation, DefaultsAreValid) {
  RunConfig run = valid();
  validate_run_config(run, model_, 1);
  EXPECT_EQ(run.data.total_batch_size, run.data.batch_size);
  EXPECT_EQ(run.data.gradient_accumulation, 1);
}

TEST_F(ConfigRunValidation, BoundariesAreAccepted) {
  RunConfig run = valid();
  run.data.max_length = 256;
  run.optimizer.warmup_steps = run.num_training_steps;
  run.optimizer.min_lr_ratio = 1.0;
  run.optimizer.adam_beta1 = 0.0;
  run.optimizer.weight_decay = 0.0;
  run.optimizer.grad_clipping = 0.0;
  run.data.eval_every = 0;
  run.checkpoint.save_every = 0;
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
  run.data.max_length = 2;
  run.optimizer.warmup_steps = 0;
  run.optimizer.min_lr_ratio = 0.0;
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
}

struct RangeCase {
  const char* flag;
  std::function<void(RunConfig&)> change;
  const char* got;  // how the bad value is printed
};

TEST_F(ConfigRunValidation, EveryRangeNamesItsFlag) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<RangeCase> cases = {
      {"--lr", [](RunConfig& r) { r.optimizer.lr = 0; }, "got 0"},
      {"--lr", [](RunConfig& r) { r.optimizer.lr = -1e-3; }, "got -0.001"},
      {"--lr", [nan](RunConfig& r) { r.optimizer.lr = nan; }, "got nan"},
      {"--lr", [inf](RunConfig& r) { r.optimizer.lr = inf; }, "got inf"},
      {"--batch_size", [](RunConfig& r) { r.data.batch_size = 0; }, "got 0"},
      {"--max_length", [](RunConfig& r) { r.data.max_length = 1; }, "got 1"},
      {"--max_length", [](RunConfig& r) { r.data.max_length = 257; }, "max_position_embeddings = 256"},
      {"--num_training_steps", [](RunConfig& r) { r.num_training_steps = 0; }, "got 0"},
      {"--warmup_steps", [](RunConfig& r) { r.optimizer.warmup_steps = -1; }, "got -1"},
      {"--warmup_steps", [](RunConfig& r) { r.optimizer.warmup_steps = r.num_training_steps + 1; },
       "got 201"},
      {"--min_lr_ratio", [](RunConfig& r) { r.optimizer.min_lr_ratio = -0.1; }, "got -0.1"},
      {"--min_lr_ratio", [](RunConfig& r) { r.optimizer.min_lr_ratio = 1.5; }, "got 1.5"},
      {"--weight_decay", [](RunConfig& r) { r.optimizer.weight_decay = -0.1; }, "got -0.1"},
      {"--grad_clipping", [](RunConfig& r) { r.optimizer.grad_clipping = -1; }, "got -1"},
      {"--adam_beta1", [](RunConfig& r) { r.optimizer.adam_beta1 = 1.0; }, "got 1"},
      {"--adam_beta1", [](RunConfig& r) { r.optimizer.adam_beta1 = -0.1; }, "got -0.1"},
      {"--adam_beta2", [](RunConfig& r) { r.optimizer.adam_beta2 = 0.0; }, "got 0"},
      {"--adam_beta2", [](RunConfig& r) { r.optimizer.adam_beta2 = 1.0; }, "got 1"},
      {"--adam_eps", [](RunConfig& r) { r.optimizer.adam_eps = 0.0; }, "got 0"},
      {"--eval_fraction", [](RunConfig& r) { r.data.eval_fraction = 0.0; }, "got 0"},
      {"--eval_fraction", [](RunConfig& r) { r.data.eval_fraction = 1.0; }, "got 1"},
      {"--eval_every", [](RunConfig& r) { r.data.eval_every = -1; }, "got -1"},
      {"--eval_batches", [](RunConfig& r) { r.data.eval_batches = -1; }, "got -1"},
      {"--eval_sequences", [](RunConfig& r) { r.data.eval_sequences = -1; }, "got -1"},
      {"--eval_tokens", [](RunConfig& r) { r.data.eval_tokens = -1; }, "got -1"},
      {"--eval_sequences", [](RunConfig& r) { r.data.eval_sequences = 4; r.data.eval_batches = 2; },
       "give one of --eval_sequences, --eval_tokens and --eval_batches, not --eval_sequences and --eval_batches"},
      {"--save_every", [](RunConfig& r) { r.checkpoint.save_every = -5; }, "got -5"},
      {"--async_save", [](RunConfig& r) { r.checkpoint.async_save = true; }, "no --save_dir"},
      {"--save_every", [](RunConfig& r) { r.checkpoint.save_every = 5; }, "no --save_dir"},
      {"--keep_last", [](RunConfig& r) { r.checkpoint.keep_last = 3; }, "no --save_dir"},
      {"--collective_timeout", [](RunConfig& r) { r.collective_timeout = 0.001; }, "got 0.001"},
      {"--log_every", [](RunConfig& r) { r.logging.log_every = 0; }, "got 0"},
      {"--total_batch_size", [](RunConfig& r) { r.data.total_batch_size = -8; }, "got -8"},
      {"--optimizer", [](RunConfig& r) { r.optimizer.name = "sgd"; }, "\"sgd\""},
      {"--data", [](RunConfig& r) { r.data.source = "/nonexistent/tokens.bin"; }, "not a file"},
  };
  for (const RangeCase& range_case : cases) {
    SCOPED_TRACE(std::string(range_case.flag) + " " + range_case.got);
    expect_mentions(error_with(range_case.change),
                    {"command line", std::string(range_case.flag) + ": ", range_case.got});
  }
}

// Tied embeddings: the config check refuses them for every command that takes the run's settings
// (training, --print_config, estimate), before a run folder or corpus is written.
TEST_F(ConfigRunValidation, TiedEmbeddingsAreRefusedByTheConfigCheck) {
  model_.tie_word_embeddings = true;
  expect_mentions(error_with([](RunConfig&) {}), {"llama_tiny", "tie_word_embeddings", "not supported", "false"});
}

// --shard_group_size: a divisor of the world size, with a hybrid strategy only; the divisors listed.
TEST_F(ConfigRunValidation, ShardGroupSizeDividesTheWorldAndNeedsAHybridStrategy) {
  for (const int group : {1, 2, 3, 6}) {
    RunConfig run = valid();
    run.sharding.strategy = ShardingStrategy::hybrid_shard;
    run.sharding.group_size = group;
    EXPECT_NO_THROW(validate_run_config(run, model_, 6)) << group;
  }
  expect_mentions(error_with(
                      [](RunConfig& r) {
                        r.sharding.strategy = ShardingStrategy::hybrid_shard_grad_op;
                        r.sharding.group_size = 4;
                      },
                      6),
                  {"--shard_group_size", "4 does not divide the 6 ranks", "1, 2, 3, 6", "ranks of one node"});
  expect_mentions(error_with([](RunConfig& r) { r.sharding.group_size = 2; }, 4),
                  {"--shard_group_size", "--sharding is full_shard", "hybrid_shard"});
  expect_mentions(error_with(
                      [](RunConfig& r) {
                        r.sharding.strategy = ShardingStrategy::hybrid_shard;
                        r.sharding.group_size = 0;
                      },
                      4),
                  {"--shard_group_size", "at least 1", "got 0"});
  // In a run's JSON (the start record, --print_config) and back.
  RunConfig run = valid();
  run.sharding.strategy = ShardingStrategy::hybrid_shard;
  run.sharding.group_size = 3;
  const RunConfig back = run_config_from_json(run.to_json(), "test");
  EXPECT_EQ(back.sharding.group_size, 3);
  EXPECT_EQ(back.sharding.strategy, ShardingStrategy::hybrid_shard);
}

// --backward_gather_size: full_shard's, a divisor below the world size, not with parameter offload.
TEST_F(ConfigRunValidation, BackwardGatherSizeIsFullShardsAndDividesTheWorld) {
  for (const int size : {1, 2, 4}) {
    RunConfig run = valid();
    run.sharding.backward_gather_size = size;
    EXPECT_NO_THROW(validate_run_config(run, model_, 8)) << size;
  }
  expect_mentions(error_with([](RunConfig& r) { r.sharding.backward_gather_size = 3; }, 8),
                  {"--backward_gather_size", "3 does not divide the 8 ranks", "(1, 2, 4)"});
  expect_mentions(error_with([](RunConfig& r) { r.sharding.backward_gather_size = 8; }, 8),
                  {"--backward_gather_size", "8 is not below the 8 ranks"});
  expect_mentions(error_with([](RunConfig& r) { r.sharding.backward_gather_size = 1; }, 1),
                  {"--backward_gather_size", "one rank gathers nothing"});
  expect_mentions(error_with(
                      [](RunConfig& r) {
                        r.sharding.backward_gather_size = 2;
                        r.sharding.strategy = ShardingStrategy::hybrid_shard;
                        r.sharding.group_size = 2;
                      },
                      4),
                  {"--backward_gather_size", "--sharding is hybrid_shard", "inside its group already"});
  expect_mentions(error_with(
                      [](RunConfig& r) {
                        r.sharding.backward_gather_size = 2;
                        r.sharding.offload = Offload::parameters;
                      },
                      4),
                  {"--backward_gather_size", "--offload parameters"});
  RunConfig run = valid();
  run.sharding.backward_gather_size = 2;
  EXPECT_EQ(run_config_from_json(run.to_json(), "test").sharding.backward_gather_size, 2);
}

// The shortest stall timeout that can tell a stopped rank from a live one, and 0 (off), are accepted.
TEST_F(ConfigRunValidation, CollectiveTimeoutAtLeastTheStalenessOfAHeartbeat) {
  for (const double seconds : {0.0, 2.5, 3.0, 600.0}) {
    RunConfig run = valid();
    run.collective_timeout = seconds;
    EXPECT_NO_THROW(validate_run_config(run, model_, 2)) << seconds;
  }
  expect_mentions(error_with([](RunConfig& r) { r.collective_timeout = 2.4; }),
                  {"--collective_timeout", "at least 2.5 seconds", "got 2.4"});
}

TEST_F(ConfigRunValidation, TotalBatchSizeDerivesGradientAccumulation) {
  RunConfig run = valid();
  run.data.batch_size = 8;
  run.data.total_batch_size = 64;
  validate_run_config(run, model_, 2);
  EXPECT_EQ(run.data.gradient_accumulation, 4);
  EXPECT_EQ(run.data.total_batch_size, 64);

  RunConfig per_step = valid();
  per_step.data.batch_size = 8;
  validate_run_config(per_step, model_, 4);
  EXPECT_EQ(per_step.data.total_batch_size, 32);
  EXPECT_EQ(per_step.data.gradient_accumulation, 1);
}

TEST_F(ConfigRunValidation, TotalBatchSizeNotAMultipleListsValidValues) {
  const std::string message = error_with(
      [](RunConfig& r) {
        r.data.batch_size = 8;
        r.data.total_batch_size = 24;
      },
      2);
  expect_mentions(message, {"--total_batch_size", "8 * 2 = 16", "16, 32, 48", "got 24"});
}

TEST_F(ConfigRunValidation, OptimizerFlagsAreRangeChecked) {
  const std::vector<RangeCase> cases = {
      {"--rank", [](RunConfig& r) { r.optimizer.name = "galore_adamw"; r.optimizer.galore_rank = 0; }, "got 0"},
      {"--update_proj_gap", [](RunConfig& r) { r.optimizer.name = "galore_adamw"; r.optimizer.update_proj_gap = -1; }, "got -1"},
      {"--galore_scale", [](RunConfig& r) { r.optimizer.name = "galore_adamw"; r.optimizer.galore_scale = 0; }, "got 0"},
      {"--proj_type", [](RunConfig& r) { r.optimizer.name = "galore_adamw"; r.optimizer.proj_type = "full"; }, "\"full\""},
      {"--subset_norm_params", [](RunConfig& r) { r.optimizer.name = "adamw_sn"; r.optimizer.subset_norm_params = "some"; }, "\"some\""},
      {"--optimizer_state_dtype", [](RunConfig& r) { r.optimizer.state_dtype = "float16"; }, "\"float16\""},
      {"--window_start", [](RunConfig& r) { r.data.window_start = "sentence"; }, "\"sentence\""},
      {"--memmap_dtype", [](RunConfig& r) { r.data.memmap_dtype = "int64"; }, "\"int64\""},
      {"--recompute", [](RunConfig& r) { r.recompute = "norm,softmax"; }, "\"softmax\" is not an operation it recomputes"},
      {"--recompute", [](RunConfig& r) { r.recompute = "norm,norm"; }, "names \"norm\" twice"},
      {"--recompute", [](RunConfig& r) { r.recompute = "block,norm"; }, "give block alone"},
      {"--recompute", [](RunConfig& r) { r.recompute = "norm,"; }, "\"\" is not an operation"},
      {"--recompute", [](RunConfig& r) { r.recompute = "norm"; r.activation_checkpointing_every = 2; }, "give one"},
      {"--recompute", [](RunConfig& r) { r.recompute = "block"; r.activation_checkpointing_every = 2; }, "give one"},
      {"--fused_ops", [](RunConfig& r) { r.fused_ops = "rms_norm,softmax"; }, "\"softmax\" is not a fused operation"},
      {"--fused_ops", [](RunConfig& r) { r.fused_ops = "rms_norm,rms_norm"; }, "names \"rms_norm\" twice"},
      {"--fused_ops", [](RunConfig& r) { r.fused_ops = ","; }, "\"\" is not a fused operation"},
      {"--fused_ops", [](RunConfig& r) { r.fused_ops = "rms_norm"; r.device = DeviceChoice::cpu; }, "are CUDA kernels and this run is --device cpu"},
      {"--offload_threads", [](RunConfig& r) { r.sharding.offload = Offload::optimizer; r.sharding.offload_threads = -1; }, "got -1"},
      {"--offload_threads", [](RunConfig& r) { r.sharding.offload_threads = 2; }, "add --offload optimizer"},
  };
  for (const RangeCase& range_case : cases) {
    SCOPED_TRACE(std::string(range_case.flag) + " " + range_case.got);
    expect_mentions(error_with(range_case.change),
                    {"command line", std::string(range_case.flag) + ": ", range_case.got});
  }
}

TEST_F(ConfigRunValidation, EpsDefaultsToEachOptimizersReference) {
  for (const auto& [name, eps] : {std::pair<const char*, double>{"adamw", 1e-8}, {"adamw_sn", 1e-6},
                                  {"galore_adamw", 1e-6}}) {
    RunConfig run = valid();
    run.optimizer.name = name;
    run.optimizer.galore_rank = 16;  // below llama_tiny's 64 x 64 matrices
    run.optimizer.adam_eps = -1;
    validate_run_config(run, model_, 1);
    EXPECT_DOUBLE_EQ(run.optimizer.adam_eps, eps) << name;
  }
}

TEST_F(ConfigRunValidation, GaloreRankThatProjectsNothingIsRefused) {
  // llama_tiny's GaLore matrices: q/k/v/o 64 x 64, gate/up 176 x 64, down 64 x 176: every one is
  // kept at min(rank, rows, cols), so from rank 64 on nothing is projected and GaLore's state
  // (moments plus projector) is larger than AdamW's.
  for (int64_t rank : {int64_t{64}, int64_t{128}, int64_t{100000}}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    expect_mentions(error_with([&](RunConfig& r) {
                      r.optimizer.name = "galore_adamw";
                      r.optimizer.galore_rank = rank;
                    }),
                    {"command line", "--rank: ", "expected an integer in [1, 63] for llama_tiny",
                     "(got " + std::to_string(rank) + ")", "64 x 64", "more memory than AdamW's",
                     "pass --rank 63 or less", "16 here"});
  }
  RunConfig run = valid();
  run.optimizer.name = "galore_adamw";
  run.optimizer.galore_rank = 63;
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
  run.optimizer.name = "adamw";  // --rank means nothing to AdamW (the command line refuses it)
  run.optimizer.galore_rank = 128;
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
}

TEST(GaloreRankCommand, DefaultRankOnASmallModelIsExitTwo) {
  // The default --rank 128 is above every matrix of llama_micro (32 x 32, 88 x 32, 32 x 88).
  const std::string base = testing::trainer_binary().string() + " estimate --config " + config_path("llama_micro") +
                           " --max_length 16 --optimizer galore_adamw";
  const auto refused = testing::run_command(base);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_mentions(refused.output, {"--rank: expected an integer in [1, 31] for llama_micro (got 128)"});
  const auto accepted = testing::run_command(base + " --rank 8");
  EXPECT_EQ(accepted.exit_code, 0) << accepted.output;
}

TEST(RunDir, FileOrUnwritablePathIsNamed) {
  ScratchDir scratch("run_dir");
  const std::string file = (scratch / "file").string();
  std::ofstream(file) << "x";
  expect_mentions(user_error_of([&] { create_run_dir(file); }),
                  {"command line", "--run_dir: ", "\"" + file + "\" is an existing file, not a folder"});
  expect_mentions(user_error_of([&] { create_run_dir(file + "/run/1"); }),
                  {"--run_dir: ", "goes through \"" + file + "\", which is a file"});
  expect_mentions(user_error_of([&] { create_run_dir("/dev/null"); }), {"--run_dir: ", "existing file"});
  if (std::filesystem::is_directory("/proc"))  // no folder can be made there, not even by root
    expect_mentions(user_error_of([&] { create_run_dir("/proc/trainer_run"); }),
                    {"--run_dir: ", "cannot create \"/proc/trainer_run\""});
  const std::string nested = (scratch / "a" / "b" / "run").string();
  EXPECT_NO_THROW(create_run_dir(nested));
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_NO_THROW(create_run_dir(nested));  // an existing folder is fine (every rank calls it)
}

TEST(RunDir, FileIsExitTwoBeforeTraining) {
  ScratchDir scratch("run_dir_command");
  const std::string file = (scratch / "file").string();
  std::ofstream(file) << "x";
  const auto result = testing::run_command(testing::trainer_binary().string() + " --config " +
                                           config_path("llama_micro") + " --max_length 16 --run_dir " + file);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  expect_mentions(result.output, {"--run_dir: ", "is an existing file"});
}

// The synthetic corpus is written into the run folder and opened by its path: a comma in that path
// is part of the name (it was once read as a --data list and blamed --data).
TEST(RunDir, ACommaInThePathTrainsOnTheSyntheticCorpus) {
  ScratchDir scratch("run_dir_comma");
  const std::string dir = (scratch / "lr,1e-3").string();
  const auto result = testing::run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                                           config_path("llama_micro") + " --device cpu --max_length 16 --batch_size 2 "
                                           "--num_training_steps 1 --eval_every 0 --run_dir '" + dir + "'");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(testing::read_metrics_events(dir, "train").size(), 1u) << result.output;
}

TEST_F(ConfigRunValidation, ContinueFromMustBeAnExistingFolder) {
  ScratchDir scratch("continue_from");
  expect_mentions(error_with([&](RunConfig& r) { r.checkpoint.continue_from = (scratch / "none").string(); }),
                  {"--continue_from", "does not exist"});
  const std::string file = (scratch / "file").string();
  std::ofstream(file) << "x";
  expect_mentions(error_with([&](RunConfig& r) { r.checkpoint.continue_from = file; }),
                  {"--continue_from", "not a folder"});
  RunConfig run = valid();
  run.checkpoint.continue_from = scratch.path().string();
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
}

TEST_F(ConfigRunValidation, WarmupLeftOutIsATenthOfTheRunAtMostTwenty) {
  // The documented rule (README's flag table): min(20, num_training_steps / 10), rounded down.
  const std::vector<std::pair<int64_t, int64_t>> steps_and_warmup = {
      {1, 0}, {5, 0}, {9, 0}, {10, 1}, {19, 1}, {20, 2}, {100, 10}, {199, 19}, {200, 20}, {100000, 20}};
  for (const auto& [steps, warmup] : steps_and_warmup) {
    SCOPED_TRACE("num_training_steps " + std::to_string(steps));
    EXPECT_EQ(default_warmup_steps(steps), warmup);
    RunConfig run = valid();
    run.num_training_steps = steps;
    ASSERT_NO_THROW(validate_run_config(run, model_, 1));
    ASSERT_TRUE(run.optimizer.warmup_steps.has_value()) << "validation resolves the warmup";
    EXPECT_EQ(*run.optimizer.warmup_steps, warmup);
  }
  RunConfig defaults = valid();
  validate_run_config(defaults, model_, 1);
  EXPECT_EQ(defaults.optimizer.warmup_steps, std::optional<int64_t>(20)) << "the all-defaults run is unchanged";
}

TEST_F(ConfigRunValidation, ShortRunFromTheCommandLineGetsTheDefaultWarmup) {
  // `trainer --config ... --num_training_steps 5`: rejected while the default warmup was a fixed 20.
  Command command = parse({"--config", config_path("llama_tiny"), "--num_training_steps", "5"});
  EXPECT_FALSE(command.run.optimizer.warmup_steps.has_value()) << "not given, so not yet decided";
  ASSERT_NO_THROW(validate_run_config(command.run, model_, 1));
  EXPECT_EQ(command.run.optimizer.warmup_steps, std::optional<int64_t>(0));
  // --print_config shows the resolved value, not the rule.
  EXPECT_EQ(resolved_config_json(model_, command.run).at("run").at("warmup_steps"), 0);
  command = parse({"--config", config_path("llama_tiny"), "--num_training_steps", "50"});
  validate_run_config(command.run, model_, 1);
  EXPECT_EQ(resolved_config_json(model_, command.run).at("run").at("warmup_steps"), 5);
}

TEST_F(ConfigRunValidation, ExplicitWarmupLongerThanTheRunIsStillAnError) {
  // Given explicitly, the warmup is the user's choice and is not shortened: 20 (the old default's
  // number) against a 5-step run is refused, naming both flags and the default to fall back on.
  Command command = parse(
      {"--config", config_path("llama_tiny"), "--num_training_steps", "5", "--warmup_steps", "20"});
  expect_mentions(user_error_of([&] { validate_run_config(command.run, model_, 1); }),
                  {"command line", "--warmup_steps: ", "--num_training_steps = 5", "got 20",
                   "no --warmup_steps for the default"});
  // Equal to the run is still accepted (the lr reaches its peak on the last step).
  command = parse(
      {"--config", config_path("llama_tiny"), "--num_training_steps", "5", "--warmup_steps", "5"});
  EXPECT_NO_THROW(validate_run_config(command.run, model_, 1));
  EXPECT_EQ(command.run.optimizer.warmup_steps, std::optional<int64_t>(5));
  // Run settings read back from a metrics.jsonl keep their recorded warmup.
  const RunConfig back = run_config_from_json(command.run.to_json(), "test");
  EXPECT_EQ(back.optimizer.warmup_steps, std::optional<int64_t>(5));
}

// vocab_size 1 to 3 with the synthetic corpus spoke of its internal "branching"; now of the config key
// and what to do.
TEST_F(ConfigRunValidation, SyntheticCorpusNeedsAVocabularyOfFour) {
  for (int64_t vocab : {1, 2, 3}) {
    model_.vocab_size = vocab;
    expect_mentions(error_with([](RunConfig&) {}),
                    {config_path("llama_tiny") + ": vocab_size: the synthetic corpus (--data synthetic, the default) "
                     "needs a vocabulary of at least 4 tokens",
                     "(got " + std::to_string(vocab) + ")", "raise vocab_size in the config", "--data FILE"});
  }
  model_.vocab_size = 4;
  RunConfig run = valid();
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
  model_.vocab_size = 2;  // a token file needs no such vocabulary
  ScratchDir scratch("small_vocab");
  run = valid();
  run.data.source = (scratch / "tokens.bin").string();
  std::ofstream(run.data.source) << "x";
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
}

TEST_F(ConfigRunValidation, DataFileThatExistsIsAccepted) {
  ScratchDir scratch("data_file");
  const std::string file = (scratch / "tokens.bin").string();
  std::ofstream(file) << "x";
  RunConfig run = valid();
  run.data.source = file;
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
}

}  // namespace
}  // namespace llm::run_config_test
