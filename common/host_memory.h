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

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

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
// Call once, first thing in main, before any tensor exists; a no-op outside glibc and Linux.
void keep_freed_host_memory();

// Transparent huge pages for one long-lived host buffer (the optimizer's masters, gradient shards and
// state, which the host step streams: with 4 KiB pages its page walks miss the caches; build/bench/
// adamw_bench at 2^26 elements, 2 threads: 44-64 ms a step without, 32-34 ms with), asked of the kernel
// for the buffer's whole 2 MiB pages (madvise MADV_HUGEPAGE; given where transparent_hugepage is
// "madvise" or "always"). Before the buffer's first write: pages already touched stay small. Not for
// every buffer of 2 MiB and more, as LibTorch's THP_MEM_ALLOC_ENABLE=1 asks (which this trainer set
// until issue 55): its 2 MiB-aligned blocks fragment the heap, which then grows for several steps,
// each step's new huge pages faulted and zeroed in (llama_9m at one rank: the forward 0.37 s a
// micro-batch in steps 1-4 against 0.094 s from step 7, and the peak RSS 907 MiB against 547 MiB).
// A no-op for a buffer under 2 MiB, off the host, or outside Linux.
void advise_huge_pages(void* data, int64_t bytes);

// at::empty(sizes, options) with huge pages advised for it when it is on the host (advise_huge_pages):
// for the optimizer's long-lived buffers, before their first write.
at::Tensor empty_streamed(at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace llm
