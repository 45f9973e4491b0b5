// The host AdamW step's dispatcher and its scalar kernel (optim/adamw_host.h). Built with the
// project's baseline flags: the ISA kernels live in optim/adamw_host_avx2.cpp and
// optim/adamw_host_avx512.cpp, and this unit only calls them on a CPU that has the ISA.
#include "optim/adamw_host.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace llm {
namespace {

// Below this many elements per thread a fork-join (a few microseconds) costs more than it saves;
// one thread updates ~32k elements in about that time.
constexpr int64_t kMinElementsPerThread = 1 << 15;
// Threads take chunks of whole 64-byte lines of fp32 (no two threads write one cache line), at
// most kChunkElements (256 KiB of each fp32 array: long enough to stream, short enough to share).
constexpr int64_t kElementsPerLine = 16;
constexpr int64_t kChunkElements = 1 << 16;

// bf16 as its bits, converted the way c10::BFloat16 converts (exactly: the upper half of the fp32).
struct Bfloat16Bits {
  uint16_t bits;
  operator float() const { return bfloat16_bits_to_float(bits); }
};
static_assert(sizeof(Bfloat16Bits) == 2, "bf16 travels as 16 bits");

// c10::BFloat16's round_to_nearest_even (what at::Tensor::to(kBFloat16) gives for every non-NaN).
uint16_t round_to_bfloat16(float value) {
  if (value != value) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>((bits + (((bits >> 16) & 1u) + 0x7FFFu)) >> 16);
}

// The element functor over [begin, end). `omp simd`: GCC vectorises it for the baseline ISA (SSE2
// on x86-64), which changes no bits (no FMA there, IEEE division and square root per lane).
template <typename GradElement, bool kLerpFromStart, typename StateElement, bool kWriteCompute>
void scalar_range(const AdamWHostArrays& arrays, const AdamWScalars& scalars, int64_t begin,
                  int64_t end) {
  StateElement* exp_avg;
  StateElement* exp_avg_sq;
  if constexpr (sizeof(StateElement) == 2) {
    exp_avg = arrays.exp_avg_bf16;
    exp_avg_sq = arrays.exp_avg_sq_bf16;
  } else {
    exp_avg = arrays.exp_avg;
    exp_avg_sq = arrays.exp_avg_sq;
  }
  AdamWElementUpdate<GradElement, kLerpFromStart, StateElement> update{
      arrays.param, static_cast<const GradElement*>(arrays.grad), exp_avg, exp_avg_sq, scalars,
      arrays.rounding};
  update.param_from = arrays.param_from;
  update.exp_avg_from = static_cast<const StateElement*>(arrays.exp_avg_from);
  update.exp_avg_sq_from = static_cast<const StateElement*>(arrays.exp_avg_sq_from);
  uint16_t* compute_out = arrays.compute_out;
  const float* param = arrays.param;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    update(i);
    if constexpr (kWriteCompute) compute_out[i] = round_to_bfloat16(param[i]);
  }
}

template <typename GradElement, bool kLerpFromStart, typename StateElement>
void scalar_range_output(const AdamWHostArrays& arrays, const AdamWScalars& scalars,
                         int64_t begin, int64_t end) {
  if (arrays.compute_out != nullptr)
    scalar_range<GradElement, kLerpFromStart, StateElement, true>(arrays, scalars, begin, end);
  else
    scalar_range<GradElement, kLerpFromStart, StateElement, false>(arrays, scalars, begin, end);
}

template <typename GradElement, typename StateElement>
void scalar_range_lerp(const AdamWHostArrays& arrays, const AdamWScalars& scalars, int64_t begin,
                       int64_t end) {
  if (scalars.exp_avg_lerp_from_start)
    scalar_range_output<GradElement, true, StateElement>(arrays, scalars, begin, end);
  else
    scalar_range_output<GradElement, false, StateElement>(arrays, scalars, begin, end);
}

template <typename GradElement>
void scalar_range_state(const AdamWHostArrays& arrays, const AdamWScalars& scalars, int64_t begin,
                        int64_t end) {
  if (arrays.state_is_bf16())
    scalar_range_lerp<GradElement, uint16_t>(arrays, scalars, begin, end);
  else
    scalar_range_lerp<GradElement, float>(arrays, scalars, begin, end);
}

using RangeKernel = void (*)(const AdamWHostArrays&, const AdamWScalars&, int64_t, int64_t);

RangeKernel kernel_of(HostIsa isa) {
  switch (isa) {
    case HostIsa::scalar: return detail::adamw_host_range_scalar;
    case HostIsa::avx2: return detail::adamw_host_range_avx2;
    case HostIsa::avx512: return detail::adamw_host_range_avx512;
  }
  return nullptr;
}

RangeKernel supported_kernel(HostIsa isa) {
  if (!host_isa_supported(isa))
    throw std::logic_error(std::string("adamw_host: the ") + to_string(isa) +
                           " kernel is not in this build or not supported by this CPU");
  return kernel_of(isa);
}

}  // namespace

const char* to_string(HostIsa isa) {
  switch (isa) {
    case HostIsa::scalar: return "scalar";
    case HostIsa::avx2: return "avx2";
    case HostIsa::avx512: return "avx512";
  }
  return "?";
}

bool host_isa_supported(HostIsa isa) {
  if (isa == HostIsa::scalar) return true;
#if defined(TRAINER_HOST_X86_KERNELS)
  // GCC's checks include the OS's support for the wider registers (XGETBV), not just CPUID.
  __builtin_cpu_init();
  if (isa == HostIsa::avx2) return __builtin_cpu_supports("avx2");
  if (isa == HostIsa::avx512) return __builtin_cpu_supports("avx512f");
#endif
  return false;
}

HostIsa best_host_isa() {
  static const HostIsa best = [] {
    for (HostIsa isa : {HostIsa::avx512, HostIsa::avx2})
      if (host_isa_supported(isa)) return isa;
    return HostIsa::scalar;
  }();
  return best;
}

void adamw_host_range(HostIsa isa, const AdamWHostArrays& arrays, const AdamWScalars& scalars,
                      int64_t begin, int64_t end) {
  supported_kernel(isa)(arrays, scalars, begin, end);
}

void adamw_host_update(const AdamWHostArrays& arrays, int64_t numel, const AdamWScalars& scalars,
                       int threads, HostIsa isa) {
  const RangeKernel kernel = supported_kernel(isa);
  const int64_t team =
      std::clamp<int64_t>(numel / kMinElementsPerThread, 1, std::max<int64_t>(threads, 1));
  if (team == 1) {
    kernel(arrays, scalars, 0, numel);
    return;
  }
  // Chunks handed out as threads finish the last (dynamic): the step shares its cores with the
  // rest of the process and the machine, and a thread that loses its core for a while then delays
  // the step by at most one chunk instead of by its whole share. Measured on the 2-core EPYC
  // against one contiguous block per thread, interleaved, two runs: within the noise at 2^22
  // elements, 3 to 18 % faster at 2^24 and 2^26.
  const int64_t per_thread = (numel + team - 1) / team;
  const int64_t chunk = std::min(kChunkElements, (per_thread + kElementsPerLine - 1) /
                                                     kElementsPerLine * kElementsPerLine);
  const int64_t chunks = (numel + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(static_cast<int>(team))
  for (int64_t index = 0; index < chunks; ++index)
    kernel(arrays, scalars, index * chunk, std::min(numel, (index + 1) * chunk));
}

void adamw_host_update(const AdamWHostArrays& arrays, int64_t numel, const AdamWScalars& scalars,
                       int threads) {
  adamw_host_update(arrays, numel, scalars, threads, best_host_isa());
}

void detail::adamw_host_range_scalar(const AdamWHostArrays& arrays, const AdamWScalars& scalars,
                                     int64_t begin, int64_t end) {
  if (arrays.grad_is_bf16)
    scalar_range_state<Bfloat16Bits>(arrays, scalars, begin, end);
  else
    scalar_range_state<float>(arrays, scalars, begin, end);
}

}  // namespace llm
