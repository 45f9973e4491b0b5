// The CUDA side of the AdamW update, as a plain C++ interface on raw device pointers and a stream.
// It exists because the CUDA sources compile as C++17 without the LibTorch headers: optim/adamw.cpp
// validates the tensors, picks the stream and calls in here; optim/adamw_cuda.cu runs the shared
// element functor (optim/adamw_functor.h) with Thrust.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "optim/adamw_functor.h"

namespace llm {

enum class GradientElementType { kFloat32, kBfloat16 };

// Applies one AdamW update in place to numel elements on the device that owns the pointers,
// enqueued on stream without a host synchronisation. grad points at fp32 or bf16 elements as
// gradient_type says; exp_avg and exp_avg_sq at fp32 elements, or at bf16 ones (stored with
// stochastic rounding by `rounding`, optim/state_rounding.h) when state_is_bf16. Launch failures
// throw SystemError.
// compute_out: when not null, the updated param rounded to bf16 (nearest even, as
// master.to(kBFloat16)) is written there in the same pass (a resident bf16 unit's compute shard).
void launch_adamw_update_cuda(float* param, const void* grad, GradientElementType gradient_type,
                              void* exp_avg, void* exp_avg_sq, bool state_is_bf16,
                              const StateRounding& rounding, int64_t numel,
                              const AdamWScalars& scalars, cudaStream_t stream, uint16_t* compute_out = nullptr);

// bf16 state for the rules written in ATen operations: `to[i]` = `from[i]` rounded stochastically
// with the high or low 16 of rounding_bits(rounding.key, rounding.index_base + i)
// (optim/state_rounding.h), for numel elements on the current device, enqueued on stream.
void launch_stochastic_round_cuda(const float* from, uint16_t* to, int64_t numel, const StateRounding& rounding,
                                  bool high_half, cudaStream_t stream);

}  // namespace llm
