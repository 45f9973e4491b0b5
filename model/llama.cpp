#include "model/llama.h"

#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/nn/functional/activation.h>

#include <set>
#include <sstream>

#include "common/allocation_failure.h"
#include "common/errors.h"
#include "common/padded_tensor.h"
#include "model/grouped_linear.h"
#include "model/layer_ops.h"

namespace llm {
namespace {

torch::nn::Linear make_linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) { return rms_norm(x, weight, eps_, form_); }

AttentionImpl::AttentionImpl(const ModelConfig& config)
    : num_heads_(config.num_attention_heads),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim()) {
  const int64_t hidden = config.hidden_size;
  q_proj = register_module("q_proj", make_linear(hidden, num_heads_ * head_dim_));
  k_proj = register_module("k_proj", make_linear(hidden, num_kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", make_linear(hidden, num_kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", make_linear(num_heads_ * head_dim_, hidden));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin) {
  const int64_t batch = x.size(0), seq = x.size(1);
  // (B, T, heads * D) -> (B, heads, T, D)
  at::Tensor q, k, v;
  std::vector<at::Tensor> projected;  // --grouped_projections: q, k and v from one GEMM
  if (grouped_) {
    projected = grouped_linear(x, {q_proj->weight, k_proj->weight, v_proj->weight});
    // Attention keeps v for its backward: a view would keep q's and k's part of the GEMM's output
    // alive with it (the rotations are new tensors), 2 (h + kv) bytes a token per layer in bf16.
    projected[2] = projected[2].contiguous();
  }
  auto project = [&](size_t i, torch::nn::Linear& projection) { return grouped_ ? projected[i] : projection(x); };
  if (fused_rotary_) {  // --fused_ops rotary: one kernel each, on the projections' (B, T, heads, D) layout
    q = apply_rotary_fused(project(0, q_proj).view({batch, seq, num_heads_, head_dim_}), cos, sin).transpose(1, 2);
    k = apply_rotary_fused(project(1, k_proj).view({batch, seq, num_kv_heads_, head_dim_}), cos, sin).transpose(1, 2);
    v = project(2, v_proj).view({batch, seq, num_kv_heads_, head_dim_}).transpose(1, 2);
  } else {
    q = project(0, q_proj).view({batch, seq, num_heads_, head_dim_}).transpose(1, 2);
    k = project(1, k_proj).view({batch, seq, num_kv_heads_, head_dim_}).transpose(1, 2);
    v = project(2, v_proj).view({batch, seq, num_kv_heads_, head_dim_}).transpose(1, 2);
    q = apply_rotary(q, cos, sin);
    k = apply_rotary(k, cos, sin);
  }
  const bool grouped = num_kv_heads_ != num_heads_;
  at::Tensor attended = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0,
                                                         /*is_causal=*/true, std::nullopt, grouped);
  // (B, heads, T, D) -> (B, T, heads * D)
  return o_proj(attended.transpose(1, 2).reshape({batch, seq, num_heads_ * head_dim_}));
}

MLPImpl::MLPImpl(const ModelConfig& config) {
  // The compute width (--pad_matmul_dims): zero pads beyond intermediate_size (model/units.h).
  gate_proj = register_module("gate_proj", make_linear(config.hidden_size, config.compute_intermediate()));
  up_proj = register_module("up_proj", make_linear(config.hidden_size, config.compute_intermediate()));
  down_proj = register_module("down_proj", make_linear(config.compute_intermediate(), config.hidden_size));
}

std::pair<at::Tensor, at::Tensor> MLPImpl::gate_and_up(const at::Tensor& x) {
  if (!grouped_) return {gate_proj(x), up_proj(x)};
  const std::vector<at::Tensor> projected = grouped_linear(x, {gate_proj->weight, up_proj->weight});
  return {projected[0], projected[1]};
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  if (swiglu_form_ == SwigluForm::eager && !grouped_)
    return down_proj(torch::nn::functional::silu(gate_proj(x)) * up_proj(x));
  const auto [gate, up] = gate_and_up(x);
  if (swiglu_form_ == SwigluForm::eager) return down_proj(torch::nn::functional::silu(gate) * up);
  return down_proj(swiglu(gate, up, swiglu_form_));  // (the fused node makes grouped views contiguous)
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& config) {
  self_attn = register_module("self_attn", Attention(config));
  mlp = register_module("mlp", MLP(config));
  input_layernorm =
      register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                     const at::Tensor& sin, const RecomputeSet& recompute) {
  if (!recompute.any()) {
    at::Tensor h = x + self_attn(input_layernorm(x), cos, sin);
    return h + mlp(post_attention_layernorm(h));
  }
  // The same operations in the same order, some of them recomputed (model/recompute.h).
  // The modules travel into the recomputations as shared pointers (ModuleHolder's -> is const).
  auto norm = [&recompute](const RMSNorm& module, const at::Tensor& input) -> std::pair<at::Tensor, at::Tensor> {
    const std::shared_ptr<RMSNormImpl> impl = module.ptr();
    if (!recompute.norm) return {input, impl->forward(input)};
    return recompute_norm([impl](const at::Tensor& t) { return impl->forward(t); }, input);
  };
  auto [residual, normed] = norm(input_layernorm, x);
  const std::shared_ptr<AttentionImpl> attention = self_attn.ptr();
  at::Tensor attended =
      recompute.attention
          ? llm::recompute([attention, cos, sin](const std::vector<at::Tensor>& in) {
              return std::vector<at::Tensor>{attention->forward(in[0], cos, sin)};
            }, {normed})[0]
          : self_attn(normed, cos, sin);
  at::Tensor h = residual + attended;
  auto [h_residual, h_normed] = norm(post_attention_layernorm, h);
  const std::shared_ptr<MLPImpl> feed_forward = mlp.ptr();
  at::Tensor projected;
  if (recompute.mlp) {
    projected = llm::recompute([feed_forward](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{feed_forward->forward(in[0])};
    }, {h_normed})[0];
  } else if (recompute.swiglu) {
    const auto [gate, up] = mlp->gate_and_up(h_normed);
    at::Tensor product = llm::recompute([](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{torch::nn::functional::silu(in[0]) * in[1]};
    }, {gate, up})[0];
    projected = mlp->down_proj(product);
  } else {
    projected = mlp(h_normed);
  }
  return h_residual + projected;
}

LlamaBackboneImpl::LlamaBackboneImpl() {
  layers = register_module("layers", torch::nn::ModuleList());
}

// Registration order is embed_tokens, layers, norm (the HF order of named_parameters) because the
// layers list is registered by the constructor, before any unit exists, and the rest are added in
// forward order.
void LlamaBackboneImpl::add_embedding(const ModelConfig& config, int64_t padding_row) {
  embed_tokens = register_module(
      "embed_tokens",
      torch::nn::Embedding(torch::nn::EmbeddingOptions(config.compute_vocab(), config.hidden_size).padding_idx(padding_row)));
}

void LlamaBackboneImpl::add_layer(const ModelConfig& config) { layers->push_back(DecoderLayer(config)); }

void LlamaBackboneImpl::add_norm(const ModelConfig& config) {
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const ModelConfig& config, UnitBuiltHook on_unit_built)
    : config_(config), units_(describe_units(config)) {
  LLM_REQUIRE(!config.tie_word_embeddings, config.name, "tie_word_embeddings",
              "tied embeddings are not supported (the GaLore family is untied); set it to false");
  model = register_module("model", LlamaBackbone());
  for (size_t u = 0; u < units_.size(); ++u) {
    allocating("unit " + units_[u].name + " of the model", [&] { build_unit(units_[u]); });
    NamedTensors parameters = unit_parameters(u);
    // The description and the modules are two statements of one model: they must agree exactly.
    bool same = parameters.size() == units_[u].parameters.size();
    for (size_t i = 0; same && i < parameters.size(); ++i)
      same = parameters[i].first == units_[u].parameters[i].name &&
             parameters[i].second.sizes() == at::IntArrayRef(units_[u].parameters[i].module_shape());
    if (!same) throw std::logic_error("unit " + units_[u].name + ": the modules built differ from its description");
    if (on_unit_built) on_unit_built(units_[u], std::move(parameters));
  }
}

void LlamaForCausalLMImpl::build_unit(const UnitSpec& unit) {
  switch (unit.kind) {
    case UnitKind::embedding:
      model->add_embedding(config_, unit.parameters.front().zero_row);
      break;
    case UnitKind::decoder_layer:
      model->add_layer(config_);
      layers_.push_back(model->layers[unit.layer]->as<DecoderLayerImpl>());
      break;
    case UnitKind::head:
      model->add_norm(config_);
      lm_head = register_module("lm_head", make_linear(config_.hidden_size, config_.compute_vocab()));
      break;
  }
}

void LlamaForCausalLMImpl::set_rms_norm_form(RmsNormForm form) {
  for (DecoderLayerImpl* layer : layers_) {
    layer->input_layernorm->set_form(form);
    layer->post_attention_layernorm->set_form(form);
  }
  if (!model->norm.is_empty()) model->norm->set_form(form);
}

void LlamaForCausalLMImpl::set_fused_rotary(bool fused) {
  for (DecoderLayerImpl* layer : layers_) layer->self_attn->set_fused_rotary(fused);
}

void LlamaForCausalLMImpl::set_grouped_projections(bool grouped) {
  for (DecoderLayerImpl* layer : layers_) {
    layer->self_attn->set_grouped(grouped);
    layer->mlp->set_grouped(grouped);
  }
}

void LlamaForCausalLMImpl::set_swiglu_form(SwigluForm form) {
  for (DecoderLayerImpl* layer : layers_) layer->mlp->set_swiglu_form(form);
}

NamedTensors LlamaForCausalLMImpl::unit_parameters(size_t unit) {
  const UnitSpec& spec = units_.at(unit);
  switch (spec.kind) {
    case UnitKind::embedding:
      return named_parameters_with_prefix(*model->embed_tokens, "model.embed_tokens.");
    case UnitKind::decoder_layer:
      return named_parameters_with_prefix(*layers_.at(spec.layer), "model.layers." + std::to_string(spec.layer) + ".");
    case UnitKind::head: {
      NamedTensors parameters = named_parameters_with_prefix(*model->norm, "model.norm.");
      for (auto& named : named_parameters_with_prefix(*lm_head, "lm_head.")) parameters.push_back(named);
      return parameters;
    }
  }
  return {};
}

std::pair<at::Tensor, at::Tensor> LlamaForCausalLMImpl::rotary_tables(int64_t seq_len,
                                                                      at::ScalarType dtype,
                                                                      at::Device device) {
  if (!rotary_cos_.defined() || rotary_cos_.size(0) < seq_len || rotary_cos_.device() != device) {
    // As HF: inv_freq = 1 / base^(2i / D) in fp32; angles = position * inv_freq; emb = [f, f].
    const int64_t dim = config_.head_dim();
    at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    at::Tensor exponents = at::arange(0, dim, 2, f32.dtype(at::kLong)).to(at::kFloat) / dim;
    at::Tensor inv_freq = 1.0 / at::pow(config_.rope_theta, exponents).to(device);
    at::Tensor positions = at::arange(seq_len, f32);
    at::Tensor angles = at::outer(positions, inv_freq);        // (T, D/2)
    at::Tensor emb = at::cat({angles, angles}, -1);            // (T, D)
    rotary_cos_ = emb.cos();
    rotary_sin_ = rotary_signed_sine(emb.sin());
  }
  return {rotary_cos_.slice(0, 0, seq_len).to(dtype), rotary_sin_.slice(0, 0, seq_len).to(dtype)};
}

at::Tensor LlamaForCausalLMImpl::forward_unit(size_t unit, const at::Tensor& input, UnitContext& context) {
  const UnitSpec& spec = units_.at(unit);
  switch (spec.kind) {
    case UnitKind::embedding: {
      at::Tensor hidden = model->embed_tokens(input);  // (B, T, hidden)
      std::tie(context.cos, context.sin) = rotary_tables(input.size(1), hidden.scalar_type(), hidden.device());
      return hidden;
    }
    case UnitKind::decoder_layer:
      return layers_[spec.layer]->forward(input, context.cos.to(input.scalar_type()),
                                          context.sin.to(input.scalar_type()), recompute_);
    case UnitKind::head: {
      if (!recompute_.norm) return lm_head(model->norm(input));  // (B, T, vocab)
      const std::shared_ptr<RMSNormImpl> norm = model->norm.ptr();  // its input has no other reader: no pass-through
      return lm_head(recompute([norm](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{norm->forward(in[0])};
      }, {input})[0]);
    }
  }
  return {};
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& input_ids) {
  UnitContext context;
  at::Tensor x = input_ids;
  for (size_t u = 0; u < units_.size(); ++u) x = forward_unit(u, x, context);
  return config_.compute_vocab() == config_.vocab_size ? x : x.narrow(-1, 0, config_.vocab_size);
}

void LlamaForCausalLMImpl::init_weights(uint64_t seed) {
  for (size_t u = 0; u < units_.size(); ++u)
    init_unit_weights(units_[u], unit_parameters(u), config_.initializer_range, seed);
}

NamedTensors named_parameters_with_prefix(torch::nn::Module& module, const std::string& prefix) {
  NamedTensors named;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    named.emplace_back(prefix + item.key(), item.value());
  return named;
}

void init_unit_weights(const UnitSpec& unit, const NamedTensors& parameters, double initializer_range,
                       uint64_t seed) {
  at::NoGradGuard no_grad;
  // A distinct, reproducible stream per unit (splitmix-style odd multiplier keeps seeds apart).
  at::Generator generator =
      at::detail::createCPUGenerator(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(unit.index) + 1);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ParameterSpec& spec = unit.parameters.at(i);
    // The logical part only draws: the same values whether or not the compute side pads.
    const at::Tensor param = logical_view(spec.shape, parameters[i].second);
    zero_padding(spec.shape, parameters[i].second);
    if (spec.init == ParameterInit::ones) {
      param.fill_(1.0);
      continue;
    }
    at::Tensor values = at::empty(spec.shape, at::kFloat);
    values.normal_(0.0, initializer_range, generator);
    param.copy_(values);
    if (spec.zero_row >= 0) param[spec.zero_row].zero_();
  }
}

std::vector<std::pair<std::string, at::Tensor>> named_parameters_in_order(torch::nn::Module& module) {
  return named_parameters_with_prefix(module, "");
}

void load_named_tensors(torch::nn::Module& module, const std::map<std::string, at::Tensor>& tensors,
                        const std::string& source) {
  at::NoGradGuard no_grad;
  std::set<std::string> seen;
  for (auto& [name, param] : named_parameters_in_order(module)) {
    auto found = tensors.find(name);
    LLM_REQUIRE(found != tensors.end(), source, name, "missing parameter");
    std::ostringstream expected;
    expected << "shape " << param.sizes() << " expected, found " << found->second.sizes();
    LLM_REQUIRE(found->second.sizes() == param.sizes(), source, name, expected.str());
    param.copy_(found->second);
    seen.insert(name);
  }
  for (const auto& [name, tensor] : tensors)
    LLM_REQUIRE(seen.count(name) == 1, source, name, "unexpected parameter (not in this model)");
}

}  // namespace llm
