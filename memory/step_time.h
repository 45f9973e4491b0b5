// `trainer estimate`'s step time (issue 54): how long one optimizer step takes on each rank, split as
// the run's own step records split it (phase_s: forward, backward, collectives, optimizer, other), so a
// run can put its measured phases beside the prediction.
//
// The model, per rank (all ranks alike; M micro-batches a step, L decoder layers, W ranks, S the ranks
// a unit is sharded over, G = W / S hybrid groups):
//   compute      per micro-batch, each unit kind's forward and backward seconds (UnitTimes): measured
//                on the local device by running one unit of each kind at the run's micro-batch, dtype
//                and threads (--profile SECONDS: profile_compute), or the FLOPs of each unit at a
//                declared rate (--device_tflops: declared_compute). The forward is M (embed + L layer
//                + head with the loss); the backward the same, plus what is recomputed: whole layers
//                under activation checkpointing, the --recompute operations' share of a layer's
//                forward FLOPs. CPU ranks that oversubscribe the cores (ranks on a node x threads >
//                cores) share them: the compute is stretched by that ratio.
//   collectives  ring collectives, each (n - 1) steps of one chunk: latency + chunk / bandwidth, the
//                inter-node link's when the communicator spans nodes (--ranks_per_node), else the
//                intra-node link's, or the measured table's time at the collective's size
//                (--collective_table inside a node, --collective_table_between across nodes,
//                --collective_table_across for hybrid's rings across the groups;
//                memory/collective_table.h). Per unit and step: full_shard gathers 2 M times (shard_grad_op M;
//                the node copy's backward gathers over the node) in the compute dtype, reduce-scatters
//                once in fp32; hybrid adds the all-reduce (or reduce-scatter and all-gather) of the
//                shard across the G groups (between nodes each rank of a node runs its own ring, so the
//                node's link is shared by them); no_shard all-reduces the whole gradient. On a CPU rank
//                every collective is in line (exposed); on CUDA a gather hides behind the unit before
//                it and a reduce-scatter behind the unit after it, as the prefetch and the reduce
//                stream allow, and only what exceeds that compute is exposed. Each sharded gather
//                also copies the gathered rows into the parameters' storage (2 c bytes a parameter
//                read and written) and each reduction first copies the gradients into the flat buffer
//                it sends ((c + 4) bytes a parameter), at the device's measured copy rate (--profile;
//                declared: the optimizer's memory rate), stretched as the compute on a shared CPU.
//   optimizer    the rank's optimizer rows at the AdamW kernel's measured (or declared) seconds per
//                element; offloaded on CUDA, the host step's 28 bytes an element (20 with bf16 state) at
//                --host_gbs and (4 + c) bytes an element over PCIe at --pcie_gbs, or stepped on the device
//                (--offload_step device) the kernel and master and moments over PCIe both ways,
//                2 (4 + m) bytes an element (m: 8 with fp32 state, 4 with bf16).
//   parameters'  offload (CUDA): each gather copies the unit's c-byte rows in over PCIe first (2 a
//                micro-batch, 1 for shard_grad_op), and the updated rows go out once a step when the
//                optimizer stays on the device; counted with the collectives, none of it hidden.
//                Each collective also waits for the last rank to arrive (--collective_wait_us:
//                ranks that share cores arrive apart; communicator_bench --compute_ms measures it).
//   other        the loss's and the gradient norm's all-reduces (latency).
// What it leaves out: data loading, the first step's allocations, kernels' launch overhead beyond what
// the profile sees, contention between collectives and compute for memory bandwidth, stragglers.
// docs/memory.md ("Step time") lists where every constant comes from.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "config/config.h"

namespace llm {

struct UnitTimes {
  double forward = 0, backward = 0;  // seconds for one micro-batch
};

struct ComputeRates {
  UnitTimes embed, layer, head;    // head: the logits and the loss
  double optimizer_seconds_per_element = 0;  // the device's optimizer step, per fp32 shard element
  double copy_seconds_per_byte = 0;          // a copy on the device, per byte read and written
  int threads = 1;                 // the threads a rank computes with (what the profile ran at)
  std::string source;              // "--profile 3 s on cpu, 2 thread(s)" or "declared: ..."
};

struct CollectiveTable;

struct LinkRates {
  double intra_gbs = 0, inter_gbs = 0;  // GB/s each way, per rank
  double latency_seconds = 0;           // per ring step
  double wait_seconds = 0;              // per collective: the wait for the last rank (--collective_wait_us)
  int ranks_per_node = 0;               // 0: every rank on one node
  // Collectives inside a node as measured (--collective_table, memory/collective_table.h): where it
  // has the collective, its time at the size replaces the ring's intra_gbs and latency.
  const CollectiveTable* intra_table = nullptr;
  // ... and the collectives whose ranks span nodes (--collective_table_between: measured over ranks on
  // several nodes, as the run's spanning rings are), in place of inter_gbs and the latency.
  const CollectiveTable* inter_table = nullptr;
  // ... and hybrid's collectives across the groups when they span nodes (--collective_table_across:
  // measured with every rank of a node running its ring at once, as the run's do: communicator_bench
  // --group_size G --groups_strided), in place of the table between nodes or inter_gbs shared.
  const CollectiveTable* across_table = nullptr;
  std::string source;
};

// The run's phases in StepTimer's order (forward, backward, collectives, optimizer, other).
inline constexpr int kPredictedPhases = 5;
const char* predicted_phase_name(int phase);

struct StepTimeEstimate {
  std::array<double, kPredictedPhases> phases{};  // exposed seconds in each
  double step_seconds = 0;
  double tokens_per_second = 0;       // the whole job's
  double collective_seconds = 0;      // every collective's time, hidden or not
  double collectives = 0;             // how many the model's units make a step (the step record's links count)
  double inter_node_bytes = 0;        // what this rank sends over the link between nodes a step
  double intra_node_bytes = 0;        // ... and inside its node
  std::string compute_source, link_source;
  nlohmann::json to_json() const;
};

// Measures UnitTimes on `device` at the run's micro-batch, dtype and precision with `threads` threads:
// a model of one decoder layer, each unit's forward and backward timed apart (as the trainer runs
// them, unit by unit), repeated for about `seconds`, the median of each over the later half of the
// passes (the heap's growth over the first ones faults in new pages: a run's first steps are slower); and
// the AdamW kernel over the model's rows (2^22 to 2^24 of them: past the caches, as a step is).
ComputeRates profile_compute(const ModelConfig& model, const RunConfig& run, c10::Device device, double seconds,
                             int threads);
// --profile_cache FILE: a profile kept by what it measured (the device, the threads, the micro-batch,
// the dtype and precision, the profile's seconds and the model's config), so that estimates of several
// commands over the same units price them with one measurement (launch/step_time_table.sh's rows):
// the file is JSON, {"format": "trainer profile cache 1", "entries": {KEY: {"embed": [forward,
// backward], "layer": [...], "head": [...], "optimizer_seconds_per_element", "copy_seconds_per_byte",
// "source"}}}. Reading: nothing for a file that does not exist or has no such entry; exit 2 (the
// user's error) for one that is not such JSON. Writing adds the entry, the file replaced whole.
std::string profile_cache_key(const ModelConfig& model, const RunConfig& run, const std::string& device, int threads,
                              double seconds);
std::optional<ComputeRates> read_profile_cache(const std::string& path, const std::string& key);
void write_profile_cache(const std::string& path, const std::string& key, const ComputeRates& rates);

// Each unit's FLOPs (forward 2 per matmul parameter and token plus the attention's 4 h S per token,
// backward twice that) at `tflops`, and the optimizer's bytes (28 a parameter for AdamW) at `memory_gbs`.
ComputeRates declared_compute(const ModelConfig& model, const RunConfig& run, double tflops, double memory_gbs);

// world ranks, `cores` per node (for the CPU's oversubscription; 0: no stretch), on "cpu" or "cuda".
StepTimeEstimate estimate_step_time(const ModelConfig& model, const RunConfig& run, int world,
                                    const std::string& device, const ComputeRates& compute, const LinkRates& links,
                                    int cores, double host_gbs, double pcie_gbs);

// The estimate's step time for `options` (world size, links, --profile or --device_tflops) on
// `device` ("cpu" or "cuda"): the rates from the options' defaults (estimate.h), the rank's threads
// as the trainer picks them (OMP_NUM_THREADS, else its share of the node's cores).
// `cache`, where given, keeps the measured rates by what they depend on (micro-batch, sequence length,
// dtype, precision), so --fit profiles each of its micro-batches once.
struct EstimateOptions;
using ComputeRatesCache = std::map<std::string, ComputeRates>;
StepTimeEstimate predict_step_time(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options,
                                   const std::string& device, ComputeRatesCache* cache = nullptr);

// The most parameters one unit holds (the embedding or the head, on most configs): the size of the
// copy --profile times for the staging copies.
int64_t largest_unit_parameters(const ModelConfig& model);

// The forward FLOPs --recompute runs again, per layer and token (estimate_fit.h states them; the norm
// and SwiGLU are memory-bound, which FLOPs undercount); 0 without --recompute.
double recomputed_flops_per_layer_token(const ModelConfig& model, const RunConfig& run);

// The Markdown section `trainer estimate` prints.
std::string step_time_section(const StepTimeEstimate& estimate, const RunConfig& run, int world);

}  // namespace llm
