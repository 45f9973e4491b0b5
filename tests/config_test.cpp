// Model config loading (the shipped GaLore family and every way a config file can be wrong), run
// config validation, and the command line. Every error test checks that the UserError names where
// the mistake is (the file or "command line") and which key or flag, since that is what a user needs.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <ostream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "tests/test_util.h"
#include "trainer/cli.h"
#include "config/config.h"

namespace llm {
namespace {

using nlohmann::json;
using testing::ScratchDir;
using testing::source_dir;

std::string config_path(const std::string& name) {
  return (source_dir() / "configs" / (name + ".json")).string();
}

// Fails the test unless `message` contains every one of `parts`.
void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << "message should mention \"" << part << "\":\n  " << message;
}

// Runs `action`, which must throw UserError; returns its message ("" and a failure otherwise).
std::string user_error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UserError& error) {
    testing::record_error_case("", 2, std::string("error: ") + error.what());  // in process: the test names it
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected UserError, got another exception: " << error.what();
    return "";
  }
  ADD_FAILURE() << "expected UserError, nothing was thrown";
  return "";
}

// ------------------------------------------------------------------------------------------------
// The shipped configs

struct FamilyRow {
  const char* name;
  double total_millions;   // optimizers.md 1.5 "total params", two decimals
  double galore_millions;  // "GaLore params": L * (4h^2 + 3hI)
};

// optimizers.md section 1.5, counted from the GaLore repo's configs.
const FamilyRow kFamily[] = {
    {"llama_9m", 9.00, 0.80},       {"llama_20m", 19.55, 3.16},
    {"llama_35m", 35.20, 10.62},    {"llama_40m", 42.39, 15.76},
    {"llama_60m", 58.07, 25.30},    {"llama_71m", 70.58, 37.80},
    {"llama_100m", 100.12, 59.01},  {"llama_130m", 134.11, 84.93},
    {"llama_250m", 247.37, 198.18}, {"llama_350m", 367.97, 302.38},
    {"llama_1b", 1339.08, 1207.91}, {"llama_3b", 2685.83, 2521.83},
    {"llama_7b", 6738.42, 6476.01},
};

// Names the row in failure messages instead of gtest's byte dump.
void PrintTo(const FamilyRow& row, std::ostream* out) { *out << row.name; }

class ConfigFamilyTable : public ::testing::TestWithParam<FamilyRow> {};

TEST_P(ConfigFamilyTable, LoadsAndCountsParametersAsTheTable) {
  const FamilyRow& row = GetParam();
  const ModelConfig config = load_model_config(config_path(row.name));
  EXPECT_EQ(config.name, row.name);
  EXPECT_EQ(config.num_key_value_heads, config.num_attention_heads);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_EQ(config.pad_token_id, -1);
  EXPECT_EQ(config.bos_token_id, 0);
  EXPECT_EQ(config.eos_token_id, 1);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config.initializer_range, 0.02);
  // The table rounds to 0.01M, so the exact count lies within half of that.
  EXPECT_NEAR(config.num_parameters() / 1e6, row.total_millions, 0.005) << row.name;
  const double h = static_cast<double>(config.hidden_size);
  const double galore = config.num_hidden_layers * (4 * h * h + 3 * h * config.intermediate_size);
  EXPECT_NEAR(galore / 1e6, row.galore_millions, 0.005) << row.name;
}

INSTANTIATE_TEST_SUITE_P(ConfigGalore, ConfigFamilyTable, ::testing::ValuesIn(kFamily),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ConfigFamily, ValuesThatDifferFromTheCommonPattern) {
  EXPECT_EQ(load_model_config(config_path("llama_100m")).vocab_size, 32100);
  // No max_position_embeddings in the GaLore files: max_sequence_length stands in for it.
  EXPECT_EQ(load_model_config(config_path("llama_7b")).max_position_embeddings, 2048);
  EXPECT_EQ(load_model_config(config_path("llama_60m")).max_position_embeddings, 1024);
  const ModelConfig one_b = load_model_config(config_path("llama_1b"));
  EXPECT_EQ(one_b.intermediate_size, 5461);  // odd, as in the GaLore file
  EXPECT_EQ(one_b.head_dim(), 64);
}

TEST(ConfigFamily, ExactParameterCountOf9m) {
  // 2 * 32000 * 128 + 4 * (4 * 128^2 + 3 * 128 * 352 + 2 * 128) + 128
  EXPECT_EQ(load_model_config(config_path("llama_9m")).num_parameters(), 8'995'968);
}

TEST(ConfigFamily, TestConfigs) {
  const ModelConfig tiny = load_model_config(config_path("llama_tiny"));
  EXPECT_EQ(tiny.name, "llama_tiny");
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.intermediate_size, 176);
  EXPECT_EQ(tiny.num_attention_heads, 4);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.vocab_size, 512);
  EXPECT_EQ(tiny.max_position_embeddings, 256);
  EXPECT_EQ(tiny.head_dim(), 16);
  const ModelConfig micro = load_model_config(config_path("llama_micro"));
  EXPECT_EQ(micro.hidden_size, 32);
  EXPECT_EQ(micro.intermediate_size, 88);
  EXPECT_EQ(micro.num_attention_heads, 2);
  EXPECT_EQ(micro.num_hidden_layers, 2);
  EXPECT_EQ(micro.vocab_size, 128);
  EXPECT_EQ(micro.max_position_embeddings, 64);
}

// ------------------------------------------------------------------------------------------------
// Parameter count, optional keys and JSON round trip

json tiny_json() {
  std::ifstream stream(config_path("llama_tiny"));
  return json::parse(stream);
}

TEST(ConfigParse, GroupedQueryAttentionAndTiedEmbeddingsCount) {
  json object = tiny_json();  // h 64, I 176, 4 heads (head_dim 16), 2 layers, V 512
  object["num_key_value_heads"] = 2;
  object["tie_word_embeddings"] = true;
  const ModelConfig config = parse_model_config(object, "gqa.json");
  const int64_t h = 64, kv_width = 2 * 16, layer = 2 * h * h + 2 * h * kv_width + 3 * h * 176 + 2 * h;
  EXPECT_EQ(config.num_parameters(), 512 * h + 2 * layer + h);
}

TEST(ConfigParse, AcceptsEveryOptionalHfKey) {
  json object = tiny_json();
  object.erase("max_position_embeddings");
  object.update(json{{"max_position_embeddings", 128}, {"max_sequence_length", 128},
                     {"rope_theta", 500000.0}, {"num_key_value_heads", 1},
                     {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"},
                     {"attention_bias", false}, {"mlp_bias", false}, {"attention_dropout", 0.0},
                     {"rope_scaling", nullptr}, {"head_dim", 16}, {"pretraining_tp", 1}});
  const ModelConfig config = parse_model_config(object, "dir/full.json");
  EXPECT_EQ(config.name, "full");
  EXPECT_EQ(config.max_position_embeddings, 128);
  EXPECT_DOUBLE_EQ(config.rope_theta, 500000.0);
  EXPECT_EQ(config.num_key_value_heads, 1);
}

// What today's transformers writes (and `trainer export` does): dtype for torch_dtype, RoPE's theta
// inside rope_parameters.
TEST(ConfigParse, AcceptsTransformers5Keys) {
  json object = tiny_json();
  object.update(json{{"dtype", "float32"},
                     {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}});
  EXPECT_DOUBLE_EQ(parse_model_config(object, "x.json").rope_theta, 500000.0);
  object["rope_theta"] = 500000.0;  // both spellings, agreeing
  EXPECT_DOUBLE_EQ(parse_model_config(object, "x.json").rope_theta, 500000.0);
}

TEST(ConfigParse, ContextLengthDefaultsToHfValueWithoutEitherKey) {
  json object = tiny_json();
  object.erase("max_position_embeddings");
  EXPECT_EQ(parse_model_config(object, "x.json").max_position_embeddings, 2048);
}

TEST(ConfigParse, ToJsonRoundTrips) {
  json object = tiny_json();
  object["num_key_value_heads"] = 2;
  object["rope_theta"] = 1234.5;
  const ModelConfig original = parse_model_config(object, "llama_tiny.json");
  const json written = original.to_json();
  const ModelConfig reread = parse_model_config(written, "llama_tiny.json");
  EXPECT_EQ(reread.to_json(), written);
  EXPECT_EQ(written.at("num_key_value_heads"), 2);
  EXPECT_EQ(written.at("max_position_embeddings"), 256);
  EXPECT_EQ(written.at("head_dim"), 16);
  EXPECT_EQ(reread.num_parameters(), original.num_parameters());
}

// ------------------------------------------------------------------------------------------------
// Every way a model config file can be wrong: one UserError naming the file and the key.

class ConfigFileError : public ::testing::Test {
 protected:
  // Writes `object` to a file and returns the message of the UserError loading it throws.
  std::string error_loading(const json& object) { return error_loading_text(object.dump(4)); }
  std::string error_loading_text(const std::string& text) {
    const std::string path = (scratch_ / "model.json").string();
    std::ofstream(path) << text;
    path_ = path;
    return user_error_of([&] { load_model_config(path); });
  }
  // Tiny config with one key changed (or removed, for a discarded json value).
  std::string error_with(const std::string& key, const json& value) {
    json object = tiny_json();
    if (value.is_discarded())
      object.erase(key);
    else
      object[key] = value;
    return error_loading(object);
  }
  ScratchDir scratch_{"config_error"};
  std::string path_;
};

const json kRemove = json(json::value_t::discarded);

TEST_F(ConfigFileError, BaseConfigIsValid) {
  const std::string path = (scratch_ / "ok.json").string();
  std::ofstream(path) << tiny_json().dump();
  EXPECT_EQ(load_model_config(path).hidden_size, 64);
}

TEST_F(ConfigFileError, MissingFile) {
  const std::string path = (scratch_ / "absent.json").string();
  expect_mentions(user_error_of([&] { load_model_config(path); }), {path, "no such file"});
}

TEST_F(ConfigFileError, FolderInsteadOfFile) {
  const std::string path = scratch_.path().string();
  expect_mentions(user_error_of([&] { load_model_config(path); }), {path, "folder"});
}

TEST_F(ConfigFileError, MalformedJsonReportsLineAndColumn) {
  const std::string message = error_loading_text("{\n  \"hidden_size\": 64,\n  \"vocab_size\" 512\n}");
  expect_mentions(message, {path_, "invalid JSON", "line 3", "column"});
}

TEST_F(ConfigFileError, TopLevelNotAnObject) {
  expect_mentions(error_loading(json::array({1, 2})), {path_, "expected a JSON object"});
}

TEST_F(ConfigFileError, DuplicatedKeyIsNamedWithItsLines) {
  // nlohmann keeps the last of two equal keys without a word: a hand-edited config could silently
  // train the second hidden_size.
  std::string text = tiny_json().dump(4);
  text.insert(text.find('{') + 1, "\n    \"vocab_size\": 1024,");
  expect_mentions(error_loading_text(text),
                  {path_, "vocab_size: given twice (lines 2 and ", "delete the one you did not mean"});
  json object = tiny_json();
  object["rope_scaling"] = json::object();
  std::string nested = object.dump();
  nested.replace(nested.find("\"rope_scaling\":{}"), 17, "\"rope_scaling\":{\"type\":\"a\",\"type\":\"b\"}");
  expect_mentions(error_loading_text(nested), {path_, "rope_scaling.type: given twice"});
  // The same key in two different objects is no duplicate (and the error is the real one).
  object["rope_scaling"] = json{{"hidden_size", 1}};
  const std::string message = error_loading(object);
  expect_mentions(message, {path_, "rope_scaling", "null"});
  EXPECT_EQ(message.find("twice"), std::string::npos) << message;
}

TEST_F(ConfigFileError, NotARegularFile) {
  expect_mentions(user_error_of([&] { load_model_config("/dev/null"); }),
                  {"/dev/null", "not a regular file (a device)", "--config"});
  // A FIFO would block start-up forever waiting for a writer.
  const std::string fifo = (scratch_ / "config.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_mentions(user_error_of([&] { load_model_config(fifo); }), {fifo, "not a regular file (a FIFO)"});
  expect_mentions(error_loading_text(""), {path_, "is empty", "--config"});
  expect_mentions(error_loading_text(" \n\t\n"), {path_, "is empty"});
}

TEST_F(ConfigFileError, UnknownKey) {
  expect_mentions(error_with("num_layers", 2), {path_, "num_layers", "unknown key"});
}

TEST_F(ConfigFileError, MissingRequiredKeys) {
  for (const char* key :
       {"hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
        "vocab_size"})
    expect_mentions(error_with(key, kRemove), {path_, std::string(key) + ": missing"});
}

TEST_F(ConfigFileError, WrongTypesForIntegers) {
  expect_mentions(error_with("hidden_size", "64"),
                  {path_, "hidden_size", "positive integer", "got string \"64\""});
  expect_mentions(error_with("vocab_size", 512.5), {path_, "vocab_size", "got float 512.5"});
  expect_mentions(error_with("vocab_size", 512.0), {path_, "vocab_size", "got float"});
  expect_mentions(error_with("num_hidden_layers", true),
                  {path_, "num_hidden_layers", "got boolean true"});
  expect_mentions(error_with("intermediate_size", nullptr), {path_, "intermediate_size", "got null"});
  expect_mentions(error_with("bos_token_id", "0"), {path_, "bos_token_id", "got string"});
}

TEST_F(ConfigFileError, WrongTypesForOtherKeys) {
  expect_mentions(error_with("tie_word_embeddings", 1),
                  {path_, "tie_word_embeddings", "true or false", "got integer 1"});
  expect_mentions(error_with("use_cache", "yes"), {path_, "use_cache", "got string"});
  expect_mentions(error_with("rms_norm_eps", "1e-6"), {path_, "rms_norm_eps", "number"});
  expect_mentions(error_with("rope_theta", false), {path_, "rope_theta", "got boolean"});
  expect_mentions(error_with("transformers_version", 4.28), {path_, "transformers_version"});
  expect_mentions(error_with("architectures", "LlamaForCausalLM"), {path_, "architectures"});
}

TEST_F(ConfigFileError, NonPositiveSizes) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_attention_heads",
                          "num_hidden_layers", "vocab_size", "max_position_embeddings",
                          "num_key_value_heads"}) {
    expect_mentions(error_with(key, 0), {path_, key, "positive integer", "got integer 0"});
    expect_mentions(error_with(key, -4), {path_, key, "got integer -4"});
  }
  expect_mentions(error_with("rms_norm_eps", 0.0), {path_, "rms_norm_eps", "positive"});
  expect_mentions(error_with("initializer_range", -0.02), {path_, "initializer_range"});
}

TEST_F(ConfigFileError, HiddenNotDivisibleByHeads) {
  expect_mentions(error_with("hidden_size", 66),
                  {path_, "hidden_size", "multiple of num_attention_heads = 4", "got 66"});
}

TEST_F(ConfigFileError, HeadsNotDivisibleByKeyValueHeads) {
  expect_mentions(error_with("num_key_value_heads", 3),
                  {path_, "num_key_value_heads", "divisor of num_attention_heads = 4", "got 3"});
}

TEST_F(ConfigFileError, OddHeadDim) {
  expect_mentions(error_with("hidden_size", 36),  // 36 / 4 heads = 9
                  {path_, "num_attention_heads", "even", "36 / 4 = 9"});
}

TEST_F(ConfigFileError, UnsupportedModelVariants) {
  expect_mentions(error_with("model_type", "mistral"), {path_, "model_type", "\"llama\"", "mistral"});
  expect_mentions(error_with("hidden_act", "gelu"), {path_, "hidden_act", "\"silu\"", "gelu"});
  expect_mentions(error_with("architectures", json::array({"GPT2LMHeadModel"})),
                  {path_, "architectures", "LlamaForCausalLM", "GPT2LMHeadModel"});
  expect_mentions(error_with("attention_bias", true), {path_, "attention_bias", "false"});
  expect_mentions(error_with("mlp_bias", true), {path_, "mlp_bias", "false"});
  expect_mentions(error_with("attention_dropout", 0.1), {path_, "attention_dropout", "0.1"});
  expect_mentions(error_with("rope_scaling", json{{"type", "linear"}, {"factor", 2.0}}),
                  {path_, "rope_scaling", "null"});
  expect_mentions(error_with("head_dim", 32), {path_, "head_dim", "= 16", "got integer 32"});
  expect_mentions(error_with("pretraining_tp", 2), {path_, "pretraining_tp", "got integer 2"});
  expect_mentions(error_with("torch_dtype", "int8"), {path_, "torch_dtype", "int8"});
  expect_mentions(error_with("dtype", "int8"), {path_, "dtype", "int8"});
  expect_mentions(error_with("rope_parameters", json{{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e4}}),
                  {path_, "rope_parameters", "we do not run RoPE scaling yarn"});
  expect_mentions(error_with("rope_parameters", json{{"rope_type", "default"}, {"rope_theta", -1}}),
                  {path_, "rope_parameters", "a rope_theta above 0"});
  expect_mentions(error_with("rope_parameters", json{{"rope_type", "default"}, {"factor", 2.0}}),
                  {path_, "rope_parameters", "key \"factor\": not a key of default RoPE"});
  json both = tiny_json();
  both.update(json{{"rope_theta", 10000.0}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}});
  expect_mentions(error_loading(both), {path_, "rope_parameters", "differs from the top-level rope_theta"});
}

TEST_F(ConfigFileError, TokenIdOutsideVocabulary) {
  expect_mentions(error_with("eos_token_id", 512), {path_, "eos_token_id", "vocab_size = 512"});
  expect_mentions(error_with("pad_token_id", -2), {path_, "pad_token_id", "got integer -2"});
}

TEST_F(ConfigFileError, ContextLengthKeysDisagree) {
  json object = tiny_json();
  object["max_sequence_length"] = 1024;
  expect_mentions(error_loading(object),
                  {path_, "max_position_embeddings", "max_sequence_length = 1024", "got 256"});
}

// max_position_embeddings 1 made --max_length 2 say "at most 1" and --max_length 1 say "at least 2":
// the config itself is refused, naming its file and the key that gave the 1.
TEST_F(ConfigFileError, ContextOfOnePositionCannotTrain) {
  expect_mentions(error_with("max_position_embeddings", 1),
                  {path_ + ": max_position_embeddings: expected at least 2 (got 1)", "cannot train on anything",
                   "--max_length >= 2"});
  json object = tiny_json();
  object.erase("max_position_embeddings");
  object["max_sequence_length"] = 1;
  expect_mentions(error_loading(object), {path_ + ": max_sequence_length: expected at least 2 (got 1)"});
  object["max_sequence_length"] = 2;  // the least a model can train with
  EXPECT_EQ(parse_model_config(object, "two.json").max_position_embeddings, 2);
}

TEST(ConfigFileCommand, ContextOfOnePositionIsExitTwoNamingTheConfig) {
  ScratchDir scratch("one_position");
  json object = tiny_json();
  object["max_position_embeddings"] = 1;
  const std::string path = (scratch / "one_position.json").string();
  std::ofstream(path) << object.dump(4);
  for (const char* length : {"1", "2"}) {
    const auto result = testing::run_command(testing::trainer_binary().string() + " --config " + path +
                                             " --max_length " + length + " --print_config");
    EXPECT_EQ(result.exit_code, 2) << result.output;
    expect_mentions(result.output, {path + ": max_position_embeddings: expected at least 2 (got 1)"});
  }
}

// A rope_theta that is 0 in fp32 made every loss NaN at step 1 with finite weights, and the run was
// told to lower --lr: the config is refused, naming the key (issue 25).
TEST(ConfigFileCommand, RopeThetaWhoseRotaryTableIsNotFiniteIsExitTwoNamingTheKey) {
  ScratchDir scratch("rope_theta");
  json object = tiny_json();
  object["rope_theta"] = 1e-300;
  const std::string path = (scratch / "rope.json").string();
  std::ofstream(path) << object.dump(4);
  const auto result = testing::run_command(testing::trainer_binary().string() + " --config " + path +
                                           " --max_length 8 --print_config");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  expect_mentions(result.output, {path + ": rope_theta: the rotary embedding's frequencies", "not finite in fp32",
                                  "use a rope_theta of at least 1"});
  object["rope_theta"] = 0.5;  // odd, but finite: accepted
  std::ofstream(path) << object.dump(4);
  EXPECT_EQ(testing::run_command(testing::trainer_binary().string() + " --config " + path +
                                 " --max_length 8 --print_config").exit_code, 0);
}

TEST_F(ConfigFileError, ParameterCountPastTwoToThe53IsRefused) {
  // Each size fits int32, but hidden * hidden * layers would pass int64 in the parameter count.
  json object = tiny_json();
  object["hidden_size"] = 1 << 30;
  object["intermediate_size"] = 2147483647;
  object["num_hidden_layers"] = 2147483647;
  expect_mentions(error_loading(object), {path_ + ": hidden_size: ", "parameters (from hidden_size, intermediate_size, "
                                          "num_hidden_layers, vocab_size)", "2^53 = 9007199254740992"});
  EXPECT_EQ(load_model_config(config_path("llama_13b")).name, "llama_13b");  // the largest shipped config
}

TEST_F(ConfigFileError, HugeIntegerDoesNotWrap) {
  expect_mentions(error_with("vocab_size", std::numeric_limits<uint64_t>::max()),
                  {path_, "vocab_size", "18446744073709551615"});
}

// ------------------------------------------------------------------------------------------------
// Run config validation

Command parse(std::vector<std::string> args);  // `trainer ARGS...` (defined with the command-line tests)

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
      {"--eval_batches", [](RunConfig& r) { r.data.eval_batches = 0; }, "got 0"},
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

TEST(ConfigFileCommand, SmallVocabularyWithSyntheticDataIsExitTwoNamingTheKey) {
  ScratchDir scratch("small_vocab_command");
  json object = tiny_json();
  object["vocab_size"] = 2;
  const std::string path = (scratch / "two_tokens.json").string();
  std::ofstream(path) << object.dump(4);
  const auto result = testing::run_command(testing::trainer_binary().string() + " --config " + path +
                                           " --print_config");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  expect_mentions(result.output, {path + ": vocab_size: ", "at least 4 tokens", "(got 2)", "--data FILE"});
  EXPECT_EQ(result.output.find("branching"), std::string::npos) << result.output;
}

TEST_F(ConfigRunValidation, DataFileThatExistsIsAccepted) {
  ScratchDir scratch("data_file");
  const std::string file = (scratch / "tokens.bin").string();
  std::ofstream(file) << "x";
  RunConfig run = valid();
  run.data.source = file;
  EXPECT_NO_THROW(validate_run_config(run, model_, 1));
}

// ------------------------------------------------------------------------------------------------
// Command line

Command parse(std::vector<std::string> args) {
  args.insert(args.begin(), "trainer");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

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
}  // namespace llm
