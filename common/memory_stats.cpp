#include "common/memory_stats.h"
#include "common/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "common/errors.h"
#include "common/output_files.h"

#ifdef TRAINER_HAVE_CUDA
#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace llm {
namespace {

// The history and the snapshot are the CUDA caching allocator's: on a CPU rank there is nothing to
// record (the host figures are in memory.rank<R>.jsonl), so asking for them is a user error.
void require_cuda(c10::Device device) {
#ifdef TRAINER_HAVE_CUDA
  if (device.is_cuda()) return;
  fail_user("command line", "--memory_snapshot",
            "needs a CUDA device (the snapshot is the CUDA caching allocator's, for "
            "pytorch.org/memory_viz); this rank runs on " + device.str() +
                ". Drop the flag on CPU runs: the host figures are in RUN_DIR/memory.rank<R>.jsonl");
#else
  fail_user("command line", "--memory_snapshot",
            "needs a CUDA device, and this trainer was built without CUDA (the snapshot is the CUDA "
            "caching allocator's). Drop the flag: the host figures are in RUN_DIR/memory.rank<R>.jsonl");
#endif
}

}  // namespace

int64_t peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t current_resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t total_pages = 0, resident_pages = 0;
  if (!(statm >> total_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

int64_t device_free_bytes(c10::Device device) {
#ifdef TRAINER_HAVE_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard on_device(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it, and say nothing is known
      return 0;
    }
    return static_cast<int64_t>(free);
  }
#endif
  (void)device;
  return 0;
}

namespace {

// One "Key:   N kB" line of /proc/meminfo, in bytes; 0 where unreadable.
int64_t meminfo_bytes(const std::string& wanted) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == wanted) return kib * 1024;
    meminfo.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

int64_t host_available_bytes() { return meminfo_bytes("MemAvailable:"); }
int64_t host_total_bytes() { return meminfo_bytes("MemTotal:"); }

DeviceMemoryStats device_memory_stats(c10::Device device) {
  DeviceMemoryStats result;
#ifdef TRAINER_HAVE_CUDA
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(at::kCUDA);  // the allocator exists only once initialised
    // Through the device-allocator interface, not c10::cuda::CUDACachingAllocator's inline get(): that
    // reads a variable of libc10_cuda, which the binary cannot refer to (common/device.h).
    const auto stats = c10::getDeviceAllocator(at::kCUDA)->getDeviceStats(device.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    result.allocated_bytes = stats.allocated_bytes[all].current;
    result.allocated_peak_bytes = stats.allocated_bytes[all].peak;
    result.reserved_bytes = stats.reserved_bytes[all].current;
    result.reserved_peak_bytes = stats.reserved_bytes[all].peak;
    result.alloc_retries = stats.num_alloc_retries;
    result.ooms = stats.num_ooms;
  }
#endif
  return result;
}

void reset_device_peak_stats(c10::Device device) {
#ifdef TRAINER_HAVE_CUDA
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(at::kCUDA);
    c10::getDeviceAllocator(at::kCUDA)->resetPeakStats(device.index());
  }
#endif
}

PinnedMemoryStats pinned_memory_stats(c10::Device device) {
  PinnedMemoryStats result;
#ifdef TRAINER_HAVE_CUDA
  if (device.is_cuda()) {
    const at::HostStats stats = at::getHostAllocator(at::kCUDA)->get_stats();
    result.reserved_bytes = stats.allocated_bytes.current;
    result.reserved_peak_bytes = stats.allocated_bytes.peak;
    result.active_bytes = stats.active_bytes.current;
  }
#endif
  return result;
}

namespace {
std::atomic<int64_t> exact_pinned{0};
}  // namespace

at::Tensor exact_host_buffer(int64_t elements, at::ScalarType dtype, c10::Device pinned_for) {
  const at::TensorOptions options = at::TensorOptions().dtype(dtype);
#ifdef TRAINER_HAVE_CUDA
  if (pinned_for.is_cuda()) {
    c10::cuda::CUDAGuard on_device(pinned_for);
    void* data = nullptr;
    const int64_t bytes = std::max<int64_t>(elements, 1) * static_cast<int64_t>(c10::elementSize(dtype));
    LLM_CHECK_CUDA(cudaHostAlloc(&data, static_cast<size_t>(bytes), cudaHostAllocDefault));
    exact_pinned.fetch_add(bytes);
    return at::from_blob(
        data, {elements},
        [bytes](void* block) {
          cudaFreeHost(block);
          exact_pinned.fetch_sub(bytes);
        },
        options);
  }
#else
  (void)pinned_for;
#endif
  return empty_streamed({elements}, options);  // long-lived: offload's rows
}

at::Tensor exact_host_copy(const at::Tensor& from, c10::Device pinned_for) {
  at::Tensor copy = exact_host_buffer(from.numel(), from.scalar_type(), pinned_for);
  copy.copy_(from.reshape({-1}));
  return copy;
}

int64_t exact_pinned_bytes() { return exact_pinned.load(); }

int64_t device_peak_allocated_bytes(c10::Device device) {
  return device_memory_stats(device).allocated_peak_bytes;
}

int64_t peak_memory_bytes(c10::Device device) {
  return device.is_cuda() ? device_peak_allocated_bytes(device) : peak_resident_bytes();
}

void start_device_memory_history(c10::Device device, int64_t max_entries) {
  require_cuda(device);
#ifdef TRAINER_HAVE_CUDA
  // enabled "all" (allocations and frees), context "all", stacks "all" (C++ frames: no Python here).
  torch::cuda::_record_memory_history(std::string("all"), std::string("all"), "all",
                                      static_cast<size_t>(max_entries));
#endif
}

void stop_device_memory_history(c10::Device device) {
  require_cuda(device);
#ifdef TRAINER_HAVE_CUDA
  torch::cuda::_record_memory_history(std::optional<std::string>(), std::optional<std::string>(), "all",
                                      0);
#endif
}

void write_device_memory_snapshot(c10::Device device, const std::string& path) {
  require_cuda(device);
#ifdef TRAINER_HAVE_CUDA
  const std::string pickled = torch::cuda::_memory_snapshot_pickled();
  write_file_atomically(path, pickled);
#else
  (void)path;
#endif
}

}  // namespace llm
