// `trainer estimate --fit --memory_budget_gib G [--host_budget_gib H]`: which memory levers to add to
// a command so that it fits a budget, and what each choice costs.
//
// The search starts from the command as given and only adds levers it leaves off, so the answer is
// always "your command, plus these flags" (a repeated flag takes its last value):
//   --optimizer_state_dtype bfloat16   unless the state is bf16 already
//   --recompute norm,swiglu            or --recompute norm,mlp,attention, or --activation_checkpointing
//                                      (whole blocks): one of the three, unless the command recomputes
//                                      already
//   --offload optimizer, parameters    on CUDA, or both (optimizer,parameters), adding to what the
//                                      command offloads already
//   --fuse_optimizer_with_backward     only with --grad_clipping 0 (the fused step cannot clip) and
//                                      without the optimizer's offload
//   --batch_size m                     any smaller micro-batch that divides the rank's share of the
//                                      global batch (accumulation keeps --total_batch_size)
//   --sharding hybrid_shard[_grad_op] --shard_group_size S [--shard_optimizer_across_groups]
//                                      across nodes only (--ranks_per_node below the world): groups of
//                                      1, 2, 4, ... whole nodes, fewer than all, each with and without
//                                      the optimizer across the groups, for a full_shard or
//                                      shard_grad_op command; and full_shard's node copy
//                                      (--backward_gather_size, the ranks of a node)
// Precision only with --fit_precision (it changes the arithmetic): an fp32 command may then take
//   --dtype bfloat16 --precision mixed or pure; not costed, and among equal costs the choices that keep
//   the command's precision rank first.
//
// Each combination is estimated as `trainer estimate` would (estimate.h); it fits when every rank's
// peak (on CUDA plus the runtime's memory beside the tensors) is within the device budget and every
// node's host memory within the host budget (default: the node's RAM). The fitting ones are ranked by
// their predicted step time, fastest first: memory/step_time.h's model, the same `trainer estimate`
// prints for one command (its compute measured by --profile, each micro-batch once, or the matmuls'
// FLOPs at --device_tflops; the collectives over the links inside and between nodes; the optimizer and
// the offload modes' copies and host step at --pcie_gbs and the host rate, fit_host_gbs). So
// checkpointing and --recompute cost their recomputed forward, offload its PCIe bytes and host step
// (or, with --offload_step device, master and moments over PCIe both ways), parameter offload its
// copies at every gather, the sharding choices across nodes their bytes between nodes and the rings'
// latency, a smaller micro-batch its extra gathers (and, measured by --profile, the device's speed at
// that size; at a declared rate the FLOPs are the same). bf16 state and the fused step are not costed.
// Steps within a microsecond tie; among ties the command's precision, the larger micro-batch, then
// fewer levers rank first. Each row prints its step time and tokens a second, and its seconds against
// the command's own prediction (negative: faster).
// The best is printed as the flags to add, the fitting runners-up as a table. When nothing fits, a
// UserError (exit 2) names the budget and the smallest peak any combination reaches, with its flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "memory/estimate.h"

namespace llm {

// The host step's GB/s per rank: --host_gbs, or kHostStepGbsPerCore per core of the rank's share of
// its node (--host_cores, default this machine's, over the ranks on the node), at most
// kHostStepGbsCap. 8 GB/s a core: the H200 machine's host step, 0.37-0.39 s for 38 B x 1.34 G
// parameters on 16 threads (docs/gpu-results.md); the cap, a socket's memory bandwidth, is assumed.
inline constexpr double kHostStepGbsPerCore = 8.0;
inline constexpr double kHostStepGbsCap = 200.0;
double fit_host_gbs(const EstimateOptions& options, int world_size);

// run validated for options.world_size; options.memory_budget_gib > 0.
std::string run_fit_command(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options);

// For the end-of-run summary: per rank, the one lever of those above (bf16 state, a recompute choice,
// offload on CUDA, the fused step, a smaller micro-batch; precision not) that lowers that rank's
// estimated peak the most, ties to the cheaper. `flags` is empty where none lowers it. run validated
// for options.world_size.
struct LeverAdvice {
  std::string flags;            // what to add to the command
  int64_t peak_bytes = 0;       // the estimate's peak of the command as it is
  int64_t lowered_bytes = 0;    // ... and with the lever
  double added_seconds = 0;     // its predicted step less the command's (memory/step_time.h)
};
std::vector<LeverAdvice> lowest_peak_levers(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options);

}  // namespace llm
