// transformers' config.json for LlamaForCausalLM, both ways: written by `trainer export` in today's
// transformers format, and checked by `--init_from` against the --config model.
//
// Writing: the keys LlamaConfig.save_pretrained writes (architectures, model_type, the sizes, head_dim,
// rms_norm_eps, rope_parameters {rope_type "default", rope_theta}, attention/mlp bias false,
// pretraining_tp 1, tie_word_embeddings, the token ids, dtype, transformers_version, use_cache), so
// LlamaForCausalLM.from_pretrained reads it without a flag or a warning. Our pad_token_id -1 (GaLore's
// configs: the last row, nn.Embedding's padding_idx -1) is written as vocab_size - 1, the row it is;
// a bos or eos id of -1 (none) is left out.
//
// Checking: a config.json from any transformers version is accepted where it describes the same maths
// as --config and refused by key, with both values, where it does not: the sizes (hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size, head_dim),
// rms_norm_eps, rope_theta (top-level or in rope_parameters), tie_word_embeddings, hidden_act,
// model_type, attention/mlp bias, attention_dropout, pretraining_tp, and a RoPE scaling
// (rope_scaling or rope_parameters with a rope_type other than "default"). Everything else (dtype,
// torch_dtype, transformers_version, max_position_embeddings, use_cache, _name_or_path, architectures,
// the token ids, initializer_range, generation settings of old configs) does not change the maths of a
// forward and backward pass and is accepted.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "model/model_config.h"

namespace llm {

// The transformers version whose config.json format `trainer export` writes (the pinned environment's,
// read by CMake from TRAINER_PYTHON at configure time; 5.23.0, the one checked, without a Python).
const char* exported_transformers_version();

// The embedding row our pad_token_id names: -1 (GaLore's configs, nn.Embedding's padding_idx -1) is
// the last row. What config.json calls pad_token_id.
int64_t padding_row(const ModelConfig& model);

// config.json for `model`, its tensors stored as `dtype_name` ("float32" or "bfloat16").
nlohmann::json hf_config_json(const ModelConfig& model, const std::string& dtype_name);
// generation_config.json, as save_pretrained writes it for a generative model.
nlohmann::json hf_generation_config_json(const ModelConfig& model);

// Throws UserError naming `source` (the config.json path) and the first key whose value changes the
// maths against `model` (--config), with both values.
void check_hf_config(const nlohmann::json& config, const ModelConfig& model, const std::string& source);

}  // namespace llm
