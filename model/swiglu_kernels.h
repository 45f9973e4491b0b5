// The CUDA side of the fused SwiGLU (model/swiglu_functor.h), as a plain C++ interface on raw device
// pointers and a stream: nvcc compiles model/swiglu_cuda.cu without the LibTorch headers, and
// model/layer_ops.cpp checks the tensors and calls in here.
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

}  // namespace llm
