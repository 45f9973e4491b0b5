#include "common/device.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include <ATen/ops/cat.h>

#include "common/errors.h"

#ifdef TRAINER_HAVE_CUDA
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

#ifdef TRAINER_HAVE_CUDA
// The CUDA caching allocator's pointer, a variable of libc10_cuda that LibTorch's inline functions read
// (c10::cuda::CUDACachingAllocator::get(), which CUDAGuard and CUDAEvent instantiate): the binary
// holds its storage itself, as a copy relocation would give it, because a copy relocation is bound when
// the binary starts and libc10_cuda is loaded later (load_cuda_runtime). libc10_cuda reads and sets it
// through its global offset table, so its own code binds to this one when it is loaded, and its static
// initialiser stores the allocator here; load_cuda_runtime checks that it did.
namespace c10::cuda::CUDACachingAllocator {
std::atomic<CUDAAllocator*> allocator{nullptr};
}  // namespace c10::cuda::CUDACachingAllocator
#endif

namespace llm {
namespace {
std::atomic<int64_t> reads{0};

// Why the CUDA runtime is not in the process; "" once it is.
std::string& absence() {
  static std::string reason = "not loaded yet";
  return reason;
}

// c10::cuda::device_count(), looked up in the process's global scope: there once libc10_cuda is.
bool c10_cuda_present() { return ::dlsym(RTLD_DEFAULT, "_ZN3c104cuda12device_countEv") != nullptr; }

}  // namespace

bool load_cuda_runtime() {
#ifdef TRAINER_HAVE_CUDA
  if (cuda_runtime_loaded()) return true;
  const char* forced = std::getenv("LLM_DEBUG_LOAD_CUDA");
  const bool force = forced != nullptr && std::string(forced) == "1";
  // The driver stays loaded (LibTorch would load it anyway); without it no GPU can be used.
  if (::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) == nullptr && !force) {
    absence() = "no NVIDIA driver on this machine: libcuda.so.1 is not found";
    return false;
  }
  // Global: its symbols bind the trainer's calls into it, and those of the libraries it brings.
  if (::dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_GLOBAL) == nullptr) {
    const char* error = ::dlerror();
    absence() = std::string("LibTorch's CUDA library could not be loaded: ") + (error != nullptr ? error : "?");
    return false;
  }
  if (!c10_cuda_present() || !at::detail::getCUDAHooks().hasCUDART()) {
    absence() = "libtorch_cuda.so is loaded, but LibTorch's CUDA hooks were read before it was (a CUDA query "
                "before load_cuda_runtime)";
    return false;
  }
  if (c10::cuda::CUDACachingAllocator::get() == nullptr) {
    absence() = "libc10_cuda.so is loaded, but its caching allocator did not reach the binary's pointer to it";
    return false;
  }
  (void)c10::cuda::device_count();  // the binary's first call into it: bound now, not in the middle of a step
  absence().clear();
  return true;
#else
  absence() = "this trainer was built without CUDA";
  return false;
#endif
}

bool cuda_runtime_loaded() {
  if (absence().empty()) return true;
  if (!c10_cuda_present()) return false;
  absence().clear();  // linked in as usual: the tests' and the benchmarks' binaries
  return true;
}

std::string cuda_runtime_absence() { return cuda_runtime_loaded() ? "" : absence(); }

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
  if (!cuda_runtime_loaded()) return 0;
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

std::vector<double> read_to_host(const std::vector<at::Tensor>& scalars) {
  std::vector<at::Tensor> doubles;
  for (const at::Tensor& scalar : scalars) doubles.push_back(scalar.reshape({1}).to(at::kDouble));
  reads.fetch_add(1, std::memory_order_relaxed);
  const at::Tensor host = at::cat(doubles).to(at::kCPU);
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

int64_t host_reads() { return reads.load(std::memory_order_relaxed); }

}  // namespace llm
