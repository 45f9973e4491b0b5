// The AdamW update of one element, written once and compiled twice: by the host compiler for the
// scalar host kernel in optim/adamw_host.cpp (the reference the AVX2 / AVX-512 kernels of
// optim/adamw_host_simd.h repeat operation for operation, and their tails) and by nvcc for the
// Thrust kernel in optim/adamw_cuda.cu. It follows torch.optim.AdamW's single-tensor path (non-foreach, non-amsgrad)
// operation by operation, in fp32 and in the same order, so that the two agree to rounding:
//
//   g = g * s                                grad.mul_(clip coefficient), folded in (s = 1: none)
//   p = p * (1 - lr * wd)                    param.mul_(1 - lr * weight_decay)
//   m = m + (1 - beta1) * (g - m)            exp_avg.lerp_(grad, 1 - beta1)   (beta1 > 0.5; below,
//                                            lerp's other form: see lerp_like_torch)
//   v = v * beta2 + ((1 - beta2) * g) * g    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
//   d = sqrt(v) / sqrt(1 - beta2^t) + eps    (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
//   p = p + (-lr / (1 - beta1^t) * m) / d    param.addcdiv_(exp_avg, denom, value=-step_size)
//
// Every per-call scalar is computed once on the host in double (as Python does) and rounded to fp32
// (as the ATen kernels do) in make_adamw_scalars; the functor only does the per-element work.
//
// This header must stay free of LibTorch: nvcc compiles it as C++17 without the LibTorch headers.
// On the host the element code vectorises under `omp simd` only with -fno-math-errno: otherwise
// GCC guards std::sqrt with a call that may set errno and keeps the loop scalar (measured on the
// 2-core CI host: 0.3 of the memory-bandwidth bound scalar, 0.6 to 1.0 vectorised).
#pragma once

#include <cmath>
#include <cstdint>

#include "optim/state_rounding.h"  // also LLM_HOST_DEVICE

#ifdef __CUDACC__
#include <cuda_bf16.h>
#endif

namespace llm {

// The per-call constants of one AdamW update, already rounded to fp32.
struct AdamWScalars {
  float decay_factor;              // 1 - lr * weight_decay
  bool exp_avg_lerp_from_start;    // lerp weight 1 - beta1 below 0.5 (every beta1 above 0.5)
  float exp_avg_lerp_coefficient;  // 1 - beta1 if exp_avg_lerp_from_start, else (1 - beta1) - 1
  float beta2;                     // decay of the second moment
  float one_minus_beta2;           // weight of g*g in the second moment
  float bias_correction2_sqrt;     // sqrt(1 - beta2^step)
  float eps;
  float negative_step_size;        // -lr / (1 - beta1^step)
  // The gradient's multiplier, read first: the clip coefficient (1: no clipping). g * s in fp32 is
  // what grad.mul_(s) on an fp32 gradient stores, so folding it in reads the gradient once instead
  // of a second pass over it (issue 42), to the same bits.
  float gradient_scale;
};

// Computes the scalars for one update; step is 1-based. Host only (the caller validated inputs).
inline AdamWScalars make_adamw_scalars(double lr, double beta1, double beta2, double eps,
                                       double weight_decay, int64_t step, double gradient_scale = 1.0) {
  const double steps = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(beta1, steps);
  const double bias_correction2 = 1.0 - std::pow(beta2, steps);
  AdamWScalars scalars;
  scalars.decay_factor = static_cast<float>(1.0 - lr * weight_decay);
  const float exp_avg_weight = static_cast<float>(1.0 - beta1);
  scalars.exp_avg_lerp_from_start = std::fabs(exp_avg_weight) < 0.5f;
  scalars.exp_avg_lerp_coefficient =
      scalars.exp_avg_lerp_from_start ? exp_avg_weight : exp_avg_weight - 1.0f;
  scalars.beta2 = static_cast<float>(beta2);
  scalars.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  scalars.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  scalars.eps = static_cast<float>(eps);
  scalars.negative_step_size = static_cast<float>(-(lr / bias_correction1));
  scalars.gradient_scale = static_cast<float>(gradient_scale);
  return scalars;
}

// Gradient element -> fp32. float passes through; c10::BFloat16 (host) converts with its own
// operator float; __nv_bfloat16 (device) with the CUDA intrinsic, which also works on the host.
template <typename GradElement>
LLM_HOST_DEVICE float gradient_to_float(GradElement gradient) {
  return static_cast<float>(gradient);
}
#ifdef __CUDACC__
LLM_HOST_DEVICE float gradient_to_float(__nv_bfloat16 gradient) {
  return __bfloat162float(gradient);
}
#endif

// torch.lerp(start, end, weight) as ATen computes it (at::native::lerp): start + w * (end - start)
// for |w| < 0.5, else end - (1 - w) * (end - start), which keeps the result exact at w = 0 and 1.
// The branch depends only on w, so the host picks it once and it is a template argument here: a
// run-time select would keep GCC from vectorising the loop. The second form is computed as
// end + (w - 1) * (end - start), equal to the bit (negation is exact).
template <bool kLerpFromStart>
LLM_HOST_DEVICE float lerp_like_torch(float start, float end, float lerp_coefficient) {
  return (kLerpFromStart ? start : end) + lerp_coefficient * (end - start);
}

// A state element as fp32, and back: fp32 state passes through; bf16 state (its 16 bits) widens
// exactly and is stored rounded stochastically with the given 16 random bits (optim/state_rounding.h).
LLM_HOST_DEVICE float state_to_float(float value) { return value; }
LLM_HOST_DEVICE float state_to_float(uint16_t bits) { return bfloat16_bits_to_float(bits); }
LLM_HOST_DEVICE void store_state(float* to, float value, uint32_t) { *to = value; }
LLM_HOST_DEVICE void store_state(uint16_t* to, float value, uint32_t random16) {
  *to = stochastic_round_to_bfloat16(value, random16);
}

// The update of element i of four flat arrays: param (fp32), exp_avg and exp_avg_sq (StateElement:
// float, or uint16_t for bf16 bits; updated in place) and grad (fp32 or bf16, read only). A plain
// aggregate so Thrust can copy it to the device. kLerpFromStart must equal
// scalars.exp_avg_lerp_from_start (see lerp_like_torch). With bf16 state the step uses the moments
// in fp32 as computed and stores them rounded (the first moment with the low 16 of the element's
// rounding bits, the second with the high 16); the parameter update is the fp32 one.
template <typename GradElement, bool kLerpFromStart, typename StateElement = float>
struct AdamWElementUpdate {
  float* param;                 // (numel) fp32
  const GradElement* grad;      // (numel) fp32 or bf16
  StateElement* exp_avg;        // (numel) first moment
  StateElement* exp_avg_sq;     // (numel) second moment
  AdamWScalars scalars;
  StateRounding rounding{};     // bf16 state only
  uint16_t* compute_out = nullptr;  // the updated param rounded to bf16 (nearest even), or nothing
  // Out of place (optim/adamw_host.h's param_from, ...): where the values before the step are read;
  // nullptr: from param, exp_avg and exp_avg_sq themselves.
  const float* param_from = nullptr;
  const StateElement* exp_avg_from = nullptr;
  const StateElement* exp_avg_sq_from = nullptr;

  LLM_HOST_DEVICE void operator()(int64_t i) const {
    const float gradient = gradient_to_float(grad[i]) * scalars.gradient_scale;
    const float decayed_param = (param_from != nullptr ? param_from[i] : param[i]) * scalars.decay_factor;
    const float first_moment = lerp_like_torch<kLerpFromStart>(
        state_to_float(exp_avg_from != nullptr ? exp_avg_from[i] : exp_avg[i]), gradient, scalars.exp_avg_lerp_coefficient);
    const float second_moment =
        state_to_float(exp_avg_sq_from != nullptr ? exp_avg_sq_from[i] : exp_avg_sq[i]) * scalars.beta2 +
        (scalars.one_minus_beta2 * gradient) * gradient;
    const float denominator =
        std::sqrt(second_moment) / scalars.bias_correction2_sqrt + scalars.eps;
    const float updated = decayed_param + (scalars.negative_step_size * first_moment) / denominator;
    param[i] = updated;
    if (compute_out != nullptr) compute_out[i] = float_to_bfloat16_bits_nearest(updated);
    uint32_t random = 0;
    if constexpr (sizeof(StateElement) == 2)
      random = rounding_bits(rounding.key, rounding.index_base + static_cast<uint32_t>(i));
    store_state(exp_avg + i, first_moment, moment_random16(random, false));
    store_state(exp_avg_sq + i, second_moment, moment_random16(random, true));
  }
};

}  // namespace llm
