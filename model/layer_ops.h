// The element-wise operations of a decoder layer in the forms the trainer runs, each equal to
// transformers' form (bitwise where it says so), with the reasoning beside it.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace llm {

// HF's rotary, x * cos + rotate_half(x) * sin with rotate_half(x1, x2) = (-x2, x1), written without
// the negation, the concatenation and the two zero-filled slice gradients: roll(x, D/2) = (x2, x1)
// and the sign moves into the table, sin_signed = (-sin1, sin2). (-a) * b and a * (-b) round alike,
// and each element of the gradient gets the same two products summed in the same order, so the
// output is HF's bit for bit and the gradient value for value (HF's zero fills add a +0, which can
// turn a -0 gradient into +0; nothing else).
// x (B, heads, T, head_dim); cos, sin_signed (T, head_dim) in x's dtype.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin_signed);

// The same as one autograd node over x laid out (B, T, heads, head_dim), as the q and k projections
// write it (apply_rotary takes the (B, heads, T, D) view): one pass forward and one backward
// (model/rotary_functor.h), eager's roundings replayed; nothing saved but the tables. The CUDA kernel
// on a GPU (--fused_ops rotary), the same functions in a loop on the CPU (what the CPU tests check).
// x fp32 or bf16; the tables fp32, or bf16 with a bf16 x; the output bf16 when both are.
at::Tensor apply_rotary_fused(const at::Tensor& x_bthd, const at::Tensor& cos, const at::Tensor& sin_signed);

// sin (..., head_dim) -> (-sin1, sin2): the table apply_rotary takes.
at::Tensor rotary_signed_sine(const at::Tensor& sin);

// RMSNorm, weight * (x * rsqrt(mean(x^2) + eps)) over the last dim, as one autograd node that keeps
// x, the weight and rstd (fp32, one a row) for backward, against the composition's fp32 copy of x,
// its normalised x and more (4h bytes a token less per norm in pure bf16, 4h in fp32 and mixed).
//   aten: HF's operations (variance in fp32, the normalised x cast to x's dtype, then times the
//         weight), forward and backward: its backward is the one autograd derives for that
//         composition, operation for operation and summed in the same order, so it is bitwise HF's on
//         every device (tests/layer_ops_test.cpp); it is the form on CPU and the default on CUDA.
//   fused: LibTorch's CUDA kernels (at::_fused_rms_norm and its backward, one kernel each way): x *
//         rstd * weight rounded once, so pure bf16 differs from HF's two roundings by up to one bf16
//         ulp. CUDA only (--fused_ops rms_norm).
enum class RmsNormForm { aten, fused };

// SwiGLU, silu(gate) * up (gate, up: the MLP's two projections, same shape and dtype).
//   eager: ATen's silu and mul; autograd keeps gate, up and silu(gate).
//   fused: one node keeping gate and up only (I elements a token less per layer), its forward and
//          backward one pass each: model/swiglu_functor.h's element functions, the CUDA kernel
//          (model/layer_kernels.cu) on a GPU and the same functions in a loop on the CPU (what the CPU
//          tests check against eager). CUDA by choice: --fused_ops swiglu.
enum class SwigluForm { eager, fused };
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, SwigluForm form = SwigluForm::eager);

// The choices of --fused_ops (config/validation.cpp checks a list against them), and the set a
// validated list names ("" none), as recompute_set reads --recompute's.
// cross_entropy: the loss's single pass (model/cross_entropy.h's CrossEntropyForm::single_pass).
inline constexpr const char* kFusedOpChoices[] = {"rms_norm", "swiglu", "rotary", "cross_entropy"};
struct FusedOps {
  bool rms_norm = false, swiglu = false, rotary = false, cross_entropy = false;
  bool any() const { return rms_norm || swiglu || rotary || cross_entropy; }
};
FusedOps fused_ops_set(const std::string& list);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, RmsNormForm form = RmsNormForm::aten);

// The kernel at::scaled_dot_product_attention picks for causal attention of `heads` query heads
// over `kv_heads`, sequences of `seq` tokens and head_dim `head_dim` in `dtype` on `device` (ATen's
// own choice, at::_fused_sdp_choice, on empty inputs of those shapes): "flash_attention",
// "efficient_attention", "cudnn_attention", "math" or "overrideable". The run logs it once.
std::string attention_backend(int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim, at::ScalarType dtype,
                              at::Device device);

}  // namespace llm
