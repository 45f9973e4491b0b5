// The run's settings: command-line flags named as in GaLore's torchrun_main.py, validated against
// the model (model/model_config.h) and the world size.
//
// Validation turns every mistake into one UserError naming the flag and what was expected.
// Everything downstream may assume a validated RunConfig is valid.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sharding/strategy.h"
#include "model/model_config.h"

namespace llm {

enum class Scheduler { cosine, linear, constant };
enum class DType { float32, bfloat16 };
enum class DeviceChoice { auto_select, cpu, cuda };
enum class Precision { pure, mixed };
// --offload: what lives in host memory instead of the device (docs/offload.md). optimizer: fp32
// masters and optimizer state, stepped there (offload/optimizer_offload.h); parameters: each unit's
// compute-dtype shard, page-locked, copied to the device ahead of its gather (sharding/fsdp_unit.h);
// or both (spelled "optimizer,parameters"; "parameters,optimizer" reads the same).
enum class Offload { none, optimizer, parameters, optimizer_and_parameters };
inline bool offloads_optimizer(Offload offload) {
  return offload == Offload::optimizer || offload == Offload::optimizer_and_parameters;
}
inline bool offloads_parameters(Offload offload) {
  return offload == Offload::parameters || offload == Offload::optimizer_and_parameters;
}
// --communicator: what carries the collectives across ranks. auto: NCCL for GPUs, MPI for CPUs.
// mpi on GPUs: CUDA tensors staged through page-locked host memory (sharding/communicator.h), so
// several ranks can share one GPU (a test bed for every sharded path) or run where NCCL does not.
enum class CommunicatorChoice { auto_select, nccl, mpi };
// --offload_step: when and where --offload optimizer steps a unit (docs/offload.md, "Which mode to
// pick"). host: on the host, once the global norm is known; speculative: on the host as soon as the
// unit's gradient lands in backward, as if no clipping were needed, into a second set of buffers,
// adopted when the norm says no clipping, else stepped again from the kept state (exact either way);
// device: on the device, the same step as without offload, over master and state kept in host
// memory and streamed through two device windows (offload/device_step.h).
enum class OffloadStep { host, speculative, device };

// Every value of each enum setting and every choice of each string setting: the one list that the
// command line's check of a flag and --help's {a,b,...} (trainer/training_flags.cpp),
// run_config_from_json and validate_run_config all read. An enum value is spelled by its to_string().
inline constexpr std::array kSchedulerValues = {Scheduler::cosine, Scheduler::linear, Scheduler::constant};
inline constexpr std::array kDTypeValues = {DType::float32, DType::bfloat16};
inline constexpr std::array kDeviceChoiceValues = {DeviceChoice::auto_select, DeviceChoice::cpu, DeviceChoice::cuda};
inline constexpr std::array kPrecisionValues = {Precision::pure, Precision::mixed};
inline constexpr std::array kOffloadValues = {Offload::none, Offload::optimizer, Offload::parameters,
                                              Offload::optimizer_and_parameters};
// The other order of the set, read as the canonical one (the command line and the JSON).
inline constexpr const char* kOffloadBothReversed = "parameters,optimizer";
inline constexpr std::array kCommunicatorValues = {CommunicatorChoice::auto_select, CommunicatorChoice::nccl,
                                                   CommunicatorChoice::mpi};
inline constexpr std::array kOffloadStepValues = {OffloadStep::host, OffloadStep::speculative, OffloadStep::device};
inline constexpr std::array kShardingValues = {ShardingStrategy::full_shard, ShardingStrategy::shard_grad_op,
                                               ShardingStrategy::no_shard, ShardingStrategy::hybrid_shard,
                                               ShardingStrategy::hybrid_shard_grad_op};
inline constexpr std::array<const char*, 2> kSubsetNormParamsChoices = {"linear", "all"};        // --subset_norm_params
inline constexpr std::array<const char*, 4> kProjTypeChoices = {"std", "reverse_std", "left", "right"};  // --proj_type
inline constexpr std::array<const char*, 2> kGaloreProjectorChoices = {"svd", "subspace"};       // --galore_projector
inline constexpr std::array<const char*, 2> kOptimizerStateDtypeChoices = {"float32", "bfloat16"};  // --optimizer_state_dtype
inline constexpr std::array<const char*, 2> kWindowStartChoices = {"anywhere", "document"};  // --window_start
inline constexpr std::array<const char*, 2> kMemmapDtypeChoices = {"uint16", "uint32"};      // --memmap_dtype
// --memmap_dtype's width in bytes: 2, 4, or 0 when not given.
inline int memmap_bytes(const std::string& memmap_dtype) {
  return memmap_dtype == "uint16" ? 2 : memmap_dtype == "uint32" ? 4 : 0;
}
inline constexpr std::array<const char*, 2> kWriteErrorChoices = {"stop", "warn"};               // --on_write_error

// Whether TEXT is one of a string setting's CHOICES (a list above).
template <std::size_t N>
bool is_choice(const std::string& text, const std::array<const char*, N>& choices) {
  for (const char* choice : choices)
    if (text == choice) return true;
  return false;
}

// What each step reads: where the tokens come from, how many per rank and per step, and the
// held-out evaluation.
struct DataConfig {
  std::string source = "synthetic";  // --data: "synthetic" or token shards (data/token_corpus.h)
  // --eval_data: a held-out corpus of its own (token shards, as --data); "": the last --eval_fraction
  // of --data's windows. With it, every window of --data is trained on.
  std::string eval_source;
  // --allow_other_data: resume from a checkpoint trained on other data (another shard list, or a
  // shard changed since: data/corpus_identity.h); without it such a resume is refused (exit 2).
  bool allow_other_data = false;
  // --window_start: "anywhere" (the corpus cut every max_length + 1 tokens) or "document" (each window
  // starts at a document: data/document_windows.h; Megatron datasets record where documents start).
  std::string window_start = "anywhere";
  // --memmap_dtype: "" or uint16 / uint32: read shards in no known format as headerless ids of that
  // width (OLMo's token files: data/token_file.h).
  std::string memmap_dtype;
  int64_t batch_size = 8;            // per-rank micro-batch, sequences
  int64_t total_batch_size = 0;      // sequences per optimizer step; 0 = batch_size * world
  int64_t gradient_accumulation = 1; // derived: total / (batch_size * world)
  // --gradient_accumulation (GaLore's flag): total = batch_size * world * N, checked against a given
  // --total_batch_size; 0: not given, derived from the total.
  int64_t gradient_accumulation_given = 0;
  int64_t max_length = 128;          // tokens per sequence
  double eval_fraction = 0.05;       // share of windows held out for evaluation
  int64_t eval_every = 50;           // 0 = only at the end
  // How much one evaluation reads; at most one of the three is given (0: not given):
  //   eval_sequences: sequences of the whole job, the same at every world size and micro-batch;
  //   eval_tokens: tokens of the whole job, rounded up to whole sequences (GaLore's target_eval_tokens);
  //   eval_batches: micro-batches on each rank (the earlier meaning: it grows with the world size).
  // None given: kDefaultEvalSequences sequences.
  int64_t eval_sequences = 0;
  int64_t eval_tokens = 0;
  int64_t eval_batches = 0;
};

inline constexpr int64_t kDefaultEvalSequences = 64;

// The sequences one evaluation reads across the job (before it is capped at the held-out windows).
inline int64_t eval_sequences_of_job(const DataConfig& data, int world_size) {
  if (data.eval_batches > 0) return data.eval_batches * data.batch_size * world_size;
  if (data.eval_tokens > 0) return (data.eval_tokens + data.max_length - 1) / data.max_length;
  return data.eval_sequences > 0 ? data.eval_sequences : kDefaultEvalSequences;
}

// Micro-batches each rank runs in an evaluation of `sequences` (every rank runs them all: the
// forward's gathers are collectives; the last may hold fewer sequences, or none on some ranks).
inline int64_t eval_micro_steps(int64_t sequences, const DataConfig& data, int world_size) {
  const int64_t global = data.batch_size * world_size;
  return (sequences + global - 1) / global;
}

// The update: which optimizer, its hyper-parameters, the learning-rate schedule and clipping.
struct OptimizerConfig {
  std::string name = "adamw";        // --optimizer: adamw | adamw_sn | galore_adamw
  double lr = 1e-3;
  // Unset (no --warmup_steps): default_warmup_steps(num_training_steps), filled in by
  // validate_run_config; a validated RunConfig always holds a value.
  std::optional<int64_t> warmup_steps;
  Scheduler scheduler = Scheduler::cosine;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;
  double grad_clipping = 1.0;        // 0 = off
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = -1;              // < 0: the optimizer's reference default (validate_run_config)
  // adamw_sn: 0 = per matrix ("heuristics": one entry per row or column); k != 0 = general form,
  // subsets of the largest divisor of numel <= k (k > 0) or <= floor(sqrt(numel) / |k|) (k < 0).
  int64_t subset_size = 0;
  std::string subset_norm_params = "linear";  // adamw_sn: "linear" weights only, or "all"
  // galore_adamw, with GaLore's flag names and torchrun_main's defaults.
  int64_t galore_rank = 128;
  int64_t update_proj_gap = 50;
  double galore_scale = 1.0;
  std::string proj_type = "std";     // std | reverse_std | left | right
  bool galore_stagger = false;       // spread projector refreshes over the gap (no all-SVD step)
  std::string galore_projector = "svd";  // svd (the reference) | subspace (no gathered gradient)
  int64_t subspace_iterations = 2;
  // The moments' dtype: float32, or bfloat16 (stochastic rounding seeded by --seed; masters and
  // GaLore's projectors stay fp32; optim/state_rounding.h).
  std::string state_dtype = "float32";
};

// How the units are spread over the ranks.
struct ShardingConfig {
  ShardingStrategy strategy = ShardingStrategy::full_shard;  // --sharding
  // Gather the next unit while one runs (on a CUDA side stream; in line on CPU). --no_prefetch turns
  // it off: at most one unit gathered under full_shard instead of two. Nothing to do for no_shard.
  bool prefetch = true;
  Offload offload = Offload::none;  // --offload
  // --offload_threads: the host step's threads (offload/optimizer_offload.h); 0: the rank's threads,
  // less one on a GPU (the thread that launches the GPU's work keeps a core).
  int offload_threads = 0;
  // --offload_delayed_update N: after N exact steps, each step's host update is applied one step late
  // (ZeRO-Offload's delayed parameter update: the forward of step t+1 runs on the weights of step
  // t-1 while the host steps t); -1: off, every step exact.
  int64_t offload_delayed_update = -1;
  OffloadStep offload_step = OffloadStep::host;  // --offload_step
  CommunicatorChoice communicator = CommunicatorChoice::auto_select;  // --communicator
  // --shard_group_size S (hybrid_*): the ranks a group shards over; 0 until resolved, then by default
  // the ranks of one node (trainer/main.cpp); it divides the world size (sharding/topology.h).
  int group_size = 0;
  // --backward_gather_size R (full_shard): after each unit's forward its rows are kept over groups of
  // R ranks (a node), and the backward gathers inside the group (ZeRO++ hpZ, FSDP2's
  // reshard_after_forward=R); 0: off. R divides the world and is below it (sharding/topology.h).
  int backward_gather_size = 0;
  // --shard_optimizer_across_groups (hybrid_*): the masters' and optimizer state's rows of a group's
  // shard are split once more over the G groups (each rank steps 1/N of the model, as under
  // full_shard), the gradient reduce-scattered across the groups and the updated rows all-gathered
  // back (sharding/fsdp_unit.h): optimizer memory per rank falls by G, the bytes across are the same.
  bool optimizer_across_groups = false;
};

// The dtype the model computes in.
struct PrecisionConfig {
  DType dtype = DType::float32;
  Precision mode = Precision::mixed;  // --precision, for bfloat16
};

struct CheckpointConfig {
  int64_t save_every = 0;            // 0 = only at the end when save_dir is set
  std::string save_dir;
  int64_t keep_last = 0;  // --keep_last: this run's step_<N> folders kept after each save; 0 = all
  // --async_save: each rank writes its files on a thread while training goes on, from a host copy of
  // its state; the save completes at a later step boundary (checkpoint/checkpoint.h, BackgroundSave).
  bool async_save = false;
  std::string continue_from;
  // --allow_changed_flags: resume although settings that change training differ from the checkpoint's
  // (config/training_settings.h lists them); without it such a resume is refused (exit 2).
  bool allow_changed_flags = false;
  // --init_from: a transformers save_pretrained folder whose weights replace the seeded init of a
  // fresh run (checkpoint/interchange/pretrained.h); never with continue_from.
  std::string init_from;
};

struct LoggingConfig {
  std::string run_dir = "runs/latest";
  int64_t log_every = 1;
  bool print_config = false;
  // CUDA only: record the caching allocator's history and write RUN_DIR/memory_snapshot.rank<R>.pickle
  // (pytorch.org/memory_viz) after the first steps; a UserError on a CPU rank.
  bool memory_snapshot = false;
  // --offload_trace: each rank writes RUN_DIR/offload_trace.rank<R>.jsonl, the offloaded optimizer's
  // schedule (which unit is stepped when, on which thread, what the next forward waited for).
  bool offload_trace = false;
  // --on_write_error: a failed write of a run file (metrics.jsonl, the ledger, memory_report.md) ends
  // the run with exit 2 naming the file ("stop"), or is logged once per file and the run goes on
  // ("warn"); common/output_files.h.
  std::string on_write_error = "stop";
  // GaLore's wandb run name and tags (--name, --tags a,b): recorded in the run's settings (and the
  // TensorBoard text of the configuration, which `wandb sync --sync-tensorboard` carries).
  std::string name;
  std::vector<std::string> tags;
  // --tensorboard_dir [DIR]: rank 0 writes TensorBoard event files there (trainer/tensorboard.h);
  // "" = off. The flag without a value means {run_dir}/tensorboard; "{run_dir}" at the start of the
  // value stands for --run_dir, resolved by validate_run_config.
  std::string tensorboard_dir;
  // --peak_tflops: the device's dense peak for the compute dtype, per rank, for MFU
  // (trainer/model_flops.h); 0 = the table of known GPUs, or the measured GEMM peak on CPU.
  double peak_tflops = 0;
};

// What --tensorboard_dir without a value means, before validation resolves it.
inline constexpr char kTensorboardInRunDir[] = "{run_dir}/tensorboard";

// The run's settings, grouped by concern; each flag fills one field (README's flag table). JSON
// (metrics.jsonl's "run" record, --print_config) keeps one flat object keyed by the flags' names.
struct RunConfig {
  std::string config_path;           // --config
  int64_t num_training_steps = 200;  // optimizer steps
  // --max_train_tokens (GaLore's flag): when > 0, num_training_steps = ceil(tokens / (total_batch_size
  // * max_length)), resolved by validate_run_config.
  int64_t max_train_tokens = 0;
  // Seconds a rank may make no progress (a collective that never completes, a stopped peer) before it
  // ends the job naming the rank that holds it up (common/watchdog.h); 0: never.
  double collective_timeout = 600;
  // Seconds from a preemption signal to the job's end (trainer/preemption.h); 0: no limit.
  double preemption_grace_seconds = 0;
  // Stopping before the end, with a save and exit status 0 (trainer/train_loop.cpp): --stop_at_step N
  // (0: none) after step N, the schedule still that of num_training_steps; --max_runtime (""
  // none; common/run_deadline.h) at the first step boundary where one more step and a save would
  // pass it.
  int64_t stop_at_step = 0;
  std::string max_runtime;
  int64_t divergence_patience = 10;  // steps of a dead or runaway run before it stops (trainer/divergence.h); 0: never
  bool skip_memory_check = false;    // --skip_memory_check: start even when the estimate says it does not fit
  // Activation checkpointing: every K-th transformer block (blocks 0, K, 2K, ...) recomputes its
  // forward in backward; 0: none. --activation_checkpointing is K = 1.
  int64_t activation_checkpointing_every = 0;
  // --recompute: "" or a comma-separated set of norm, swiglu, mlp, attention (model/recompute.h) or
  // block (every block, as --activation_checkpointing: validation sets activation_checkpointing_every).
  std::string recompute;
  // --fused_ops: "" or a comma-separated set of the CUDA kernels used in place of the ATen forms of
  // the layer's operations (model/layer_ops.h): rms_norm. CUDA only; none is on by default until a
  // GPU run has passed its test (docs/gpu.md).
  std::string fused_ops;
  // --pad_matmul_dims auto|on|off: the MLP's intermediate dimension padded with zeros on the compute
  // side only (model/model_config.h says when; model/units.h what stays unpadded).
  std::string pad_matmul_dims = "auto";
  // --grouped_projections: each layer's q/k/v and gate/up as one GEMM each (model/grouped_linear.h),
  // on every device; off by default until a GPU run has measured it (docs/gpu.md).
  bool grouped_projections = false;
  // Each unit's optimizer step as soon as its gradient shard is reduced, in backward, its gradient
  // shard freed right after (--fuse_optimizer_with_backward); needs --grad_clipping 0.
  bool fuse_optimizer_with_backward = false;
  uint64_t seed = 0;                 // weight init and data order
  DeviceChoice device = DeviceChoice::auto_select;
  DataConfig data;
  OptimizerConfig optimizer;
  ShardingConfig sharding;
  PrecisionConfig precision;
  CheckpointConfig checkpoint;
  LoggingConfig logging;

  nlohmann::json to_json() const;
};

// The ranks a unit is sharded over: 1 under no_shard, the group's under hybrid_*, else the world.
inline int shard_world(const RunConfig& run, int world_size) {
  if (run.sharding.strategy == ShardingStrategy::no_shard) return 1;
  return is_hybrid(run.sharding.strategy) && run.sharding.group_size > 0 ? run.sharding.group_size : world_size;
}

// Pure bf16 AdamW on one rank keeps each resident unit's gradient shard in bf16 (sharding/fsdp_unit.h's
// keep_bf16_gradient): autograd accumulates into it and the AdamW kernel reads it, with no fp32 copy of
// a bf16 gradient; with --offload optimizer the bf16 shard is what crosses to the host step. Not with
// parameter offload (no resident unit) or the fused step.
inline bool bf16_gradient_shards(const RunConfig& run, int world_size) {
  return world_size == 1 && run.precision.dtype == DType::bfloat16 && run.precision.mode == Precision::pure &&
         run.optimizer.name == "adamw" && !offloads_parameters(run.sharding.offload) &&
         !run.fuse_optimizer_with_backward;
}

// The inverse of RunConfig::to_json for the keys it writes (a run's metrics.jsonl start record ->
// the run's settings, for `trainer report` and `trainer estimate`). Keys it lacks keep their
// defaults; a key of the wrong type is a UserError naming `source`.
RunConfig run_config_from_json(const nlohmann::json& object, const std::string& source);

// Checks ranges and cross-field rules (warmup <= steps, total divisible by batch*world, ...) and
// derives gradient_accumulation (and total_batch_size when it was 0). Throws UserError naming the
// flag: "command line: --FLAG: what is expected (got X)".
// --adam_eps left unset becomes the optimizer's reference default: 1e-8 for adamw (torch), 1e-6 for
// adamw_sn and galore_adamw (their HF-style references). --warmup_steps left unset becomes
// default_warmup_steps(num_training_steps); given, it must lie in [0, num_training_steps].
// With galore_adamw, --rank must be below the widest projected matrix's smaller dimension.
// --gradient_accumulation N sets total_batch_size = batch_size * world * N (an error naming both
// flags when a given --total_batch_size differs); --max_train_tokens then sets num_training_steps.
void validate_run_config(RunConfig& run, const ModelConfig& model, int world_size);

// --sharding hybrid_* and --shard_group_size against the world (config/sharding_validation.cpp, called
// by validate_run_config): the group size given only with a hybrid strategy, resolved (> 0: main
// resolves the default, the ranks of one node, first), and dividing the world size.
void check_sharding_topology(const RunConfig& run, int world_size);

// "" for an optimizer this trainer has (adamw, adamw_sn, galore_adamw); for another, what it is and
// the nearest flags here (GaLore's and AdamW-SN's other optimizers by name, e.g.
// galore_adamw8bit_per_layer, rmsprop_sn, adamw_snsm).
std::string unknown_optimizer_reason(const std::string& name);

// Creates --run_dir for a training run (every rank may call it; it is a folder already when it
// exists). A UserError naming --run_dir when the path is an existing file, passes through a file,
// or cannot be created or written (a probe file is created in it and removed), so the run stops
// before it starts rather than at its first log.
void create_run_dir(const std::string& run_dir);

// Why a file cannot be created in FOLDER ("" when it can): creates and removes a probe file, so a
// read-only folder or file system is found even where access() says yes (root, NFS, read-only mounts).
std::string folder_write_problem(const std::string& folder);

// The warmup when --warmup_steps is not given: 20 steps, but never more than a tenth of the run
// (rounded down), so a short run works with the default flags: 200 steps or more warm up for 20,
// 100 steps for 10, fewer than 10 steps not at all. A warmup the user gives is kept as given (an
// error when it exceeds the run), since silently shortening it would change the schedule they chose.
int64_t default_warmup_steps(int64_t num_training_steps);

const char* to_string(Scheduler value);
const char* to_string(DType value);
const char* to_string(DeviceChoice value);
const char* to_string(Precision value);
const char* to_string(Offload value);
const char* to_string(CommunicatorChoice value);
const char* to_string(OffloadStep value);

}  // namespace llm
