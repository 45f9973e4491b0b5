#include "common/device.h"

#include <atomic>

#include "common/errors.h"

#ifdef TRAINER_HAVE_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace llm {
namespace {
std::atomic<int64_t> reads{0};
}  // namespace

void make_current_device(c10::Device device) {
  if (!device.is_cuda()) return;
#ifdef TRAINER_HAVE_CUDA
  LLM_REQUIRE(device.has_index(), "device", device.str(), "names no GPU; give its index, e.g. cuda:0");
  c10::cuda::set_device(device.index());
  // The caching allocator's statistics (the memory check, the ledger) are read before the first
  // CUDA tensor exists: LibTorch initialises the allocator only with that tensor, and before it every
  // reading fails with "Invalid device argument" (the first GPU run, docs/gpu-results.md).
  at::globalContext().lazyInitDevice(at::kCUDA);
#endif
}

int visible_gpu_count() {
#ifdef TRAINER_HAVE_CUDA
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

std::string gpu_bus_id(c10::Device device) {
  if (!device.is_cuda()) return "";
#ifdef TRAINER_HAVE_CUDA
  char bus_id[32] = {};
  LLM_CHECK_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device.index()));
  return bus_id;
#else
  return "";
#endif
}

std::string gpu_name(c10::Device device) {
  if (!device.is_cuda()) return "";
#ifdef TRAINER_HAVE_CUDA
  cudaDeviceProp properties{};
  LLM_CHECK_CUDA(cudaGetDeviceProperties(&properties, device.index()));
  return properties.name;
#else
  return "";
#endif
}

double read_to_host(const at::Tensor& scalar) {
  reads.fetch_add(1, std::memory_order_relaxed);
  return scalar.item<double>();
}

int64_t host_reads() { return reads.load(std::memory_order_relaxed); }

}  // namespace llm
