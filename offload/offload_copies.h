// OptimizerOffload's CUDA copy streams and events, shared by its two source files
// (optimizer_offload.cpp: the schedule; offload_copies.cpp: what crosses the bus and when).
#pragma once

#include <vector>

#include "offload/optimizer_offload.h"

#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace llm {

#ifdef TRAINER_HAVE_CUDA
struct OptimizerOffload::CudaCopies {
  c10::DeviceIndex device;
  c10::cuda::CUDAStream to_host, to_device;
  // Per unit: the gradient left the device (D2H) / the compute shard holds the update (H2D) / the
  // compute stream is past its last read of the unit before the H2D copy overwrites it.
  std::vector<c10::cuda::CUDAEvent> gradient_landed, update_landed;
  c10::cuda::CUDAEvent backward_done;
  // The host waits on gradient_landed and update_landed (cudaEventSynchronize): blocking-sync events,
  // so the waiting thread sleeps instead of spinning a core the host step's threads need.
  explicit CudaCopies(c10::DeviceIndex index, size_t units)
      : device(index),
        to_host(c10::cuda::getStreamFromPool(false, index)),
        to_device(c10::cuda::getStreamFromPool(false, index)) {
    for (size_t u = 0; u < units; ++u) {
      gradient_landed.emplace_back(cudaEventDisableTiming | cudaEventBlockingSync);
      update_landed.emplace_back(cudaEventDisableTiming | cudaEventBlockingSync);
    }
  }
};
#else
struct OptimizerOffload::CudaCopies {};
#endif

}  // namespace llm
