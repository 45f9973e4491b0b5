// The fused element-wise kernels of a decoder layer on the GPU, each one pass over its bytes with
// Thrust, over the element functions the CPU loop runs:
//   SwiGLU (model/swiglu_functor.h): gate and up read once, the product written; backward d out, gate
//     and up read once, d gate and d up written, where eager runs silu, mul and silu_backward apart
//     and keeps silu(gate) for the product's backward;
//   rotary (model/rotary_functor.h): x and the tables read once, the rotated x written (eager: two
//     products, a roll and a sum); backward the same for d x.
#include "model/layer_kernels.h"

#include <string>

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/system_error.h>

#include "common/errors.h"
#include "model/rotary_functor.h"
#include "model/swiglu_functor.h"

namespace llm {
namespace {

template <typename Functor>
void for_each_element(const Functor& functor, int64_t numel, cudaStream_t stream, const char* what) {
  try {
    const thrust::counting_iterator<int64_t> first(0);
    // par_nosync: enqueued on the caller's stream, no host wait.
    thrust::for_each(thrust::cuda::par_nosync.on(stream), first, first + numel, functor);
  } catch (const thrust::system_error& error) {
    throw SystemError(std::string(what) + ": the CUDA kernel failed to launch: " + error.what());
  }
}

}  // namespace

void launch_swiglu_forward_cuda(const void* gate, const void* up, void* out, int64_t numel, bool bf16,
                                cudaStream_t stream) {
  if (bf16)
    for_each_element(SwigluForward<uint16_t>{static_cast<const uint16_t*>(gate), static_cast<const uint16_t*>(up),
                                             static_cast<uint16_t*>(out)},
                     numel, stream, "swiglu forward");
  else
    for_each_element(SwigluForward<float>{static_cast<const float*>(gate), static_cast<const float*>(up),
                                          static_cast<float*>(out)},
                     numel, stream, "swiglu forward");
}

void launch_swiglu_backward_cuda(const void* grad, const void* gate, const void* up, void* grad_gate, void* grad_up,
                                 int64_t numel, bool bf16, cudaStream_t stream) {
  if (bf16)
    for_each_element(SwigluBackward<uint16_t>{static_cast<const uint16_t*>(grad), static_cast<const uint16_t*>(gate),
                                              static_cast<const uint16_t*>(up), static_cast<uint16_t*>(grad_gate),
                                              static_cast<uint16_t*>(grad_up)},
                     numel, stream, "swiglu backward");
  else
    for_each_element(SwigluBackward<float>{static_cast<const float*>(grad), static_cast<const float*>(gate),
                                           static_cast<const float*>(up), static_cast<float*>(grad_gate),
                                           static_cast<float*>(grad_up)},
                     numel, stream, "swiglu backward");
}

void launch_rotary_cuda(bool forward, const void* in, const void* cos, const void* sin_signed, void* out, int64_t batch,
                        int64_t seq, int64_t heads, int64_t head_dim, bool x_bf16, bool tables_bf16, cudaStream_t stream) {
  const RotaryGeometry shape{seq, heads, head_dim};
  const int64_t numel = batch * seq * heads * head_dim;
  const auto run = [&](const auto& pass) { for_each_element(pass, numel, stream, forward ? "rotary forward" : "rotary backward"); };
  if (forward)
    with_rotary_pass<RotaryForward>(x_bf16, tables_bf16, in, cos, sin_signed, out, shape, run);
  else
    with_rotary_pass<RotaryBackward>(x_bf16, tables_bf16, in, cos, sin_signed, out, shape, run);
}

}  // namespace llm
