// The CUDA side of the fused SwiGLU (model/swiglu_functor.h), rotary (model/rotary_functor.h) and cross
// entropy (model/cross_entropy_functor.h), as a plain C++ interface on raw device pointers and a
// stream: nvcc compiles model/*.cu without the LibTorch headers, and model/layer_ops.cpp and
// model/cross_entropy.cpp check the tensors and call in here.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace llm {

// numel elements each, on the device that owns the pointers, enqueued on `stream`; bf16: the
// pointers hold bf16 bits, else fp32. Launch failures throw SystemError.
void launch_swiglu_forward_cuda(const void* gate, const void* up, void* out, int64_t numel, bool bf16,
                                cudaStream_t stream);
void launch_swiglu_backward_cuda(const void* grad, const void* gate, const void* up, void* grad_gate, void* grad_up,
                                 int64_t numel, bool bf16, cudaStream_t stream);

// The fused rotary (model/rotary_functor.h) over (batch, seq, heads, head_dim) and tables
// (seq, head_dim): forward reads x and writes the rotated x, backward reads d out and writes d x.
// x_bf16 / tables_bf16 say which are bf16 bits (else fp32); the output is bf16 only when both are,
// and x's gradient has x's type.
void launch_rotary_cuda(bool forward, const void* in, const void* cos, const void* sin_signed, void* out, int64_t batch,
                        int64_t seq, int64_t heads, int64_t head_dim, bool x_bf16, bool tables_bf16, cudaStream_t stream);

// The single-pass cross entropy (model/cross_entropy_functor.h) over `rows` rows of `vocab` counted
// columns, `stride` apart: the per-row fp32 losses, and when `gradient` is not null (it may be
// `logits`) the gradient times *scale (a device scalar), in the logits' type (bf16 bits when bf16).
void launch_cross_entropy_cuda(const void* logits, const int64_t* labels, void* gradient, const float* scale,
                               float* losses, int64_t rows, int64_t vocab, int64_t stride, bool bf16,
                               cudaStream_t stream);

}  // namespace llm
