// The training loop: data -> model -> loss -> backward -> clip -> AdamW, with gradient accumulation,
// the learning-rate schedule, periodic evaluation on the held-out split, checkpoints, and the logs of
// trainer/metrics.h. Mixed precision has two forms for --dtype bfloat16: "mixed" (fp32 weights,
// forward under bf16 autocast) and "pure" (bf16 weights as GaLore's --dtype bfloat16, but with fp32
// master weights and fp32 optimizer state kept beside them, so small updates are not rounded away).
//
// Where each part lives: the set-up and the run loop in trainer/train_loop.cpp, one step in
// trainer/train_step.cpp (both members of Training, trainer/training.h), the checkpoints in
// trainer/run_checkpoints.h and the run's records (metrics.jsonl, the memory ledger) in
// trainer/run_records.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "sharding/topology.h"

namespace llm {

class Communicator;
class PretrainedFolder;

class StallWatchdog;

struct RuntimeContext {
  int rank = 0;
  int world_size = 1;
  c10::Device device = c10::Device(c10::kCPU);
  Communicator* communicator = nullptr;  // over all ranks, for this device
  // Over all ranks, for host tensors: offload's optimizer collectives and the per-step preemption
  // agreement. The device communicator on a CPU rank; MPI beside NCCL on a GPU (NCCL
  // carries device tensors only). nullptr: the device communicator (a CPU rank's tests).
  Communicator* host_communicator = nullptr;
  // Hybrid sharding (sharding/topology.h): this rank's group (what the units are sharded over; for
  // the device, and for host tensors beside NCCL), the ranks holding the same shard in the other
  // groups, and where this rank is. nullptr: the world's communicators (every other strategy).
  Communicator* shard_communicator = nullptr;
  Communicator* host_shard_communicator = nullptr;
  Communicator* replicas = nullptr;
  Communicator* host_replicas = nullptr;  // the replicas for host tensors beside NCCL (nullptr: replicas)
  ShardTopology topology;
  // --backward_gather_size: this rank's node (groups of R ranks), where full_shard's backward gathers.
  Communicator* backward_gather = nullptr;
  // --shard_optimizer_across_groups: every rank in the order of the world layout the optimizer steps
  // (rank k G + g: place k in group g), over which its collectives and the gradient norm go.
  Communicator* optimizer_communicator = nullptr;
  // The same for host tensors beside NCCL (the offloaded optimizer's; nullptr: optimizer_communicator).
  Communicator* host_optimizer_communicator = nullptr;
  // The checkpoint --continue_from resolved to at start-up (check_checkpoints_at_start,
  // checkpoint/checkpoint.h); "" for a fresh run, or to resolve it in train().
  std::string resume_folder;
  // This run's data identity when check_checkpoints_at_start read it (a resume on token files); null:
  // read at start-up (data/corpus_identity.h's run_data_identity).
  nlohmann::json data_identity;
  // --init_from opened and checked at start-up (checkpoint/interchange/pretrained.h): each unit's weights
  // are read from it as the unit is built, before it is sharded. nullptr: the seeded init.
  const PretrainedFolder* init_from = nullptr;
  // The stall watchdog running since start-up (trainer/main.cpp); nullptr: train() runs its own from
  // the first step (in-process tests).
  StallWatchdog* watchdog = nullptr;
};

struct TrainingOutcome {
  int64_t steps = 0;
  double final_loss = 0;
  double final_eval_loss = 0;
  double corpus_unigram_entropy = 0;  // synthetic data only, else 0
  double corpus_entropy_rate = 0;     // synthetic data only, else 0
  // Preempted (trainer/preemption.h): the signal the ranks agreed on after step `steps`, and the
  // checkpoint holding that step ("" without --save_dir). 0: the run went to its end.
  int preempted_by = 0;
  std::string preemption_checkpoint;  // also the checkpoint of a run stopped by stopped_by
  // Stopped before the end on purpose: "--stop_at_step" or "--max_runtime" ("" otherwise), after step
  // `steps`, saved in preemption_checkpoint when there is a --save_dir.
  std::string stopped_by;
  // The signal came during start-up: the run stopped before its first step (nothing trained, nothing
  // to save; `steps` is where it would have started).
  bool preempted_before_first_step = false;
};

// The stall watchdog of a run (common/watchdog.h), running from now: --collective_timeout over
// several ranks, off (0) for a single process, which has no collective to wait in. `host`: this
// rank's host name; every rank's is gathered (a collective), since another node's heartbeats may be
// unreadable here.
std::unique_ptr<StallWatchdog> watch_for_stalls(const RunConfig& run, int rank, int world_size, const std::string& host);

// Picks the device from --device: cuda:<local_rank % visible GPUs> when asked for (or auto and one
// is present).
c10::Device select_device(DeviceChoice choice, int local_rank);
// gpus: every rank's "<host> <PCI bus id>" ("" for a CPU rank). Why the run cannot go on over NCCL
// (two ranks on one physical GPU), or nothing. Several ranks may see one GPU each by its own
// CUDA_VISIBLE_DEVICES: only the same physical GPU counts.
std::optional<std::string> ranks_sharing_a_gpu(const std::vector<std::string>& gpus);

// Runs the whole training job, or until a preemption signal (the outcome says which, and at which
// step). Throws UserError for bad data or checkpoints and TrainingError when the loss stops being
// finite.
TrainingOutcome train(const ModelConfig& model_config, const RunConfig& run,
                      const RuntimeContext& context);

}  // namespace llm
