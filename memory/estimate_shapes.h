// The sizes the memory estimate's simulation places on its timeline (memory/estimate_simulation.h):
// per element, per token and per unit, for a model config and the run's precision, each derived op
// by op from what the trainer's modules keep. Internal to the estimate.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "model/model_config.h"
#include "model/layer_ops.h"
#include "model/recompute.h"
#include "model/units.h"

namespace llm {

// Whether oneDNN widens a bf16 matmul's operands to fp32 here (see the head's backward): on a CPU
// without native bf16 (cpu_lacks_native_bf16_matmul), unless ONEDNN_MAX_CPU_ISA (or
// DNNL_MAX_CPU_ISA) caps oneDNN below AVX-512: then it has no bf16 path and none is widened
// (measured: AVX2 there makes the product go).
bool cpu_bf16_matmul_widens();

// The sizes of the step's tensors for a model config and the run's precision: per element, per
// token, per unit. Only sizes: the simulation (StepSimulation) places them on the timeline.
struct ModelShape {
  enum class Mode { fp32, mixed, pure };

  const ModelConfig& config;
  const RunConfig& run;
  Mode mode;
  int64_t tokens;  // per micro-batch on this rank: batch_size x max_length
  int64_t h, I, V, kv, heads;  // I, V: the MLP's and the logits' compute widths (--pad_matmul_dims)
  RecomputeSet recompute;  // --recompute's operations
  bool fused_swiglu;       // --fused_ops swiglu: the SwiGLU node keeps gate and up, not silu(gate)
  bool single_pass_loss;   // --fused_ops cross_entropy: the logits' gradient written over them, no row blocks
  // --grouped_projections: under autocast q/k/v keep one bf16 cast of their input, not three, and
  // gate/up one, not two (model/grouped_linear.h): 6h bytes a token less per layer in mixed.
  bool grouped;

  ModelShape(const ModelConfig& model, const RunConfig& run_config)
      : config(model), run(run_config),
        mode(run_config.precision.dtype == DType::float32 ? Mode::fp32
             : run_config.precision.mode == Precision::mixed ? Mode::mixed : Mode::pure),
        tokens(run_config.data.batch_size * run_config.data.max_length),
        h(model.hidden_size), I(model.compute_intermediate()), V(model.compute_vocab()),
        kv(model.num_key_value_heads * model.head_dim()), heads(model.num_attention_heads),
        recompute(recompute_set(run_config.recompute)),
        fused_swiglu(fused_ops_set(run_config.fused_ops).swiglu),
        single_pass_loss(fused_ops_set(run_config.fused_ops).cross_entropy),
        grouped(run_config.grouped_projections) {}

  int64_t compute_bytes() const { return mode == Mode::pure ? 2 : 4; }      // compute copy element
  int64_t hidden_bytes() const { return mode == Mode::pure ? 2 : 4; }       // unit boundary element
  int64_t activation_grad_bytes() const { return mode == Mode::fp32 ? 4 : 2; }  // inside a layer
  int64_t logits_bytes() const { return mode == Mode::fp32 ? 4 : 2; }

  // Bytes per token autograd saves in a decoder layer's forward, its output included (the
  // layer's input is the previous unit's output). Op by op (model/llama.cpp); each RMSNorm is one
  // node keeping its input x and rstd (4, fp32), its output kept by the linears that read it:
  //   fp32  input_layernorm: rstd (1), its output (h, the q/k/v input);
  //         rotary: q_rot (h), k_rot (kv) (x * cos saves only cos: q itself needs no grad);
  //         v (kv); SDPA (CPU flash): output (h, o_proj's input is a view of it) and its
  //         logsumexp (heads, fp32); h = x + attention (h, post_attention_layernorm's input);
  //         post_attention_layernorm (h + 1); SwiGLU: gate, silu, up, product (4I); output (h).
  //         = 4 (6h + 2kv + 4I + heads + 2)
  //   mixed (bf16 autocast): the norms in fp32 (rstd 4 each; h 4h; the outputs are kept by no one:
  //         every linear saves its own bf16 cast of its input (3 x 2h for q, k, v; 2 x 2h for gate,
  //         up)); output 4h; q_rot and k_rot are fp32 (bf16 q times fp32 cos) and SDPA saves their
  //         bf16 casts (2h + 2kv), v (2kv), output (2h), logsumexp (4 heads); SwiGLU in bf16 (8I).
  //         = 22h + 4kv + 8I + 8 + 4 heads, plus the bf16 weight casts, 2 bytes per linear weight
  //         element, which autograd keeps until the layer's backward
  //   pure (bf16 weights): each norm's rstd (4) and output (2h); h = x + attention (2h, the post
  //         norm's input); q_rot, k_rot, v, output (4h + 4kv), logsumexp (4 heads); SwiGLU (8I);
  //         output (2h).
  //         = 12h + 4kv + 8I + 8 + 4 heads
  int64_t layer_saved_per_token() const {
    switch (mode) {
      case Mode::fp32: return 4 * (6 * h + 2 * kv + 4 * I + heads + 2) - layer_recompute_frees_per_token();
      case Mode::mixed:
        return 22 * h - (grouped ? 6 * h : 0) + 4 * kv + 8 * I + 8 + 4 * heads - layer_recompute_frees_per_token();
      case Mode::pure: return 12 * h + 4 * kv + 8 * I + 8 + 4 * heads - layer_recompute_frees_per_token();
    }
    return 0;
  }
  // What --recompute frees of the above (model/recompute.h: an operation keeps only its inputs):
  //   norm       each norm's rstd (2 x 4 = 8): the norm node keeps nothing else of its own
  //   swiglu     silu(gate): fp32 4I, bf16 2I (so does --fused_ops swiglu's node)
  //   mlp        gate, up, silu, product: fp32 16I; pure 8I; mixed 8I and gate's and up's casts of
  //              the input (4h), less the fp32 input the operation keeps (4h): 8I
  //   attention  q_rot, k_rot, v, SDPA's output and logsumexp: fp32 4 (2h + 2kv + heads); pure
  //              4h + 4kv + 4 heads; mixed also q's, k's, v's casts of the input (6h) less the fp32
  //              input kept (4h): 6h + 4kv + 4 heads
  //   (grouped in mixed: one cast for q/k/v (2h, so attention frees 4h less) and one for gate/up
  //   (mlp frees 2h less))
  int64_t layer_recompute_frees_per_token() const {
    int64_t frees = 0;
    const bool grouped_casts = grouped && mode == Mode::mixed;
    if (recompute.norm) frees += 8;
    if (recompute.mlp)
      frees += (mode == Mode::fp32 ? 16 * I : 8 * I) - (grouped_casts ? 2 * h : 0);
    else if (recompute.swiglu || fused_swiglu)  // silu(gate) is not kept
      frees += mode == Mode::fp32 ? 4 * I : 2 * I;
    if (recompute.attention)
      frees += mode == Mode::fp32    ? 4 * (2 * h + 2 * kv + heads)
               : mode == Mode::mixed ? 6 * h - (grouped_casts ? 4 * h : 0) + 4 * kv + 4 * heads
                                     : 4 * h + 4 * kv + 4 * heads;
    return frees;
  }
  // The head: the final norm's rstd (4) and output (the lm_head input: fp32 4h, pure 2h; mixed its
  // bf16 cast, 2h) and the logits. --recompute norm frees the rstd.
  int64_t head_saved_per_token() const {
    const int64_t frees = recompute.norm ? 4 : 0;
    switch (mode) {
      case Mode::fp32: return 4 * (h + 1) + 4 * V - frees;
      case Mode::mixed: return 4 + 2 * h + 2 * V - frees;
      case Mode::pure: return 2 * h + 4 + 2 * V - frees;
    }
    return 0;
  }
  // What is live for a moment at the end of a layer's forward, beyond what it keeps: fp32 the down
  // projection's output while the residual add writes the output (4h); mixed also
  // post_attention_layernorm's fp32 output (a temporary of the whole expression, 4h) and the fp32
  // copy CPU makes of the bf16 operand of a mixed-dtype add (4h): 10h; pure 4h (down's output and
  // its accumulation buffer).
  int64_t layer_forward_tail_per_token() const {
    return mode == Mode::fp32 ? 4 * h : mode == Mode::mixed ? 10 * h : 4 * h;
  }
  // Without grad (evaluation) a layer keeps only its output, but the SwiGLU temporaries of one
  // expression live together: gate, silu, up, product, and post_attention_layernorm's output with
  // the down projection's output (fp32: 4 (4I + 2h)); mixed adds the bf16 casts of the norm output
  // (2 x 2h; one when grouped) and the fp32 copy of down's output for the residual add: 8I + 14h; pure
  // 8I + 4h.
  int64_t layer_eval_tail_per_token() const {
    return mode == Mode::fp32    ? 4 * (4 * I + 2 * h)
           : mode == Mode::mixed ? 8 * I + 14 * h - (grouped ? 2 * h : 0)
                                 : 8 * I + 4 * h;
  }
  // The head's forward under autocast: the final norm's fp32 output, a temporary of
  // `lm_head(norm(x))`, is live while the logits are written (lm_head keeps only its bf16 cast). In
  // fp32 and pure bf16 lm_head keeps the norm's output itself.
  int64_t head_forward_tail_per_token() const { return mode == Mode::mixed ? 4 * h : 0; }
  // Without grad also the bf16 cast of lm_head's weight is a temporary (mixed: 2 V h, not per
  // token), with the norm's fp32 output and its cast (6h).
  int64_t head_eval_tail_per_token() const { return mode == Mode::mixed ? 6 * h : 4 * h; }
  // The weights autocast casts to bf16 and autograd keeps for backward (mixed only).
  int64_t autocast_weight_bytes(const UnitSpec& unit) const {
    if (mode != Mode::mixed) return 0;
    int64_t bytes = 0;
    for (const ParameterSpec& parameter : unit.parameters)
      if (parameter.linear) bytes += 2 * parameter.numel();
    return bytes;
  }
};

}  // namespace llm
