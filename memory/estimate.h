// Predicts each rank's peak memory by category for a model config, the training flags and a world
// size, without running: `trainer estimate`, and the "estimate" column of `trainer report`.
//
// The prediction replays one training step as the trainer runs it: the same StepPlan of per-unit
// actions (sharding/step_plan.h) over the same units (model/units.h) and the same layouts
// (sharding/flat_layout.h), and sums, at each timeline point and at the worst moment inside each
// phase (its window), the buffers alive:
//   persistent  fp32 master shard, bf16 compute shard (pure bf16), fp32 gradient shard, optimizer
//               state (optim's optimizer_state_bytes() per parameter and rank), the batch and rotary
//               tables
//   parameters  + the gathered compute copies, as the plan gathers, prefetches and releases them
//               (full_shard: the running unit and, with prefetch, the next; shard_grad_op: every
//               unit from its forward to its backward; no_shard: all, always)
//   activations the tensors autograd saves per unit, derived from the LLaMA units (model/units.h)
//               (estimate_shapes.h lists them op by op), in the dtypes --dtype / --precision give them
//   transients  the gather buffer, the reduce-scatter buffer and padded copies, the backward's
//               gradient buffers, the loss's log-softmax, the optimizer's temporaries, GaLore's
//               gathered gradient and SVD at a projector refresh
// Nothing is calibrated from measurements; docs/memory.md has the formulas and the measured errors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "memory/categories.h"

namespace llm {

struct EstimateOptions {
  int world_size = 1;
  // The device the estimate is for: "cpu" or "cuda". Empty: the run's --device (auto = cuda).
  std::string device;
  double memory_budget_gib = 0;  // > 0: `trainer estimate` says whether each rank's peak fits
  bool json = false;             // `trainer estimate --json`: the whole estimate as JSON
  // Ranks sharing one node's host memory, consecutive world ranks (mpirun's default placement by
  // slot). 0: every rank on one node.
  int ranks_per_node = 0;
  // A node's RAM, GiB, for the host verdict. 0: this machine's (MemTotal of /proc/meminfo).
  double node_memory_gib = 0;
  // Models with more decoder layers than this are not simulated layer by layer: the layers are
  // identical units, so a few are simulated and the step of all of them is extrapolated from those,
  // exactly (estimate_extrapolation.cpp): the cost does not grow with the depth. Their phases
  // list every layer up to 4096 layers; beyond, each pass's first and last few (which hold its
  // maxima). Tests lower it to check the extrapolation against the full simulation.
  int64_t simulate_layers_up_to = 256;
  // Ranks of one kind are alike (estimate.cpp: rank_kind): each kind is simulated once, so the cost
  // does not grow with --world_size. Tests set this to simulate every rank and compare.
  bool simulate_every_rank = false;
  // Log how far along a long estimate is (every 5 s); --fit, which makes one estimate per candidate,
  // says its own progress over all of them instead.
  bool progress = true;
  // --fit (memory/estimate_fit.h): the levers to add so the run fits memory_budget_gib per rank and
  // host_budget_gib per node (0: node_memory_gib, else this machine's RAM), ranked by the seconds they
  // add at these rates (device_tflops 0: 200 on CUDA, 0.07 on a CPU).
  bool fit = false;
  // --fit_precision: --fit may also change an fp32 command to bf16 (mixed or pure); it changes the
  // arithmetic, so only when asked.
  bool fit_precision = false;
  double host_budget_gib = 0;
  double device_tflops = 0;
  double pcie_gbs = 25;
  // The host step's GB/s (--host_gbs); 0: derived from the cores (fit_host_gbs, memory/estimate_fit.h).
  double host_gbs = 0;
  int host_cores = 0;  // --host_cores: a node's cores for that; 0: this machine's
  // --inter_node_gbs: one node's link to the others, GB/s each way, for the sharding lever of --fit
  // (hybrid sharding, the node's copy for the backward) on more than one node (--ranks_per_node).
  double inter_node_gbs = 25;
  // The step time (memory/step_time.h): --profile SECONDS measures the units on this machine's
  // device (0: the matmuls at --device_tflops); the links inside a node (--intra_node_gbs, 0: 2 GB/s
  // on a CPU, MPI's shared memory; 150 on CUDA) and each ring step's latency (--link_latency_us,
  // 0: 20 us on a CPU, 10 on CUDA).
  double profile_seconds = 0;
  // --profile_cache FILE: --profile's measurement kept in FILE and reused by a later estimate of the
  // same units (memory/step_time.h); empty: every estimate profiles.
  std::string profile_cache;
  double intra_node_gbs = 0;
  double link_latency_us = 0;
  // --collective_wait_us: each collective's wait for the last rank to arrive (ranks sharing cores
  // arrive apart); `communicator_bench --compute_ms MS` measures it; 0: none.
  double collective_wait_us = 0;
  // --collective_table FILE: communicator_bench --jsonl's rows; the collectives inside a node at their
  // measured times (memory/collective_table.h); empty: the ring model alone.
  std::string collective_table;
  // --collective_table_between FILE: the same measured over ranks on several nodes, for the collectives
  // that span nodes; empty: the ring over --inter_node_gbs.
  std::string collective_table_between;
  // --collective_table_across FILE: hybrid's collectives across the groups as measured with all of a
  // node's rings at once (communicator_bench --group_size G --groups_strided over the nodes); empty:
  // the table between nodes or --inter_node_gbs, shared by the node's ranks.
  std::string collective_table_across;
};

// One phase's window: the largest total inside it, and the categories at its closing point.
struct PhaseEstimate {
  std::string label;           // "forward:layer.0", "backward:head", "optimizer", ...
  int64_t peak_bytes = 0;      // the worst moment inside the window
  MemoryCategories at_point;   // at the closing point (what the ledger's point records)
  bool operator==(const PhaseEstimate&) const = default;
};

// What a CUDA rank's device holds beside its tensors, which the simulation does not see (it counts
// tensors, the caching allocator's allocated bytes). Budgets from documented defaults, not yet
// measured on our GPUs (docs/memory.md says where each comes from; the GPU kit's probe measures
// them):
//   modules            kernel images loaded after the context exists (LibTorch's, cuBLAS's,
//                      flash attention's; CUDA loads modules lazily): 512 MiB
//   cublas_workspaces  one workspace per (cuBLAS handle, stream) for cuBLAS and one for cuBLASLt,
//                      32 MiB each on sm_90 (NVIDIA's recommendation, LibTorch's default), from the
//                      caching allocator; the main thread's handle and the autograd engine's on the
//                      compute stream, and the main thread's on the reduce stream (the shard's
//                      norm): 160 MiB
//   nccl_buffers       several ranks over NCCL (not --communicator mpi): per channel (up to 32 on
//                      Hopper) the Simple (4 MiB),
//                      LL128 (~4.5 MiB) and LL (256 KiB) buffers, for the ring's and the tree's peers
//                      (2 x 32 x 9 MiB): 576 MiB; 0 at one rank or over MPI
//   allocator_slack    reserved over allocated: blocks cached on one stream that another cannot use,
//                      rounding of large blocks to 2 MiB, fragmentation: 1/16 of the peak + 40 MiB
// The CUDA context itself is created before the free memory is read, so it is already taken off.
struct CudaRuntimeBytes {
  int64_t modules = 0, cublas_workspaces = 0, nccl_buffers = 0, allocator_slack = 0;
  int64_t total() const { return modules + cublas_workspaces + nccl_buffers + allocator_slack; }
  bool operator==(const CudaRuntimeBytes&) const = default;
};
// The NCCL communicators a rank makes (0 over MPI or at one rank; hybrid sharding: the world's, its
// group's and the replicas', and the optimizer's with --shard_optimizer_across_groups; the node's with
// --backward_gather_size; each with its own buffers), and what it holds beside its tensors.
int nccl_communicators(const RunConfig& run, int world_size);
CudaRuntimeBytes cuda_runtime_bytes(int64_t tensor_peak_bytes, int nccl_communicators);

struct RankEstimate {
  int rank = 0;
  int64_t peak_bytes = 0;       // largest window peak of a training step (eval included)
  std::string peak_phase;
  MemoryCategories max;         // each category's largest value at any point
  MemoryCategories at_peak;     // the categories at the point closing the peak's window
  int64_t checkpoint_peak_bytes = 0;  // writing a checkpoint: what the step left behind (nothing gathered)
  // Host memory the rank's training holds at its peak: on a CPU rank its whole peak; on CUDA what
  // --offload optimizer keeps in host memory (the process itself, LibTorch and the CUDA context's
  // host side, is not modelled), of which pinned_bytes are page-locked.
  int64_t host_bytes = 0;
  int64_t pinned_bytes = 0;
  // --async_save: the host copy a background save keeps (in host_bytes, and in pinned_bytes on CUDA
  // without --offload optimizer).
  int64_t async_save_host_bytes = 0;
  // CUDA: the device memory beside the tensors (zero on CPU); peak_bytes + runtime.total() is what
  // the start-up check compares with the GPU's free memory.
  CudaRuntimeBytes runtime;
  std::vector<PhaseEstimate> phases;
  bool operator==(const RankEstimate&) const = default;
};

// Consecutive ranks whose estimates are equal but for the rank, as [first, last] pairs: what the
// estimate prints once (65536 ranks of GaLore once made 2 GB of JSON).
std::vector<std::pair<int, int>> ranks_alike(const std::vector<RankEstimate>& ranks);

// The ranks of one node (consecutive world ranks) and the host memory they hold together: the sum of
// their host peaks (the ranks step in lockstep, so their peaks meet).
struct NodeEstimate {
  int first_rank = 0;
  int ranks = 1;
  int64_t host_bytes = 0;
  int64_t pinned_bytes = 0;
};

struct MemoryEstimate {
  std::string device;           // "cpu" or "cuda"
  int gathered_units = 1;       // the gather schedule's peak of units gathered at once
  std::vector<RankEstimate> ranks;
  std::vector<NodeEstimate> nodes;  // EstimateOptions::ranks_per_node ranks each, the last maybe fewer
  int simulated_ranks = 0;          // the step simulations run: one per kind of rank (or every rank)
};

// Whether this CPU runs oneDNN's bf16 matmuls through fp32 products: AVX-512 with BW, VL and DQ
// (PyTorch's test for oneDNN's bf16 path) but no AVX512_BF16, as on an Intel Xeon of family 6, model
// 85. The hardware alone: the estimate also honours ONEDNN_MAX_CPU_ISA (docs/memory.md).
bool cpu_lacks_native_bf16_matmul();

// The device an estimate is for: options.device, else the run's --device ("cuda" for auto).
std::string estimate_device(const RunConfig& run, const EstimateOptions& options);

// run must be validated for options.world_size (validate_run_config), so gradient_accumulation
// and total_batch_size are set.
MemoryEstimate estimate_memory(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options);

nlohmann::json estimate_to_json(const MemoryEstimate& estimate);

// What `trainer estimate` prints: the settings, a per-rank table by category, the phase of the
// peak, the checkpoint peak, with a budget whether every rank fits, and each node's host memory
// against its RAM.
std::string run_estimate_command(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options);

}  // namespace llm
