// The body of the vector AdamW kernels, written once over a vector type and compiled once per ISA:
// included only by optim/adamw_host_avx2.cpp and optim/adamw_host_avx512.cpp, each of which defines
// its vector type (`Vec`, below) and is compiled with its ISA's flags.
//
// Everything here has internal linkage (an unnamed namespace) and calls nothing inline from another
// header: code compiled with -mavx512f must never be a copy the linker can share with a unit built
// for a lesser CPU (optim/adamw_host.h says why). The element maths is the functor's
// (optim/adamw_functor.h) operation for operation, one vector of elements at a time:
//
//   decayed = p * decay_factor
//   m'      = (lerp_from_start ? m : g) + lerp_coefficient * (g - m)
//   v'      = v * beta2 + (one_minus_beta2 * g) * g
//   denom   = sqrt(v') / bias_correction2_sqrt + eps
//   p'      = decayed + (negative_step_size * m') / denom
//
// with separate multiplies and adds (the units are built with -ffp-contract=off, so none becomes an
// FMA) and IEEE vdivps / vsqrtps, which round exactly as the scalar divss / sqrtss do: the same bits.
//
// A vector type provides, for kWidth floats: Float, load, store, broadcast, add, sub, mul, div,
// sqrt, load_bf16 (bf16 bits -> fp32, exact), store_bf16 (fp32 -> bf16 bits, round to nearest
// even, NaN -> 0x7FC0: c10::BFloat16's rounding), store_bf16_stochastic (bf16 state: bits plus 16
// random bits, shifted; optim/state_rounding.h), and for the random bits 32-bit lanes: Int,
// lane_indices, broadcast_int, bit_xor, bit_and, shift_right<k>, multiply_low.
#ifndef LLM_ADAMW_HOST_SIMD_KERNEL
#error "optim/adamw_host_simd.h is the body of an ISA translation unit; include it from one"
#endif

namespace {

// Prefetches the line `bytes` after `from` into L1. The address is formed as an integer: it may
// lie past the end of the array (a prefetch never faults), where pointer arithmetic would be
// undefined.
void prefetch(const void* from, uintptr_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(from) + bytes), _MM_HINT_T0);
}

// optim/state_rounding.h's rounding_bits for kWidth consecutive elements from `first`.
template <class Vec>
typename Vec::Int rounding_bits(const llm::StateRounding& rounding, int64_t first) {
  using Int = typename Vec::Int;
  Int x = Vec::bit_xor(Vec::lane_indices(rounding.index_base + static_cast<uint32_t>(first)),
                       Vec::broadcast_int(rounding.key));
  x = Vec::bit_xor(x, Vec::template shift_right<16>(x));
  x = Vec::multiply_low(x, Vec::broadcast_int(0x7feb352du));
  x = Vec::bit_xor(x, Vec::template shift_right<15>(x));
  x = Vec::multiply_low(x, Vec::broadcast_int(0x846ca68bu));
  return Vec::bit_xor(x, Vec::template shift_right<16>(x));
}

template <class Vec, bool kGradBf16, bool kLerpFromStart, bool kWriteCompute, bool kStateBf16>
void update_range(const llm::AdamWHostArrays& arrays, const llm::AdamWScalars& scalars,
                  int64_t begin, int64_t end) {
  using Float = typename Vec::Float;
  float* __restrict param = arrays.param;
  const float* __restrict grad_fp32 = static_cast<const float*>(arrays.grad);
  const uint16_t* __restrict grad_bf16 = static_cast<const uint16_t*>(arrays.grad);
  float* __restrict exp_avg = arrays.exp_avg;
  float* __restrict exp_avg_sq = arrays.exp_avg_sq;
  uint16_t* __restrict compute_out = arrays.compute_out;
  uint16_t* __restrict exp_avg_bf16 = arrays.exp_avg_bf16;
  uint16_t* __restrict exp_avg_sq_bf16 = arrays.exp_avg_sq_bf16;
  // What the step reads: the outputs themselves (in place), or the values before an out-of-place
  // step. Not __restrict: in place they are the outputs.
  const float* param_in = arrays.param_from != nullptr ? arrays.param_from : param;
  const float* exp_avg_in = arrays.exp_avg_from != nullptr ? static_cast<const float*>(arrays.exp_avg_from) : exp_avg;
  const float* exp_avg_sq_in =
      arrays.exp_avg_sq_from != nullptr ? static_cast<const float*>(arrays.exp_avg_sq_from) : exp_avg_sq;
  const uint16_t* exp_avg_bf16_in =
      arrays.exp_avg_from != nullptr ? static_cast<const uint16_t*>(arrays.exp_avg_from) : exp_avg_bf16;
  const uint16_t* exp_avg_sq_bf16_in =
      arrays.exp_avg_sq_from != nullptr ? static_cast<const uint16_t*>(arrays.exp_avg_sq_from) : exp_avg_sq_bf16;

  const Float decay_factor = Vec::broadcast(scalars.decay_factor);
  const Float lerp_coefficient = Vec::broadcast(scalars.exp_avg_lerp_coefficient);
  const Float beta2 = Vec::broadcast(scalars.beta2);
  const Float one_minus_beta2 = Vec::broadcast(scalars.one_minus_beta2);
  const Float bias_correction2_sqrt = Vec::broadcast(scalars.bias_correction2_sqrt);
  const Float eps = Vec::broadcast(scalars.eps);
  const Float negative_step_size = Vec::broadcast(scalars.negative_step_size);
  const Float gradient_scale = Vec::broadcast(scalars.gradient_scale);

  // Always inlined: GCC 12 left this body out of line in every bf16-state instantiation of the
  // AVX2 unit (a call per vector, the scalars reloaded through memory each time); inlined, that
  // step's arithmetic in cache took 6-41 % less time in 5 of 5 interleaved pairs on an Intel Xeon
  // (docs/optimizers.md). The other instantiations were inlined already.
  const auto update_vector = [&](int64_t i) __attribute__((always_inline)) {
    const Float gradient =
        Vec::mul(kGradBf16 ? Vec::load_bf16(grad_bf16 + i) : Vec::load(grad_fp32 + i), gradient_scale);
    const Float first = kStateBf16 ? Vec::load_bf16(exp_avg_bf16_in + i) : Vec::load(exp_avg_in + i);
    const Float second = kStateBf16 ? Vec::load_bf16(exp_avg_sq_bf16_in + i) : Vec::load(exp_avg_sq_in + i);
    const Float decayed_param = Vec::mul(Vec::load(param_in + i), decay_factor);
    const Float first_moment = Vec::add(kLerpFromStart ? first : gradient,
                                        Vec::mul(lerp_coefficient, Vec::sub(gradient, first)));
    const Float second_moment = Vec::add(Vec::mul(second, beta2),
                                         Vec::mul(Vec::mul(one_minus_beta2, gradient), gradient));
    const Float denominator =
        Vec::add(Vec::div(Vec::sqrt(second_moment), bias_correction2_sqrt), eps);
    const Float updated =
        Vec::add(decayed_param, Vec::div(Vec::mul(negative_step_size, first_moment), denominator));
    Vec::store(param + i, updated);
    if constexpr (kStateBf16) {
      const auto random = rounding_bits<Vec>(arrays.rounding, i);
      Vec::store_bf16_stochastic(exp_avg_bf16 + i, first_moment, Vec::bit_and(random, Vec::broadcast_int(0xFFFFu)));
      Vec::store_bf16_stochastic(exp_avg_sq_bf16 + i, second_moment, Vec::template shift_right<16>(random));
    } else {
      Vec::store(exp_avg + i, first_moment);
      Vec::store(exp_avg_sq + i, second_moment);
    }
    if (kWriteCompute) Vec::store_bf16(compute_out + i, updated);
  };

  // One 64-byte line of each fp32 array per iteration, and a prefetch of the line kPrefetchAhead
  // elements on. The hardware prefetchers stop at every 4 KiB page, and past a few hundred MB the
  // page walks themselves miss the caches; the software prefetch runs ahead across both (measured
  // on the 2-core EPYC, interleaved with the same loop without it: +10 to +30 % at 2^26 elements,
  // no difference beyond the noise at 2^22 and 2^24). Once a page (1024 fp32), one more touch four
  // pages on starts the page walk early (another +0 to +13 % at 2^26, measured the same way).
  constexpr int64_t kLine = 16;
  constexpr int64_t kPrefetchAhead = 256;
  constexpr int64_t kPageWalkEvery = 1024;
  constexpr int64_t kPageWalkAhead = 4096;
  // Every array's element i + elements_ahead (the gradient's in its own width).
  const auto prefetch_arrays = [&](int64_t i, int64_t elements_ahead) {
    prefetch(param_in + i, elements_ahead * sizeof(float));
    if (kStateBf16) {
      prefetch(exp_avg_bf16_in + i, elements_ahead * sizeof(uint16_t));
      prefetch(exp_avg_sq_bf16_in + i, elements_ahead * sizeof(uint16_t));
    } else {
      prefetch(exp_avg_in + i, elements_ahead * sizeof(float));
      prefetch(exp_avg_sq_in + i, elements_ahead * sizeof(float));
    }
    if (kGradBf16)
      prefetch(grad_bf16 + i, elements_ahead * sizeof(uint16_t));
    else
      prefetch(grad_fp32 + i, elements_ahead * sizeof(float));
  };
  int64_t i = begin;
  for (; i + kLine <= end; i += kLine) {
    prefetch_arrays(i, kPrefetchAhead);
    if (((i - begin) & (kPageWalkEvery - 1)) == 0) prefetch_arrays(i, kPageWalkAhead);
    for (int64_t j = 0; j < kLine; j += Vec::kWidth) update_vector(i + j);
  }
  for (; i + Vec::kWidth <= end; i += Vec::kWidth) update_vector(i);
  if (i < end) llm::detail::adamw_host_range_scalar(arrays, scalars, i, end);
}

// The sixteen instantiations, picked from the arguments once per call.
template <class Vec, bool kGradBf16, bool kLerpFromStart, bool kWriteCompute>
void update_range_state(const llm::AdamWHostArrays& arrays, const llm::AdamWScalars& scalars,
                        int64_t begin, int64_t end) {
  if (arrays.exp_avg_bf16 != nullptr)  // not state_is_bf16(): no inline code shared across ISAs
    update_range<Vec, kGradBf16, kLerpFromStart, kWriteCompute, true>(arrays, scalars, begin, end);
  else
    update_range<Vec, kGradBf16, kLerpFromStart, kWriteCompute, false>(arrays, scalars, begin, end);
}

template <class Vec, bool kGradBf16, bool kLerpFromStart>
void update_range_output(const llm::AdamWHostArrays& arrays, const llm::AdamWScalars& scalars,
                         int64_t begin, int64_t end) {
  if (arrays.compute_out != nullptr)
    update_range_state<Vec, kGradBf16, kLerpFromStart, true>(arrays, scalars, begin, end);
  else
    update_range_state<Vec, kGradBf16, kLerpFromStart, false>(arrays, scalars, begin, end);
}

template <class Vec, bool kGradBf16>
void update_range_lerp(const llm::AdamWHostArrays& arrays, const llm::AdamWScalars& scalars,
                       int64_t begin, int64_t end) {
  if (scalars.exp_avg_lerp_from_start)
    update_range_output<Vec, kGradBf16, true>(arrays, scalars, begin, end);
  else
    update_range_output<Vec, kGradBf16, false>(arrays, scalars, begin, end);
}

template <class Vec>
void update_range_any(const llm::AdamWHostArrays& arrays, const llm::AdamWScalars& scalars,
                      int64_t begin, int64_t end) {
  if (arrays.grad_is_bf16)
    update_range_lerp<Vec, true>(arrays, scalars, begin, end);
  else
    update_range_lerp<Vec, false>(arrays, scalars, begin, end);
}

}  // namespace
