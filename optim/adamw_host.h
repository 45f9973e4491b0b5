// The host AdamW step on raw arrays: what the CPU-offload path and llm::adamw_update's CPU case call.
//
// One pass reads the gradient (fp32 or bf16), the fp32 master and both moments, and writes the
// master, the moments and, when asked, the compute-dtype copy of the updated master (bf16, rounded
// to nearest even as c10::BFloat16 does) straight into a buffer the caller names, e.g. the staging
// buffer that offload copies to the GPU. The step is bound by memory (28 bytes per element with fp32
// gradients), so it is written to stream: each thread takes one contiguous block, vector code walks
// it once.
//
// The vector code is chosen at run time, per CPU: AVX-512 where the CPU has AVX512F, AVX2 where it
// has AVX2, else the element functor (optim/adamw_functor.h) auto-vectorised for the build's
// baseline ISA. Each ISA's kernel lives in its own translation unit compiled with that ISA's flags
// (optim/adamw_host_avx2.cpp, optim/adamw_host_avx512.cpp), and those units include no LibTorch
// and use no inline function shared with other units: an inline function compiled with -mavx512f in
// one unit could be the copy the linker keeps for every unit (an ODR hazard that crashes CPUs
// without the ISA). Every kernel gives the bits of the scalar functor: same operations in the same
// order, IEEE division and square root, no FMA contraction (-ffp-contract=off; the AVX2 unit is built
// without -mfma at all). tests/optim_adamw_host_test.cpp checks each variant the CPU runs against
// the scalar loop, bit for bit.
//
// This header is free of LibTorch (bf16 travels as its 16 bits); optim/adamw.h has the typed API.
#pragma once

#include <cstdint>

#include "optim/adamw_functor.h"

namespace llm {

// The kernels a build may hold. scalar: the element functor in an `omp simd` loop (portable; SSE2
// vectors on x86-64). avx2 and avx512 exist on x86-64 GCC/Clang builds only.
enum class HostIsa { scalar, avx2, avx512 };
const char* to_string(HostIsa isa);

// The arrays of one update, (numel) each, contiguous. bf16 values are their bits (the upper half of
// the fp32 pattern: c10::BFloat16 and __nv_bfloat16 have this layout).
struct AdamWHostArrays {
  float* param;                  // fp32 master, updated in place
  const void* grad;              // fp32, or bf16 when grad_is_bf16
  bool grad_is_bf16 = false;
  float* exp_avg;                // fp32 first moment, updated in place
  float* exp_avg_sq;             // fp32 second moment, updated in place
  uint16_t* compute_out = nullptr;  // bf16 bits of the updated param, or nullptr for none
  // bf16 state (--optimizer_state_dtype bfloat16): the moments as bf16 bits, in place of exp_avg and
  // exp_avg_sq (null then), stored with stochastic rounding by `rounding` (optim/state_rounding.h).
  uint16_t* exp_avg_bf16 = nullptr;
  uint16_t* exp_avg_sq_bf16 = nullptr;
  StateRounding rounding{};
  // Out of place (offload's speculative step, which keeps the values before it): the master and the
  // moments are read from these and the arrays above only written. nullptr: in place. The moments'
  // sources are bf16 bits where the state is bf16.
  const float* param_from = nullptr;
  const void* exp_avg_from = nullptr;
  const void* exp_avg_sq_from = nullptr;
  bool state_is_bf16() const { return exp_avg_bf16 != nullptr; }
};

// Whether this build holds isa's kernel and this CPU can run it.
bool host_isa_supported(HostIsa isa);
// The fastest supported kernel (decided once per process).
HostIsa best_host_isa();

// Elements [begin, end) with one kernel, on the calling thread. isa must be supported (tests
// compare the variants; everything else goes through adamw_host_update). Throws std::logic_error
// for an unsupported isa.
void adamw_host_range(HostIsa isa, const AdamWHostArrays& arrays, const AdamWScalars& scalars,
                      int64_t begin, int64_t end);

// The whole update on up to `threads` OpenMP threads (one contiguous block each; fewer threads for
// sizes where a fork costs more than it saves) with the best kernel.
void adamw_host_update(const AdamWHostArrays& arrays, int64_t numel, const AdamWScalars& scalars,
                       int threads);
// The same with a chosen kernel (the bench times the scalar one beside the best). isa must be
// supported.
void adamw_host_update(const AdamWHostArrays& arrays, int64_t numel, const AdamWScalars& scalars,
                       int threads, HostIsa isa);

namespace detail {
// Each kernel's entry point, defined in its own translation unit. The vector kernels hand their
// tail (fewer elements than one vector) to the scalar kernel, so tails are the functor's bits too.
void adamw_host_range_scalar(const AdamWHostArrays& arrays, const AdamWScalars& scalars,
                             int64_t begin, int64_t end);
void adamw_host_range_avx2(const AdamWHostArrays& arrays, const AdamWScalars& scalars,
                           int64_t begin, int64_t end);
void adamw_host_range_avx512(const AdamWHostArrays& arrays, const AdamWScalars& scalars,
                             int64_t begin, int64_t end);
}  // namespace detail

}  // namespace llm
