// The two validated descriptions of a run: the model (an HF LlamaConfig JSON file, as the GaLore
// family in configs/) and the run (command-line flags named as in GaLore's torchrun_main.py).
//
// Loading checks every field and turns every mistake into one UserError naming the file (or flag),
// the key and what was expected. Everything downstream may assume these structs are valid.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace llm {

struct ModelConfig {
  std::string name;                 // file stem, e.g. "llama_350m"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t num_hidden_layers = 0;
  int64_t max_position_embeddings = 2048;  // HF default; the GaLore files do not set it
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  int64_t pad_token_id = -1;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Exact parameter count of LlamaForCausalLM for this config (untied unless tie_word_embeddings).
  int64_t num_parameters() const;
  nlohmann::json to_json() const;
};

// Throws UserError: unknown keys, missing required keys, wrong types, non-positive sizes, hidden
// size not divisible by heads, heads not divisible by kv heads, odd head_dim (RoPE), unsupported
// hidden_act / rope_scaling.
ModelConfig load_model_config(const std::string& path);
ModelConfig parse_model_config(const nlohmann::json& json, const std::string& source);

enum class Scheduler { cosine, linear, constant };
enum class DType { float32, bfloat16 };
enum class DeviceChoice { auto_select, cpu, cuda };
enum class Precision { pure, mixed };  // bf16 only: pure bf16 weights (GaLore) or autocast + fp32 master

struct RunConfig {
  std::string config_path;
  double lr = 1e-3;
  int64_t batch_size = 8;            // per-rank micro-batch, sequences
  int64_t total_batch_size = 0;      // sequences per optimizer step; 0 = batch_size * world
  int64_t gradient_accumulation = 1; // derived: total / (batch_size * world)
  int64_t max_length = 128;          // tokens per sequence
  int64_t num_training_steps = 200;  // optimizer steps
  int64_t warmup_steps = 20;
  Scheduler scheduler = Scheduler::cosine;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;
  double grad_clipping = 1.0;        // 0 = off
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  DType dtype = DType::float32;
  Precision precision = Precision::mixed;
  std::string optimizer = "adamw";
  uint64_t seed = 0;
  std::string data = "synthetic";    // "synthetic" or a token file made by `trainer prepare`
  double eval_fraction = 0.05;       // share of windows held out for evaluation
  int64_t eval_every = 50;           // 0 = only at the end
  int64_t eval_batches = 8;
  int64_t save_every = 0;            // 0 = only at the end when save_dir is set
  std::string save_dir;
  std::string continue_from;
  std::string run_dir = "runs/latest";
  DeviceChoice device = DeviceChoice::auto_select;
  int64_t log_every = 1;
  bool print_config = false;

  nlohmann::json to_json() const;
};

// Checks ranges and cross-field rules (warmup <= steps, total divisible by batch*world, ...) and
// derives gradient_accumulation. Throws UserError naming the flag.
void validate_run_config(RunConfig& run, const ModelConfig& model, int world_size);

const char* to_string(Scheduler value);
const char* to_string(DType value);
const char* to_string(DeviceChoice value);
const char* to_string(Precision value);

}  // namespace llm
