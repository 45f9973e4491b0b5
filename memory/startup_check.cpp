#include "memory/startup_check.h"

#include <exception>
#include <sstream>

#include "common/device.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/memory_stats.h"

namespace llm {
namespace {

std::string gib(int64_t bytes) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return out.str();
}

// "parameters 1.20 GiB, gradients ..., at backward:head"
std::string breakdown(const RankEstimate& rank) {
  std::ostringstream out;
  out << "at " << rank.peak_phase << ": parameters " << gib(rank.at_peak.parameters) << ", gradients "
      << gib(rank.at_peak.gradients) << ", optimizer " << gib(rank.at_peak.optimizer_device + rank.at_peak.optimizer_host)
      << ", activations " << gib(rank.at_peak.activations);
  // The rest of the peak is what lives only inside the window (the logits' gradient, a layer's
  // backward temporaries), on top of what the closing point holds.
  const int64_t held = rank.at_peak.parameters + rank.at_peak.gradients + rank.at_peak.optimizer_device +
                       rank.at_peak.activations + rank.at_peak.other;
  if (rank.peak_bytes > held) out << ", transients " << gib(rank.peak_bytes - held);
  return out.str();
}

// What a CUDA rank keeps in host memory, by the estimate (memory/estimate.h).
std::string cuda_host_use(const RunConfig& run) {
  const bool offload = run.sharding.offload != Offload::none;
  if (!offload && !run.checkpoint.async_save) return "";
  return std::string(" for ") +
         (offloads_optimizer(run.sharding.offload) && offloads_parameters(run.sharding.offload)
              ? "the offloaded optimizer and parameters (masters, state, landing buffers, compute rows)"
          : offloads_optimizer(run.sharding.offload) ? "the offloaded optimizer (masters, state, landing and staging buffers)"
          : offload ? "the offloaded parameters (each unit's rows in the compute dtype)" : "") +
         (offload && run.checkpoint.async_save ? " and " : "") +
         (run.checkpoint.async_save ? "--async_save's copy of each rank's state" : "");
}

std::string remedies(const RunConfig& run, bool cuda) {
  std::ostringstream out;
  out << "To fit: lower --batch_size (now " << run.data.batch_size << ") or --max_length (now " << run.data.max_length
      << "), run on more ranks or nodes (full_shard divides parameters, gradients and optimizer state among them)";
  if (cuda && !offloads_optimizer(run.sharding.offload)) out << ", or --offload optimizer (state and masters in host memory)";
  if (cuda && !offloads_parameters(run.sharding.offload))
    out << ", or --offload " << (offloads_optimizer(run.sharding.offload) ? "optimizer,parameters" : "parameters")
        << " (each unit's rows in host memory, copied in at its gather)";
  if (run.precision.dtype == DType::float32) out << ", or --dtype bfloat16 --precision pure";
  if (run.checkpoint.async_save) out << ", or drop --async_save (its host copy of each rank's state)";
  out << ". `trainer estimate` with the same flags shows where the memory goes; --skip_memory_check starts anyway";
  return out.str();
}

}  // namespace

std::optional<std::string> memory_check_failure(const MemoryEstimate& estimate, int rank, int local_ranks,
                                                const MemoryAvailable& available, const RunConfig& run) {
  const bool cuda = estimate.device == "cuda";
  const RankEstimate& mine = estimate.ranks.at(static_cast<size_t>(rank));
  const NodeEstimate& node = estimate.nodes.at(static_cast<size_t>(rank / std::max(1, local_ranks)));
  std::ostringstream why;
  const int64_t device_need = mine.peak_bytes + mine.runtime.total();
  const int sharing = std::max(1, available.ranks_per_gpu);
  if (cuda && available.device_free_bytes > 0 && device_need * sharing > available.device_free_bytes) {
    why << "memory check: rank " << rank << " needs about " << gib(device_need) << " of device memory at its peak ("
        << gib(mine.peak_bytes) << " of tensors " << breakdown(mine) << "; beside them kernel modules "
        << gib(mine.runtime.modules) << ", cuBLAS workspaces " << gib(mine.runtime.cublas_workspaces)
        << ", NCCL buffers " << gib(mine.runtime.nccl_buffers) << ", allocator slack "
        << gib(mine.runtime.allocator_slack) << ") and its GPU has " << gib(available.device_free_bytes) << " free"
        << (sharing > 1 ? " for the " + std::to_string(sharing) + " ranks that share it (--communicator mpi)" : "")
        << ". " << remedies(run, cuda);
    return why.str();
  }
  if (available.host_available_bytes > 0 && node.host_bytes > available.host_available_bytes) {
    why << "memory check: " << (node.ranks == 1 ? std::string("this rank needs") : "the " + std::to_string(node.ranks) + " ranks on this node need") << " about "
        << gib(node.host_bytes) << " of host memory"
        << (cuda ? cuda_host_use(run)
                 : std::string(node.ranks == 1 ? " at its peak" : " at their peaks") + " (rank " + std::to_string(rank) + ": " + gib(mine.peak_bytes) + ", " +
                       breakdown(mine) + ")")
        << " and this machine has " << gib(available.host_available_bytes) << " available (MemAvailable). "
        << remedies(run, cuda);
    return why.str();
  }
  return std::nullopt;
}

void check_memory_before_training(const ModelConfig& model, const RunConfig& run, int rank, int world_size,
                                  int local_ranks, c10::Device device) {
  MemoryEstimate estimate;
  try {
    EstimateOptions options;
    options.world_size = world_size;
    options.device = device.is_cuda() ? "cuda" : "cpu";
    options.ranks_per_node = local_ranks;
    estimate = estimate_memory(model, run, options);
  } catch (const std::exception& error) {
    // A check that cannot be made does not let the run start unchecked: the run it could not
    // estimate is the kind that fails part-way into start-up (an allocator's abort, the OOM killer).
    throw UserError(std::string("memory check: the start-up memory check could not be made, so the run does not start: "
                                "the estimate of this run failed: ") +
                    error.what() +
                    ". Check the config and the flags (`trainer estimate` with the same flags shows the same failure); "
                    "--skip_memory_check starts the run without the check");
  }
  MemoryAvailable available{device_free_bytes(device), host_available_bytes()};
  const int gpus = visible_gpu_count();
  if (device.is_cuda() && run.sharding.communicator == CommunicatorChoice::mpi && gpus > 0)
    available.ranks_per_gpu = (local_ranks + gpus - 1) / gpus;
  if (const std::optional<std::string> failure = memory_check_failure(estimate, rank, local_ranks, available, run))
    throw UserError(*failure);
  if (rank == 0) {
    const RankEstimate& first = estimate.ranks.front();
    log::info("memory check: about {} per rank at the peak ({}){}; host {} per node ({} rank(s) on this one) of {} available",
              gib(first.peak_bytes + first.runtime.total()),
              first.peak_phase,
              device.is_cuda() ? " of " + gib(available.device_free_bytes) + " free on the GPU" : std::string(),
              gib(estimate.nodes.front().host_bytes), estimate.nodes.front().ranks, gib(available.host_available_bytes));
  }
}

}  // namespace llm
