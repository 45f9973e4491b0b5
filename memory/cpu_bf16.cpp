// Whether this CPU computes a bf16 matmul natively, and what oneDNN does where it does not: the
// estimate counts the fp32 product such a CPU writes (memory/estimate_shapes.h).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "memory/estimate.h"
#include "memory/estimate_shapes.h"

namespace llm {

bool cpu_lacks_native_bf16_matmul() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool lacks = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512dq") && !__builtin_cpu_supports("avx512bf16");
  return lacks;
#else
  return false;
#endif
}

bool cpu_bf16_matmul_widens() {
  static const bool widens = [] {
    if (!cpu_lacks_native_bf16_matmul()) return false;
    const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
    if (cap == nullptr) cap = std::getenv("DNNL_MAX_CPU_ISA");
    if (cap == nullptr) return true;
    std::string isa(cap);
    std::transform(isa.begin(), isa.end(), isa.begin(), [](unsigned char c) { return std::toupper(c); });
    return isa.empty() || isa == "ALL" || isa == "DEFAULT" || isa.find("AVX512") != std::string::npos ||
           isa.find("AVX10") != std::string::npos;
  }();
  return widens;
}

}  // namespace llm
