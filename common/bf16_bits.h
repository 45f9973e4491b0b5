// bf16 as its 16 bits, for code that nvcc compiles without LibTorch (the AdamW functor, the
// layer kernels' element functions): fp32 <-> bf16 bits, and the host/device function marker.
#pragma once

#include <cstdint>
#include <cstring>

// Host and device functions (nvcc), plain inline functions elsewhere.
#ifndef LLM_HOST_DEVICE
#ifdef __CUDACC__
#define LLM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LLM_HOST_DEVICE inline
#endif
#endif

namespace llm {

LLM_HOST_DEVICE uint32_t float_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

LLM_HOST_DEVICE float bfloat16_bits_to_float(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
#ifdef __CUDA_ARCH__
  return __uint_as_float(widened);
#else
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
#endif
}

// fp32 -> bf16 bits, round to nearest even (c10::BFloat16's rounding; NaN stays NaN).
LLM_HOST_DEVICE uint16_t float_to_bfloat16_bits_nearest(float value) {
  if (value != value) return 0x7FC0;
  const uint32_t bits = float_bits(value);
  return static_cast<uint16_t>((bits + (((bits >> 16) & 1u) + 0x7FFFu)) >> 16);
}

}  // namespace llm
