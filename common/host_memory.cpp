#include "common/host_memory.h"

#include <malloc.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <cstdlib>

#include <atomic>
#include <limits>
#include <mutex>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace llm {
namespace {

void raise_to(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

class CountingCPUAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr block = base_->allocate(bytes);
    // The default CPU allocator's context is its data pointer; we keep that convention (and take
    // over the deleter) so the raw interface stays valid.
    void* data = block.release_context();
    if (data != nullptr) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        sizes_.emplace(data, bytes);
      }
      const int64_t now = current_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
                          static_cast<int64_t>(bytes);
      raise_to(peak_, now);
      raise_to(window_peak_, now);
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    default_copy_data(destination, source, count);
  }

  static void release(void* data) {
    if (data == nullptr) return;
    CountingCPUAllocator& self = instance();
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto found = self.sizes_.find(data);
      if (found != self.sizes_.end()) {
        bytes = found->second;
        self.sizes_.erase(found);
      }
    }
    self.current_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    self.base_deleter_(data);
  }

  // Never destroyed: LibTorch frees static tensors during exit, after function-local statics die.
  static CountingCPUAllocator& instance() {
    static CountingCPUAllocator* allocator = new CountingCPUAllocator();
    return *allocator;
  }

  void install() {
    std::call_once(installed_, [this] {
      base_ = c10::GetDefaultCPUAllocator();
      base_deleter_ = base_->raw_deleter();
      c10::SetCPUAllocator(this, /*priority=*/1);
      active_.store(true);
    });
  }

  bool active() const { return active_.load(); }
  HostMemoryCounters counters() {
    HostMemoryCounters counters;
    counters.current_bytes = current_.load(std::memory_order_relaxed);
    counters.peak_bytes = peak_.load(std::memory_order_relaxed);
    counters.window_peak_bytes = window_peak_.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mutex_);
    counters.live_blocks = static_cast<int64_t>(sizes_.size());
    return counters;
  }
  void reset_window() { window_peak_.store(current_.load(std::memory_order_relaxed)); }

 private:
  c10::Allocator* base_ = nullptr;
  c10::DeleterFnPtr base_deleter_ = nullptr;
  std::once_flag installed_;
  std::atomic<bool> active_{false};
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
  std::atomic<int64_t> current_{0}, peak_{0}, window_peak_{0};
};

}  // namespace

void install_host_memory_tracking() { CountingCPUAllocator::instance().install(); }

void keep_freed_host_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);  // no per-block mappings: every block from the heaps
  // Give the heap's top back only above 2 GiB free (mallopt takes an int: INT_MAX is the most).
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
}
void advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (data == nullptr || end <= begin) return;
  // Advice only: a kernel without THP refuses it, which changes nothing. The heap may hand out pages
  // an earlier buffer already faulted in as 4 KiB ones, which the advice alone leaves small: they are
  // collapsed into huge pages now (MADV_COLLAPSE, Linux 6.1; older kernels leave them to khugepaged).
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#ifndef MADV_COLLAPSE
  constexpr int MADV_COLLAPSE = 25;
#endif
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_COLLAPSE);
#else
  (void)data;
  (void)bytes;
#endif
}

bool host_memory_tracking_installed() { return CountingCPUAllocator::instance().active(); }
HostMemoryCounters host_memory_counters() { return CountingCPUAllocator::instance().counters(); }
void reset_host_window_peak() { CountingCPUAllocator::instance().reset_window(); }

at::Tensor empty_streamed(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor buffer = at::empty(sizes, options);
  if (buffer.is_cpu()) advise_huge_pages(buffer.data_ptr(), static_cast<int64_t>(buffer.nbytes()));
  return buffer;
}

}  // namespace llm
