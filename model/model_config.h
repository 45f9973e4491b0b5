// The model's description: an HF LlamaConfig JSON file, as the GaLore family in configs/.
//
// Loading checks every field and turns every mistake into one UserError naming the file, the key and
// what was expected. Everything downstream may assume a ModelConfig is valid.
//
// Accepted keys: the GaLore files' keys (architectures, model_type "llama", hidden_act "silu",
// bos/eos/pad_token_id, initializer_range, rms_norm_eps, transformers_version, use_cache,
// max_sequence_length and the five sizes) and the HF LlamaConfig keys a plain LLaMA may carry
// (max_position_embeddings, rope_theta, num_key_value_heads, tie_word_embeddings, torch_dtype, and
// attention_bias false, mlp_bias false, attention_dropout 0, rope_scaling null, head_dim equal to
// hidden/heads, pretraining_tp 1: other values would describe a model this trainer does not build).
// Any other key is an error rather than silently ignored, so a typo never changes the model.
//
// Context length: max_position_embeddings when given; otherwise the GaLore files' own
// max_sequence_length (what GaLore's modeling_llama sizes its rotary cache with); otherwise 2048, the
// LlamaConfig default. When both keys are given they must agree. torch_dtype, transformers_version
// and use_cache are accepted and ignored: the run's --dtype decides the dtype.
#pragma once

#include <cstdint>
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
  int64_t max_position_embeddings = 2048;  // else max_sequence_length, else this HF default
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  int64_t pad_token_id = -1;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  // The width the MLP computes at (--pad_matmul_dims): intermediate_size padded with zero rows
  // and columns so every matmul dimension is a multiple of kMatmulPadMultiple; 0: not padded. Set
  // for a run (with_matmul_padding), never read from nor written to a config file: the model, its
  // checkpoints and exports stay intermediate_size wide (model/units.h).
  int64_t compute_intermediate_size = 0;
  // The same for the vocabulary: the embedding's and lm_head's rows, the logits' width. The pad
  // rows are never looked up; the pad logits are zero and the loss reads only the first vocab_size
  // (model/cross_entropy.h), so the pads' gradients are zero.
  int64_t compute_vocab_size = 0;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t compute_intermediate() const { return compute_intermediate_size > 0 ? compute_intermediate_size : intermediate_size; }
  int64_t compute_vocab() const { return compute_vocab_size > 0 ? compute_vocab_size : vocab_size; }
  bool matmul_padded() const { return compute_intermediate() != intermediate_size || compute_vocab() != vocab_size; }
  // Exact parameter count of LlamaForCausalLM for this config (untied unless tie_word_embeddings).
  int64_t num_parameters() const;
  // An HF LlamaConfig object (no "name": that is the file stem) that parse_model_config reads back
  // into an equal config and transformers' LlamaConfig loads as the same model.
  nlohmann::json to_json() const;
};

// Throws UserError: missing or unreadable file, not a regular file (a folder, /dev/null, a FIFO), an
// empty file, malformed JSON (with nlohmann's line and column), a key given twice in one object
// (which JSON readers would silently resolve to one of them), unknown keys, missing required keys, wrong types, non-positive sizes, hidden size not divisible by
// heads, heads not divisible by kv heads, odd head_dim (RoPE), unsupported hidden_act / rope_scaling.
// Every message reads "SOURCE: KEY: what is expected (got X)".
ModelConfig load_model_config(const std::string& path);
// `source` names the JSON in messages (normally its path); the config's name is its stem.
ModelConfig parse_model_config(const nlohmann::json& json, const std::string& source);

// --pad_matmul_dims: where the compute side pads (auto: on a GPU, a dimension that is not a multiple
// of 8 elements, which cuBLAS's Hopper kernels need for 16-byte strides; on: every dimension not a
// multiple of kMatmulPadMultiple, on any device; off: none). Padded to a multiple of 128.
inline constexpr const char* kPadMatmulChoices[] = {"auto", "on", "off"};
inline constexpr int64_t kMatmulPadMultiple = 128;
// MODEL with compute_intermediate_size and compute_vocab_size set as CHOICE says for a run on a GPU
// (cuda) or not.
ModelConfig with_matmul_padding(ModelConfig model, const std::string& choice, bool cuda);

// How configuration messages show a JSON value ("integer 3", "string \"abc\"", "null") and a number.
std::string describe_json_value(const nlohmann::json& value);
std::string format_number(double value);

}  // namespace llm
