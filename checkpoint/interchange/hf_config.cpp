#include "checkpoint/interchange/hf_config.h"

#include <optional>

#include "common/errors.h"
#include "common/json_file.h"

#ifndef TRAINER_TRANSFORMERS_VERSION
#define TRAINER_TRANSFORMERS_VERSION "5.23.0"
#endif

namespace llm {
namespace {

using nlohmann::json;

// Reads the folder's keys with LlamaConfig's defaults for those it leaves out, and refuses by name.
class FolderConfig {
 public:
  FolderConfig(const json& config, const ModelConfig& model, const std::string& source)
      : config_(config), model_(model), source_(source) {}

  [[noreturn]] void refuse(const std::string& key, const std::string& there, const std::string& here,
                           const std::string& why) const {
    fail_user(source_, key,
              there + " there, " + here + " in --config " + model_.name + ": " + why +
                  ". Pass the --config that describes this folder's model, or another --init_from");
  }
  // The key's value, or nullopt when it is absent or null (transformers' "use the default").
  std::optional<json> value(const char* key) const {
    auto found = config_.find(key);
    if (found == config_.end() || found->is_null()) return std::nullopt;
    return *found;
  }
  // A size or id key against ours, LlamaConfig's default when absent.
  void same_integer(const char* key, int64_t ours, std::optional<int64_t> hf_default,
                    const char* why = "the weights are of another model shape") const {
    const std::optional<json> given = value(key);
    if (!given && !hf_default) refuse(key, "missing", std::to_string(ours), "the folder does not say its size");
    if (given && !given->is_number_integer()) refuse(key, json_excerpt(*given), std::to_string(ours), "expected an integer");
    const int64_t theirs = given ? given->get<int64_t>() : *hf_default;
    if (theirs != ours)
      refuse(key, std::to_string(theirs) + (given ? "" : " (LlamaConfig's default)"), std::to_string(ours),
             why);
  }
  void same_number(const std::string& key, const std::optional<json>& given, double ours, double hf_default,
                   const char* why) const {
    if (given && !given->is_number()) refuse(key, json_excerpt(*given), format_number(ours), "expected a number");
    const double theirs = given ? given->get<double>() : hf_default;
    if (theirs != ours)
      refuse(key, format_number(theirs) + (given ? "" : " (LlamaConfig's default)"), format_number(ours), why);
  }
  void same_boolean(const char* key, bool ours, bool hf_default, const char* why) const {
    const std::optional<json> given = value(key);
    if (given && !given->is_boolean()) refuse(key, json_excerpt(*given), ours ? "true" : "false", "expected true or false");
    const bool theirs = given ? given->get<bool>() : hf_default;
    if (theirs != ours) refuse(key, theirs ? "true" : "false", ours ? "true" : "false", why);
  }
  void same_string(const char* key, const std::string& ours, const char* why) const {
    const std::optional<json> given = value(key);
    if (given && (!given->is_string() || given->get<std::string>() != ours))
      refuse(key, json_excerpt(*given), "\"" + ours + "\"", why);
  }

  // A RoPE scaling in rope_scaling (transformers 4) or rope_parameters (5): refused by its type. Returns
  // rope_parameters' rope_theta when it has one.
  std::optional<json> check_rope() const {
    std::optional<json> theta;
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
      const std::optional<json> rope = value(key);
      if (!rope) continue;
      if (!rope->is_object()) refuse(key, json_excerpt(*rope), "no RoPE scaling", "expected an object");
      std::string type = "default";
      for (const char* type_key : {"rope_type", "type"})
        if (rope->contains(type_key) && rope->at(type_key).is_string()) type = rope->at(type_key).get<std::string>();
      if (!rope->contains("rope_type") && !rope->contains("type") && std::string(key) == "rope_parameters" &&
          !rope->empty() && !rope->contains("rope_theta"))
        refuse(key, json_excerpt(*rope), "one RoPE for every layer",
               "per-layer-type RoPE parameters are not run here");
      if (type != "default" && type != "none")
        fail_user(source_, std::string(key) + ".rope_type",
                  "we do not run RoPE scaling " + type + " (only the unscaled rotary embedding, rope_type "
                  "\"default\"): this model cannot be trained here");
      if (rope->contains("rope_theta")) theta = rope->at("rope_theta");
    }
    return theta;
  }

 private:
  const json& config_;
  const ModelConfig& model_;
  const std::string& source_;
};

}  // namespace

const char* exported_transformers_version() { return TRAINER_TRANSFORMERS_VERSION; }

int64_t padding_row(const ModelConfig& model) {
  return model.pad_token_id < 0 ? model.vocab_size + model.pad_token_id : model.pad_token_id;
}

json hf_config_json(const ModelConfig& model, const std::string& dtype_name) {
  json config = {
      {"architectures", json::array({"LlamaForCausalLM"})},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"dtype", dtype_name},
      {"head_dim", model.head_dim()},
      {"hidden_act", "silu"},
      {"hidden_size", model.hidden_size},
      {"initializer_range", model.initializer_range},
      {"intermediate_size", model.intermediate_size},
      {"max_position_embeddings", model.max_position_embeddings},
      {"mlp_bias", false},
      {"model_type", "llama"},
      {"num_attention_heads", model.num_attention_heads},
      {"num_hidden_layers", model.num_hidden_layers},
      {"num_key_value_heads", model.num_key_value_heads},
      {"pad_token_id", padding_row(model)},
      {"pretraining_tp", 1},
      {"rms_norm_eps", model.rms_norm_eps},
      {"rope_parameters", {{"rope_theta", model.rope_theta}, {"rope_type", "default"}}},
      {"tie_word_embeddings", model.tie_word_embeddings},
      {"transformers_version", exported_transformers_version()},
      {"use_cache", true},
      {"vocab_size", model.vocab_size},
  };
  if (model.bos_token_id >= 0) config["bos_token_id"] = model.bos_token_id;
  if (model.eos_token_id >= 0) config["eos_token_id"] = model.eos_token_id;
  return config;
}

json hf_generation_config_json(const ModelConfig& model) {
  json config = {{"_from_model_config", true},
                 {"pad_token_id", padding_row(model)},
                 {"transformers_version", exported_transformers_version()},
                 {"use_cache", true}};
  if (model.bos_token_id >= 0) config["bos_token_id"] = model.bos_token_id;
  if (model.eos_token_id >= 0) config["eos_token_id"] = model.eos_token_id;
  return config;
}

void check_hf_config(const json& config, const ModelConfig& model, const std::string& source) {
  LLM_REQUIRE(config.is_object(), source, "(top level)", "expected a JSON object (a transformers config.json)");
  const FolderConfig folder(config, model, source);
  folder.same_string("model_type", "llama", "this trainer builds LLaMA models only");
  folder.same_integer("vocab_size", model.vocab_size, 32000);
  folder.same_integer("hidden_size", model.hidden_size, 4096);
  folder.same_integer("intermediate_size", model.intermediate_size, 11008);
  folder.same_integer("num_hidden_layers", model.num_hidden_layers, 32);
  folder.same_integer("num_attention_heads", model.num_attention_heads, 32);
  const std::optional<json> heads = folder.value("num_attention_heads");
  folder.same_integer("num_key_value_heads", model.num_key_value_heads,
                      heads && heads->is_number_integer() ? heads->get<int64_t>() : 32);
  folder.same_integer("head_dim", model.head_dim(), model.head_dim());
  folder.same_string("hidden_act", "silu", "the LLaMA MLP here is SwiGLU (silu)");
  folder.same_number("rms_norm_eps", folder.value("rms_norm_eps"), model.rms_norm_eps, 1e-6,
                     "RMSNorm's epsilon changes every layer's output");
  const std::optional<json> rope_theta = folder.check_rope();
  folder.same_number(rope_theta ? "rope_parameters.rope_theta" : "rope_theta",
                     rope_theta ? rope_theta : folder.value("rope_theta"), model.rope_theta, 10000.0,
                     "the rotary base changes attention");
  folder.same_boolean("tie_word_embeddings", model.tie_word_embeddings, false,
                      "tied input and output embeddings are one tensor, untied two");
  folder.same_boolean("attention_bias", false, false, "LLaMA projections here have no bias");
  folder.same_boolean("mlp_bias", false, false, "LLaMA projections here have no bias");
  folder.same_number("attention_dropout", folder.value("attention_dropout"), 0.0, 0.0,
                     "pre-training here runs without dropout");
  folder.same_integer("pretraining_tp", 1, 1, "tensor-parallel emulation is not run here");
  if (folder.value("quantization_config"))
    fail_user(source, "quantization_config",
              "the folder holds quantized weights; training needs them unquantized: save the model without "
              "quantization");
}

}  // namespace llm
