// How optimizer state kept in bf16 (--optimizer_state_dtype bfloat16) is rounded: stochastically,
// with random bits that are a pure function of (seed, step, parameter, moment, element index), so a
// run is reproducible and gives the same bits at any world size and thread count.
//
// Why stochastic: Adam's second moment moves by (1 - beta2) = 0.1 % of itself per step, below bf16's
// resolution (2^-8 = 0.39 %); rounded to nearest it would never decay. Rounded stochastically it is
// unbiased: E[round(x)] = x, so the moment follows its fp32 path on average.
//
//   stochastic_round_to_bfloat16(x, r)  (bits(x) + r) >> 16 with r uniform in [0, 2^16): rounds |x|
//                                       up with probability (the dropped fraction); NaN -> 0x7FC0
//   rounding_bits(key, i)               lowbias32(i ^ key): 32 random bits for element i; the first
//                                       moment takes the low 16, the second the high 16
//   rounding_key(seed, step, parameter) the per-tensor key, on the host (splitmix64)
//
// i is the element's index in the full (unsharded) parameter, flattened, modulo 2^32: a rank adds
// the index of its first element (its first row times the columns) to its local index. lowbias32 is
// Chris Wellons's 32-bit integer hash (a bijection with low bias); tests/state_rounding_reference.py
// repeats all of it in NumPy.
//
// This header must stay free of LibTorch: nvcc compiles it as C++17 without the LibTorch headers.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/bf16_bits.h"  // LLM_HOST_DEVICE, float_bits, bf16 bits <-> fp32

namespace llm {

// The random bits of one state tensor's elements at one step.
struct StateRounding {
  uint32_t key = 0;         // rounding_key(seed, step, parameter)
  uint32_t index_base = 0;  // the full parameter's index of this rank's first element (mod 2^32)
};

LLM_HOST_DEVICE uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

LLM_HOST_DEVICE uint32_t rounding_bits(uint32_t key, uint32_t index) { return lowbias32(index ^ key); }

// random16 < 2^16. Infinities stay infinite (their low half is zero and the carry cannot reach the
// exponent); the largest finite values may round up to infinity, as they should with that chance.
LLM_HOST_DEVICE uint16_t stochastic_round_to_bfloat16(float value, uint32_t random16) {
  if (value != value) return 0x7FC0;
  return static_cast<uint16_t>((float_bits(value) + random16) >> 16);
}

// A moment's 16 random bits from its element's 32: the first moment takes the low half, the second
// the high half.
LLM_HOST_DEVICE uint32_t moment_random16(uint32_t bits, bool second_moment) {
  return second_moment ? bits >> 16 : bits & 0xFFFFu;
}

// Element i of a moment (i counted from the rank's first element), stored under `rounding`.
LLM_HOST_DEVICE uint16_t round_moment_element(float value, const StateRounding& rounding, uint32_t i,
                                              bool second_moment) {
  return stochastic_round_to_bfloat16(
      value, moment_random16(rounding_bits(rounding.key, rounding.index_base + i), second_moment));
}

// splitmix64's finaliser.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The key of one parameter's state at one step: parameter is its index among the model's parameters
// (the same at every world size), step is 1-based.
inline uint32_t rounding_key(uint64_t seed, int64_t step, int64_t parameter) {
  const uint64_t mixed = splitmix64(splitmix64(seed) ^ (static_cast<uint64_t>(step) << 32) ^
                                    static_cast<uint64_t>(parameter));
  return static_cast<uint32_t>(mixed);
}

}  // namespace llm
