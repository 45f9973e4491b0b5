// Process-level memory readings for the per-step log line: the peak resident set of this process
// and, on CUDA, the caching allocator's peak allocated bytes. The full per-category ledger builds on
// these (docs/architecture.md, memory ledger).
#pragma once

#include <cstdint>

#include <c10/core/Device.h>

namespace llm {

int64_t peak_resident_bytes();                  // getrusage ru_maxrss, in bytes
int64_t device_peak_allocated_bytes(c10::Device device);  // 0 on CPU
// The figure the step line shows: device peak on CUDA, process peak RSS on CPU.
int64_t peak_memory_bytes(c10::Device device);

}  // namespace llm
