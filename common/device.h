// The device a rank computes on, made current once, and the host's reads of device values.
//
// The CUDA caching allocator, cudaHostAlloc, cuBLAS handles and every kernel launched without a
// guard use the *current* device of the calling thread. select_device() only names cuda:<local
// rank>; make_current_device() makes it current for the main thread, right after, so a rank with
// local rank N never creates a context or allocates on GPU 0. Threads we start ourselves (the
// offload worker, the background save, the watchdog) set it again with a CUDAGuard where they
// touch CUDA.
//
// A host read of a device value (tensor.item(), a copy to the host that is waited for) drains the
// GPU's queue: the host waits for every kernel queued before it, and nothing new is queued while
// it waits. A step should have a fixed, small number of them, independent of the micro-batches and
// units. read_to_host() is the one way the training step reads a device value, and it counts, so
// a CPU test can show how many a step takes (Train.HostReadsPerStep*).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llm {

// LibTorch's CUDA half (libtorch_cuda and libc10_cuda, and with them cuBLAS, cuDNN and NCCL) is not
// among the trainer binary's load-time dependencies: CMakeLists.txt removes it from the binary after
// the link (its calls into them stay, bound at their first call). Loaded for every process, it costs
// 0.12 s of start-up CPU and 350 MB of resident memory, for nothing on a machine without a GPU: a CPU
// job of 4 ranks, every `trainer estimate`, `report` and `export`. load_cuda_runtime(), first thing
// in main, loads it where an NVIDIA driver is installed (libcuda.so.1), before anything could use CUDA
// (LibTorch reads its CUDA hooks once, at their first use). LLM_DEBUG_LOAD_CUDA=1 loads it without a
// driver too (the tests' way through the loading on a CPU machine). Binaries linked with it as usual
// (the tests, the benchmarks) have it already. Returns whether it is in the process.
bool load_cuda_runtime();
// Whether LibTorch's CUDA half is in this process; why not, when it is not ("" when it is).
bool cuda_runtime_loaded();
std::string cuda_runtime_absence();

// On a CUDA device: cudaSetDevice for this thread (c10::cuda::set_device). Nothing on CPU.
void make_current_device(c10::Device device);
// The GPUs this process sees (CUDA_VISIBLE_DEVICES applied); 0 without CUDA or its runtime.
int visible_gpu_count();
// The PCI bus id of a CUDA device ("0000:3B:00.0"): one physical GPU, whatever index or
// CUDA_VISIBLE_DEVICES a rank names it by. "" on CPU.
std::string gpu_bus_id(c10::Device device);
// A CUDA device's name (cudaDeviceProp::name, "NVIDIA H100 80GB HBM3"); "" on CPU.
std::string gpu_name(c10::Device device);

// The value of a one-element tensor as a double, read on the host: one synchronisation on a GPU.
double read_to_host(const at::Tensor& scalar);
// The values of several one-element tensors (each converted to double on its device, exactly for
// fp32 and fp64), read in one copy: one synchronisation, counted once.
std::vector<double> read_to_host(const std::vector<at::Tensor>& scalars);
// How many read_to_host calls this process has made (all threads).
int64_t host_reads();

}  // namespace llm
