// The memory estimate's totals (memory/estimate.h): each rank's simulated step (estimate_simulation.h)
// into its peak, categories, checkpoint and host figures, the nodes' host memory, and the CUDA
// runtime's budgets. What `trainer estimate` prints of it is in estimate_command.cpp.
#include "memory/estimate.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "common/log.h"
#include "config/optimizer_setup.h"
#include "memory/estimate_simulation.h"
#include "model/units.h"
#include "sharding/flat_layout.h"
#include "sharding/topology.h"

namespace llm {
std::string estimate_device(const RunConfig& run, const EstimateOptions& options) {
  if (!options.device.empty()) return options.device;
  return run.device == DeviceChoice::cpu ? "cpu" : "cuda";
}

namespace {

// A rank's estimate from its step's phases: the peak is the first phase with the largest window,
// each category its largest value at a point.
RankEstimate finish_rank(int rank, bool cuda, bool offload, std::vector<PhaseEstimate> phases, const RankTotals& totals) {
  RankEstimate estimate;
  estimate.rank = rank;
  estimate.phases = std::move(phases);
  bool first = true;
  for (const PhaseEstimate& phase : estimate.phases) {
    estimate.max.raise_to(phase.at_point);
    if (first || phase.peak_bytes > estimate.peak_bytes) {
      estimate.peak_bytes = phase.peak_bytes;
      estimate.peak_phase = phase.label;
      estimate.at_peak = phase.at_point;
      first = false;
    }
  }
  // save(): every rank writes views of its own buffers (checkpoint/checkpoint.h), one tensor at a time:
  // on the CPU the view itself, on a GPU its host copy (outside the device's memory); nothing is
  // gathered. So the save holds what the step left behind: the point after the optimizer (the
  // host-resident offloaded state aside on CUDA, as the training peak counts the device alone).
  const PhaseEstimate& after_optimizer = *std::find_if(
      estimate.phases.begin(), estimate.phases.end(), [](const PhaseEstimate& p) { return p.label == "optimizer"; });
  estimate.checkpoint_peak_bytes = after_optimizer.at_point.total() - (cuda ? after_optimizer.at_point.optimizer_host : 0);
  estimate.host_bytes = cuda ? totals.offload_host : estimate.peak_bytes;
  estimate.pinned_bytes = totals.offload_pinned;
  if (totals.async_save) {
    estimate.async_save_host_bytes = totals.async_save_bytes;
    estimate.host_bytes += estimate.async_save_host_bytes;
    if (cuda && !offload) estimate.pinned_bytes += estimate.async_save_host_bytes;
  }
  return estimate;
}

// What tells a rank's step apart from another's, as a key. The layout gives every rank the same
// shard size (rows padded to a multiple of the world size), so ranks differ only in how many of their
// rows are real (the key lists them, per parameter: the tail ranks hold fewer), in rank 0's host copy
// of an --async_save, and under GaLore in whether the rank owns a matrix's SVD at a refresh (matrix i
// is rank i mod world's): a rank that owns one is a kind of its own, the ranks that own none are
// alike. AdamW-SN's subsets are a function of the rows alone. parameter_rows: every parameter's rows,
// in unit order; galore_matrices: how many matrices GaLore projects.
// Under hybrid sharding a rank is its shard of its group (rank % S, consecutive ranks a group), and
// the ranks of group 0 are apart (they write the checkpoint: an --async_save's host copy).
std::string rank_kind(const std::vector<int64_t>& parameter_rows, int64_t galore_matrices, const RunConfig& run,
                      int world, int rank) {
  std::string key = rank == 0 ? "0;" : "r;";
  const int group = shard_world(run, world);
  // --shard_optimizer_across_groups: the world's layout, rank k G + g of it (every rank writes).
  const bool blocks = is_hybrid(run.sharding.strategy) && run.sharding.optimizer_across_groups;
  const int shards = blocks ? world : group;
  if (is_hybrid(run.sharding.strategy) && !blocks) key += rank < shards ? "w;" : "g;";
  if (shards == 1) return key;
  const int shard = blocks ? world_shard_index(rank % group, rank / group, world / group) : rank % shards;
  for (const int64_t rows : parameter_rows) {
    const int64_t per_rank = (rows + shards - 1) / shards;
    key += std::to_string(std::clamp<int64_t>(rows - per_rank * shard, 0, per_rank)) + ",";
  }
  if (shard < galore_matrices) key += ";owns " + std::to_string(shard);
  return key;
}

}  // namespace

MemoryEstimate estimate_memory(const ModelConfig& config, const RunConfig& run, const EstimateOptions& options) {
  LLM_REQUIRE(options.world_size >= 1, "command line", "--world_size", "expected an integer >= 1");
  MemoryEstimate estimate;
  estimate.device = estimate_device(run, options);
  LLM_REQUIRE(estimate.device == "cpu" || estimate.device == "cuda", "command line", "--device",
              "the estimate is for cpu or cuda (got \"" + estimate.device + "\")");
  // The compute width the run will have (--pad_matmul_dims), as train() sets it.
  const ModelConfig model = with_matmul_padding(config, run.pad_matmul_dims, estimate.device == "cuda");
  // The simulation counts bytes in int64: a run whose activations and weights pass an exbibyte (no
  // machine has one) would wrap. A generous upper bound in long double decides first: every
  // layer's fp32 saved bytes and three logits-sized tensors per token, 20 bytes per parameter.
  const long double tokens = static_cast<long double>(run.data.batch_size) * static_cast<long double>(run.data.max_length);
  const long double per_token =
      4.0L * (3.0L * model.vocab_size +
              static_cast<long double>(model.num_hidden_layers) *
                  (8.0L * model.hidden_size + 2.0L * model.num_key_value_heads * model.head_dim() +
                   4.0L * model.compute_intermediate() + model.num_attention_heads + 2.0L));
  const long double bound = tokens * per_token + 20.0L * static_cast<long double>(model.num_parameters());
  if (bound > 0x1p60L)
    fail_user("command line", "--batch_size",
              "--batch_size " + std::to_string(run.data.batch_size) + " x --max_length " +
                  std::to_string(run.data.max_length) + " tokens per micro-batch of " + model.name +
                  " needs more than an exbibyte (2^60 bytes) per rank, which the estimate does not count to and "
                  "no machine has: lower --batch_size or --max_length (gradient accumulation, "
                  "--total_batch_size, keeps the global batch)");
  const ModelShape shape(model, run);
  const bool cuda = estimate.device == "cuda";
  std::map<std::string, SimulatedRank> kinds;  // one simulation per kind of rank
  // The rows of every parameter of the embedding, one decoder layer (they are alike: one says what
  // all say, and 10^8 layers are never listed) and the head.
  std::vector<int64_t> parameter_rows;
  int64_t galore_matrices = 0;
  ModelConfig one_layer = model;
  one_layer.num_hidden_layers = std::min<int64_t>(model.num_hidden_layers, 1);
  for (const UnitSpec& unit : describe_units(one_layer)) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const ParameterSpec& parameter : unit.parameters) {
      parameter_rows.push_back(parameter.rows());
      shapes.emplace_back(parameter.name, parameter.shape);
    }
    const std::vector<UpdateRule> rules = update_rules_for(FlatShardLayout::from_shapes(unit.name, shapes, 0, 1), run);
    const int64_t projected = std::count(rules.begin(), rules.end(), UpdateRule::galore);
    galore_matrices += unit.kind == UnitKind::decoder_layer ? projected * model.num_hidden_layers : projected;
  }
  const bool kinds_alike = !options.simulate_every_rank;
  const auto started = std::chrono::steady_clock::now();
  auto last_report = started;
  for (int rank = 0; rank < options.world_size; ++rank) {
    const std::string kind = kinds_alike ? rank_kind(parameter_rows, galore_matrices, run, options.world_size, rank) : "";
    SimulatedRank simulated;
    if (kind.empty()) {
      ++estimate.simulated_ranks;
      simulated = simulate_rank(shape, model, options, rank, cuda);
    } else {
      auto found = kinds.find(kind);
      if (found == kinds.end()) {
        ++estimate.simulated_ranks;
        found = kinds.emplace(kind, simulate_rank(shape, model, options, rank, cuda)).first;
      }
      simulated = found->second;
    }
    // Many ranks of their own kind (GaLore's SVD owners) take a simulation each: say how far along.
    const auto now = std::chrono::steady_clock::now();
    if (options.progress && now - last_report > std::chrono::seconds(5)) {
      last_report = now;
      log::info("estimate: {} of {} ranks done ({} simulated, {:.0f} s)", rank + 1, options.world_size,
                estimate.simulated_ranks, std::chrono::duration<double>(now - started).count());
    }
    estimate.ranks.push_back(finish_rank(rank, cuda, offloads_optimizer(run.sharding.offload),
                                         std::move(simulated.phases), simulated.totals));
    estimate.gathered_units = static_cast<int>(simulated.totals.gathered_units);
    if (estimate.device == "cuda")
      estimate.ranks.back().runtime =
          cuda_runtime_bytes(estimate.ranks.back().peak_bytes, nccl_communicators(run, options.world_size));
  }
  LLM_REQUIRE(options.ranks_per_node >= 0, "command line", "--ranks_per_node",
              "expected 0 (every rank on one node) or a positive number of ranks per node");
  const int per_node = options.ranks_per_node > 0 ? std::min(options.ranks_per_node, options.world_size)
                                                  : options.world_size;
  for (int first = 0; first < options.world_size; first += per_node) {
    NodeEstimate node;
    node.first_rank = first;
    node.ranks = std::min(per_node, options.world_size - first);
    for (int r = first; r < first + node.ranks; ++r) {
      node.host_bytes += estimate.ranks[r].host_bytes;
      node.pinned_bytes += estimate.ranks[r].pinned_bytes;
    }
    estimate.nodes.push_back(node);
  }
  return estimate;
}

int nccl_communicators(const RunConfig& run, int world_size) {
  if (world_size == 1 || run.sharding.communicator == CommunicatorChoice::mpi) return 0;
  // The node's for the backward's gathers (--backward_gather_size; one rank a node: none).
  const int node = run.sharding.backward_gather_size > 1 ? 1 : 0;
  if (!is_hybrid(run.sharding.strategy)) return 1 + node;
  const int group = shard_world(run, world_size);  // the world's, the group's and the replicas' (one rank: none)
  // and the optimizer's, in its layout's order (--shard_optimizer_across_groups)
  return 1 + (group > 1 ? 1 : 0) + (world_size / group > 1 ? 1 : 0) + (run.sharding.optimizer_across_groups ? 1 : 0);
}

CudaRuntimeBytes cuda_runtime_bytes(int64_t tensor_peak_bytes, int nccl_communicators) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  CudaRuntimeBytes bytes;
  bytes.modules = 512 * kMiB;
  // 2 handles x (cuBLAS + cuBLASLt) x 32 MiB, and the main thread's handle on the reduce stream
  bytes.cublas_workspaces = (2 * 2 + 1) * 32 * kMiB;
  bytes.nccl_buffers = nccl_communicators * 2 * 32 * 9 * kMiB;
  bytes.allocator_slack = tensor_peak_bytes / 16 + 40 * kMiB;
  return bytes;
}

}  // namespace llm
