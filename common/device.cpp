#include "common/device.h"

#include <atomic>

#include "common/errors.h"

#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
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
#endif
}

double read_to_host(const at::Tensor& scalar) {
  reads.fetch_add(1, std::memory_order_relaxed);
  return scalar.item<double>();
}

int64_t host_reads() { return reads.load(std::memory_order_relaxed); }

}  // namespace llm
