// The AVX-512 AdamW kernel: 16 floats per vector. Built with -mavx512f -ffp-contract=off
// (CMakeLists.txt): AVX512F includes FMA instructions, and -ffp-contract=off is what keeps the
// separate multiplies and adds separate. Selected at run time by optim/adamw_host.cpp only on CPUs
// that report AVX512F. Includes no LibTorch and no inline code shared with other units
// (optim/adamw_host.h explains the hazard).
#include "optim/adamw_host.h"

#if defined(__AVX512F__)
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves and -Wall reports
// each use as maybe-uninitialized (GCC bug 105593, fixed in 12.3 / 13): silence that one warning.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

namespace {

struct Vec {
  using Float = __m512;
  static constexpr int64_t kWidth = 16;

  static Float load(const float* from) { return _mm512_loadu_ps(from); }
  static void store(float* to, Float value) { _mm512_storeu_ps(to, value); }
  static Float broadcast(float value) { return _mm512_set1_ps(value); }
  static Float add(Float a, Float b) { return _mm512_add_ps(a, b); }
  static Float sub(Float a, Float b) { return _mm512_sub_ps(a, b); }
  static Float mul(Float a, Float b) { return _mm512_mul_ps(a, b); }
  static Float div(Float a, Float b) { return _mm512_div_ps(a, b); }
  static Float sqrt(Float a) { return _mm512_sqrt_ps(a); }

  // bf16 is the upper half of the fp32 pattern: widen to 32 bits and shift (exact).
  static Float load_bf16(const uint16_t* from) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  // c10::BFloat16's round_to_nearest_even: (bits + 0x7FFF + lowest kept bit) >> 16; NaN -> 0x7FC0.
  static void store_bf16(uint16_t* to, Float value) {
    const __m512i bits = _mm512_castps_si512(value);
    const __m512i kept_lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    store_shifted(to, value, _mm512_add_epi32(bits, _mm512_add_epi32(kept_lsb, _mm512_set1_epi32(0x7FFF))));
  }
  // optim/state_rounding.h's stochastic_round_to_bfloat16: (bits + random16) >> 16; NaN -> 0x7FC0.
  static void store_bf16_stochastic(uint16_t* to, Float value, __m512i random16) {
    store_shifted(to, value, _mm512_add_epi32(_mm512_castps_si512(value), random16));
  }

  // 32-bit lanes for the rounding bits (optim/state_rounding.h).
  using Int = __m512i;
  static Int lane_indices(uint32_t first) {
    return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)),
                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  }
  static Int broadcast_int(uint32_t value) { return _mm512_set1_epi32(static_cast<int>(value)); }
  static Int bit_xor(Int a, Int b) { return _mm512_xor_si512(a, b); }
  static Int bit_and(Int a, Int b) { return _mm512_and_si512(a, b); }
  template <int kBits>
  static Int shift_right(Int a) { return _mm512_srli_epi32(a, kBits); }
  static Int multiply_low(Int a, Int b) { return _mm512_mullo_epi32(a, b); }

 private:
  // Stores the upper 16 bits of each lane of `sum` (NaN lanes of value: 0x7FC0).
  static void store_shifted(uint16_t* to, Float value, __m512i sum) {
    const __m512i rounded = _mm512_srli_epi32(sum, 16);
    const __mmask16 ordered = _mm512_cmp_ps_mask(value, value, _CMP_ORD_Q);
    const __m512i result = _mm512_mask_blend_epi32(ordered, _mm512_set1_epi32(0x7FC0), rounded);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), _mm512_cvtepi32_epi16(result));  // vpmovdw
  }
};

}  // namespace

#define LLM_ADAMW_HOST_SIMD_KERNEL
#include "optim/adamw_host_simd.h"

void llm::detail::adamw_host_range_avx512(const AdamWHostArrays& arrays,
                                          const AdamWScalars& scalars, int64_t begin,
                                          int64_t end) {
  update_range_any<Vec>(arrays, scalars, begin, end);
}

#else  // not built for AVX-512 (not x86-64, or a compiler without the flag): never selected

#include <cstdlib>

void llm::detail::adamw_host_range_avx512(const AdamWHostArrays&, const AdamWScalars&, int64_t,
                                          int64_t) {
  std::abort();  // host_isa_supported(HostIsa::avx512) is false in this build
}

#endif
