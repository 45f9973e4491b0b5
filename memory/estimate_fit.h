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
// the seconds they add to a step, a stated model (per rank, W ranks, T tokens a rank takes a step,
// P parameters, c the compute dtype's bytes):
//   checkpointing   the forward of every block again: 2 P T FLOPs at --device_tflops
//   recompute       the recomputed operations' forward FLOPs at --device_tflops, per layer and token:
//                   norm 2 x 4h, SwiGLU 4I, MLP 6 h I, attention 4h^2 + 4 h kv + 4 h S (S the sequence
//                   length); the norm and SwiGLU are memory-bound, which FLOPs undercount
//   offload         (W: the ranks the rows are split over, the world's with the optimizer across
//                   groups) of the optimizer, stepped on the host: (4 + c) P / W bytes over PCIe (gradients
//                   down, parameters up) at --pcie_gbs, and the host step's 28 P / W bytes (20 with
//                   bf16 state) at the host rate (fit_host_gbs); stepped on the device
//                   (--offload_step device, tried wherever it is allowed: not with parameter
//                   offload, AdamW when sharded): master and moments both ways, 2 (4 + m) P / W bytes
//                   over PCIe (m: 8 with fp32 state, 4 with bf16), the kernel itself not costed; so
//                   the host step wins on a host with cores to spare and the device step where a
//                   rank's share of the host is small. Of the parameters: c P / W bytes in at each
//                   gather (2 a micro-batch, 1 for shard_grad_op; no_shard P, not P / W) and once
//                   out a step when the optimizer stays on the device; none overlapped
//   sharding        a node's bytes out to the other nodes a step at --inter_node_gbs (default 25,
//                   a 200 Gbit/s NIC), ring collectives with a node's ranks consecutive: a group that
//                   spans nodes (S ranks) sends (S - 1)(g c + 4) P / S (g gathers a step: 2 a
//                   micro-batch, 1 for shard_grad_op or with the node copy), hybrid's exchange across
//                   the G groups 2 (G - 1) / G x 4 P / S per rank of the node, no_shard's all-reduce
//                   2 (N - 1) / N x 4 P; the change from the command's, so a faster choice is negative.
//                   Link latency and overlap with compute are not modelled (bench/multinode_links.sh
//                   measures them)
//   bf16 state, the fused step: nothing
//   a smaller micro-batch: not costed; among equal costs the larger micro-batch, then fewer levers,
//                   rank first
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
  double added_seconds = 0;     // the cost model's seconds a step
};
std::vector<LeverAdvice> lowest_peak_levers(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options);

}  // namespace llm
