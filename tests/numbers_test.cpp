// Numbers that would wrap or be clamped: every numeric flag of every subcommand is read whole (no
// clamping to INT64_MAX, no wrapping of -1 or of 10000000000B, no octal or hex, no inf or nan), the
// int64 products of counts (tokens per step, the run's tokens, the total batch) are checked, and the
// integers of a run's JSON settings are read whole too. Every refusal is exit 2 naming the flag (or
// key), the value as typed and the range.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "tests/test_util.h"
#include "trainer/cli.h"
#include "config/config.h"
#include "model/model_config.h"

namespace llm::numbers_test {
namespace {

using nlohmann::json;
using testing::source_dir;

constexpr const char* kHuge = "99999999999999999999";  // 1e20: past int64 and uint64

void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "message should mention \"" << part << "\":\n  " << message;
}

Command parse(std::vector<std::string> args) {
  args.insert(args.begin(), "trainer");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

// The UserError `trainer ARGS...` stops with, recorded as an exit-2 case of the errors table unless
// `record` is false (the sweeps over every flag record one flag's cases, not hundreds of rows).
std::string parse_error(const std::vector<std::string>& args, bool record = true) {
  std::string command = "trainer";
  for (const std::string& arg : args) command += " " + (arg.empty() ? std::string("''") : arg);
  try {
    parse(args);
  } catch (const UserError& error) {
    if (record) testing::record_error_case(command, 2, std::string("error: ") + error.what());
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << command << ": expected a UserError, got " << error.what();
    return "";
  }
  ADD_FAILURE() << command << ": expected a UserError, nothing was thrown";
  return "";
}

std::string validation_error(RunConfig run, int world_size = 1) {
  const ModelConfig model = load_model_config((source_dir() / "configs" / "llama_tiny.json").string());
  try {
    validate_run_config(run, model, world_size);
  } catch (const UserError& error) {
    testing::record_error_case("", 2, std::string("error: ") + error.what());
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError from validate_run_config";
  return "";
}

// `trainer --config configs/llama_tiny.json FLAGS --print_config`, which must stop with exit 2.
testing::CommandResult run_trainer_expecting_exit_2(const std::string& flags) {
  const testing::CommandResult result =
      testing::run_command("cd " + source_dir().string() + " && " + testing::trainer_binary().string() +
                           " --config configs/llama_tiny.json " + flags + " --print_config 2>&1");
  EXPECT_EQ(result.exit_code, 2) << flags << "\n" << result.output;
  return result;
}

// The flags of the optimizer named first, or of every optimizer when it is "".
struct FlagOf {
  const char* flag;
  const char* optimizer;
};

const std::vector<FlagOf> kIntegerFlags = {
    {"--batch_size", ""},        {"--total_batch_size", ""},   {"--max_length", ""},
    {"--num_training_steps", ""}, {"--divergence_patience", ""}, {"--activation_checkpointing_every", ""},
    {"--warmup_steps", ""},      {"--eval_every", ""},         {"--eval_batches", ""},
    {"--save_every", ""},        {"--keep_last", ""},          {"--log_every", ""},
    {"--gradient_accumulation", ""}, {"--rank", "galore_adamw"}, {"--update_proj_gap", "galore_adamw"},
    {"--subspace_iterations", "galore_adamw"},
};

const std::vector<FlagOf> kRealFlags = {
    {"--lr", ""},           {"--min_lr_ratio", ""},       {"--weight_decay", ""},
    {"--grad_clipping", ""}, {"--adam_beta1", ""},        {"--adam_beta2", ""},
    {"--adam_eps", ""},     {"--eval_fraction", ""},      {"--collective_timeout", ""},
    {"--preemption_grace_seconds", ""}, {"--beta1", ""}, {"--galore_scale", "galore_adamw"},
};

std::vector<std::string> with_flag(const FlagOf& flag, const std::string& value) {
  std::vector<std::string> args = {"--config", "c"};
  if (*flag.optimizer != '\0') args.insert(args.end(), {"--optimizer", flag.optimizer});
  args.insert(args.end(), {flag.flag, value});
  return args;
}

TEST(CommandLineNumbers, EveryIntegerFlagRefusesWhatWouldWrapOrBeClamped) {
  struct Case {
    std::string typed, said;
  };
  const std::vector<Case> cases = {
      {kHuge, "expected an integer (got 99999999999999999999, above the largest 64-bit integer, "
              "9223372036854775807)"},
      {"-99999999999999999999", "expected an integer (got -99999999999999999999, below the smallest 64-bit "
                                "integer, -9223372036854775808)"},
      {"9223372036854775808", "expected an integer (got 9223372036854775808, above the largest 64-bit integer"},
      {"1.5", "expected an integer (got 1.5)"},
      {"1e3", "expected an integer (got 1e3)"},
      {"0x10", "expected an integer (got 0x10)"},
      {"+5", "expected an integer (got +5)"},
      {" 5", "expected an integer (got  5)"},
      {"5k", "expected an integer (got 5k)"},
      {"", "expected an integer (got nothing)"},
  };
  for (const FlagOf& flag : kIntegerFlags)
    for (const Case& bad : cases) {
      SCOPED_TRACE(std::string(flag.flag) + " \"" + bad.typed + "\"");
      expect_mentions(parse_error(with_flag(flag, bad.typed), &flag == &kIntegerFlags.front()),
                      {std::string("command line: ") + flag.flag + ": " + bad.said});
    }
}

TEST(CommandLineNumbers, EveryRealFlagRefusesInfNanAndNumbersPastADouble) {
  struct Case {
    std::string typed, said;
  };
  const std::vector<Case> cases = {
      {"inf", "expected a finite number (got inf)"},
      {"-inf", "expected a finite number (got -inf)"},
      {"infinity", "expected a finite number (got infinity)"},
      {"nan", "expected a finite number (got nan)"},
      {"1e999", "expected a finite number (got 1e999, above the largest double, 1.79769e+308)"},
      {"-1e999", "expected a finite number (got -1e999, below the lowest double, -1.79769e+308)"},
      {"1e-400", "expected a finite number (got 1e-400, closer to 0 than the smallest double"},
      {"0x1p3", "expected a finite number (got 0x1p3)"},
      {"1,5", "expected a finite number (got 1,5)"},
      {"fast", "expected a finite number (got fast)"},
  };
  for (const FlagOf& flag : kRealFlags)
    for (const Case& bad : cases) {
      SCOPED_TRACE(std::string(flag.flag) + " " + bad.typed);
      expect_mentions(parse_error(with_flag(flag, bad.typed), &flag == &kRealFlags.front()),
                      {std::string("command line: ") + flag.flag + ": " + bad.said});
    }
}

TEST(CommandLineNumbers, WholeDecimalNumbersAreReadAsTyped) {
  // Decimal always: CLI11's strtoll read 010 as octal 8.
  EXPECT_EQ(parse({"--config", "c", "--batch_size", "010"}).run.data.batch_size, 10);
  EXPECT_EQ(parse({"--config", "c", "--keep_last", "9223372036854775807"}).run.checkpoint.keep_last,
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parse({"--config", "c", "--warmup_steps", "-9223372036854775808"}).run.optimizer.warmup_steps,
            std::numeric_limits<int64_t>::min());
  EXPECT_DOUBLE_EQ(parse({"--config", "c", "--lr", "3e-4"}).run.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(parse({"--config", "c", "--lr", ".5"}).run.optimizer.lr, 0.5);
  EXPECT_DOUBLE_EQ(parse({"--config", "c", "--lr", "1e-310"}).run.optimizer.lr, 1e-310);  // subnormal, not 0
  EXPECT_DOUBLE_EQ(parse({"--config", "c", "--lr=2"}).run.optimizer.lr, 2);
  // Help still shows each number's default.
  expect_mentions(parse({"--help"}).help_text, {"--batch_size INT=8", "--lr FLOAT=0.001"});
}

TEST(CommandLineNumbers, SeedIsAnUnsigned64BitInteger) {
  EXPECT_EQ(parse({"--config", "c", "--seed", "18446744073709551615"}).run.seed,
            std::numeric_limits<uint64_t>::max());
  expect_mentions(parse_error({"--config", "c", "--seed", "-1"}), {"--seed: expected an integer >= 0 (got -1)"});
  expect_mentions(parse_error({"--config", "c", "--seed", "18446744073709551616"}),
                  {"--seed: expected an integer >= 0 (got 18446744073709551616, above the largest 64-bit integer, "
                   "18446744073709551615)"});
}

TEST(CommandLineNumbers, SubsetSizeOfTheSmallestInt64IsRefused) {
  // -k is taken of a negative k: -(-2^63) does not exist in int64.
  expect_mentions(parse_error({"--config", "c", "--optimizer", "adamw_sn", "--subset_size", "-9223372036854775808"}),
                  {"--subset_size: expected heuristics or a non-zero integer from -9223372036854775807 to "
                   "9223372036854775807 (got \"-9223372036854775808\")"});
  expect_mentions(parse_error({"--config", "c", "--optimizer", "adamw_sn", "--subset_size", kHuge}),
                  {"--subset_size", "(got \"99999999999999999999\")"});
  EXPECT_EQ(parse({"--config", "c", "--optimizer", "adamw_sn", "--subset_size", "-9223372036854775807"})
                .run.optimizer.subset_size,
            -std::numeric_limits<int64_t>::max());
}

TEST(CommandLineNumbers, MaxTrainTokensThatWouldWrapIsRefusedAsTyped) {
  // 10000000000B = 10^19 tokens, past int64: it wrapped to 8,446,744,073,709,551,616 and the message
  // showed that number; 18446744074B wrapped to 290,448,384 tokens and trained.
  for (const char* typed : {"18446744074B", "999999999999B", "10000000000B", "9223372036855M", "9223372036854775808"}) {
    SCOPED_TRACE(typed);
    expect_mentions(parse_error({"--config", "c", "--max_train_tokens", typed}),
                    {"command line: --max_train_tokens: expected a number of tokens >= 1 and at most "
                     "9223372036854775807 (9223372036B)",
                     std::string("(got \"") + typed + "\")"});
  }
  EXPECT_EQ(parse({"--config", "c", "--max_train_tokens", "9223372036B"}).run.max_train_tokens,
            9'223'372'036'000'000'000);
  EXPECT_EQ(parse({"--config", "c", "--max_train_tokens", "007M"}).run.max_train_tokens, 7'000'000);
}

TEST(CommandLineNumbers, SubcommandNumbersAreReadTheSameWay) {
  expect_mentions(parse_error({"prepare", "--input", "a", "--output", "o", "--vocab_size", kHuge}),
                  {"--vocab_size: expected an integer in [4, 2147483647]", "(got 99999999999999999999)"});
  expect_mentions(parse_error({"estimate", "--config", "c", "--world_size", kHuge}),
                  {"--world_size: expected an integer from 1 to 65536", "(got 99999999999999999999)"});
  expect_mentions(parse_error({"estimate", "--config", "c", "--ranks_per_node", "4294967297"}),
                  {"--ranks_per_node: expected an integer from 1 to 65536", "(got 4294967297)"});
  expect_mentions(parse_error({"estimate", "--config", "c", "--memory_budget_gib", "1e999"}),
                  {"--memory_budget_gib: expected a number of GiB above 0 and at most 1048576", "(got 1e999)"});
  expect_mentions(parse_error({"estimate", "--config", "c", "--node_memory_gib", "0x10"}),
                  {"--node_memory_gib", "(got 0x10)"});
  // Training flags given to estimate are read the same way.
  expect_mentions(parse_error({"estimate", "--config", "c", "--batch_size", kHuge}),
                  {"--batch_size: expected an integer (got 99999999999999999999, above the largest"});
  // export's --max_shard_size: too large, and "." (std::stod threw: a crash with exit 1).
  for (const char* typed : {"99999999999999999999", "20000000000GB", ".GB", "."}) {
    SCOPED_TRACE(typed);
    expect_mentions(parse_error({"export", "--from", "a", "--to", "b", "--max_shard_size", typed}),
                    {"--max_shard_size: expected a size of at least 1 byte and below 1.8e19 bytes",
                     std::string("(got \"") + typed + "\")"});
  }
}

// The cases of the issue, from the trainer binary: each was exit 0 with a wrapped or clamped number.
TEST(CommandLineNumbers, TrainerStopsWithExitTwoOnNumbersPastTheirType) {
  for (const std::string flag : {"--keep_last", "--save_every", "--num_training_steps", "--batch_size", "--eval_batches"}) {
    const testing::CommandResult result = run_trainer_expecting_exit_2(flag + " " + kHuge);
    expect_mentions(result.output, {"error: command line: " + flag + ": expected an integer (got " + kHuge +
                                    ", above the largest 64-bit integer, 9223372036854775807)"});
  }
  expect_mentions(run_trainer_expecting_exit_2("--max_train_tokens 18446744074B").output,
                  {"--max_train_tokens", "(got \"18446744074B\")", "at most 9223372036854775807"});
  expect_mentions(run_trainer_expecting_exit_2("--optimizer adamw_sn --subset_size -9223372036854775808").output,
                  {"--subset_size", "from -9223372036854775807 to 9223372036854775807", "(got \"-9223372036854775808\")"});
  expect_mentions(run_trainer_expecting_exit_2("--num_training_steps 9223372036854775807").output,
                  {"--num_training_steps: expected at most 9007199254740991 steps of 1024 tokens",
                   "(got 9223372036854775807)"});
}

TEST(CountProducts, ProductsThatWouldWrapAnInt64AreRefused) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  RunConfig run;
  run.data.batch_size = int64_t{1} << 62;
  expect_mentions(validation_error(run, 4),
                  {"--batch_size: expected at most 2305843009213693951 sequences per rank with 4 ranks",
                   "(got 4611686018427387904)"});
  run = RunConfig{};
  run.data.gradient_accumulation_given = int64_t{1} << 62;
  expect_mentions(validation_error(run, 2),
                  {"--gradient_accumulation: expected at most 576460752303423487 with --batch_size * world size = 16",
                   "(got 4611686018427387904)"});
  run = RunConfig{};
  run.data.batch_size = 1;
  run.data.total_batch_size = int64_t{1} << 62;
  expect_mentions(validation_error(run), {"--total_batch_size / --max_length", "4611686018427387904 sequences of 128 "
                                          "tokens is more tokens than a 64-bit count holds"});
  run = RunConfig{};
  run.num_training_steps = max;  // 8 x 128 = 1024 tokens a step
  expect_mentions(validation_error(run), {"--num_training_steps: expected at most 9007199254740991 steps of 1024 tokens",
                                          "(got 9223372036854775807)"});
  run = RunConfig{};
  run.max_train_tokens = max;  // ceil(max / 1024) steps are one step past the count
  expect_mentions(validation_error(run), {"--max_train_tokens: expected at most 9223372036854774784 tokens",
                                          "(got 9223372036854775807"});
  run = RunConfig{};
  run.max_train_tokens = 9223372036854774784;  // the most: exactly that many steps
  const ModelConfig model = load_model_config((source_dir() / "configs" / "llama_tiny.json").string());
  validate_run_config(run, model, 1);
  EXPECT_EQ(run.num_training_steps, 9007199254740991);
  run = RunConfig{};
  run.data.eval_batches = max;
  expect_mentions(validation_error(run), {"--eval_batches: expected at most 9007199254740991 batches of 1024 tokens",
                                          "(got 9223372036854775807)"});
  run = RunConfig{};
  run.optimizer.update_proj_gap = int64_t{1} << 31;
  expect_mentions(validation_error(run), {"--update_proj_gap: expected an integer from 1 to 2147483647",
                                          "(got 2147483648)"});
  run = RunConfig{};
  run.optimizer.subspace_iterations = max;
  expect_mentions(validation_error(run), {"--subspace_iterations: expected an integer from 1 to 3074457345618258602",
                                          "(got 9223372036854775807)"});
}

TEST(RunSettingsJson, IntegersAreReadWhole) {
  // nlohmann's get<int64_t>() truncated 2.5 to 2 and wrapped 2^64-1 to -1; get<uint64_t>() wrapped -1.
  struct Case {
    json settings;
    std::vector<std::string> said;
  };
  const std::vector<Case> cases = {
      {json{{"batch_size", 2.5}}, {"metrics.jsonl: run.batch_size: expected an integer (got float 2.5)"}},
      {json{{"num_training_steps", std::numeric_limits<uint64_t>::max()}},
       {"run.num_training_steps: expected an integer from -9223372036854775808 to 9223372036854775807",
        "(got integer 18446744073709551615)"}},
      {json{{"seed", -1}}, {"run.seed: expected an integer from 0 to 18446744073709551615 (got integer -1)"}},
      {json{{"warmup_steps", 1e30}}, {"run.warmup_steps: expected an integer (got float 1e+30)"}},
      {json{{"lr", "fast"}}, {"run.lr: expected a number (got string \"fast\")"}},
      {json{{"async_save", 1}}, {"run.async_save: expected true or false (got integer 1)"}},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.settings.dump());
    std::string message;
    try {
      run_config_from_json(bad.settings, "metrics.jsonl");
    } catch (const UserError& error) {
      message = error.what();
      testing::record_error_case("", 2, "error: " + message);
    }
    expect_mentions(message, bad.said);
  }
  const RunConfig read = run_config_from_json(json{{"seed", std::numeric_limits<uint64_t>::max()}, {"lr", 1}}, "m");
  EXPECT_EQ(read.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_DOUBLE_EQ(read.optimizer.lr, 1.0);  // an integer is a number
}

}  // namespace
}  // namespace llm::numbers_test
