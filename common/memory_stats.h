// Process-level memory readings: the peak and current resident set of this process, the CUDA
// caching allocator's statistics, the pinned host bytes of CUDA's caching host allocator, and the
// CUDA allocator's history and snapshot for pytorch.org/memory_viz. The per-category ledger
// (trainer/memory_ledger.h) builds on these and on common/host_memory.h.
//
// Every CUDA reading is compile-guarded (TRAINER_HAVE_CUDA) and returns zeros for a CPU device, so
// callers need no guards of their own.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace llm {

int64_t peak_resident_bytes();     // getrusage ru_maxrss, in bytes
int64_t current_resident_bytes();  // /proc/self/statm resident pages, in bytes (0 if unreadable)
int64_t device_peak_allocated_bytes(c10::Device device);  // 0 on CPU
// The figure the step line shows: device peak on CUDA, process peak RSS on CPU.
int64_t peak_memory_bytes(c10::Device device);

// What a run may still allocate: on CUDA the device's free bytes (cudaMemGetInfo, before this
// process allocated anything: the other processes' and the context's use taken off); 0 on CPU.
int64_t device_free_bytes(c10::Device device);
// This machine's MemAvailable (/proc/meminfo: free memory plus what the kernel can reclaim) and
// MemTotal (its RAM), 0 where unreadable.
int64_t host_available_bytes();
int64_t host_total_bytes();

// The CUDA caching allocator's aggregate statistics (all pools). Zero on CPU.
struct DeviceMemoryStats {
  int64_t allocated_bytes = 0;       // in tensors now
  int64_t allocated_peak_bytes = 0;  // since the last reset_device_peak_stats
  int64_t reserved_bytes = 0;        // segments held from cudaMalloc now (allocated + cached)
  int64_t reserved_peak_bytes = 0;
  int64_t alloc_retries = 0;         // cudaMalloc failures that freed the cache and retried
  int64_t ooms = 0;                  // out-of-memory errors raised
};
DeviceMemoryStats device_memory_stats(c10::Device device);
void reset_device_peak_stats(c10::Device device);

// CUDA's caching host allocator (pinned memory from tensor.pin_memory() and pinned_memory(true)).
// Zero on CPU. Pinned pools allocated with cudaHostAlloc directly are not in these figures.
struct PinnedMemoryStats {
  int64_t reserved_bytes = 0;  // pinned blocks held (in use + cached)
  int64_t reserved_peak_bytes = 0;
  int64_t active_bytes = 0;    // pinned blocks in use
};
PinnedMemoryStats pinned_memory_stats(c10::Device device);

// A host tensor of `elements` of `dtype`, page-locked for `pinned_for` with cudaHostAlloc itself
// when that is a CUDA device (a CUDA build only; otherwise at::empty): the caching host allocator
// behind pinned_memory(true) rounds every block up to a power of two and keeps it, so a 9.4 GiB
// buffer would hold 16 GiB. Allocated under a guard of that device (cudaHostAlloc makes a context on
// the current one). Freed (cudaFreeHost) with its last tensor; not in pinned_memory_stats, but in
// exact_pinned_bytes().
at::Tensor exact_host_buffer(int64_t elements, at::ScalarType dtype, c10::Device pinned_for);
// A flat copy of `from` (its elements and dtype) in an exact_host_buffer.
at::Tensor exact_host_copy(const at::Tensor& from, c10::Device pinned_for);
// The bytes exact_host_buffer holds page-locked now, in this process (0 on CPU).
int64_t exact_pinned_bytes();

// The CUDA allocator's history (torch::cuda::_record_memory_history: every allocation and free with
// its C++ stack, up to max_entries events in a ring) and its snapshot as the pickle that
// pytorch.org/memory_viz opens (torch::cuda::_memory_snapshot_pickled). Both throw UserError unless
// `device` is CUDA in a CUDA build.
void start_device_memory_history(c10::Device device, int64_t max_entries);
void stop_device_memory_history(c10::Device device);
void write_device_memory_snapshot(c10::Device device, const std::string& path);

}  // namespace llm
