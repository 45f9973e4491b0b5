// What the memory estimate prints: `trainer estimate`'s Markdown (the settings, the per-rank table,
// the checkpoint save, the budget's verdict, the CUDA runtime's share, each node's host memory) and
// its JSON (--json, and the "estimate" of a run record). Apart from estimate.cpp, which computes the
// estimate: this file only formats it.
#include "memory/estimate.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/memory_stats.h"
#include "memory/step_time.h"

namespace llm {

std::vector<std::pair<int, int>> ranks_alike(const std::vector<RankEstimate>& ranks) {
  std::vector<std::pair<int, int>> groups;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!groups.empty()) {
      RankEstimate as_first = ranks[r];
      as_first.rank = ranks[static_cast<size_t>(groups.back().first)].rank;
      if (as_first == ranks[static_cast<size_t>(groups.back().first)]) {
        groups.back().second = static_cast<int>(r);
        continue;
      }
    }
    groups.emplace_back(static_cast<int>(r), static_cast<int>(r));
  }
  return groups;
}

nlohmann::json estimate_to_json(const MemoryEstimate& estimate) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& [first, last] : ranks_alike(estimate.ranks)) {
    const RankEstimate& rank = estimate.ranks[static_cast<size_t>(first)];
    nlohmann::json phases = nlohmann::json::array();
    for (const PhaseEstimate& phase : rank.phases)
      phases.push_back({{"label", phase.label}, {"peak_bytes", phase.peak_bytes}, {"at_point", phase.at_point.to_json()}});
    ranks.push_back({{"rank", rank.rank},
                     {"last_rank", estimate.ranks[static_cast<size_t>(last)].rank},
                     {"peak_bytes", rank.peak_bytes},
                     {"peak_phase", rank.peak_phase},
                     {"max", rank.max.to_json()},
                     {"at_peak", rank.at_peak.to_json()},
                     {"checkpoint_peak_bytes", rank.checkpoint_peak_bytes},
                     {"host_bytes", rank.host_bytes},
                     {"async_save_host_bytes", rank.async_save_host_bytes},
                     {"pinned_bytes", rank.pinned_bytes},
                     {"cuda_runtime", {{"modules_bytes", rank.runtime.modules},
                                       {"cublas_workspace_bytes", rank.runtime.cublas_workspaces},
                                       {"nccl_buffer_bytes", rank.runtime.nccl_buffers},
                                       {"allocator_slack_bytes", rank.runtime.allocator_slack}}},
                     {"phases", phases}});
  }
  nlohmann::json nodes = nlohmann::json::array();
  for (const NodeEstimate& node : estimate.nodes)
    nodes.push_back({{"first_rank", node.first_rank}, {"ranks", node.ranks}, {"host_bytes", node.host_bytes},
                     {"pinned_bytes", node.pinned_bytes}});
  return {{"device", estimate.device}, {"gathered_units", estimate.gathered_units}, {"ranks", ranks}, {"nodes", nodes},
          {"simulated_ranks", estimate.simulated_ranks}};
}

namespace {

// Each node's host memory against its RAM: what --offload optimizer adds to host memory is the
// reason a run may fit the GPUs and not the node (four ranks on one node share its RAM).
std::string node_memory_section(const MemoryEstimate& estimate, const EstimateOptions& options) {
  const bool cuda = estimate.device == "cuda";
  int64_t largest = 0;
  for (const NodeEstimate& node : estimate.nodes) largest = std::max(largest, node.host_bytes);
  const int64_t ram = options.node_memory_gib > 0 ? static_cast<int64_t>(options.node_memory_gib * 1073741824.0)
                                                  : host_total_bytes();
  const ByteUnit unit = byte_unit_for(std::max(largest, ram));
  std::ostringstream out;
  out << "\nHost memory per node (" << estimate.nodes.front().ranks << " rank(s) per node, consecutive ranks; "
      << (cuda ? "what --offload keeps in host memory: of the optimizer masters, gradient landing buffers, staging "
                 "buffers (pinned) and optimizer state; of the parameters each unit's rows (pinned, in place of the "
                 "staging buffers); and --async_save's copies; the processes themselves come on top"
               : "every rank's peak, all of it host memory, and --async_save's copies")
      << "). Sizes in " << unit.name << ".\n\n"
      << "| node | ranks | host | of which pinned |\n|---:|---|---:|---:|\n";
  for (size_t i = 0; i < estimate.nodes.size(); ++i) {
    const NodeEstimate& node = estimate.nodes[i];
    out << "| " << i << " | " << node.first_rank << "-" << node.first_rank + node.ranks - 1 << " | "
        << format_in(node.host_bytes, unit) << " | " << format_in(node.pinned_bytes, unit) << " |\n";
  }
  if (ram <= 0) {
    out << "\nThis machine's RAM is unknown (no /proc/meminfo): pass --node_memory_gib for the verdict.\n";
    return out.str();
  }
  char line[320];
  std::snprintf(line, sizeof(line), "\nNode RAM %.1f GiB (%s): the largest node's host memory, %.2f GiB, %s.\n",
                static_cast<double>(ram) / 1073741824.0,
                options.node_memory_gib > 0 ? "--node_memory_gib" : "this machine's; --node_memory_gib for another",
                static_cast<double>(largest) / 1073741824.0,
                largest <= ram ? "fits" : "does NOT fit: use more nodes (fewer --ranks_per_node), shard over more ranks, or a lighter optimizer");
  out << line;
  return out.str();
}

}  // namespace

std::string run_estimate_command(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options) {
  const MemoryEstimate estimate = estimate_memory(model, run, options);
  // The step time when its compute rate is measured (--profile) or given (--device_tflops).
  const bool timed = options.profile_seconds > 0 || options.device_tflops > 0;
  const StepTimeEstimate step_time = timed ? predict_step_time(model, run, options, estimate.device) : StepTimeEstimate{};
  if (options.json) {
    nlohmann::json json = estimate_to_json(estimate);
    if (timed) json["step_time"] = step_time.to_json();
    return json.dump(1) + "\n";
  }
  int64_t largest = 0, largest_checkpoint = 0;
  for (const RankEstimate& rank : estimate.ranks) {
    largest = std::max(largest, rank.peak_bytes);
    largest_checkpoint = std::max(largest_checkpoint, rank.checkpoint_peak_bytes);
  }
  const ByteUnit unit = byte_unit_for(std::max(largest, largest_checkpoint));
  std::ostringstream out;
  out << "Estimate for " << model.name << " (" << model.num_parameters() << " parameters), --optimizer "
      << run.optimizer.name
      << (run.optimizer.state_dtype == "bfloat16" ? " --optimizer_state_dtype bfloat16" : "")
      << ", --dtype " << to_string(run.precision.dtype);
  if (run.precision.dtype == DType::bfloat16) out << " --precision " << to_string(run.precision.mode);
  out << ", --sharding " << to_string(run.sharding.strategy) << ", " << options.world_size << " rank(s) on "
      << estimate.device << ", micro-batch " << run.data.batch_size << " x " << run.data.max_length << " tokens"
      << (run.data.gradient_accumulation > 1 ? ", " + std::to_string(run.data.gradient_accumulation) + " micro-batches per step" : "")
      << ", " << (run.sharding.prefetch ? "prefetch" : "no prefetch") << ": at most " << estimate.gathered_units
      << " unit(s) gathered at once.\n"
      << "Peak: the largest total inside any phase of a step (evaluation included); the categories: each one's "
         "largest value at a phase boundary (docs/memory.md). Sizes in "
      << unit.name << ".\n\n";
  out << "| rank | peak | peak in | parameters | gradients | optimizer (device) | offloaded (host) | activations | other | checkpoint save |\n"
      << "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& [first, last] : ranks_alike(estimate.ranks)) {
    const RankEstimate& rank = estimate.ranks[static_cast<size_t>(first)];
    out << "| " << rank.rank << (last > first ? "-" + std::to_string(estimate.ranks[static_cast<size_t>(last)].rank) : "")
        << " | " << format_in(rank.peak_bytes, unit) << " | " << rank.peak_phase << " |";
    for (int i = 0; i < MemoryCategories::kCount; ++i) out << ' ' << format_in(rank.max.at(i), unit) << " |";
    out << ' ' << format_in(rank.checkpoint_peak_bytes, unit) << " |\n";
  }
  out << "\nCheckpoint save: every rank writes its own shards as they are (nothing is gathered), so a save "
         "holds what the step left behind (--save_dir).\n";
  if (run.checkpoint.async_save)
    out << "--async_save: each rank also holds a host copy of what it saves, at most "
        << format_in(estimate.ranks.front().async_save_host_bytes, unit) << " " << unit.name
        << " on rank 0, kept from the first save on (in the host memory below"
        << (estimate.device == "cuda" &&  !offloads_optimizer(run.sharding.offload) ? ", pinned" : "") << ").\n";
  if (options.memory_budget_gib > 0) {
    const double budget = options.memory_budget_gib * 1073741824.0;
    const bool fits = static_cast<double>(largest) <= budget;
    char line[256];
    std::snprintf(line, sizeof(line), "\nBudget %.1f GiB per rank: the training peak %s (largest rank %.2f GiB)",
                  options.memory_budget_gib, fits ? "fits" : "does NOT fit",
                  static_cast<double>(largest) / 1073741824.0);
    out << line;
    if (!run.checkpoint.save_dir.empty() || largest_checkpoint > budget) {
      std::snprintf(line, sizeof(line), "; saving a checkpoint %s (%.2f GiB)",
                    static_cast<double>(largest_checkpoint) <= budget ? "fits" : "does NOT fit",
                    static_cast<double>(largest_checkpoint) / 1073741824.0);
      out << line;
    }
    out << ".\n";
    if (estimate.device == "cuda")
      out << "(CUDA: allocated bytes; the runtime's own memory below comes on top.)\n";
  }
  if (estimate.device == "cuda") {
    const CudaRuntimeBytes& runtime = estimate.ranks.front().runtime;
    out << "\nBeside the tensors, each GPU holds about " << format_in(runtime.total(), unit) << " " << unit.name
        << " more on rank 0 (budgets, not yet measured: docs/memory.md): kernel modules "
        << format_in(runtime.modules, unit) << ", cuBLAS workspaces " << format_in(runtime.cublas_workspaces, unit)
        << ", NCCL buffers " << format_in(runtime.nccl_buffers, unit) << ", the caching allocator's slack "
        << format_in(runtime.allocator_slack, unit) << ". The start-up check counts them.\n";
  }
  out << node_memory_section(estimate, options);
  out << (timed ? step_time_section(step_time, run, options.world_size)
                : "\nStep time: pass --profile SECONDS to time this machine's device (or --device_tflops T) for the "
                  "predicted step time, tokens a second and exposed communication (memory/step_time.h).\n");
  return out.str();
}

}  // namespace llm
