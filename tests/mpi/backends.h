// The Communicator backends the multi-rank tests run over, and whether this host can run one.
#pragma once

#include <memory>
#include <string>

#include <torch/cuda.h>

#include "sharding/communicator.h"
#include "sharding/world.h"

namespace llm::testing {

// "" when `backend` ("single", "mpi", "mpi_staged", "single_cuda", "nccl", "mpi_staged_cuda") can
// run here; else why not. The GPU backends need a CUDA build and a GPU; NCCL also one GPU per rank
// on this host (it cannot share one), the staged MPI backend does not ("mpi_staged" is the same
// backend over CPU tensors: its staging runs host to host).
inline std::string backend_unavailable_reason(const std::string& backend) {
  if (backend != "nccl" && backend != "single_cuda" && backend != "mpi_staged_cuda") return "";
#ifndef TRAINER_HAVE_CUDA
  return "built without CUDA";
#else
  if (!torch::cuda::is_available()) return "no GPU on this host";
  if (backend == "mpi_staged_cuda") return "";
  const World& world = current_world();
  if (world.local_size > static_cast<int>(torch::cuda::device_count()))
    return std::to_string(world.local_size) + " ranks on this host but " +
           std::to_string(torch::cuda::device_count()) + " GPU(s): NCCL needs one each";
  return "";
#endif
}

// A communicator of an available backend (check backend_unavailable_reason first).
inline std::unique_ptr<Communicator> make_backend(const std::string& backend) {
  const World& world = current_world();
  const c10::Device gpu(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank));
  if (backend == "single") return make_single_rank_communicator(c10::kCPU);
  if (backend == "single_cuda") return make_single_rank_communicator(gpu);
  if (backend == "mpi") return make_mpi_communicator(world);
  if (backend == "mpi_staged") return make_staged_mpi_communicator(world, c10::kCPU);
  if (backend == "mpi_staged_cuda")  // ranks share the GPUs there are
    return make_staged_mpi_communicator(
        world, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank % torch::cuda::device_count())));
  return make_nccl_communicator(world, gpu);
}

}  // namespace llm::testing
