#include "model/layer_ops.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_rms_norm.h>
#include <ATen/ops/_fused_rms_norm_backward.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/roll.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/silu.h>
#include <torch/autograd.h>

#include "common/errors.h"
#include "common/split.h"
#include "model/rotary_functor.h"
#include "model/swiglu_functor.h"
#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "model/layer_kernels.h"
#endif

namespace llm {
namespace {

// The composition's forward, keeping rstd: x32 = x in fp32, r = rsqrt(mean(x32^2) + eps),
// out = weight * (x32 * r).to(x's dtype).
std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor rstd = at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return {weight * (x32 * rstd).to(x.scalar_type()), rstd};
}

// Inputs (x, x again, weight): autograd sums the gradients reaching x in arrival order. The
// composition's fp32 x gets three: the residual's (first: the add was recorded after the norm), then
// the product x * r's, then the square's; handing x's two terms back as two inputs' gradients
// repeats that order. In another dtype they meet in the cast's node, summed, then cast, as here.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& x, const at::Tensor& x_again,
                            const at::Tensor& weight, double eps, bool fused) {
    (void)x_again;
    at::Tensor out, rstd;
    if (fused) {
      std::tie(out, rstd) = at::_fused_rms_norm(x, {x.size(-1)}, weight, eps);
    } else {
      std::tie(out, rstd) = rms_norm_forward(x, weight, eps);
    }
    context->save_for_backward({x, weight, rstd});
    context->saved_data["fused"] = fused;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list output_grads) {
    const torch::autograd::variable_list saved = context->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::Tensor& grad = output_grads[0];
    if (context->saved_data["fused"].toBool()) {
      auto [grad_x, grad_weight] =
          at::_fused_rms_norm_backward(grad, x, {x.size(-1)}, rstd, weight, {true, weight.requires_grad()});
      return {grad_x, at::Tensor(), grad_weight, at::Tensor(), at::Tensor()};
    }
    // Each line is the derivative autograd records for the forward's operation, in the order its
    // engine runs them (tools/autograd/derivatives.yaml, torch/csrc/autograd/FunctionsManual.cpp).
    const at::Tensor x32 = x.to(at::kFloat);
    const at::Tensor normed32 = x32 * rstd;
    const at::Tensor normed = normed32.to(x.scalar_type());
    // weight * normed: mul's two gradients; the weight's summed to its shape as the engine does.
    // (The engine casts a gradient to its input's dtype where they differ: the two .to below.)
    const at::Tensor grad_weight =
        weight.requires_grad() ? at::sum_to(grad * normed, weight.sizes()).to(weight.scalar_type()) : at::Tensor();
    const at::Tensor grad_normed32 = (grad * weight).to(normed.scalar_type()).to(at::kFloat);  // and the cast's backward
    // x32 * rstd: x32's gradient, and rstd's summed over the row.
    const at::Tensor grad_x_product = grad_normed32 * rstd;
    const at::Tensor grad_rstd = at::sum_to(grad_normed32 * x32, rstd.sizes());
    // rsqrt: -0.5 * grad * result^3; + eps passes it; mean: expanded, divided by the row's length;
    // pow(2): grad * (2 * x32^1).
    const at::Tensor grad_variance = -0.5 * grad_rstd * rstd.pow(3);
    const at::Tensor grad_square = grad_variance.expand(x32.sizes()).div(x32.size(-1));
    const at::Tensor grad_x_square = grad_square * (2.0 * x32.pow(1.0));
    if (x.scalar_type() == at::kFloat) return {grad_x_product, grad_x_square, grad_weight, at::Tensor(), at::Tensor()};
    return {(grad_x_product + grad_x_square).to(x.scalar_type()), at::Tensor(), grad_weight, at::Tensor(), at::Tensor()};
  }
};

bool is_bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }

template <typename Functor>
void for_each_element_on_host(const Functor& functor, int64_t numel) {
  at::parallel_for(0, numel, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) functor(i);
  });
}

template <typename T>
const T* elements(const at::Tensor& t) { return static_cast<const T*>(t.const_data_ptr()); }
template <typename T>
T* mutable_elements(at::Tensor& t) { return static_cast<T*>(t.data_ptr()); }

// The fused SwiGLU's two passes over contiguous tensors of one dtype (fp32 or bf16), on their device.
at::Tensor swiglu_forward_pass(const at::Tensor& gate, const at::Tensor& up) {
  at::Tensor out = at::empty_like(gate);
  if (gate.is_cuda()) {
#ifdef TRAINER_HAVE_CUDA
    const c10::cuda::CUDAGuard guard(gate.device());
    launch_swiglu_forward_cuda(gate.const_data_ptr(), up.const_data_ptr(), out.data_ptr(), gate.numel(), is_bf16(gate),
                               c10::cuda::getCurrentCUDAStream(gate.device().index()));
    return out;
#else
    throw SystemError("swiglu: a CUDA tensor, and this build has no CUDA kernels");
#endif
  }
  if (is_bf16(gate))
    for_each_element_on_host(SwigluForward<uint16_t>{elements<uint16_t>(gate), elements<uint16_t>(up),
                                                     mutable_elements<uint16_t>(out)}, gate.numel());
  else
    for_each_element_on_host(SwigluForward<float>{elements<float>(gate), elements<float>(up), mutable_elements<float>(out)},
                             gate.numel());
  return out;
}

std::pair<at::Tensor, at::Tensor> swiglu_backward_pass(const at::Tensor& grad, const at::Tensor& gate,
                                                       const at::Tensor& up) {
  at::Tensor grad_gate = at::empty_like(gate), grad_up = at::empty_like(up);
  if (gate.is_cuda()) {
#ifdef TRAINER_HAVE_CUDA
    const c10::cuda::CUDAGuard guard(gate.device());
    launch_swiglu_backward_cuda(grad.const_data_ptr(), gate.const_data_ptr(), up.const_data_ptr(), grad_gate.data_ptr(),
                                grad_up.data_ptr(), gate.numel(), is_bf16(gate),
                                c10::cuda::getCurrentCUDAStream(gate.device().index()));
    return {grad_gate, grad_up};
#else
    throw SystemError("swiglu: a CUDA tensor, and this build has no CUDA kernels");
#endif
  }
  if (is_bf16(gate))
    for_each_element_on_host(SwigluBackward<uint16_t>{elements<uint16_t>(grad), elements<uint16_t>(gate),
                                                      elements<uint16_t>(up), mutable_elements<uint16_t>(grad_gate),
                                                      mutable_elements<uint16_t>(grad_up)}, gate.numel());
  else
    for_each_element_on_host(SwigluBackward<float>{elements<float>(grad), elements<float>(gate), elements<float>(up),
                                                   mutable_elements<float>(grad_gate), mutable_elements<float>(grad_up)},
                             gate.numel());
  return {grad_gate, grad_up};
}

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& gate, const at::Tensor& up) {
    context->save_for_backward({gate, up});
    return swiglu_forward_pass(gate, up);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list output_grads) {
    const torch::autograd::variable_list saved = context->get_saved_variables();
    auto [grad_gate, grad_up] = swiglu_backward_pass(output_grads[0].contiguous(), saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};

// forward: in = x, out in the output's dtype; backward: in = d out, out = d x in x's dtype.
at::Tensor rotary_pass(bool forward, const at::Tensor& in, const at::Tensor& cos, const at::Tensor& sin,
                       at::ScalarType x_type) {
  const bool x_bf16 = x_type == at::kBFloat16, tables_bf16 = is_bf16(cos);
  const at::ScalarType out_type = forward ? (x_bf16 && tables_bf16 ? at::kBFloat16 : at::kFloat) : x_type;
  at::Tensor out = at::empty(in.sizes(), in.options().dtype(out_type));
  const RotaryGeometry shape{in.size(1), in.size(2), in.size(3)};
  if (in.is_cuda()) {
#ifdef TRAINER_HAVE_CUDA
    const c10::cuda::CUDAGuard guard(in.device());
    launch_rotary_cuda(forward, in.const_data_ptr(), cos.const_data_ptr(), sin.const_data_ptr(), out.data_ptr(),
                       in.size(0), shape.seq, shape.heads, shape.head_dim, x_bf16, tables_bf16,
                       c10::cuda::getCurrentCUDAStream(in.device().index()));
    return out;
#else
    throw SystemError("rotary: a CUDA tensor, and this build has no CUDA kernels");
#endif
  }
  // The kernel's algorithm on the host (what the CPU tests check).
  const auto run = [&](const auto& pass) { for_each_element_on_host(pass, in.numel()); };
  if (forward)
    with_rotary_pass<RotaryForward>(x_bf16, tables_bf16, in.const_data_ptr(), cos.const_data_ptr(), sin.const_data_ptr(),
                                    out.data_ptr(), shape, run);
  else
    with_rotary_pass<RotaryBackward>(x_bf16, tables_bf16, in.const_data_ptr(), cos.const_data_ptr(), sin.const_data_ptr(),
                                     out.data_ptr(), shape, run);
  return out;
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    context->save_for_backward({cos, sin});
    context->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    return rotary_pass(true, x, cos, sin, x.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list output_grads) {
    const torch::autograd::variable_list saved = context->get_saved_variables();
    const auto x_type = static_cast<at::ScalarType>(context->saved_data["x_type"].toInt());
    return {rotary_pass(false, output_grads[0].contiguous(), saved[0], saved[1], x_type), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor apply_rotary_fused(const at::Tensor& x_bthd, const at::Tensor& cos, const at::Tensor& sin_signed) {
  const bool types_ok = (x_bthd.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat) ||
                        (x_bthd.scalar_type() == at::kBFloat16 &&
                         (cos.scalar_type() == at::kFloat || cos.scalar_type() == at::kBFloat16));
  LLM_REQUIRE(x_bthd.dim() == 4 && cos.dim() == 2 && cos.size(0) == x_bthd.size(1) && cos.size(1) == x_bthd.size(3) &&
                  x_bthd.size(3) % 2 == 0 && cos.sizes() == sin_signed.sizes() &&
                  cos.scalar_type() == sin_signed.scalar_type() && types_ok && x_bthd.device() == cos.device(),
              "rotary", "fused", "needs x (B, T, heads, D), tables (T, D) on its device, x fp32 or bf16, tables fp32 or bf16 with a bf16 x");
  const at::Tensor x = x_bthd.contiguous(), c = cos.contiguous(), s = sin_signed.contiguous();
  if (at::GradMode::is_enabled() && x.requires_grad()) return RotaryFunction::apply(x, c, s);
  return rotary_pass(true, x, c, s, x.scalar_type());
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, SwigluForm form) {
  if (form == SwigluForm::eager) return at::silu(gate) * up;
  LLM_REQUIRE(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type() && gate.device() == up.device() &&
                  (gate.scalar_type() == at::kFloat || gate.scalar_type() == at::kBFloat16),
              "swiglu", "fused", "needs gate and up of one shape, device and dtype (fp32 or bf16)");
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  if (at::GradMode::is_enabled() && (gate.requires_grad() || up.requires_grad())) return SwigluFunction::apply(g, u);
  return swiglu_forward_pass(g, u);
}

FusedOps fused_ops_set(const std::string& list) {
  FusedOps set;
  if (list.empty()) return set;
  for (const std::string& item : split_list(list)) {
    set.rms_norm = set.rms_norm || item == "rms_norm";
    set.swiglu = set.swiglu || item == "swiglu";
    set.rotary = set.rotary || item == "rotary";
    set.cross_entropy = set.cross_entropy || item == "cross_entropy";
  }
  return set;
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin_signed) {
  return x * cos + at::roll(x, x.size(-1) / 2, -1) * sin_signed;
}

at::Tensor rotary_signed_sine(const at::Tensor& sin) {
  const int64_t half = sin.size(-1) / 2;
  return at::cat({-sin.slice(-1, 0, half), sin.slice(-1, half)}, -1);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, RmsNormForm form) {
  const bool fused = form == RmsNormForm::fused;
  if (fused && !x.is_cuda())
    throw std::logic_error("rms_norm: the fused form is LibTorch's CUDA kernel; x is on " + x.device().str());
  const bool tracked = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  if (!tracked) return fused ? std::get<0>(at::_fused_rms_norm(x, {x.size(-1)}, weight, eps)) : rms_norm_forward(x, weight, eps).first;
  return RmsNormFunction::apply(x, x, weight, eps, fused);
}

std::string attention_backend(int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim, at::ScalarType dtype,
                              at::Device device) {
  const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor q = at::empty({1, heads, seq, head_dim}, options);
  const at::Tensor kv = at::empty({1, kv_heads, seq, head_dim}, options);
  const int64_t choice = at::_fused_sdp_choice(q, kv, kv, /*attn_mask=*/{}, 0.0, /*is_causal=*/true, std::nullopt,
                                               /*enable_gqa=*/kv_heads != heads);
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::flash_attention: return "flash_attention";
    case at::SDPBackend::efficient_attention: return "efficient_attention";
    case at::SDPBackend::cudnn_attention: return "cudnn_attention";
    case at::SDPBackend::overrideable: return "overrideable";
    case at::SDPBackend::error: break;
  }
  return "error (no kernel)";
}

}  // namespace llm
