#include "model/units.h"

namespace llm {

const char* to_string(UnitKind kind) {
  switch (kind) {
    case UnitKind::embedding: return "embedding";
    case UnitKind::decoder_layer: return "decoder_layer";
    case UnitKind::head: return "head";
  }
  return "?";
}

int64_t ParameterSpec::numel() const {
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  return count;
}

int64_t ParameterSpec::compute_numel() const {
  int64_t count = 1;
  for (int64_t size : module_shape()) count *= size;
  return count;
}

std::vector<UnitSpec> describe_units(const ModelConfig& config) {
  const int64_t h = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
  const int64_t compute_I = config.compute_intermediate(), compute_V = config.compute_vocab();
  const int64_t q = config.num_attention_heads * config.head_dim();
  const int64_t kv = config.num_key_value_heads * config.head_dim();
  auto linear = [](std::string name, int64_t out, int64_t in, std::vector<int64_t> compute_shape = {}) {
    ParameterSpec spec{std::move(name), {out, in}, ParameterInit::normal, /*linear=*/true, -1, {}};
    spec.compute_shape = compute_shape.empty() ? spec.shape : std::move(compute_shape);
    return spec;
  };
  auto gain = [](std::string name, int64_t size) {
    return ParameterSpec{std::move(name), {size}, ParameterInit::ones, /*linear=*/false, -1, {size}};
  };

  std::vector<UnitSpec> units;
  // pad_token_id -1 means the last row, as GaLore's model (nn.Embedding's padding_idx -1).
  const int64_t padding_row = config.pad_token_id < 0 ? V + config.pad_token_id : config.pad_token_id;
  units.push_back({"embed", UnitKind::embedding, 0, -1,
                   {ParameterSpec{"model.embed_tokens.weight", {V, h}, ParameterInit::normal,
                                  /*linear=*/false, padding_row, {compute_V, h}}}});
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    units.push_back({"layer." + std::to_string(layer), UnitKind::decoder_layer, layer + 1, layer,
                     {linear(prefix + "self_attn.q_proj.weight", q, h),
                      linear(prefix + "self_attn.k_proj.weight", kv, h),
                      linear(prefix + "self_attn.v_proj.weight", kv, h),
                      linear(prefix + "self_attn.o_proj.weight", h, q),
                      linear(prefix + "mlp.gate_proj.weight", I, h, {compute_I, h}),
                      linear(prefix + "mlp.up_proj.weight", I, h, {compute_I, h}),
                      linear(prefix + "mlp.down_proj.weight", h, I, {h, compute_I}),
                      gain(prefix + "input_layernorm.weight", h),
                      gain(prefix + "post_attention_layernorm.weight", h)}});
  }
  units.push_back({"head", UnitKind::head, config.num_hidden_layers + 1, -1,
                   {gain("model.norm.weight", h), linear("lm_head.weight", V, h, {compute_V, h})}});
  return units;
}

std::vector<bool> recomputed_units(const std::vector<UnitSpec>& units, int64_t every) {
  std::vector<bool> recomputed(units.size(), false);
  if (every <= 0) return recomputed;
  for (size_t u = 0; u < units.size(); ++u)
    recomputed[u] = units[u].kind == UnitKind::decoder_layer && units[u].layer % every == 0;
  return recomputed;
}

}  // namespace llm
