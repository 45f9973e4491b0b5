#include "common/memory_stats.h"

#include <sys/resource.h>

#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace llm {

int64_t peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t device_peak_allocated_bytes(c10::Device device) {
#ifdef TRAINER_HAVE_CUDA
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#endif
  return 0;
}

int64_t peak_memory_bytes(c10::Device device) {
  return device.is_cuda() ? device_peak_allocated_bytes(device) : peak_resident_bytes();
}

}  // namespace llm
