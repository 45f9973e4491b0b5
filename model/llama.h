// LLaMA exactly as transformers' LlamaForCausalLM for the GaLore config family: RMSNorm, rotary
// embeddings (rotate-half, base rope_theta), SwiGLU MLP, no biases, untied embeddings, causal
// attention through at::scaled_dot_product_attention, init N(0, initializer_range).
//
// Single-device on purpose: this file knows nothing of sharding or offload. Those are applied from
// outside (sharding/), unit by unit. The units are those of model/units.h: the model builds
// the modules its unit descriptions name, one unit at a time, and runs forward as a loop over
// forward_unit, the function the trainer calls unit by unit. Parameter names are the HF names
// ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight"), so checkpoints and golden files map
// one to one.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "model/cross_entropy.h"
#include "model/layer_ops.h"
#include "model/model_config.h"
#include "model/recompute.h"
#include "model/units.h"

namespace llm {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Called as each unit's modules are built, in forward order, with the unit's description and its
// HF-named parameters. A caller can initialise and shard a unit before the next is allocated, so the
// whole unsharded model never exists at once.
using UnitBuiltHook = std::function<void(const UnitSpec& unit, NamedTensors parameters)>;

// A module's parameters with a name prefix: ("model.layers.3.", layer) -> "model.layers.3.mlp...".
NamedTensors named_parameters_with_prefix(torch::nn::Module& module, const std::string& prefix);

// Initialises one unit's parameters as its description says (GaLore's model: N(0, initializer_range)
// for matrices and embeddings, ones for norm gains, the embedding's padding row zeroed). Each unit
// draws from its own generator seeded from (seed, unit.index), so a unit's weights do not depend on
// the others or on when it is built.
void init_unit_weights(const UnitSpec& unit, const NamedTensors& parameters, double initializer_range,
                       uint64_t seed);

// RMSNorm as HF computes it (variance in fp32, x * rsqrt(var + eps) cast back to the input dtype,
// then times the weight), as one autograd node: model/layer_ops.h's rms_norm.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);  // (..., dim)
  void set_form(RmsNormForm form) { form_ = form; }
  at::Tensor weight;

 private:
  double eps_;
  RmsNormForm form_ = RmsNormForm::aten;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);
  // x (B, T, hidden); cos, signed sin (T, head_dim) in x's dtype
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  void set_fused_rotary(bool fused) { fused_rotary_ = fused; }  // --fused_ops rotary
  void set_grouped(bool grouped) { grouped_ = grouped; }           // --grouped_projections
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  bool fused_rotary_ = false;
  bool grouped_ = false;  // q, k and v as one GEMM (model/grouped_linear.h)
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x);  // down(silu(gate(x)) * up(x))
  // gate(x) and up(x): one GEMM when grouped (--grouped_projections), else two.
  std::pair<at::Tensor, at::Tensor> gate_and_up(const at::Tensor& x);
  void set_swiglu_form(SwigluForm form) { swiglu_form_ = form; }  // --fused_ops swiglu
  void set_grouped(bool grouped) { grouped_ = grouped; }           // --grouped_projections
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  SwigluForm swiglu_form_ = SwigluForm::eager;
  bool grouped_ = false;
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const ModelConfig& config);
  // `recompute`: the operations whose backward runs their forward again (model/recompute.h).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const RecomputeSet& recompute = {});
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

// The HF "model." prefix: embeddings, layers and final norm, registered in that order as their units
// are built (LlamaForCausalLMImpl's constructor).
class LlamaBackboneImpl : public torch::nn::Module {
 public:
  LlamaBackboneImpl();
  void add_embedding(const ModelConfig& config, int64_t padding_row);
  void add_layer(const ModelConfig& config);
  void add_norm(const ModelConfig& config);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaBackbone);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const ModelConfig& config, UnitBuiltHook on_unit_built = nullptr);

  // input_ids (B, T) int64 -> logits (B, T, vocab) in the parameters' dtype: forward_unit over every
  // unit in order.
  at::Tensor forward(const at::Tensor& input_ids);

  // One unit's forward: the embedding takes ids (B, T) to hidden states (B, T, hidden) and sets the
  // context's rotary tables; a decoder layer takes hidden states to hidden states; the head takes
  // them to logits (B, T, compute vocab): with --pad_matmul_dims the zero pad logits follow the
  // vocabulary's (causal_lm_loss reads the first vocab_size; forward() returns those alone).
  at::Tensor forward_unit(size_t unit, const at::Tensor& input, UnitContext& context);

  const std::vector<UnitSpec>& units() const { return units_; }
  NamedTensors unit_parameters(size_t unit);  // the unit's parameters, HF-named, in spec order

  // Rotary tables for positions [0, seq_len): cos and the signed sine (-sin1, sin2) (seq_len,
  // head_dim; apply_rotary in llama.cpp says why), computed in fp32 and cast to dtype. Cached per
  // (length, device).
  std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t seq_len, at::ScalarType dtype,
                                                  at::Device device);

  // init_unit_weights for every unit, in order.
  void init_weights(uint64_t seed);

  const ModelConfig& config() const { return config_; }
  // --recompute: the operations of every decoder layer (and the head's norm) recomputed in backward.
  void set_recompute(const RecomputeSet& recompute) { recompute_ = recompute; }
  const RecomputeSet& recompute_set() const { return recompute_; }
  // --fused_ops rms_norm: every RMSNorm (the layers' and the head's) in that form.
  void set_rms_norm_form(RmsNormForm form);
  // --fused_ops swiglu: every layer's MLP in that form (the recomputed MLP and SwiGLU too).
  void set_swiglu_form(SwigluForm form);
  // --fused_ops rotary: every layer's q and k rotated by one kernel each.
  void set_fused_rotary(bool fused);
  // --grouped_projections: every layer's q/k/v and gate/up as one GEMM each (model/grouped_linear.h).
  // Their weights must then be adjacent in memory, as the trainer's units keep them; a logic_error
  // at the forward otherwise.
  void set_grouped_projections(bool grouped);
  // The cached cos and signed sine tables (undefined before the first forward): owned buffers, not parameters.
  const at::Tensor& rotary_cos_cache() const { return rotary_cos_; }
  const at::Tensor& rotary_sin_cache() const { return rotary_sin_; }
  LlamaBackbone model{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  void build_unit(const UnitSpec& unit);

  ModelConfig config_;
  std::vector<UnitSpec> units_;
  RecomputeSet recompute_;
  std::vector<DecoderLayerImpl*> layers_;  // owned by model->layers
  at::Tensor rotary_cos_, rotary_sin_;
};
TORCH_MODULE(LlamaForCausalLM);

// Name -> tensor views of every parameter, in registration order (HF names).
std::vector<std::pair<std::string, at::Tensor>> named_parameters_in_order(torch::nn::Module& module);

// Copies tensors by HF name into the module's parameters. Throws UserError naming `source` and the
// key for a missing or unexpected name or a shape mismatch. Keeps parameter storage (copy_).
void load_named_tensors(torch::nn::Module& module, const std::map<std::string, at::Tensor>& tensors,
                        const std::string& source);

}  // namespace llm
