// SwiGLU, silu(gate) * up, forward and backward for one element, written once and compiled twice:
// by the host compiler for the CPU loop (model/layer_ops.cpp) and by nvcc for the CUDA kernel
// (model/layer_kernels.cu). Each step replays ATen's eager operations and their roundings in the
// element type T (fp32, or bf16 computed in fp32 and rounded where ATen's tensors are bf16):
//
//   s   = T(g / (1 + exp(-g)))                         at::silu (opmath fp32)
//   out = T(s * u)                                     mul
//   ds  = T(dout * u),  du = T(dout * s)               mul's backward (the product's two inputs)
//   dg  = T(ds * sig * (1 + g * (1 - sig))), sig = 1 / (1 + exp(-g))    at::silu_backward
//
// so the fused node keeps gate and up only (the composition also keeps s for mul's backward) and
// gives eager's numbers: bit for bit where both evaluate exp alike (the CUDA kernel uses expf, as
// ATen's CUDA kernels do; ATen's CPU kernels vectorise exp with Sleef, within an ulp of std::exp).
// LibTorch-free: nvcc compiles it as C++17.
#pragma once

#include <cmath>
#include <cstdint>

#include "model/element_io.h"  // element_to_float, store_element, round_like, exp_like_aten

namespace llm {

// Element i of out = silu(gate) * up. T: float, or uint16_t for bf16 bits.
template <typename T>
struct SwigluForward {
  const T* gate;
  const T* up;
  T* out;
  LLM_HOST_DEVICE void operator()(int64_t i) const {
    const float g = element_to_float(gate[i]);
    const float s = round_like(T{}, g / (1.0f + exp_like_aten(-g)));
    store_element(out + i, s * element_to_float(up[i]));
  }
};

// Element i of d gate and d up from d out.
template <typename T>
struct SwigluBackward {
  const T* grad;
  const T* gate;
  const T* up;
  T* grad_gate;
  T* grad_up;
  LLM_HOST_DEVICE void operator()(int64_t i) const {
    const float g = element_to_float(gate[i]), u = element_to_float(up[i]), dout = element_to_float(grad[i]);
    const float s = round_like(T{}, g / (1.0f + exp_like_aten(-g)));
    const float ds = round_like(T{}, dout * u);
    store_element(grad_up + i, dout * s);
    const float sigmoid = 1.0f / (1.0f + exp_like_aten(-g));
    store_element(grad_gate + i, ds * sigmoid * (1.0f + g * (1.0f - sigmoid)));
  }
};

}  // namespace llm
