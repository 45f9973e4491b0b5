// Counts the host (CPU) bytes LibTorch holds: a c10::Allocator that wraps LibTorch's default CPU
// allocator and keeps the current, peak and "window" peak bytes of every live allocation.
//
// Why a wrapper and not the profiler's reporting hooks: those are thread-local (OpenMP workers may
// not carry them) and share a slot with the Kineto profiler (shared/reference/libtorch_api.md §2b).
// The wrapper sees every tensor storage made through c10::GetCPUAllocator() on any thread. It does
// not see what LibTorch never asks it for: oneDNN / BLAS scratch buffers, memory-mapped files,
// from_blob memory, pinned host memory (CUDA's host allocator) and device memory.
//
// The DataPtr keeps the base allocator's convention (context == data), so raw_allocate /
// raw_deallocate and copy-on-write keep working; the size of each live block lives in a side table,
// because a DataPtr deleter is a plain function pointer with no room for it. Frees may come from any
// thread (autograd workers, the data loader), so the table is locked and the counters are atomic.
//
// Install it before the first tensor is made: blocks allocated earlier keep LibTorch's own deleter
// and are never counted (neither their allocation nor their free).
#pragma once

#include <cstdint>

namespace llm {

struct HostMemoryCounters {
  int64_t current_bytes = 0;      // live bytes now
  int64_t peak_bytes = 0;         // most live bytes since install
  int64_t window_peak_bytes = 0;  // most live bytes since the last reset_host_window_peak()
  int64_t live_blocks = 0;        // live allocations now
};

// Registers the counting allocator for c10::DeviceType::CPU with priority 1 (above the default's 0).
// Idempotent; the allocator has static lifetime (c10 does not take ownership).
void install_host_memory_tracking();
bool host_memory_tracking_installed();
HostMemoryCounters host_memory_counters();
// Starts a new window: window_peak_bytes = current_bytes.
void reset_host_window_peak();

// Keeps freed host memory in the process for reuse, as CUDA's caching allocator keeps device memory:
// glibc otherwise serves every block above its mmap threshold (128 KiB, rising to at most 32 MiB)
// with a fresh mapping and unmaps it on free, and trims the heap's top, so a buffer made and freed
// every step (a unit's all-gather buffer and gathered weights, the reduce-scatter buffer, large
// activations) is page-faulted and zeroed by the kernel anew each time. Measured at 4 CPU ranks of
// llama_20m: 1.56-1.91 s per step before, 1.23 s after, peak RSS unchanged (docs/performance.md).
// Also asks LibTorch for transparent huge pages on host buffers of 2 MiB and more
// (THP_MEM_ALLOC_ENABLE=1, unless the environment already sets it: 0 turns it off), where the kernel
// gives them on request (transparent_hugepage "madvise" or "always"): the host optimizer step streams
// arrays of hundreds of MB, and with 4 KiB pages its page walks miss the caches. Measured with
// build/bench/adamw_bench at 2^26 elements (1 GiB of AdamW arrays, 2 threads): 44-64 ms per step
// without, 32-34 ms with (docs/performance.md).
// Call once, first thing in main, before any tensor exists; a no-op outside glibc and Linux.
void keep_freed_host_memory();

}  // namespace llm
