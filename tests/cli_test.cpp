// The command line (trainer/cli.h): every flag of training, prepare and estimate parses to the setting
// it names, --help is not an error, a repeated flag takes its last value with a warning, and a bad
// flag, value or choice is a UserError that says "command line" and names the flag. Ranges are left
// to the run config's validation (run_config_test.cpp); the command lines of GaLore's and AdamW-SN's
// READMEs are in command_lines_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "tests/config_test_util.h"
#include "tests/test_util.h"
#include "trainer/cli.h"

namespace llm::cli_test {
namespace {

using nlohmann::json;
using testing::config_path;
using testing::expect_mentions;
using testing::parse;
using testing::user_error_of;

// `trainer ARGS...`, which must be refused: the UserError's message, recorded as exit status 2.
std::string parse_error(const std::vector<std::string>& args) {
  const std::string message = user_error_of([&] { parse(args); });
  std::string command = "trainer";
  for (const std::string& arg : args) command += " " + arg;
  testing::record_error_case(command, 2, "error: " + message);  // a UserError is exit status 2
  return message;
}

TEST(CliTrain, DefaultsAreRunConfigDefaults) {
  const Command command = parse({"--config", "configs/llama_60m.json"});
  EXPECT_EQ(command.kind, Command::Kind::train);
  RunConfig expected;
  expected.config_path = "configs/llama_60m.json";
  EXPECT_EQ(command.run.to_json(), expected.to_json());
}

TEST(CliTrain, EveryFlagIsParsed) {
  const Command command = parse({
      "--config", "c.json", "--lr", "3e-4", "--batch_size", "4", "--total_batch_size", "64",
      "--max_length", "512", "--num_training_steps", "1000", "--warmup_steps", "100",
      "--scheduler", "linear", "--min_lr_ratio", "0.05", "--weight_decay", "0.1",
      "--grad_clipping", "0.5", "--adam_beta1", "0.8", "--adam_beta2=0.95", "--adam_eps", "1e-6",
      "--dtype", "bfloat16", "--precision", "pure", "--optimizer", "galore_adamw", "--seed", "42",
      "--data", "tokens.bin", "--eval_fraction", "0.1", "--eval_every", "10", "--eval_batches",
      "3", "--save_every", "20", "--save_dir", "ckpt", "--continue_from", "old", "--run_dir",
      "runs/x", "--device", "cpu", "--log_every", "5", "--print_config", "--no_prefetch"});
  const RunConfig& run = command.run;
  EXPECT_EQ(command.kind, Command::Kind::train);
  EXPECT_EQ(run.config_path, "c.json");
  EXPECT_DOUBLE_EQ(run.optimizer.lr, 3e-4);
  EXPECT_EQ(run.data.batch_size, 4);
  EXPECT_EQ(run.data.total_batch_size, 64);
  EXPECT_EQ(run.data.max_length, 512);
  EXPECT_EQ(run.num_training_steps, 1000);
  EXPECT_EQ(run.optimizer.warmup_steps, 100);
  EXPECT_EQ(run.optimizer.scheduler, Scheduler::linear);
  EXPECT_DOUBLE_EQ(run.optimizer.min_lr_ratio, 0.05);
  EXPECT_DOUBLE_EQ(run.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(run.optimizer.grad_clipping, 0.5);
  EXPECT_DOUBLE_EQ(run.optimizer.adam_beta1, 0.8);
  EXPECT_DOUBLE_EQ(run.optimizer.adam_beta2, 0.95);
  EXPECT_DOUBLE_EQ(run.optimizer.adam_eps, 1e-6);
  EXPECT_EQ(run.precision.dtype, DType::bfloat16);
  EXPECT_EQ(run.precision.mode, Precision::pure);
  EXPECT_EQ(run.optimizer.name, "galore_adamw");
  EXPECT_EQ(run.seed, 42u);
  EXPECT_EQ(run.data.source, "tokens.bin");
  EXPECT_DOUBLE_EQ(run.data.eval_fraction, 0.1);
  EXPECT_EQ(run.data.eval_every, 10);
  EXPECT_EQ(run.data.eval_batches, 3);
  EXPECT_EQ(run.checkpoint.save_every, 20);
  EXPECT_EQ(run.checkpoint.save_dir, "ckpt");
  EXPECT_EQ(run.checkpoint.continue_from, "old");
  EXPECT_EQ(run.logging.run_dir, "runs/x");
  EXPECT_EQ(run.device, DeviceChoice::cpu);
  EXPECT_EQ(run.logging.log_every, 5);
  EXPECT_TRUE(run.logging.print_config);
  EXPECT_FALSE(run.sharding.prefetch);
  EXPECT_EQ(run.to_json().at("prefetch"), false);
  EXPECT_TRUE(parse({"--config", "c.json"}).run.sharding.prefetch) << "prefetch is on by default";
}

TEST(CliTrain, OptimizerFlagsAreParsed) {
  const RunConfig galore = parse({"--config", "c", "--optimizer", "galore_adamw", "--rank", "64",
                                  "--update_proj_gap", "200", "--galore_scale", "0.25", "--proj_type",
                                  "reverse_std", "--galore_stagger", "--galore_projector", "subspace",
                                  "--subspace_iterations", "3"}).run;
  EXPECT_TRUE(galore.optimizer.galore_stagger);
  EXPECT_EQ(galore.optimizer.galore_projector, "subspace");
  EXPECT_EQ(galore.optimizer.subspace_iterations, 3);
  EXPECT_EQ(galore.optimizer.galore_rank, 64);
  EXPECT_EQ(galore.optimizer.update_proj_gap, 200);
  EXPECT_DOUBLE_EQ(galore.optimizer.galore_scale, 0.25);
  EXPECT_EQ(galore.optimizer.proj_type, "reverse_std");
  const RunConfig general = parse({"--config", "c", "--optimizer", "adamw_sn", "--subset_size", "-2",
                                   "--subset_norm_params", "all"}).run;
  EXPECT_EQ(general.optimizer.subset_size, -2);
  EXPECT_EQ(general.optimizer.subset_norm_params, "all");
  EXPECT_EQ(parse({"--config", "c", "--optimizer", "adamw_sn", "--subset_size", "heuristics"}).run.optimizer.subset_size, 0);
  EXPECT_EQ(parse({"--config", "c", "--optimizer", "adamw_sn", "--subset_size", "512"}).run.optimizer.subset_size, 512);
  EXPECT_EQ(parse({"--config", "c"}).run.optimizer.state_dtype, "float32");
  for (const char* optimizer : {"adamw", "adamw_sn", "galore_adamw"})
    EXPECT_EQ(parse({"--config", "c", "--optimizer", optimizer, "--optimizer_state_dtype", "bfloat16"}).run.optimizer.state_dtype,
              "bfloat16");
}

TEST(CliTrain, BadOptimizerFlagsAreNamed) {
  for (const char* bad : {"0", "many", "12x"})
    expect_mentions(parse_error({"--config", "c", "--optimizer", "adamw_sn", "--subset_size", bad}),
                    {"--subset_size", "heuristics or a non-zero integer", bad});
  expect_mentions(parse_error({"--config", "c", "--optimizer", "galore_adamw", "--proj_type", "full"}),
                  {"--proj_type", "full"});
  // A flag of another optimizer would do nothing: it is refused, naming the optimizer it belongs to.
  expect_mentions(parse_error({"--config", "c", "--rank", "64"}),
                  {"--rank", "applies to --optimizer galore_adamw only", "got --optimizer adamw"});
  expect_mentions(parse_error({"--config", "c", "--optimizer", "galore_adamw", "--subset_size", "-2"}),
                  {"--subset_size", "adamw_sn only"});
}

TEST(CliTrain, EnumSpellings) {
  EXPECT_EQ(parse({"--config", "c", "--scheduler", "cosine"}).run.optimizer.scheduler, Scheduler::cosine);
  EXPECT_EQ(parse({"--config", "c", "--scheduler", "constant"}).run.optimizer.scheduler,
            Scheduler::constant);
  EXPECT_EQ(parse({"--config", "c", "--dtype", "float32"}).run.precision.dtype, DType::float32);
  EXPECT_EQ(parse({"--config", "c", "--precision", "mixed"}).run.precision.mode, Precision::mixed);
  EXPECT_EQ(parse({"--config", "c", "--device", "auto"}).run.device, DeviceChoice::auto_select);
  EXPECT_EQ(parse({"--config", "c", "--device", "cuda"}).run.device, DeviceChoice::cuda);
  EXPECT_EQ(parse({"--config", "c"}).run.sharding.communicator, CommunicatorChoice::auto_select);
  EXPECT_EQ(parse({"--config", "c", "--communicator", "mpi"}).run.sharding.communicator, CommunicatorChoice::mpi);
  EXPECT_EQ(parse({"--config", "c", "--communicator", "nccl"}).run.to_json().at("communicator"), "nccl");
}

TEST(CliTrain, RepeatedFlagTakesTheLastValue) {
  // launch/train.sh passes its own --batch_size, --max_length, ... before the user's flags, as the
  // README's `RANKS=2 CONFIG=configs/llama_60m.json bash launch/train.sh --batch_size 16` does.
  const Command command = parse({"--config", "configs/llama_60m.json", "--run_dir", "runs/default",
                                 "--batch_size", "4", "--max_length", "128", "--num_training_steps", "100",
                                 "--warmup_steps", "10", "--lr", "3e-3", "--eval_every", "25",
                                 "--batch_size", "16", "--scheduler", "linear", "--scheduler", "constant",
                                 "--lr=1e-4", "--device", "cpu", "--device", "cpu", "--run_dir", "runs/mine"});
  EXPECT_EQ(command.kind, Command::Kind::train);
  EXPECT_EQ(command.run.data.batch_size, 16);
  EXPECT_EQ(command.run.optimizer.scheduler, Scheduler::constant);
  EXPECT_DOUBLE_EQ(command.run.optimizer.lr, 1e-4);
  EXPECT_EQ(command.run.logging.run_dir, "runs/mine");
  EXPECT_EQ(command.run.data.max_length, 128) << "flags given once are untouched";
  // One warning per flag repeated with different values, naming it; none for --device cpu twice.
  ASSERT_EQ(command.warnings.size(), 4u) << ::testing::PrintToString(command.warnings);
  std::string all;
  for (const std::string& warning : command.warnings) all += warning + "\n";
  expect_mentions(all, {"--batch_size given 2 times (4, 16); using the last, 16", "--scheduler", "--lr",
                        "--run_dir given 2 times (runs/default, runs/mine)"});
  EXPECT_EQ(all.find("--device"), std::string::npos) << all;
  EXPECT_TRUE(parse({"--config", "c", "--lr", "1e-3"}).warnings.empty());

  // Flags, optimizer flags and the subcommands' own flags follow the same rule.
  EXPECT_TRUE(parse({"--config", "c", "--no_prefetch", "--no_prefetch"}).run.sharding.prefetch == false);
  const RunConfig galore = parse({"--config", "c", "--optimizer", "adamw", "--optimizer", "galore_adamw",
                                  "--rank", "8", "--rank", "64"}).run;
  EXPECT_EQ(galore.optimizer.name, "galore_adamw");
  EXPECT_EQ(galore.optimizer.galore_rank, 64);
  EXPECT_EQ(parse({"--config", "c", "--optimizer", "adamw_sn", "--subset_size", "4", "--subset_size",
                   "heuristics"}).run.optimizer.subset_size, 0);
  const Command estimate = parse({"estimate", "--config", "c", "--world_size", "2", "--world_size", "4",
                                  "--batch_size", "2", "--batch_size", "3"});
  EXPECT_EQ(estimate.kind, Command::Kind::estimate);
  EXPECT_EQ(estimate.estimate.world_size, 4);
  EXPECT_EQ(estimate.run.data.batch_size, 3);
  EXPECT_EQ(estimate.warnings.size(), 2u) << ::testing::PrintToString(estimate.warnings);
  EXPECT_EQ(parse({"prepare", "--input", "a.txt", "--output", "x.bin", "--output", "t.bin", "--vocab_size",
                   "100"}).prepare.output, "t.bin");
  // A value outside a flag's choices is an error even when a later one is good (CLI11 checks every
  // value against IsMember). Only the last value is converted to a number, so an earlier "fast" is
  // not an error, but the warning shows it.
  expect_mentions(parse_error({"--config", "c", "--scheduler", "cosine_restarts", "--scheduler", "cosine"}),
                  {"--scheduler", "cosine_restarts"});
  const Command overridden = parse({"--config", "c", "--lr", "fast", "--lr", "1e-3"});
  EXPECT_DOUBLE_EQ(overridden.run.optimizer.lr, 1e-3);
  ASSERT_EQ(overridden.warnings.size(), 1u);
  expect_mentions(overridden.warnings[0], {"--lr given 2 times (fast, 1e-3); using the last, 1e-3"});
}

TEST(CliTrain, ListValuedOptionsKeepEveryValue) {
  const Command prepare = parse({"prepare", "--input", "a.txt", "--input", "b.txt", "--input", "c.txt",
                                 "--output", "t.bin", "--vocab_size", "100"});
  EXPECT_EQ(prepare.prepare.inputs, (std::vector<std::string>{"a.txt", "b.txt", "c.txt"}));
  EXPECT_TRUE(prepare.warnings.empty());
  const Command report = parse({"report", "runs/a", "runs/b", "--out", "r"});
  EXPECT_EQ(report.report.run_dirs, (std::vector<std::string>{"runs/a", "runs/b"}));
  EXPECT_TRUE(report.warnings.empty());
}

TEST(CliTrain, RangesAreLeftToValidation) {
  // Parsing checks syntax only: a negative number is a value, and validate_run_config rejects it.
  const Command command = parse({"--config", "c", "--warmup_steps", "-5", "--lr", "-1"});
  EXPECT_EQ(command.run.optimizer.warmup_steps, -5);
  EXPECT_DOUBLE_EQ(command.run.optimizer.lr, -1.0);
}

// Both flags given and disagreeing: refused (one silently won), naming both and what each means.
TEST(CliTrain, ActivationCheckpointingFlagsThatDisagreeAreRefused) {
  expect_mentions(parse_error({"--config", "c", "--activation_checkpointing", "--activation_checkpointing_every", "2"}),
                  {"command line: --activation_checkpointing / --activation_checkpointing_every: give one",
                   "--activation_checkpointing recomputes every transformer block in backward",
                   "--activation_checkpointing_every 2 recomputes one block in 2"});
  EXPECT_EQ(parse({"--config", "c", "--activation_checkpointing", "--activation_checkpointing_every", "1"})
                .run.activation_checkpointing_every, 1);  // the same setting twice
  EXPECT_EQ(parse({"--config", "c", "--activation_checkpointing"}).run.activation_checkpointing_every, 1);
  EXPECT_EQ(parse({"--config", "c", "--activation_checkpointing_every", "2"}).run.activation_checkpointing_every, 2);
}

TEST(CliTrain, BadChoiceNamesTheFlag) {
  expect_mentions(parse_error({"--config", "c", "--scheduler", "cosine_restarts"}),
                  {"command line", "--scheduler", "cosine_restarts"});
  expect_mentions(parse_error({"--config", "c", "--dtype", "float16"}), {"--dtype", "float16"});
  expect_mentions(parse_error({"--config", "c", "--precision", "half"}), {"--precision"});
  expect_mentions(parse_error({"--config", "c", "--device", "tpu"}), {"--device", "tpu"});
  expect_mentions(parse_error({"--config", "c", "--communicator", "gloo"}), {"--communicator", "gloo"});
  expect_mentions(parse_error({"--config", "c", "--optimizer_state_dtype", "float16"}),
                  {"--optimizer_state_dtype", "float16"});
}

TEST(CliTrain, BadNumberNamesTheFlag) {
  expect_mentions(parse_error({"--config", "c", "--lr", "fast"}), {"--lr", "fast"});
  expect_mentions(parse_error({"--config", "c", "--batch_size", "1.5"}), {"--batch_size"});
  expect_mentions(parse_error({"--config", "c", "--max_length", "long"}), {"--max_length"});
  expect_mentions(parse_error({"--config", "c", "--seed", "x"}), {"--seed"});
  expect_mentions(parse_error({"--config", "c", "--seed", "-1"}), {"--seed", ">= 0", "got -1"});
  expect_mentions(parse_error({"--config", "c", "--lr"}), {"--lr"});  // value missing
}

TEST(CliTrain, UnknownFlagIsNamed) {
  expect_mentions(parse_error({"--config", "c", "--learning_rate", "1"}),
                  {"command line", "--learning_rate", "--help"});
  expect_mentions(parse_error({"--config", "c", "stray"}), {"stray"});
}

TEST(CliTrain, ConfigIsRequiredForTraining) {
  expect_mentions(parse_error({"--lr", "1e-3"}), {"command line", "--config", "required"});
  expect_mentions(parse_error({}), {"--config"});
}

TEST(CliHelp, HelpIsNotAnErrorAndShowsDefaults) {
  for (const char* flag : {"--help", "-h"}) {
    const Command command = parse({flag});
    ASSERT_EQ(command.kind, Command::Kind::help);
    expect_mentions(command.help_text, {"--config", "--lr", "--total_batch_size", "--scheduler",
                                        "cosine", "linear", "constant", "--print_config",
                                        "prepare", "0.001", "runs/latest"});
  }
}

TEST(CliHelp, PrepareHelpShowsItsOwnFlags) {
  const Command command = parse({"prepare", "--help"});
  ASSERT_EQ(command.kind, Command::Kind::help);
  expect_mentions(command.help_text,
                  {"--input", "--output", "--tokenizer", "--vocab_size", "--model_type", "bpe"});
  EXPECT_EQ(command.help_text.find("--lr"), std::string::npos) << command.help_text;
}

TEST(CliPrepare, TrainsTokenizerFromRepeatedInputs) {
  const Command command = parse({"prepare", "--input", "a.txt", "--input", "b.txt", "--output",
                                 "tokens.bin", "--vocab_size", "1000", "--model_type", "unigram"});
  ASSERT_EQ(command.kind, Command::Kind::prepare);
  EXPECT_EQ(command.prepare.inputs, (std::vector<std::string>{"a.txt", "b.txt"}));
  EXPECT_EQ(command.prepare.output, "tokens.bin");
  EXPECT_EQ(command.prepare.vocab_size, 1000);
  EXPECT_TRUE(command.prepare.tokenizer.empty());
  EXPECT_EQ(command.prepare.model_type, "unigram");
}

TEST(CliPrepare, EncodesWithExistingTokenizer) {
  const Command command =
      parse({"prepare", "--input", "a.txt", "--output", "t.bin", "--tokenizer", "t5.model"});
  ASSERT_EQ(command.kind, Command::Kind::prepare);
  EXPECT_EQ(command.prepare.tokenizer, "t5.model");
  EXPECT_EQ(command.prepare.vocab_size, 0);
  EXPECT_EQ(command.prepare.model_type, "bpe");
}

TEST(CliPrepare, ExactlyOneOfTokenizerAndVocabSize) {
  expect_mentions(parse_error({"prepare", "--input", "a", "--output", "o"}),
                  {"--tokenizer", "--vocab_size", "exactly one", "neither"});
  expect_mentions(parse_error({"prepare", "--input", "a", "--output", "o", "--tokenizer", "m",
                               "--vocab_size", "100"}),
                  {"--tokenizer", "--vocab_size", "exactly one", "both"});
}

TEST(CliPrepare, RequiredAndBadFlagsAreNamed) {
  expect_mentions(parse_error({"prepare", "--output", "o", "--vocab_size", "100"}), {"--input"});
  expect_mentions(parse_error({"prepare", "--input", "a", "--vocab_size", "100"}), {"--output"});
  for (const char* outside : {"0", "3", "2147483648"})
    expect_mentions(parse_error({"prepare", "--input", "a", "--output", "o", "--vocab_size", outside}),
                    {"--vocab_size", "an integer in [4, 2147483647]", "reserves 3 pieces",
                     std::string("got ") + outside});
  expect_mentions(parse_error({"prepare", "--input", "a", "--output", "o", "--vocab_size", "many"}),
                  {"--vocab_size"});
  expect_mentions(parse_error({"prepare", "--input", "a", "--output", "o", "--vocab_size", "100",
                               "--model_type", "word"}),
                  {"--model_type", "word"});
  expect_mentions(parse_error({"prepare", "--input", "a", "--output", "o", "--vocab_size", "100",
                               "--lr", "1"}),
                  {"--lr"});
}

TEST(CliPrepare, OverwriteIsOffUnlessGiven) {
  const std::vector<std::string> args = {"prepare", "--input", "a.txt", "--output", "t.bin", "--vocab_size", "100"};
  EXPECT_FALSE(parse(args).prepare.overwrite);
  std::vector<std::string> with_flag = args;
  with_flag.push_back("--overwrite");
  EXPECT_TRUE(parse(with_flag).prepare.overwrite);
  expect_mentions(parse_error({"--config", "c", "--overwrite"}), {"--overwrite"});  // prepare's only
}

TEST(CliEstimate, AbsurdValuesAreRefusedInWords) {
  // Each names the flag and the accepted range in words; none is CLI11's "not in range 0.000000 to
  // 1.797e308" (a 300-digit number) and none is accepted silently (nan was, and 1e300 GiB of node
  // memory read as "this machine's RAM is unknown").
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {{"--world_size", "0"}, {"--world_size: expected an integer from 1 to 65536", "(got 0)"}},
      {{"--world_size", "-1"}, {"--world_size: expected an integer from 1 to 65536", "(got -1)"}},
      {{"--world_size", "1000000"}, {"--world_size", "simulates and lists each one", "(got 1000000)"}},
      {{"--world_size", "100000000000"}, {"--world_size", "(got 100000000000)"}},
      {{"--memory_budget_gib", "-1"}, {"--memory_budget_gib: expected a number of GiB above 0", "(got -1)"}},
      {{"--memory_budget_gib", "0"}, {"--memory_budget_gib", "leave it out for no verdict", "(got 0)"}},
      {{"--memory_budget_gib", "nan"}, {"--memory_budget_gib", "(got nan)"}},
      {{"--memory_budget_gib", "inf"}, {"--memory_budget_gib", "(got inf)"}},
      {{"--memory_budget_gib", "1e30"}, {"--memory_budget_gib", "at most 1048576 (1 PiB)", "(got 1e30)"}},
      {{"--ranks_per_node", "0"}, {"--ranks_per_node: expected an integer from 1 to 65536",
                                   "leave it out for every rank on one node", "(got 0)"}},
      {{"--ranks_per_node", "-2"}, {"--ranks_per_node", "(got -2)"}},
      {{"--ranks_per_node", "70000"}, {"--ranks_per_node", "(got 70000)"}},
      {{"--node_memory_gib", "-5"}, {"--node_memory_gib: expected a number of GiB above 0", "(got -5)"}},
      {{"--node_memory_gib", "0"}, {"--node_memory_gib", "leave it out for this machine's", "(got 0)"}},
      {{"--node_memory_gib", "nan"}, {"--node_memory_gib", "(got nan)"}},
      {{"--node_memory_gib", "1e300"}, {"--node_memory_gib", "(got 1e300)"}},  // as typed
  };
  for (const Case& absurd : cases) {
    std::vector<std::string> args = {"estimate", "--config", "c"};
    args.insert(args.end(), absurd.flags.begin(), absurd.flags.end());
    SCOPED_TRACE(absurd.flags[0] + " " + absurd.flags[1]);
    const std::string message = parse_error(args);
    expect_mentions(message, absurd.fragments);
    EXPECT_EQ(message.find("not in range"), std::string::npos) << message;
  }
  // The boundaries are accepted, and a flag left out keeps its default.
  const Command edges = parse({"estimate", "--config", "c", "--world_size", "65536", "--ranks_per_node", "1",
                               "--memory_budget_gib", "0.5", "--node_memory_gib", "1048576"});
  EXPECT_EQ(edges.kind, Command::Kind::estimate);
  EXPECT_EQ(edges.estimate.world_size, 65536);
  EXPECT_EQ(edges.estimate.ranks_per_node, 1);
  EXPECT_DOUBLE_EQ(edges.estimate.memory_budget_gib, 0.5);
  EXPECT_DOUBLE_EQ(edges.estimate.node_memory_gib, 1048576);
  const Command defaults = parse({"estimate", "--config", "c"});
  EXPECT_EQ(defaults.estimate.world_size, 1);
  EXPECT_EQ(defaults.estimate.ranks_per_node, 0);
  EXPECT_EQ(defaults.estimate.memory_budget_gib, 0);
  EXPECT_EQ(defaults.estimate.node_memory_gib, 0);
}

TEST(CliPrepare, TrainingFlagsAreRejected) {
  expect_mentions(parse_error({"--lr", "1", "prepare", "--input", "a", "--output", "o",
                               "--vocab_size", "100"}),
                  {"command line", "--lr", "training flag"});
}

TEST(CliPrintConfig, ResolvedConfigHasModelAndRun) {
  const ModelConfig model = load_model_config(config_path("llama_9m"));
  RunConfig run;
  run.config_path = config_path("llama_9m");
  validate_run_config(run, model, 2);
  const json resolved = resolved_config_json(model, run);
  EXPECT_EQ(resolved.at("model").at("name"), "llama_9m");
  EXPECT_EQ(resolved.at("model").at("num_parameters"), 8'995'968);
  EXPECT_EQ(resolved.at("model").at("config").at("hidden_size"), 128);
  EXPECT_EQ(resolved.at("model").at("config").at("max_position_embeddings"), 1024);
  EXPECT_EQ(resolved.at("run").at("total_batch_size"), 16);  // derived: 8 * world 2
  EXPECT_EQ(resolved.at("run").at("scheduler"), "cosine");
  EXPECT_EQ(resolved.at("run").at("device"), "auto");
  // The model part is itself a loadable config.
  EXPECT_EQ(parse_model_config(resolved.at("model").at("config"), "llama_9m.json").num_parameters(),
            model.num_parameters());
}

}  // namespace
}  // namespace llm::cli_test
