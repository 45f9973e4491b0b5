#include "trainer/config.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/errors.h"

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
    "pretraining_tp"};

// Sizes go into tensor shapes and into products like vocab * hidden; int32 range keeps both sane.
constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();

// "integer 3", "float 1.5", "string \"abc\"", "boolean true", "null", "array [...]".
std::string describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  if (value.is_number_integer()) return "integer " + text;
  if (value.is_number_float()) return "float " + text;
  if (value.is_null()) return "null";
  return std::string(value.type_name()) + " " + text;
}

std::string known_keys_list() {
  std::string list;
  for (std::string_view key : kKnownModelKeys) {
    if (!list.empty()) list += ", ";
    list += key;
  }
  return list;
}

std::string format_number(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
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
    fail(key, "expected " + expected + " (got " + describe(got) + ")");
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
    const std::string expected = "a positive integer";
    auto found = object_.find(key);
    if (found == object_.end())
      fail(key, "missing: " + expected + " is required (see configs/llama_60m.json)");
    const int64_t size = integer(key, *found, expected);
    if (size <= 0 || size > kMaxSize) fail_expected(key, expected + " up to 2^31-1", *found);
    return size;
  }

  std::optional<int64_t> optional_size(const char* key) const {
    const json* value = optional(key);
    if (value == nullptr) return std::nullopt;
    const int64_t size = integer(key, *value, "a positive integer");
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

ModelConfig parse_model_config(const json& object, const std::string& source) {
  if (!object.is_object())
    fail_user(source, "(top level)",
              "expected a JSON object of HF LlamaConfig keys (got " + describe(object) + ")");
  for (const auto& item : object.items()) {
    bool known = false;
    for (std::string_view key : kKnownModelKeys) known = known || key == item.key();
    if (!known)
      fail_user(source, item.key(),
                "unknown key: remove it or fix its spelling (accepted keys: " + known_keys_list() +
                    ")");
  }

  const ModelConfigReader reader(object, source);
  ModelConfig config;
  config.name = std::filesystem::path(source).stem().string();

  config.hidden_size = reader.required_size("hidden_size");
  config.intermediate_size = reader.required_size("intermediate_size");
  config.num_attention_heads = reader.required_size("num_attention_heads");
  config.num_hidden_layers = reader.required_size("num_hidden_layers");
  config.vocab_size = reader.required_size("vocab_size");

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
  if (const json* dtype = reader.optional("torch_dtype")) {
    if (!dtype->is_string() || (dtype->get<std::string>() != "float32" &&
                                dtype->get<std::string>() != "float16" &&
                                dtype->get<std::string>() != "bfloat16"))
      reader.fail_expected("torch_dtype", "\"float32\", \"float16\" or \"bfloat16\" (ignored: --dtype decides)",
                           *dtype);
  }

  config.bos_token_id = reader.token_id("bos_token_id", config.bos_token_id, config.vocab_size);
  config.eos_token_id = reader.token_id("eos_token_id", config.eos_token_id, config.vocab_size);
  config.pad_token_id = reader.token_id("pad_token_id", config.pad_token_id, config.vocab_size);
  config.initializer_range = reader.positive_number("initializer_range", config.initializer_range);
  config.rms_norm_eps = reader.positive_number("rms_norm_eps", config.rms_norm_eps);
  config.rope_theta = reader.positive_number("rope_theta", config.rope_theta);
  config.tie_word_embeddings = reader.boolean("tie_word_embeddings", config.tie_word_embeddings);

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

  reader.require_bool("attention_bias", false, "LLaMA projections have no bias");
  reader.require_bool("mlp_bias", false, "LLaMA projections have no bias");
  reader.require_number("attention_dropout", 0.0, "pre-training runs without dropout");
  if (reader.present("rope_scaling") && !object.at("rope_scaling").is_null())
    reader.fail_expected("rope_scaling", "null: RoPE scaling is not supported", object.at("rope_scaling"));
  if (const json* tp = reader.optional("pretraining_tp")) {
    if (reader.integer("pretraining_tp", *tp, "the integer 1") != 1)
      reader.fail_expected("pretraining_tp", "1: tensor-parallel emulation is not supported", *tp);
  }

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
  if (const json* head_dim = reader.optional("head_dim")) {
    const std::string expected = "hidden_size / num_attention_heads = " +
                                 std::to_string(config.head_dim());
    if (reader.integer("head_dim", *head_dim, expected) != config.head_dim())
      reader.fail_expected("head_dim", expected, *head_dim);
  }
  return config;
}

ModelConfig load_model_config(const std::string& path) {
  namespace fs = std::filesystem;
  const char* what_to_pass = "pass --config with an HF LlamaConfig JSON file, e.g. configs/llama_60m.json";
  std::error_code error;
  if (!fs::exists(path, error)) fail_user(path, "", std::string("no such file: ") + what_to_pass);
  if (fs::is_directory(path, error))
    fail_user(path, "", std::string("is a folder, not a JSON file: ") + what_to_pass);
  std::ifstream stream(path);
  if (!stream) fail_user(path, "", "cannot be opened for reading: check its permissions");

  json object;
  try {
    object = json::parse(stream);
  } catch (const json::parse_error& parse_error) {
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line L, column C: ...".
    std::string detail = parse_error.what();
    if (const size_t tag_end = detail.find("] "); detail.rfind("[json.exception", 0) == 0 &&
                                                  tag_end != std::string::npos)
      detail = detail.substr(tag_end + 2);
    fail_user(path, "", "invalid JSON: " + detail);
  }
  return parse_model_config(object, path);
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

const char* to_string(Scheduler value) {
  switch (value) {
    case Scheduler::cosine: return "cosine";
    case Scheduler::linear: return "linear";
    case Scheduler::constant: return "constant";
  }
  return "?";
}

const char* to_string(DType value) {
  switch (value) {
    case DType::float32: return "float32";
    case DType::bfloat16: return "bfloat16";
  }
  return "?";
}

const char* to_string(DeviceChoice value) {
  switch (value) {
    case DeviceChoice::auto_select: return "auto";
    case DeviceChoice::cpu: return "cpu";
    case DeviceChoice::cuda: return "cuda";
  }
  return "?";
}

const char* to_string(Precision value) {
  switch (value) {
    case Precision::pure: return "pure";
    case Precision::mixed: return "mixed";
  }
  return "?";
}

json RunConfig::to_json() const {
  return json{
      {"config", config_path},
      {"lr", lr},
      {"batch_size", batch_size},
      {"total_batch_size", total_batch_size},
      {"gradient_accumulation", gradient_accumulation},
      {"max_length", max_length},
      {"num_training_steps", num_training_steps},
      {"warmup_steps", warmup_steps},
      {"scheduler", to_string(scheduler)},
      {"min_lr_ratio", min_lr_ratio},
      {"weight_decay", weight_decay},
      {"grad_clipping", grad_clipping},
      {"adam_beta1", adam_beta1},
      {"adam_beta2", adam_beta2},
      {"adam_eps", adam_eps},
      {"dtype", to_string(dtype)},
      {"precision", to_string(precision)},
      {"optimizer", optimizer},
      {"subset_size", subset_size},
      {"subset_norm_params", subset_norm_params},
      {"rank", galore_rank},
      {"update_proj_gap", update_proj_gap},
      {"galore_scale", galore_scale},
      {"proj_type", proj_type},
      {"galore_stagger", galore_stagger},
      {"galore_projector", galore_projector},
      {"subspace_iterations", subspace_iterations},
      {"seed", seed},
      {"data", data},
      {"eval_fraction", eval_fraction},
      {"eval_every", eval_every},
      {"eval_batches", eval_batches},
      {"save_every", save_every},
      {"save_dir", save_dir},
      {"continue_from", continue_from},
      {"run_dir", run_dir},
      {"device", to_string(device)},
      {"sharding", llm::to_string(sharding)},
      {"prefetch", prefetch},
      {"log_every", log_every},
      {"print_config", print_config},
      {"memory_snapshot", memory_snapshot},
  };
}

RunConfig run_config_from_json(const json& object, const std::string& source) {
  RunConfig run;
  if (!object.is_object()) fail_user(source, "run", "expected a JSON object of run settings (got " + describe(object) + ")");
  auto read = [&](const char* key, auto& field) {
    auto found = object.find(key);
    if (found == object.end() || found->is_null()) return;
    try {
      field = found->get<std::remove_reference_t<decltype(field)>>();
    } catch (const json::exception&) {
      fail_user(source, std::string("run.") + key, "has the wrong type (got " + describe(*found) + ")");
    }
  };
  // Enums are written by to_string(); read them back through the same spellings.
  auto read_enum = [&](const char* key, auto& field, auto... values) {
    std::string text;
    read(key, text);
    if (text.empty()) return;
    bool matched = false;
    ((text == to_string(values) ? (field = values, matched = true) : false), ...);
    if (!matched) fail_user(source, std::string("run.") + key, "unknown value \"" + text + "\"");
  };
  read("config", run.config_path);
  read("lr", run.lr);
  read("batch_size", run.batch_size);
  read("total_batch_size", run.total_batch_size);
  read("gradient_accumulation", run.gradient_accumulation);
  read("max_length", run.max_length);
  read("num_training_steps", run.num_training_steps);
  read("warmup_steps", run.warmup_steps);
  read_enum("scheduler", run.scheduler, Scheduler::cosine, Scheduler::linear, Scheduler::constant);
  read("min_lr_ratio", run.min_lr_ratio);
  read("weight_decay", run.weight_decay);
  read("grad_clipping", run.grad_clipping);
  read("adam_beta1", run.adam_beta1);
  read("adam_beta2", run.adam_beta2);
  read("adam_eps", run.adam_eps);
  read_enum("dtype", run.dtype, DType::float32, DType::bfloat16);
  read_enum("precision", run.precision, Precision::pure, Precision::mixed);
  read("optimizer", run.optimizer);
  read("subset_size", run.subset_size);
  read("subset_norm_params", run.subset_norm_params);
  read("rank", run.galore_rank);
  read("update_proj_gap", run.update_proj_gap);
  read("galore_scale", run.galore_scale);
  read("proj_type", run.proj_type);
  read("galore_stagger", run.galore_stagger);
  read("galore_projector", run.galore_projector);
  read("subspace_iterations", run.subspace_iterations);
  read("seed", run.seed);
  read("data", run.data);
  read("eval_fraction", run.eval_fraction);
  read("eval_every", run.eval_every);
  read("eval_batches", run.eval_batches);
  read("save_every", run.save_every);
  read("save_dir", run.save_dir);
  read("continue_from", run.continue_from);
  read("run_dir", run.run_dir);
  read_enum("device", run.device, DeviceChoice::auto_select, DeviceChoice::cpu, DeviceChoice::cuda);
  read_enum("sharding", run.sharding, ShardingStrategy::full_shard, ShardingStrategy::shard_grad_op,
            ShardingStrategy::no_shard);
  read("prefetch", run.prefetch);
  read("log_every", run.log_every);
  read("print_config", run.print_config);
  read("memory_snapshot", run.memory_snapshot);
  return run;
}

namespace {

// Range checks for one flag: "command line: --FLAG: expected ... (got X)".
constexpr const char* kCommandLine = "command line";

void require_flag(bool ok, const char* flag, const std::string& expected, const std::string& got) {
  if (!ok) fail_user(kCommandLine, flag, "expected " + expected + " (got " + got + ")");
}
void require_flag(bool ok, const char* flag, const std::string& expected, double got) {
  require_flag(ok, flag, expected, format_number(got));
}
void require_flag(bool ok, const char* flag, const std::string& expected, int64_t got) {
  require_flag(ok, flag, expected, std::to_string(got));
}

}  // namespace

void validate_run_config(RunConfig& run, const ModelConfig& model, int world_size) {
  namespace fs = std::filesystem;
  if (world_size < 1)
    throw std::invalid_argument("validate_run_config: world_size must be >= 1, got " +
                                std::to_string(world_size));

  require_flag(std::isfinite(run.lr) && run.lr > 0, "--lr", "a finite number > 0", run.lr);
  require_flag(run.batch_size >= 1, "--batch_size", "an integer >= 1 (sequences per rank)",
               run.batch_size);
  require_flag(run.max_length >= 2, "--max_length",
               "an integer >= 2 (each sequence needs an input and a next-token target)",
               run.max_length);
  if (run.max_length > model.max_position_embeddings)
    fail_user(kCommandLine, "--max_length",
              "expected at most the model's max_position_embeddings = " +
                  std::to_string(model.max_position_embeddings) + " from " +
                  (run.config_path.empty() ? model.name : run.config_path) + " (got " +
                  std::to_string(run.max_length) + ")");
  require_flag(run.num_training_steps >= 1, "--num_training_steps", "an integer >= 1",
               run.num_training_steps);
  require_flag(run.warmup_steps >= 0 && run.warmup_steps <= run.num_training_steps,
               "--warmup_steps",
               "an integer in [0, --num_training_steps = " +
                   std::to_string(run.num_training_steps) + "]",
               run.warmup_steps);
  require_flag(run.min_lr_ratio >= 0 && run.min_lr_ratio <= 1, "--min_lr_ratio",
               "a number in [0, 1]", run.min_lr_ratio);
  require_flag(std::isfinite(run.weight_decay) && run.weight_decay >= 0, "--weight_decay",
               "a finite number >= 0", run.weight_decay);
  require_flag(std::isfinite(run.grad_clipping) && run.grad_clipping >= 0, "--grad_clipping",
               "a finite number >= 0 (0 turns clipping off)", run.grad_clipping);
  require_flag(run.adam_beta1 >= 0 && run.adam_beta1 < 1, "--adam_beta1", "a number in [0, 1)",
               run.adam_beta1);
  require_flag(run.adam_beta2 > 0 && run.adam_beta2 < 1, "--adam_beta2", "a number in (0, 1)",
               run.adam_beta2);
  require_flag(run.eval_fraction > 0 && run.eval_fraction < 1, "--eval_fraction",
               "a number in (0, 1)", run.eval_fraction);
  require_flag(run.eval_every >= 0, "--eval_every", "an integer >= 0 (0 = only at the end)",
               run.eval_every);
  require_flag(run.eval_batches >= 1, "--eval_batches", "an integer >= 1", run.eval_batches);
  require_flag(run.save_every >= 0, "--save_every", "an integer >= 0 (0 = only at the end)",
               run.save_every);
  require_flag(run.log_every >= 1, "--log_every", "an integer >= 1", run.log_every);
  require_flag(!run.run_dir.empty(), "--run_dir", "a folder path", std::string("\"\""));

  // Batching, as GaLore's torchrun_main: total = batch_size * world_size * gradient_accumulation.
  const int64_t sequences_per_micro_step = run.batch_size * world_size;
  require_flag(run.total_batch_size >= 0, "--total_batch_size",
               "0 (= batch_size * world_size) or a positive multiple of batch_size * world_size",
               run.total_batch_size);
  if (run.total_batch_size == 0) run.total_batch_size = sequences_per_micro_step;
  if (run.total_batch_size % sequences_per_micro_step != 0)
    fail_user(kCommandLine, "--total_batch_size",
              "expected a multiple of --batch_size * world size = " +
                  std::to_string(run.batch_size) + " * " + std::to_string(world_size) + " = " +
                  std::to_string(sequences_per_micro_step) + ", i.e. one of " +
                  std::to_string(sequences_per_micro_step) + ", " +
                  std::to_string(2 * sequences_per_micro_step) + ", " +
                  std::to_string(3 * sequences_per_micro_step) +
                  ", ... (or change --batch_size) (got " + std::to_string(run.total_batch_size) +
                  ")");
  run.gradient_accumulation = run.total_batch_size / sequences_per_micro_step;

  require_flag(run.optimizer == "adamw" || run.optimizer == "adamw_sn" || run.optimizer == "galore_adamw",
               "--optimizer", "one of adamw, adamw_sn, galore_adamw", "\"" + run.optimizer + "\"");
  if (run.adam_eps < 0) run.adam_eps = run.optimizer == "adamw" ? 1e-8 : 1e-6;
  require_flag(std::isfinite(run.adam_eps) && run.adam_eps > 0, "--adam_eps",
               "a finite number > 0", run.adam_eps);
  require_flag(run.subset_norm_params == "linear" || run.subset_norm_params == "all",
               "--subset_norm_params", "linear or all", "\"" + run.subset_norm_params + "\"");
  require_flag(run.galore_rank >= 1, "--rank", "an integer >= 1 (GaLore's projection rank)", run.galore_rank);
  require_flag(run.update_proj_gap >= 1, "--update_proj_gap",
               "an integer >= 1 (steps between projector updates)", run.update_proj_gap);
  require_flag(std::isfinite(run.galore_scale) && run.galore_scale > 0, "--galore_scale",
               "a finite number > 0", run.galore_scale);
  require_flag(run.galore_projector == "svd" || run.galore_projector == "subspace", "--galore_projector",
               "svd or subspace", "\"" + run.galore_projector + "\"");
  require_flag(run.subspace_iterations >= 1, "--subspace_iterations", "an integer >= 1",
               run.subspace_iterations);
  require_flag(run.proj_type == "std" || run.proj_type == "reverse_std" || run.proj_type == "left" ||
                   run.proj_type == "right",
               "--proj_type", "one of std, reverse_std, left, right", "\"" + run.proj_type + "\"");

  if (!run.continue_from.empty() && !fs::is_directory(run.continue_from))
    fail_user(kCommandLine, "--continue_from",
              "expected an existing checkpoint folder (got \"" + run.continue_from + "\", which " +
                  (fs::exists(run.continue_from) ? "is not a folder" : "does not exist") + ")");
  if (run.data != "synthetic" && !fs::is_regular_file(run.data))
    fail_user(kCommandLine, "--data",
              "expected \"synthetic\" or an existing token file made by `trainer prepare` (got \"" +
                  run.data + "\", which is not a file)");
}

}  // namespace llm
