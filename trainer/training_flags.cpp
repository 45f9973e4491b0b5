// The training flags (trainer/training_flags.h): one function per group, called in the order
// `trainer --help` lists them (where that order strays from the concern, as for --warmup_steps and
// --device, the stray flag says so), then the steps after parsing.
#include "trainer/training_flags.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <sstream>

#include "common/errors.h"

namespace llm {

TrainingFlags::TrainingFlags(const RunConfig& defaults)
    : no_prefetch(!defaults.sharding.prefetch),
      sharding(kShardingValues, defaults.sharding.strategy),
      offload(kOffloadValues, defaults.sharding.offload),
      offload_step(kOffloadStepValues, defaults.sharding.offload_step),
      communicator(kCommunicatorValues, defaults.sharding.communicator),
      scheduler(kSchedulerValues, defaults.optimizer.scheduler),
      dtype(kDTypeValues, defaults.precision.dtype),
      precision(kPrecisionValues, defaults.precision.mode),
      device(kDeviceChoiceValues, defaults.device) {
  offload.by_name.emplace(kOffloadBothReversed, Offload::optimizer_and_parameters);  // a set: either order
}

namespace {

// GaLore's and AdamW-SN's torchrun_main spellings, read into FLAGS (TrainingFlags::reference).
void add_reference_spellings(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.reference = {
      flags.add(app.add_option("--model_config", flags.model_config, "GaLore's name for --config")),
      flags.add(numbers.add(app, "--beta1", flags.beta1, "AdamW-SN's name for --adam_beta1")),
      flags.add(numbers.add(app, "--gradient_accumulation", run.data.gradient_accumulation_given,
                            "micro-batches per optimizer step: --total_batch_size = batch_size * ranks * N")),
      flags.add(app.add_option_function<std::string>(
          "--max_train_tokens",
          [&flags](const std::string& text) {
            // GaLore's spelling: an integer with an optional M (10^6) or B (10^9) suffix; the product
            // must fit the int64 count (10000000000B would wrap).
            const char suffix = text.empty() ? '\0' : text.back();
            const int64_t scale = suffix == 'M' ? 1'000'000 : suffix == 'B' ? 1'000'000'000 : 1;
            const std::optional<int64_t> count =
                whole_number<int64_t>(scale == 1 ? text : text.substr(0, text.size() - 1));
            if (!count || *count < 1 || __builtin_mul_overflow(*count, scale, &flags.max_train_tokens))
              fail_user(kCommandLine, "--max_train_tokens",
                        "expected a number of tokens >= 1 and at most " +
                            std::to_string(std::numeric_limits<int64_t>::max()) + " (" +
                            std::to_string(std::numeric_limits<int64_t>::max() / 1'000'000'000) +
                            "B), digits with an optional M (10^6) or B (10^9) suffix, as 100M or 1B (got \"" + text +
                            "\")");
          },
          "tokens to train on (100M, 1B): sets --num_training_steps = ceil(tokens / (total_batch_size * "
          "max_length))")),
      flags.add(app.add_flag("--single_gpu", flags.single_gpu,
                             "GaLore's flag: accepted, nothing to do (a world of one)")),
      flags.add(app.add_flag("--use_subset_norm_heuristics", flags.use_subset_norm_heuristics,
                             "AdamW-SN's name for --subset_size heuristics")),
      flags.add(app.add_option("--name", run.logging.name,
                               "run name, recorded in metrics.jsonl (GaLore's wandb name)")),
      flags.add(app.add_option_function<std::string>(
          "--tags",
          [&run](const std::string& text) {
            run.logging.tags.clear();
            std::stringstream list(text);
            for (std::string tag; std::getline(list, tag, ',');) run.logging.tags.push_back(tag);
          },
          "comma-separated tags, recorded in metrics.jsonl (GaLore's wandb tags)")),
  };
  flags.of_optimizer.emplace_back(app.get_option("--use_subset_norm_heuristics"), "adamw_sn");
}

// The flags most command lines set: peak learning rate, batch sizes, sequence length, steps.
void add_headline_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(numbers.add(app, "--lr", run.optimizer.lr, "peak learning rate")->capture_default_str());
  flags.add(numbers.add(app, "--batch_size", run.data.batch_size, "micro-batch per rank, in sequences")
          ->capture_default_str());
  flags.add(numbers.add(app, "--total_batch_size", run.data.total_batch_size,
                        "sequences per optimizer step; 0 = batch_size * world size (no accumulation)")
          ->capture_default_str());
  flags.add(numbers.add(app, "--max_length", run.data.max_length, "tokens per sequence")->capture_default_str());
  flags.add(numbers.add(app, "--num_training_steps", run.num_training_steps, "optimizer steps to run")
          ->capture_default_str());
}

// When a run stops itself, or refuses to start.
void add_safeguard_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(numbers.add(app, "--divergence_patience", run.divergence_patience,
                        "stop (exit 3) after this many steps with a zero gradient norm, or with the loss at or above "
                        "ln(vocab) + 1 after warmup; 0: never")
          ->capture_default_str());
  flags.add(numbers.add(app, "--collective_timeout", run.collective_timeout,
                        "with several ranks: seconds a rank may make no progress (a collective that never "
                        "completes, a stopped or hung peer) before it ends the job (exit 4) naming the rank that "
                        "holds it up; 0: never")
          ->capture_default_str());
  flags.add(numbers.add(app, "--preemption_grace_seconds", run.preemption_grace_seconds,
                        "seconds the cluster allows between its preemption signal and the kill: a rank whose step "
                        "and checkpoint have not finished by then ends itself (exit 128 + signal), saying so; 0: no "
                        "limit")
          ->capture_default_str());
  flags.add(numbers.add(app, "--stop_at_step", run.stop_at_step,
                        "stop after this step (saving it with --save_dir) and exit 0; the learning-rate schedule "
                        "stays that of --num_training_steps, so --continue_from goes on as if never stopped; 0: none")
          ->capture_default_str());
  flags.add(app.add_option("--max_runtime", run.max_runtime,
                           "minutes from the start (230, 1.5) or an end time (2026-11-26T18:00, local): stop at "
                           "the first step boundary where one more step and a save would pass it, save (with "
                           "--save_dir) and exit 0 (Megatron's --exit-duration-in-mins)"));
  flags.add(app.add_flag("--skip_memory_check", run.skip_memory_check,
                         "start even when the start-up memory check (this run's estimate against the GPU's free memory "
                         "and the node's available RAM) says it does not fit"));
}

// What backward does besides the gradients: the fused optimizer step, activation checkpointing.
void add_backward_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(app.add_flag("--fuse_optimizer_with_backward", run.fuse_optimizer_with_backward,
                         "step each unit's optimizer as soon as its gradient shard is reduced, in backward, and free "
                         "the shard (needs --grad_clipping 0)"));
  flags.checkpointing_flag = flags.add(app.add_flag(
      "--activation_checkpointing", flags.activation_checkpointing,
      "recompute every transformer block's forward in backward, keeping only the block's input"));
  flags.checkpoint_every_flag = flags.add(numbers.add(
      app, "--activation_checkpointing_every", flags.checkpoint_every,
      "recompute every K-th block only (blocks 0, K, 2K, ...): less memory saved, less recompute"));
  flags.add(app.add_option("--recompute", run.recompute,
                           "operations to recompute in backward, comma-separated: norm (the RMSNorms), swiglu "
                           "(silu(gate) * up), mlp, attention, or block (the whole layer, as "
                           "--activation_checkpointing); each keeps only its inputs, bitwise equal to none"));
  flags.add(app.add_option("--fused_ops", run.fused_ops,
                           "CUDA kernels in place of the layer's ATen forms, comma-separated: rms_norm (LibTorch's "
                           "fused RMSNorm: one rounding, within a bf16 ulp of transformers' two), swiglu (one pass "
                           "each way, keeping gate and up only), rotary (q and k one pass each way), cross_entropy (the "
                           "loss in one read of the logits for the loss and one for its gradient, written over the "
                           "logits); default none"));
  flags.add(app.add_option("--pad_matmul_dims", run.pad_matmul_dims,
                           "pad the MLP's intermediate dimension and the vocabulary with zeros to a multiple of 128 in "
                           "the compute copies only (masters, optimizer state, checkpoints stay as the config says): auto "
                           "(on a GPU, where one is not a multiple of 8), on, off; default auto"));
  flags.add(app.add_flag("--grouped_projections", run.grouped_projections,
                         "compute each layer's q, k and v as one GEMM, and gate and up as one, from the adjacent "
                         "weights of the gathered unit (the input's gradient accumulated in the GEMMs, no additions); "
                         "equal to the separate projections to rounding; default off"));
}

// --warmup_steps, which --help lists here rather than with the schedule's flags; read into FLAGS, as
// the run's warmup stays unset (a default of num_training_steps) unless it is given.
void add_warmup_flag(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags) {
  flags.warmup_flag = flags.add(
      numbers.add(app, "--warmup_steps", flags.warmup_steps,
                  "linear warm-up steps of the schedule; default min(20, num_training_steps / 10)")
          ->default_str("min(20, num_training_steps / 10)"));
}

// How the model is spread over the ranks and what carries their collectives.
void add_sharding_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(flags.sharding.add(app, "--sharding",
                               "full_shard (ZeRO-3), shard_grad_op (ZeRO-2), no_shard (data parallel), or "
                               "hybrid_shard / hybrid_shard_grad_op (full_shard / shard_grad_op inside each group "
                               "of --shard_group_size ranks, replicated across the groups)"));
  flags.add(numbers.add(app, "--shard_group_size", run.sharding.group_size,
                        "hybrid_*: the ranks each group shards over (default: the ranks of one node); it divides "
                        "the world size",
                        NumberRange<int>{1, 1 << 20, "a rank count in [1, 1048576] that divides the world size"}));
  flags.add(numbers.add(app, "--backward_gather_size", run.sharding.backward_gather_size,
                        "full_shard: after each unit's forward keep its rows over groups of this many ranks (a "
                        "node), so the backward's all-gathers stay inside the group (ZeRO++ hpZ); 0: off",
                        NumberRange<int>{0, 1 << 20, "a rank count in [0, 1048576] that divides the world size"}));
  flags.add(app.add_flag("--shard_optimizer_across_groups", run.sharding.optimizer_across_groups,
                         "hybrid_*: split the masters and optimizer state of a group's shard over the groups too "
                         "(each rank steps 1/N of the model; optimizer memory per rank falls by the number of "
                         "groups; the gradient is reduce-scattered across the groups and the rows all-gathered)"));
  flags.add(app.add_flag("--no_prefetch", flags.no_prefetch,
                         "gather each unit only when it runs (default: the next unit's all-gather is "
                         "prefetched while one runs, on a CUDA side stream)"));
  flags.add(app.add_option(
      "--offload", flags.offload.text,
      "what lives in host memory: optimizer (fp32 master shards and optimizer state, pinned where "
      "they cross to a GPU, stepped there per unit while the device goes on), parameters (each unit's "
      "shard in the compute dtype, page-locked, copied to the device ahead of its gather), or "
      "optimizer,parameters (docs/offload.md)")
                ->check(CLI::Validator(
                    [&flags](std::string& text) {
                      if (flags.offload.by_name.count(text) > 0) return std::string();
                      return "expected none, or a set of optimizer and parameters separated by a comma "
                             "(optimizer, parameters, optimizer,parameters), got \"" + text + "\"";
                    },
                    "none|optimizer|parameters|optimizer,parameters", "offload set"))
                ->capture_default_str());
  flags.add(numbers.add(app, "--offload_threads", run.sharding.offload_threads,
                           "threads of the offloaded optimizer step (--offload optimizer); default 0: the rank's "
                           "threads, less one on a GPU, so the thread that launches the GPU's work keeps a core"));
  flags.add(numbers.add(app, "--offload_delayed_update", run.sharding.offload_delayed_update,
                       "with --offload optimizer: after N exact steps, apply each step's host update one step "
                       "late, so the host step overlaps the next forward and backward (ZeRO-Offload's delayed "
                       "parameter update; not exact: docs/offload.md measures its loss); default -1, off"));
  flags.add(flags.offload_step.add(
      app, "--offload_step",
      "with --offload optimizer, when and where each unit's step runs: host (on the host, after backward, "
      "once the global norm is known), speculative (on the host as each unit's gradient lands in backward, "
      "as if no clipping were needed, into a second set of host buffers; adopted when the norm says so, "
      "else stepped again from the kept state: a second master and state in host memory), or device (on "
      "the device, the step without offload's own kernel, over master and state kept in page-locked host "
      "memory and streamed through two device windows; AdamW when sharded). All exact"));
  flags.add(flags.communicator.add(
      app, "--communicator",
      "what carries collectives across ranks: auto (NCCL on GPUs, MPI on CPUs), nccl, or mpi "
      "(on GPUs: CUDA tensors staged through page-locked host memory, slow; lets several ranks "
      "share one GPU, e.g. mpirun -np 4 on a one-GPU machine)"));
}

// The schedule after warm-up and the update's hyper-parameters every optimizer shares.
void add_update_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(flags.scheduler.add(app, "--scheduler", "learning-rate schedule after warm-up"));
  flags.add(numbers.add(app, "--min_lr_ratio", run.optimizer.min_lr_ratio,
                        "final lr of cosine / linear decay, as a fraction of --lr")
          ->capture_default_str());
  flags.add(numbers.add(app, "--weight_decay", run.optimizer.weight_decay, "decoupled weight decay")
          ->capture_default_str());
  flags.add(numbers.add(app, "--grad_clipping", run.optimizer.grad_clipping, "max global grad norm; 0 = off")
          ->capture_default_str());
  flags.add(numbers.add(app, "--adam_beta1", run.optimizer.adam_beta1, "Adam beta1")->capture_default_str());
  flags.add(numbers.add(app, "--adam_beta2", run.optimizer.adam_beta2, "Adam beta2")->capture_default_str());
  flags.add(numbers.add(app, "--adam_eps", run.optimizer.adam_eps,
                        "Adam epsilon; default 1e-8 for adamw, 1e-6 for adamw_sn and galore_adamw "
                        "(their references)"));
}

// The dtype the model computes in.
void add_precision_flags(CLI::App& app, TrainingFlags& flags) {
  flags.add(flags.dtype.add(app, "--dtype", "compute dtype"));
  flags.add(flags.precision.add(app, "--precision",
                                "with bfloat16: pure bf16 weights (as GaLore) or mixed (fp32 master weights)"));
}

// --optimizer, then the flags of adamw_sn and of galore_adamw (each refused with another optimizer).
void add_optimizer_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(app.add_option("--optimizer", run.optimizer.name,
                           "adamw (torch.optim.AdamW), adamw_sn (subset-norm) or galore_adamw (GaLore)")
          ->check(CLI::Validator(
              [](std::string& name) { return unknown_optimizer_reason(name); }, "", "known optimizer"))
          ->capture_default_str());
  flags.add(app.add_option("--optimizer_state_dtype", run.optimizer.state_dtype,
                           "float32, or bfloat16: the optimizer's moments in bf16 (half their bytes), stepped in fp32 "
                           "and stored with stochastic rounding seeded by --seed; masters stay fp32")
          ->check(CLI::IsMember(kOptimizerStateDtypeChoices))
          ->capture_default_str());
  flags.for_optimizer("adamw_sn",
      app.add_option_function<std::string>(
             "--subset_size",
             [&run](const std::string& text) {
               if (text == "heuristics") {
                 run.optimizer.subset_size = 0;
                 return;
               }
               // -k is taken of a negative k (subset_size_for), so INT64_MIN is out.
               const std::optional<int64_t> value = whole_number<int64_t>(text);
               if (!value || *value == 0 || *value < -std::numeric_limits<int64_t>::max())
                 fail_user(kCommandLine, "--subset_size",
                           "expected heuristics or a non-zero integer from -" +
                               std::to_string(std::numeric_limits<int64_t>::max()) + " to " +
                               std::to_string(std::numeric_limits<int64_t>::max()) + " (got \"" + text + "\")");
               run.optimizer.subset_size = *value;
             },
             "adamw_sn: heuristics (one subset per row or column of a matrix) or k: contiguous "
             "subsets of the largest divisor of numel <= k (k > 0) or <= sqrt(numel)/|k| (k < 0)")
          ->default_str("heuristics"));
  flags.for_optimizer("adamw_sn",
      app.add_option("--subset_norm_params", run.optimizer.subset_norm_params,
                     "adamw_sn: subset-norm on the linear weights only (the paper's best) or on all")
          ->check(CLI::IsMember(kSubsetNormParamsChoices))
          ->capture_default_str());
  flags.for_optimizer("galore_adamw",
      numbers.add(app, "--rank", run.optimizer.galore_rank, "galore_adamw: projection rank")->capture_default_str());
  flags.for_optimizer("galore_adamw",
      numbers.add(app, "--update_proj_gap", run.optimizer.update_proj_gap,
                  "galore_adamw: steps between projector updates")
          ->capture_default_str());
  flags.for_optimizer("galore_adamw",
      numbers.add(app, "--galore_scale", run.optimizer.galore_scale, "galore_adamw: scale of the projected update")
          ->capture_default_str());
  flags.for_optimizer("galore_adamw",
      app.add_option("--proj_type", run.optimizer.proj_type, "galore_adamw: std, reverse_std, left or right")
          ->check(CLI::IsMember(kProjTypeChoices))
          ->capture_default_str());
  flags.for_optimizer("galore_adamw",
      app.add_flag("--galore_stagger", run.optimizer.galore_stagger,
                   "galore_adamw: spread projector updates over the gap instead of all at once"));
  flags.for_optimizer("galore_adamw",
      app.add_option("--galore_projector", run.optimizer.galore_projector,
                     "galore_adamw: svd (the reference's SVD of the gathered gradient) or subspace "
                     "(warm-started power iteration on the shards, no gathered gradient)")
          ->check(CLI::IsMember(kGaloreProjectorChoices))
          ->capture_default_str());
  flags.for_optimizer("galore_adamw",
      numbers.add(app, "--subspace_iterations", run.optimizer.subspace_iterations,
                  "galore_adamw subspace: power iterations per refresh (3x at the first)")
          ->capture_default_str());
}

// The seed, the token source and the held-out evaluation.
void add_data_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(numbers.add(app, "--seed", run.seed, "seed for initialisation and data order")
          ->capture_default_str());
  flags.add(app.add_option("--data", run.data.source,
                           "\"synthetic\", or token files: a comma-separated list of files (`trainer prepare`'s, llm.c .bin, Megatron .bin/.idx, NumPy .npy), folders and glob patterns; ITEM:WEIGHT items for a weighted mixture, or a mixture file (.json)")
          ->capture_default_str());
  flags.add(app.add_option("--eval_data", run.data.eval_source,
                           "a held-out corpus of its own for evaluation (token shards, as --data); without it the "
                           "last --eval_fraction of --data's windows"));
  flags.add(app.add_option("--window_start", run.data.window_start,
                           "anywhere: windows of max_length + 1 tokens cut end to end, across documents; document: "
                           "each window starts at a document (Megatron datasets record where; the rest of a longer "
                           "document is not read)")
          ->check(CLI::IsMember(kWindowStartChoices))
          ->capture_default_str());
  flags.add(app.add_option("--memmap_dtype", run.data.memmap_dtype,
                           "uint16 or uint32: read token files in no known format as headerless ids of that width "
                           "(OLMo's .npy token arrays, written through numpy.memmap; OLMo's data.memmap_dtype)")
          ->check(CLI::IsMember(kMemmapDtypeChoices)));
  flags.add(app.add_flag("--allow_other_data", run.data.allow_other_data,
                         "resume from a checkpoint trained on other data (another shard list, or a shard changed "
                         "since it was saved); without it such a resume is refused, naming the difference"));
  flags.add(numbers.add(app, "--eval_fraction", run.data.eval_fraction,
                        "share of the token windows held out for evaluation")
          ->capture_default_str());
  flags.add(numbers.add(app, "--eval_every", run.data.eval_every, "evaluate every N steps; 0 = only at the end")
          ->capture_default_str());
  flags.add(numbers.add(app, "--eval_sequences", run.data.eval_sequences,
                        "sequences per evaluation, for the whole job: the same held-out sequences at every world "
                        "size and micro-batch (default " + std::to_string(kDefaultEvalSequences) +
                            " when none of --eval_sequences, --eval_tokens, --eval_batches is given)"));
  flags.add(numbers.add(app, "--eval_tokens", run.data.eval_tokens,
                        "tokens per evaluation, for the whole job, rounded up to whole sequences (GaLore's "
                        "target_eval_tokens)"));
  flags.add(numbers.add(app, "--eval_batches", run.data.eval_batches,
                        "micro-batches per evaluation on each rank: grows with the world size (--eval_sequences "
                        "does not)"));
}

// Saving, keeping and resuming checkpoints, and starting from a transformers folder.
void add_checkpoint_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(numbers.add(app, "--save_every", run.checkpoint.save_every,
                        "checkpoint every N steps; 0 = only at the end (with --save_dir)")
          ->capture_default_str());
  flags.add(app.add_option("--save_dir", run.checkpoint.save_dir, "checkpoint folder; empty = no checkpoints")
          ->capture_default_str());
  flags.add(numbers.add(app, "--keep_last", run.checkpoint.keep_last,
                        "after each save, keep this run's newest N step_<N> folders and remove older ones; 0 = all")
          ->capture_default_str());
  flags.add(app.add_flag("--async_save", run.checkpoint.async_save,
                         "write each checkpoint on a background thread from a host copy of each rank's state while "
                         "training goes on; it completes at a later step boundary"));
  flags.add(app.add_option("--continue_from", run.checkpoint.continue_from, "checkpoint folder to resume from")
          ->capture_default_str());
  flags.add(app.add_flag("--allow_changed_flags", run.checkpoint.allow_changed_flags,
                         "resume although flags that change training (learning rate and schedule, optimizer and "
                         "its settings, seed, batch and sequence size, dtype, held-out split) differ from the "
                         "checkpoint's; without it such a resume is refused, naming each difference"));
  flags.add(app.add_option("--init_from", run.checkpoint.init_from,
                           "start a new run from a transformers save_pretrained folder's weights (safetensors), e.g. "
                           "one `trainer export` wrote"));
}

// The run folder and what goes into it; --help lists --device among them.
void add_output_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(app.add_option("--run_dir", run.logging.run_dir, "folder for logs and metrics (JSONL)")
          ->capture_default_str());
  flags.add(flags.device.add(app, "--device", "auto = this rank's GPU when there is one, else the CPU"));
  flags.add(numbers.add(app, "--log_every", run.logging.log_every, "log a line every N steps")
          ->capture_default_str());
  flags.add(app.add_option_function<std::string>(
                   "--tensorboard_dir",
                   [&run](const std::string& text) {
                     run.logging.tensorboard_dir = text.empty() ? std::string(kTensorboardInRunDir) : text;
                   },
                   "rank 0 writes TensorBoard event files here as the run goes (without a value: "
                   "RUN_DIR/tensorboard); `tensorboard --logdir DIR`, or `wandb sync --sync-tensorboard DIR`")
                ->expected(0, 1));
  flags.add(numbers.add(app, "--peak_tflops", run.logging.peak_tflops,
                        "the device's dense peak (TFLOP/s per rank) for the MFU figure; 0: the table of known GPUs, "
                        "or this CPU's measured GEMM peak")
                ->capture_default_str());
  flags.add(app.add_flag("--print_config", run.logging.print_config,
                         "print the resolved model and run config as JSON and exit"));
  flags.add(app.add_flag("--memory_snapshot", run.logging.memory_snapshot,
                         "CUDA only: record the allocator's history and write "
                         "RUN_DIR/memory_snapshot.rank<R>.pickle for pytorch.org/memory_viz"));
  flags.add(app.add_flag("--offload_trace", run.logging.offload_trace,
                         "with --offload optimizer: write RUN_DIR/offload_trace.rank<R>.jsonl, the host step's "
                         "schedule event by event (docs/offload.md, \"The schedule, recorded\")"));
  flags.add(app.add_option("--on_write_error", run.logging.on_write_error,
                           "a failed write of a run file (metrics.jsonl, memory ledger, memory_report.md; disk "
                           "full, quota): stop (exit 2 naming the file, after a last checkpoint when --save_dir is "
                           "elsewhere) or warn (once per file, and train on)")
          ->check(CLI::IsMember(kWriteErrorChoices))
          ->capture_default_str());
}

// GaLore's and AdamW-SN's spellings mean ours: their values go into RUN, refused when both names
// are given with different values.
void apply_reference_spellings(const CLI::App& app, const TrainingFlags& flags, RunConfig& run) {
  auto both_given = [&](const char* theirs, const char* ours) {
    fail_user(kCommandLine, std::string(theirs) + " / " + ours,
              std::string("the same setting given twice under two names, with different values; give one"));
  };
  if (app.count("--model_config") > 0) {
    if (app.count("--config") > 0 && run.config_path != flags.model_config) both_given("--model_config", "--config");
    run.config_path = flags.model_config;
  }
  if (app.count("--beta1") > 0) {
    if (app.count("--adam_beta1") > 0 && run.optimizer.adam_beta1 != flags.beta1) both_given("--beta1", "--adam_beta1");
    run.optimizer.adam_beta1 = flags.beta1;
  }
  if (flags.use_subset_norm_heuristics) {
    if (app.count("--subset_size") > 0 && run.optimizer.subset_size != 0)
      both_given("--use_subset_norm_heuristics", "--subset_size");
    run.optimizer.subset_size = 0;
  }
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--eval_sequences", run.data.eval_sequences},
                                    {"--eval_tokens", run.data.eval_tokens},
                                    {"--eval_batches", run.data.eval_batches}})
    if (app.count(flag) > 0 && value < 1)
      fail_user(kCommandLine, flag, "expected an integer >= 1 (got " + std::to_string(value) + ")");
  if (app.count("--gradient_accumulation") > 0 && run.data.gradient_accumulation_given < 1)
    fail_user(kCommandLine, "--gradient_accumulation",
              "expected an integer >= 1: micro-batches per optimizer step (got " +
                  std::to_string(run.data.gradient_accumulation_given) + ")");
  run.max_train_tokens = flags.max_train_tokens;
}

// Where their defaults differ from ours, the command line keeps our meaning and the user is told
// (README "Command lines from GaLore and AdamW-SN").
void warn_reference_defaults(const CLI::App& app, const TrainingFlags& flags, const RunConfig& run,
                             std::vector<std::string>& warnings) {
  const bool reference_command_line = std::any_of(flags.reference.begin(), flags.reference.end(),
                                                  [](const CLI::Option* flag) { return flag->count() > 0; });
  auto warn = [&](const std::string& text) { warnings.push_back(std::string(kCommandLine) + ": " + text); };
  const char* theirs = "GaLore's and AdamW-SN's torchrun_main";
  if (flags.single_gpu)
    warn("--single_gpu: accepted and ignored; the world here is the ranks mpirun starts, and one rank (no "
         "mpirun) is a single-GPU run with no flag");
  if (flags.max_train_tokens > 0)
    warn("--max_train_tokens " + std::to_string(flags.max_train_tokens) +
         ": --num_training_steps becomes ceil(tokens / (total_batch_size * max_length))" +
         (app.count("--num_training_steps") > 0 ? ", replacing the one given" : "") +
         "; GaLore's divides by total_batch_size only (sequences, not tokens), which gives max_length times "
         "more steps: pass --num_training_steps for its count");
  if (flags.dtype.value() == DType::bfloat16 && app.count("--precision") == 0)
    warn("--dtype bfloat16 without --precision: mixed here (fp32 weights, bf16 autocast); GaLore's and "
         "AdamW-SN's --dtype bfloat16 is pure bf16 (the model cast to bf16): add --precision pure for bf16 "
         "weights (updated through fp32 master copies here)");
  if (app.count("--grad_clipping") == 0 && (reference_command_line || run.optimizer.name == "galore_adamw"))
    warn("--grad_clipping not given: the gradient norm is clipped to " + format_number(run.optimizer.grad_clipping) +
         " here; " + theirs + " default to 0 (no clipping): pass --grad_clipping 0 for theirs");
  if (reference_command_line) {
    // Defaults that differ from the references', for flags their command lines leave out.
    struct Default { const char* flag; std::string here, there; };
    const Default defaults[] = {
        {"--dtype", to_string(flags.dtype.value()), "bfloat16 (pure) where the GPU supports it"},
        {"--max_length", std::to_string(run.data.max_length), "256"},
        {"--lr", format_number(run.optimizer.lr), "1e-4"},
        {"--num_training_steps", std::to_string(run.num_training_steps), "10000"},
        {"--warmup_steps", "min(20, num_training_steps / 10)", "1000"},
        {"--eval_every", std::to_string(run.data.eval_every), "5000"},
    };
    for (const Default& entry : defaults)
      if (app.count(entry.flag) == 0 &&
          !(flags.max_train_tokens > 0 && std::string(entry.flag) == "--num_training_steps"))
        warn(std::string(entry.flag) + " not given: " + entry.here + " here; " + theirs + " default to " +
             entry.there + ": pass " + entry.flag + " for theirs");
    if (run.optimizer.name == "adamw_sn" && app.count("--subset_size") == 0 && !flags.use_subset_norm_heuristics)
      warn("--optimizer adamw_sn without --subset_size or --use_subset_norm_heuristics: heuristics here (one "
           "subset per row or column); AdamW-SN's torchrun_main defaults to --subset_size -2: pass "
           "--subset_size -2 for theirs");
    if (app.count("--beta1") > 0 && run.optimizer.name == "galore_adamw")
      warn("--beta1 is Adam's beta1 here (AdamW-SN's meaning); GaLore's torchrun_main passes it to Adafactor "
           "and SGD only, its galore_adamw keeps 0.9");
  }
}

// The checks CLI11 cannot make (--config given, a flag of another optimizer, the two activation
// checkpointing flags), then what FLAGS read becomes RUN's fields.
void fill_run_from_flags(const TrainingFlags& flags, bool estimate, RunConfig& run) {
  if (run.config_path.empty())
    fail_user(kCommandLine, "--config",
              std::string("required for ") + (estimate ? "`trainer estimate`" : "training") +
                  ": pass a model config such as configs/llama_60m.json (or run `trainer --help`)");
  for (const auto& [flag, owner] : flags.of_optimizer)
    if (flag->count() > 0 && run.optimizer.name != owner)
      fail_user(kCommandLine, flag->get_name(),
                "applies to --optimizer " + owner + " only (got --optimizer " + run.optimizer.name + ")");
  if (flags.warmup_flag->count() > 0) run.optimizer.warmup_steps = flags.warmup_steps;
  if (flags.checkpoint_every_flag->count() > 0) {
    if (flags.checkpoint_every < 1)
      fail_user(kCommandLine, "--activation_checkpointing_every",
                "expected a number of blocks >= 1 (got " + std::to_string(flags.checkpoint_every) +
                    "); leave it out for no activation checkpointing");
    // Both given and disagreeing: refused rather than one silently winning.
    if (flags.activation_checkpointing && flags.checkpoint_every != 1) {
      const std::string k = std::to_string(flags.checkpoint_every);
      fail_user(kCommandLine, "--activation_checkpointing / --activation_checkpointing_every",
                "give one: --activation_checkpointing recomputes every transformer block in backward (as "
                "--activation_checkpointing_every 1); --activation_checkpointing_every " + k +
                    " recomputes one block in " + k + " (blocks 0, " + k + ", 2 x " + k +
                    ", ...), saving less memory for less recompute");
    }
    run.activation_checkpointing_every = flags.checkpoint_every;
  } else if (flags.checkpointing_flag->count() > 0 && flags.activation_checkpointing)
    run.activation_checkpointing_every = 1;
  run.optimizer.scheduler = flags.scheduler.value();
  run.sharding.strategy = flags.sharding.value();
  run.sharding.prefetch = !flags.no_prefetch;
  run.sharding.offload = flags.offload.value();
  run.sharding.offload_step = flags.offload_step.value();
  run.sharding.communicator = flags.communicator.value();
  run.precision.dtype = flags.dtype.value();
  run.precision.mode = flags.precision.value();
  run.device = flags.device.value();
}

}  // namespace

void add_training_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run) {
  flags.add(app.add_option("--config", run.config_path,
                           "model config: HF LlamaConfig JSON (required), e.g. configs/llama_60m.json"));
  add_reference_spellings(app, numbers, flags, run);
  add_headline_flags(app, numbers, flags, run);
  add_safeguard_flags(app, numbers, flags, run);
  add_backward_flags(app, numbers, flags, run);
  add_warmup_flag(app, numbers, flags);
  add_sharding_flags(app, numbers, flags, run);
  add_update_flags(app, numbers, flags, run);
  add_precision_flags(app, flags);
  add_optimizer_flags(app, numbers, flags, run);
  add_data_flags(app, numbers, flags, run);
  add_checkpoint_flags(app, numbers, flags, run);
  add_output_flags(app, numbers, flags, run);
}

void apply_training_flags(const CLI::App& app, const TrainingFlags& flags, bool estimate, RunConfig& run,
                          std::vector<std::string>& warnings) {
  apply_reference_spellings(app, flags, run);
  warn_reference_defaults(app, flags, run, warnings);
  fill_run_from_flags(flags, estimate, run);
}

}  // namespace llm
