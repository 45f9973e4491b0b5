// Model config files: the shipped GaLore family and test configs load with the table's sizes and
// parameter counts, the optional Hugging Face keys parse and round-trip through JSON, and every way a
// config file can be wrong is one UserError naming the file and the key, in process and as exit
// status 2 of the trainer binary. Run settings are checked in run_config_test.cpp, the command line
// in cli_test.cpp.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "tests/config_test_util.h"
#include "tests/test_util.h"

namespace llm::model_config_test {
namespace {

using nlohmann::json;
using testing::config_path;
using testing::expect_mentions;
using testing::ScratchDir;
using testing::user_error_of;

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
                  {"/dev/null", "is a character device, not a regular file", "--config"});
  // A FIFO would block start-up forever waiting for a writer.
  const std::string fifo = (scratch_ / "config.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_mentions(user_error_of([&] { load_model_config(fifo); }), {fifo, "is a fifo, not a regular file"});
  // A link to nothing, and a loop of links, said as what they are (not "no such file").
  const std::string dangling = (scratch_ / "dangling.json").string(), loop = (scratch_ / "loop.json").string();
  std::filesystem::create_symlink(scratch_ / "gone.json", dangling);
  std::filesystem::create_symlink(loop, loop);
  expect_mentions(user_error_of([&] { load_model_config(dangling); }), {dangling, "is a symbolic link to nothing ("});
  expect_mentions(user_error_of([&] { load_model_config(loop); }), {loop, "is a loop of symbolic links"});
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

// 1e999 in a config: a number no double holds. The file, the key and the line, not the JSON
// library's out_of_range text (issue 44).
TEST(ConfigFileCommand, ANumberBeyondADoubleNamesTheKeyAndTheLine) {
  ScratchDir scratch("overflow");
  std::string text = tiny_json().dump(4);
  const size_t at = text.find("\"rms_norm_eps\": ");
  ASSERT_NE(at, std::string::npos);
  const size_t end = text.find_first_of(",\n", at + 16);
  text = text.substr(0, at) + "\"rms_norm_eps\": 1e999" + text.substr(end);
  const std::string path = (scratch / "overflow.json").string();
  std::ofstream(path) << text;
  const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
  const auto result = testing::run_command(testing::trainer_binary().string() + " --config " + path +
                                           " --max_length 8 --print_config");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  expect_mentions(result.output, {path + ": rms_norm_eps: the number 1e999 (line " + std::to_string(line) + ")",
                                  "beyond what a double holds"});
  EXPECT_EQ(result.output.find("json.exception"), std::string::npos) << result.output;
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

TEST_F(ConfigFileError, ParameterCountPastTwoToThe53IsRefused) {
  // Each size fits int32, but hidden * hidden * layers would pass int64 in the parameter count.
  json object = tiny_json();
  object["hidden_size"] = 1 << 30;
  object["intermediate_size"] = 2147483647;
  object["num_hidden_layers"] = 2147483647;
  expect_mentions(error_loading(object), {path_ + ": hidden_size: ", "parameters (from hidden_size, intermediate_size, "
                                          "num_hidden_layers, vocab_size)", "2^53 = 9007199254740992"});
  EXPECT_EQ(load_model_config(config_path("llama_30b")).name, "llama_30b");  // the largest shipped config
}

TEST_F(ConfigFileError, HugeIntegerDoesNotWrap) {
  expect_mentions(error_with("vocab_size", std::numeric_limits<uint64_t>::max()),
                  {path_, "vocab_size", "18446744073709551615"});
}

}  // namespace
}  // namespace llm::model_config_test
