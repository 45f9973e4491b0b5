// The AdamW update on the GPU: Thrust's for_each over element indices, running the same functor the
// host loop runs (optim/adamw_functor.h). Thrust picks the launch shape; the update is one pass
// that reads p, g, m, v once and writes p, m, v once, so it is bound by memory bandwidth and a
// hand-written kernel would gain nothing measurable.
#include "optim/adamw_kernels.h"

#include <string>

#include <cuda_bf16.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/system_error.h>

#include "common/errors.h"

namespace llm {
namespace {

template <typename GradElement, bool kLerpFromStart, typename StateElement>
void for_each_element_with_lerp_form(float* param, const GradElement* grad, void* exp_avg,
                                     void* exp_avg_sq, const StateRounding& rounding, int64_t numel,
                                     const AdamWScalars& scalars, cudaStream_t stream, uint16_t* compute_out) {
  const AdamWElementUpdate<GradElement, kLerpFromStart, StateElement> update{
      param, grad, static_cast<StateElement*>(exp_avg), static_cast<StateElement*>(exp_avg_sq), scalars,
      rounding, compute_out};
  const thrust::counting_iterator<int64_t> first(0);
  // par_nosync: the step is enqueued on the caller's stream and the host does not wait for it;
  // plain par would synchronise the stream after every tensor.
  thrust::for_each(thrust::cuda::par_nosync.on(stream), first, first + numel, update);
}

template <typename GradElement, typename StateElement>
void for_each_element(float* param, const GradElement* grad, void* exp_avg, void* exp_avg_sq,
                      const StateRounding& rounding, int64_t numel, const AdamWScalars& scalars,
                      cudaStream_t stream, uint16_t* compute_out) {
  if (scalars.exp_avg_lerp_from_start) {
    for_each_element_with_lerp_form<GradElement, true, StateElement>(param, grad, exp_avg, exp_avg_sq, rounding,
                                                                     numel, scalars, stream, compute_out);
  } else {
    for_each_element_with_lerp_form<GradElement, false, StateElement>(param, grad, exp_avg, exp_avg_sq, rounding,
                                                                      numel, scalars, stream, compute_out);
  }
}

template <typename GradElement>
void for_each_element_state(float* param, const GradElement* grad, void* exp_avg, void* exp_avg_sq,
                            bool state_is_bf16, const StateRounding& rounding, int64_t numel,
                            const AdamWScalars& scalars, cudaStream_t stream, uint16_t* compute_out) {
  if (state_is_bf16)
    for_each_element<GradElement, uint16_t>(param, grad, exp_avg, exp_avg_sq, rounding, numel, scalars, stream,
                                            compute_out);
  else
    for_each_element<GradElement, float>(param, grad, exp_avg, exp_avg_sq, rounding, numel, scalars, stream,
                                         compute_out);
}

struct StochasticRoundElement {
  const float* from;
  uint16_t* to;
  StateRounding rounding;
  bool high_half;
  LLM_HOST_DEVICE void operator()(int64_t i) const {
    to[i] = round_moment_element(from[i], rounding, static_cast<uint32_t>(i), high_half);
  }
};

}  // namespace

void launch_stochastic_round_cuda(const float* from, uint16_t* to, int64_t numel, const StateRounding& rounding,
                                  bool high_half, cudaStream_t stream) {
  if (numel == 0) return;
  try {
    const thrust::counting_iterator<int64_t> first(0);
    thrust::for_each(thrust::cuda::par_nosync.on(stream), first, first + numel,
                     StochasticRoundElement{from, to, rounding, high_half});
  } catch (const thrust::system_error& error) {
    fail_system_call("thrust::for_each(StochasticRoundElement)", __FILE__, __LINE__, error.what(),
                     "check that the tensors live on the current CUDA device");
  }
  LLM_CHECK_CUDA(cudaGetLastError());
}

void launch_adamw_update_cuda(float* param, const void* grad, GradientElementType gradient_type,
                              void* exp_avg, void* exp_avg_sq, bool state_is_bf16,
                              const StateRounding& rounding, int64_t numel,
                              const AdamWScalars& scalars, cudaStream_t stream, uint16_t* compute_out) {
  if (numel == 0) return;
  try {
    if (gradient_type == GradientElementType::kBfloat16) {
      for_each_element_state(param, static_cast<const __nv_bfloat16*>(grad), exp_avg, exp_avg_sq,
                             state_is_bf16, rounding, numel, scalars, stream, compute_out);
    } else {
      for_each_element_state(param, static_cast<const float*>(grad), exp_avg, exp_avg_sq, state_is_bf16,
                             rounding, numel, scalars, stream, compute_out);
    }
  } catch (const thrust::system_error& error) {
    fail_system_call("thrust::for_each(AdamWElementUpdate)", __FILE__, __LINE__, error.what(),
                     "check that the tensors live on the current CUDA device");
  }
  LLM_CHECK_CUDA(cudaGetLastError());
}

}  // namespace llm
