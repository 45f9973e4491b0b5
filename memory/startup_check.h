// The memory check before a training run allocates anything: the trainer's own estimate
// (memory/estimate.h) for this run, against what this rank and this node have. A run that
// cannot fit stops with exit 2 and the numbers (what it needs, where, what is there, what to change)
// instead of an allocator's out-of-memory error or the kernel's OOM killer part-way into start-up.
// --skip_memory_check starts anyway (the estimate is within 10 % on CPU, unmeasured on GPUs).
//
// What is compared (a run is refused only when the estimate exceeds what is there, with no margin):
//   CUDA  the rank's estimated device peak against the device's free memory before the run
//         allocates (cudaMemGetInfo), and the node's offloaded host memory against MemAvailable
//   CPU   the node's ranks' estimated peaks, summed, against MemAvailable
// The node is `local_ranks` consecutive ranks (mpirun's default placement), the ranks that share this
// host's memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "config/config.h"
#include "memory/estimate.h"

namespace llm {

struct MemoryAvailable {
  int64_t device_free_bytes = 0;     // CUDA: free device memory; 0 on CPU or unknown (not checked)
  int64_t host_available_bytes = 0;  // MemAvailable; 0: unknown (not checked)
  int ranks_per_gpu = 1;  // --communicator mpi may put several ranks on one GPU: they share its free memory
};

// Why the run does not fit, or nothing: the verdict for an estimate made with
// ranks_per_node = local_ranks. Pure, for tests.
std::optional<std::string> memory_check_failure(const MemoryEstimate& estimate, int rank, int local_ranks,
                                                const MemoryAvailable& available, const RunConfig& run);

// Estimates this run and throws UserError (exit 2) when it does not fit; logs the figures on rank 0
// when it does. An estimate that cannot be made (a run too large to count, a failure of the
// estimator) also throws UserError, saying why and that --skip_memory_check skips the check: a run is
// never started unchecked without that flag.
void check_memory_before_training(const ModelConfig& model, const RunConfig& run, int rank, int world_size,
                                  int local_ranks, c10::Device device);

}  // namespace llm
