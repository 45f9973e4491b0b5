// The AVX2 AdamW kernel: 8 floats per vector. Built with -mavx2 -ffp-contract=off and without -mfma
// (CMakeLists.txt), so the compiler cannot fuse a multiply and an add even if it wanted to; selected
// at run time by optim/adamw_host.cpp only on CPUs that report AVX2. Includes no LibTorch and no
// inline code shared with other units (optim/adamw_host.h explains the hazard).
#include "optim/adamw_host.h"

#if defined(__AVX2__)
#include <immintrin.h>

namespace {

struct Vec {
  using Float = __m256;
  using Int = __m256i;
  static constexpr int64_t kWidth = 8;

  static Float load(const float* from) { return _mm256_loadu_ps(from); }
  static void store(float* to, Float value) { _mm256_storeu_ps(to, value); }
  static Float broadcast(float value) { return _mm256_set1_ps(value); }
  static Float add(Float a, Float b) { return _mm256_add_ps(a, b); }
  static Float sub(Float a, Float b) { return _mm256_sub_ps(a, b); }
  static Float mul(Float a, Float b) { return _mm256_mul_ps(a, b); }
  static Float div(Float a, Float b) { return _mm256_div_ps(a, b); }
  static Float sqrt(Float a) { return _mm256_sqrt_ps(a); }

  // bf16 is the upper half of the fp32 pattern: widen to 32 bits and shift (exact).
  static Float load_bf16(const uint16_t* from) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
  // c10::BFloat16's round_to_nearest_even: (bits + 0x7FFF + lowest kept bit) >> 16; NaN -> 0x7FC0.
  static void store_bf16(uint16_t* to, Float value) {
    const __m256i bits = _mm256_castps_si256(value);
    const __m256i kept_lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    store_shifted(to, value, _mm256_add_epi32(bits, _mm256_add_epi32(kept_lsb, _mm256_set1_epi32(0x7FFF))));
  }
  // optim/state_rounding.h's stochastic_round_to_bfloat16: (bits + random16) >> 16; NaN -> 0x7FC0.
  static void store_bf16_stochastic(uint16_t* to, Float value, Int random16) {
    store_shifted(to, value, _mm256_add_epi32(_mm256_castps_si256(value), random16));
  }

  // 32-bit lanes for the rounding bits (optim/state_rounding.h).
  static Int lane_indices(uint32_t first) {
    return _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Int broadcast_int(uint32_t value) { return _mm256_set1_epi32(static_cast<int>(value)); }
  static Int bit_xor(Int a, Int b) { return _mm256_xor_si256(a, b); }
  static Int bit_and(Int a, Int b) { return _mm256_and_si256(a, b); }
  template <int kBits>
  static Int shift_right(Int a) { return _mm256_srli_epi32(a, kBits); }
  static Int multiply_low(Int a, Int b) { return _mm256_mullo_epi32(a, b); }

 private:
  // Stores the upper 16 bits of each lane of `sum` (NaN lanes of value: 0x7FC0).
  static void store_shifted(uint16_t* to, Float value, __m256i sum) {
    __m256i rounded = _mm256_srli_epi32(sum, 16);
    const __m256 ordered = _mm256_cmp_ps(value, value, _CMP_ORD_Q);
    rounded = _mm256_blendv_epi8(_mm256_set1_epi32(0x7FC0), rounded, _mm256_castps_si256(ordered));
    // Pack the eight 32-bit lanes (each < 2^16, so unsigned saturation is a plain narrowing) to
    // 16 bits: packus works per 128-bit half, the permute brings the two halves' results together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to), _mm256_castsi256_si128(packed));
  }
};

}  // namespace

#define LLM_ADAMW_HOST_SIMD_KERNEL
#include "optim/adamw_host_simd.h"

void llm::detail::adamw_host_range_avx2(const AdamWHostArrays& arrays, const AdamWScalars& scalars,
                                        int64_t begin, int64_t end) {
  update_range_any<Vec>(arrays, scalars, begin, end);
}

#else  // not built for AVX2 (not x86-64, or a compiler without the flag): never selected

#include <cstdlib>

void llm::detail::adamw_host_range_avx2(const AdamWHostArrays&, const AdamWScalars&, int64_t,
                                        int64_t) {
  std::abort();  // host_isa_supported(HostIsa::avx2) is false in this build
}

#endif
