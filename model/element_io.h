// Reading and writing one element of an fp32 or bf16 tensor in the fused kernels' element functions
// (model/swiglu_functor.h, model/rotary_functor.h, model/cross_entropy_functor.h), which the host
// compiler builds for the CPU loops and nvcc for the CUDA kernels. T is float, or uint16_t for bf16 bits.
// LibTorch-free: nvcc compiles it as C++17.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/bf16_bits.h"  // LLM_HOST_DEVICE, bfloat16 bits <-> fp32

namespace llm {

// An element as fp32, and an fp32 value rounded to the element type (nearest even for bf16, as a
// bf16 tensor stores ATen's fp32 result).
LLM_HOST_DEVICE float element_to_float(float value) { return value; }
LLM_HOST_DEVICE float element_to_float(uint16_t bf16_bits) { return bfloat16_bits_to_float(bf16_bits); }
LLM_HOST_DEVICE void store_element(float* to, float value) { *to = value; }
LLM_HOST_DEVICE void store_element(uint16_t* to, float value) { *to = float_to_bfloat16_bits_nearest(value); }
LLM_HOST_DEVICE float round_like(float, float value) { return value; }
LLM_HOST_DEVICE float round_like(uint16_t, float value) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits_nearest(value));
}

// exp and log as ATen's kernels evaluate them: the CUDA math library's on the device, libm's here.
LLM_HOST_DEVICE float exp_like_aten(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);
#else
  return std::exp(x);
#endif
}
LLM_HOST_DEVICE float log_like_aten(float x) {
#ifdef __CUDA_ARCH__
  return logf(x);
#else
  return std::log(x);
#endif
}

}  // namespace llm
