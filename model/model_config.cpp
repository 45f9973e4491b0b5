#include "model/model_config.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/json_file.h"

namespace llm {
namespace {

using nlohmann::json;

// Every key a model config may hold. Anything else is rejected so that a misspelt key ("num_layers")
// is reported instead of silently leaving a default in place.
constexpr std::string_view kKnownModelKeys[] = {
    // The GaLore family (configs/llama_*.json).
    "architectures", "model_type", "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range", "rms_norm_eps", "transformers_version", "use_cache", "hidden_size",
    "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
    "max_sequence_length",
    // Optional HF LlamaConfig keys.
    "max_position_embeddings", "rope_theta", "num_key_value_heads", "tie_word_embeddings",
    "torch_dtype", "attention_bias", "mlp_bias", "attention_dropout", "rope_scaling", "head_dim",
    "pretraining_tp",
    // Keys of today's transformers (5.x: what `trainer export` writes).
    "dtype", "rope_parameters"};

// Sizes go into tensor shapes and into products like vocab * hidden; int32 range keeps both sane.
constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();
// The most parameters a model may have: a count (and its bytes, in GiB as doubles) kept exact.
constexpr int64_t kMaxParameters = int64_t{1} << 53;

std::string known_keys_list() {
  std::string list;
  for (std::string_view key : kKnownModelKeys) {
    if (!list.empty()) list += ", ";
    list += key;
  }
  return list;
}


// Reads typed fields of one JSON object, failing with "SOURCE: KEY: expected ... (got ...)".
class ModelConfigReader {
 public:
  ModelConfigReader(const json& object, const std::string& source)
      : object_(object), source_(source) {}

  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    fail_user(source_, key, message);
  }
  [[noreturn]] void fail_expected(const std::string& key, const std::string& expected,
                                  const json& got) const {
    fail(key, "expected " + expected + " (got " + describe_json_value(got) + ")");
  }

  // The value, or nullptr when the key is absent or null (HF writes null for "use the default").
  const json* optional(const char* key) const {
    auto found = object_.find(key);
    if (found == object_.end() || found->is_null()) return nullptr;
    return &*found;
  }
  bool present(const char* key) const { return object_.contains(key); }

  int64_t integer(const char* key, const json& value, const std::string& expected) const {
    if (!value.is_number_integer()) fail_expected(key, expected, value);
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_expected(key, expected, value);
    return value.get<int64_t>();
  }

  int64_t required_size(const char* key) const {
    const std::string expected = "a positive integer up to 2^31-1";
    auto found = object_.find(key);
    if (found == object_.end())
      fail(key, "missing: " + expected + " is required (see configs/llama_60m.json)");
    const int64_t size = integer(key, *found, expected);
    if (size <= 0 || size > kMaxSize) fail_expected(key, expected, *found);
    return size;
  }

  std::optional<int64_t> optional_size(const char* key) const {
    const json* value = optional(key);
    if (value == nullptr) return std::nullopt;
    const int64_t size = integer(key, *value, "a positive integer up to 2^31-1");
    if (size <= 0 || size > kMaxSize) fail_expected(key, "a positive integer up to 2^31-1", *value);
    return size;
  }

  // Token ids: an id in [-1, vocab_size), -1 or null meaning "none".
  int64_t token_id(const char* key, int64_t fallback, int64_t vocab_size) const {
    const std::string expected =
        "an integer token id in [-1, vocab_size = " + std::to_string(vocab_size) + ") or null";
    if (!present(key)) return fallback;
    const json& value = object_.at(key);
    if (value.is_null()) return -1;
    const int64_t id = integer(key, value, expected);
    if (id < -1 || id >= vocab_size) fail_expected(key, expected, value);
    return id;
  }

  double positive_number(const char* key, double fallback) const {
    const json* value = optional(key);
    if (value == nullptr) return fallback;
    const std::string expected = "a positive finite number";
    if (!value->is_number()) fail_expected(key, expected, *value);
    const double number = value->get<double>();
    if (!(number > 0.0) || !std::isfinite(number)) fail_expected(key, expected, *value);
    return number;
  }

  bool boolean(const char* key, bool fallback) const {
    const json* value = optional(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) fail_expected(key, "true or false", *value);
    return value->get<bool>();
  }

  // A key that is accepted only with the one value this trainer builds.
  void require_bool(const char* key, bool only, const char* why) const {
    const json* value = optional(key);
    if (value == nullptr) return;
    if (!value->is_boolean()) fail_expected(key, "a boolean", *value);
    if (value->get<bool>() != only)
      fail_expected(key, std::string(only ? "true" : "false") + ": " + why, *value);
  }
  void require_number(const char* key, double only, const char* why) const {
    const json* value = optional(key);
    if (value == nullptr) return;
    if (!value->is_number()) fail_expected(key, "a number", *value);
    if (value->get<double>() != only)
      fail_expected(key, format_number(only) + ": " + why, *value);
  }
  void require_string(const char* key, const char* only, const char* why) const {
    const json* value = optional(key);
    if (value == nullptr) return;
    if (!value->is_string() || value->get<std::string>() != only)
      fail_expected(key, std::string("\"") + only + "\": " + why, *value);
  }
  void require_string_type(const char* key) const {
    const json* value = optional(key);
    if (value != nullptr && !value->is_string()) fail_expected(key, "a string", *value);
  }

 private:
  const json& object_;
  const std::string& source_;
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

}  // namespace

// "integer 3", "float 1.5", "string \"abc\"", "boolean true", "null", "array [...]".
std::string describe_json_value(const json& value) {
  const std::string text = json_excerpt(value, 60);
  if (value.is_number_integer()) return "integer " + text;
  if (value.is_number_float()) return "float " + text;
  if (value.is_null()) return "null";
  return std::string(value.type_name()) + " " + text;
}

std::string format_number(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

namespace {

// A key that no LlamaConfig has: a misspelling, or a model this trainer does not build.
void refuse_unknown_keys(const json& object, const std::string& source) {
  for (const auto& item : object.items()) {
    bool known = false;
    for (std::string_view key : kKnownModelKeys) known = known || key == item.key();
    if (!known)
      fail_user(source, item.key(),
                "unknown key: remove it or fix its spelling (accepted keys: " + known_keys_list() +
                    ")");
  }
}

// A LLaMA and nothing else: the architecture, model type and activation; keys read for their type only.
void check_llama_identity(const ModelConfigReader& reader) {
  if (const json* architectures = reader.optional("architectures")) {
    const char* expected = "[\"LlamaForCausalLM\"] (any capitalisation, e.g. GaLore's LLaMAForCausalLM)";
    if (!architectures->is_array() || architectures->size() != 1 ||
        !(*architectures)[0].is_string() ||
        !iequals((*architectures)[0].get<std::string>(), "LlamaForCausalLM"))
      reader.fail_expected("architectures", expected, *architectures);
  }
  reader.require_string("model_type", "llama", "this trainer builds LLaMA models only");
  reader.require_string("hidden_act", "silu", "the LLaMA MLP is SwiGLU");
  reader.require_string_type("transformers_version");
  reader.boolean("use_cache", true);  // inference-only switch: checked for type, then ignored
  for (const char* key : {"torch_dtype", "dtype"})  // transformers 4 and 5 spell it so
    if (const json* dtype = reader.optional(key)) {
      if (!dtype->is_string() || (dtype->get<std::string>() != "float32" &&
                                  dtype->get<std::string>() != "float16" &&
                                  dtype->get<std::string>() != "bfloat16"))
        reader.fail_expected(key, "\"float32\", \"float16\" or \"bfloat16\" (ignored: --dtype decides)", *dtype);
    }
}

void read_rope_parameters(const ModelConfigReader& reader, ModelConfig& config) {
  // transformers 5: {"rope_type": "default", "rope_theta": ...}; any other rope_type rescales the
  // positions, which this trainer does not run.
  if (const json* rope = reader.optional("rope_parameters"); rope != nullptr && !rope->is_null()) {
    if (!rope->is_object())
      reader.fail_expected("rope_parameters", "an object such as {\"rope_type\": \"default\", \"rope_theta\": 10000.0}",
                           *rope);
    const std::string type = rope->contains("rope_type") && rope->at("rope_type").is_string()
                                 ? rope->at("rope_type").get<std::string>()
                                 : "default";
    if (type != "default")
      reader.fail("rope_parameters", "rope_type \"" + type + "\": we do not run RoPE scaling " + type +
                                         " (only \"default\", plain RoPE)");
    if (rope->contains("rope_theta")) {
      const json& theta = rope->at("rope_theta");
      if (!theta.is_number() || !(theta.get<double>() > 0))
        reader.fail_expected("rope_parameters", "a rope_theta above 0", theta);
      if (reader.present("rope_theta") && theta.get<double>() != config.rope_theta)
        reader.fail("rope_parameters", "rope_theta " + json_excerpt(theta) + " differs from the top-level rope_theta " +
                                           std::to_string(config.rope_theta) + ": keep one of the two");
      config.rope_theta = theta.get<double>();
    }
    for (const auto& [key, value] : rope->items())
      if (key != "rope_type" && key != "rope_theta")
        reader.fail("rope_parameters", "key \"" + key + "\": not a key of default RoPE (rope_type, rope_theta)");
  }
}

// max_position_embeddings, or GaLore's max_sequence_length: one context length.
void read_max_positions(const ModelConfigReader& reader, ModelConfig& config) {
  const std::optional<int64_t> max_position = reader.optional_size("max_position_embeddings");
  const std::optional<int64_t> max_sequence = reader.optional_size("max_sequence_length");
  if (max_position && max_sequence && *max_position != *max_sequence)
    reader.fail("max_position_embeddings",
                "expected the same value as max_sequence_length = " +
                    std::to_string(*max_sequence) + " or only one of the two keys (got " +
                    std::to_string(*max_position) + ")");
  config.max_position_embeddings = max_position ? *max_position
                                   : max_sequence ? *max_sequence
                                                  : config.max_position_embeddings;
  if (config.max_position_embeddings < 2)
    reader.fail(max_position ? "max_position_embeddings" : "max_sequence_length",
                "expected at least 2 (got " + std::to_string(config.max_position_embeddings) +
                    "): this config cannot train on anything, since a sequence needs at least one input token "
                    "and the next token as its target (--max_length >= 2); set it to the context length the "
                    "model is for, e.g. 1024");
}

// Biases, dropout, RoPE scaling and tensor-parallel emulation: features of other models, refused.
void refuse_what_llama_lacks(const ModelConfigReader& reader, const json& object) {
  reader.require_bool("attention_bias", false, "LLaMA projections have no bias");
  reader.require_bool("mlp_bias", false, "LLaMA projections have no bias");
  reader.require_number("attention_dropout", 0.0, "pre-training runs without dropout");
  if (reader.present("rope_scaling") && !object.at("rope_scaling").is_null())
    reader.fail_expected("rope_scaling", "null: RoPE scaling is not supported", object.at("rope_scaling"));
  if (const json* tp = reader.optional("pretraining_tp")) {
    if (reader.integer("pretraining_tp", *tp, "the integer 1") != 1)
      reader.fail_expected("pretraining_tp", "1: tensor-parallel emulation is not supported", *tp);
  }
}

void check_shapes(const ModelConfigReader& reader, ModelConfig& config) {
  // Shape rules: whole heads, whole groups of heads per kv head, an even head_dim for rotate-half.
  if (config.hidden_size % config.num_attention_heads != 0)
    reader.fail("hidden_size",
                "expected a multiple of num_attention_heads = " +
                    std::to_string(config.num_attention_heads) + " (got " +
                    std::to_string(config.hidden_size) + ")");
  config.num_key_value_heads =
      reader.optional_size("num_key_value_heads").value_or(config.num_attention_heads);
  if (config.num_attention_heads % config.num_key_value_heads != 0)
    reader.fail("num_key_value_heads",
                "expected a divisor of num_attention_heads = " +
                    std::to_string(config.num_attention_heads) + " (got " +
                    std::to_string(config.num_key_value_heads) + ")");
  if (config.head_dim() % 2 != 0)
    reader.fail("num_attention_heads",
                "expected hidden_size / num_attention_heads (the head dim) to be even for rotary "
                "embeddings (got " + std::to_string(config.hidden_size) + " / " +
                    std::to_string(config.num_attention_heads) + " = " +
                    std::to_string(config.head_dim()) + ")");
  // The rotary table as the model computes it (fp32: inv_freq = 1 / theta^(2i / D), angles = position x
  // inv_freq) must be finite: a rope_theta that is 0 in fp32 (1e-300) makes every loss NaN at step 1
  // with finite weights, which no flag of the run can fix.
  {
    const float theta = static_cast<float>(config.rope_theta);
    const float last = std::pow(theta, static_cast<float>(config.head_dim() - 2) / static_cast<float>(config.head_dim()));
    const float largest_angle = static_cast<float>(config.max_position_embeddings - 1) / std::min(1.0f, last);
    if (!(theta > 0) || !std::isfinite(1.0f / last) || !std::isfinite(largest_angle))
      reader.fail("rope_theta",
                  "the rotary embedding's frequencies 1 / rope_theta^(2i / head_dim) are not finite in fp32 with "
                  "rope_theta = " + format_number(config.rope_theta) +
                      " (every loss would be NaN from the first step): use a rope_theta of at least 1, as every "
                      "LLaMA does (10000, or 500000 for Llama 3)");
  }
  // Each size fits int32, but their products (hidden * intermediate * layers, vocab * hidden) can pass
  // int64: the parameter count is bounded so that it, and the bytes of the memory plan, stay exact.
  const __int128 h = config.hidden_size, kv_width = static_cast<__int128>(config.num_key_value_heads) * config.head_dim();
  const __int128 parameters = 2 * config.vocab_size * h + h +
                              config.num_hidden_layers * (2 * h * h + 2 * h * kv_width + 3 * h * config.intermediate_size + 2 * h);
  if (parameters > kMaxParameters)
    reader.fail("hidden_size",
                "the model has about " + format_number(static_cast<double>(parameters)) +
                    " parameters (from hidden_size, intermediate_size, num_hidden_layers, vocab_size), more than "
                    "the 2^53 = " + std::to_string(kMaxParameters) +
                    " this trainer counts exactly: lower the sizes");
  if (const json* head_dim = reader.optional("head_dim")) {
    const std::string expected = "hidden_size / num_attention_heads = " +
                                 std::to_string(config.head_dim());
    if (reader.integer("head_dim", *head_dim, expected) != config.head_dim())
      reader.fail_expected("head_dim", expected, *head_dim);
  }
}

}  // namespace

ModelConfig parse_model_config(const json& object, const std::string& source) {
  if (!object.is_object())
    fail_user(source, "(top level)",
              "expected a JSON object of HF LlamaConfig keys (got " + describe_json_value(object) + ")");
  refuse_unknown_keys(object, source);

  const ModelConfigReader reader(object, source);
  ModelConfig config;
  config.name = std::filesystem::path(source).stem().string();

  config.hidden_size = reader.required_size("hidden_size");
  config.intermediate_size = reader.required_size("intermediate_size");
  config.num_attention_heads = reader.required_size("num_attention_heads");
  config.num_hidden_layers = reader.required_size("num_hidden_layers");
  config.vocab_size = reader.required_size("vocab_size");

  check_llama_identity(reader);
  config.bos_token_id = reader.token_id("bos_token_id", config.bos_token_id, config.vocab_size);
  config.eos_token_id = reader.token_id("eos_token_id", config.eos_token_id, config.vocab_size);
  config.pad_token_id = reader.token_id("pad_token_id", config.pad_token_id, config.vocab_size);
  config.initializer_range = reader.positive_number("initializer_range", config.initializer_range);
  config.rms_norm_eps = reader.positive_number("rms_norm_eps", config.rms_norm_eps);
  config.rope_theta = reader.positive_number("rope_theta", config.rope_theta);
  read_rope_parameters(reader, config);
  config.tie_word_embeddings = reader.boolean("tie_word_embeddings", config.tie_word_embeddings);

  read_max_positions(reader, config);
  refuse_what_llama_lacks(reader, object);
  check_shapes(reader, config);
  return config;
}

ModelConfig load_model_config(const std::string& path) {
  return parse_model_config(
      read_json_file(path, "pass --config with an HF LlamaConfig JSON file, e.g. configs/llama_60m.json"), path);
}

ModelConfig with_matmul_padding(ModelConfig model, const std::string& choice, bool cuda) {
  const auto padded = [&](int64_t size) -> int64_t {
    const bool pad = choice == "on" ? size % kMatmulPadMultiple != 0 : choice == "auto" && cuda && size % 8 != 0;
    return pad ? (size + kMatmulPadMultiple - 1) / kMatmulPadMultiple * kMatmulPadMultiple : 0;
  };
  model.compute_intermediate_size = padded(model.intermediate_size);
  model.compute_vocab_size = padded(model.vocab_size);
  return model;
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size;
  const int64_t kv_width = num_key_value_heads * head_dim();
  const int64_t attention = 2 * h * h + 2 * h * kv_width;  // q, o: h x h; k, v: kv_width x h
  const int64_t mlp = 3 * h * intermediate_size;           // gate, up, down
  const int64_t norms = 2 * h;                             // input and post-attention RMSNorm
  const int64_t embedding = vocab_size * h;
  const int64_t head = tie_word_embeddings ? 0 : vocab_size * h;
  return embedding + head + num_hidden_layers * (attention + mlp + norms) + h;
}

json ModelConfig::to_json() const {
  return json{
      {"architectures", json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"num_hidden_layers", num_hidden_layers},
      {"head_dim", head_dim()},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"initializer_range", initializer_range},
      {"tie_word_embeddings", tie_word_embeddings},
      {"pad_token_id", pad_token_id},
      {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_id},
  };
}

}  // namespace llm
