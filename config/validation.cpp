// validate_run_config: every range and cross-field rule of the run's settings, one function per
// concern (lengths, batch sizes, run length, memory, safeguards, schedule, evaluation, optimizer,
// checkpoints, data), called in one fixed order so that the first mistake is the one reported. Kept
// apart from config.cpp (the settings' spellings, JSON and run folder): this file is where the rules
// live, what each flag accepts and what an unset one becomes once the others are known.
#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>

#include "common/errors.h"
#include "common/output_files.h"
#include "common/run_deadline.h"
#include "common/split.h"
#include "common/watchdog.h"
#include "model/layer_ops.h"
#include "model/recompute.h"
#include "config/optimizer_setup.h"
#include "data/synthetic.h"
#include "data/token_corpus.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

// Range checks for one flag: "command line: --FLAG: expected ... (got X)".

void require_flag(bool ok, const char* flag, const std::string& expected, const std::string& got) {
  if (!ok) fail_user(kCommandLine, flag, "expected " + expected + " (got " + got + ")");
}
void require_flag(bool ok, const char* flag, const std::string& expected, double got) {
  require_flag(ok, flag, expected, format_number(got));
}
void require_flag(bool ok, const char* flag, const std::string& expected, int64_t got) {
  require_flag(ok, flag, expected, std::to_string(got));
}

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// a * b, or nullopt where the int64 product would wrap (both >= 0 here).
std::optional<int64_t> product(int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) return std::nullopt;
  return result;
}

// --lr, --batch_size and --max_length, the last against the model's max_position_embeddings.
void check_headline_flags(const RunConfig& run, const ModelConfig& model) {
  require_flag(std::isfinite(run.optimizer.lr) && run.optimizer.lr > 0, "--lr", "a finite number > 0", run.optimizer.lr);
  require_flag(run.data.batch_size >= 1, "--batch_size", "an integer >= 1 (sequences per rank)",
               run.data.batch_size);
  require_flag(run.data.max_length >= 2, "--max_length",
               "an integer >= 2 (each sequence needs an input and a next-token target)",
               run.data.max_length);
  if (run.data.max_length > model.max_position_embeddings)
    fail_user(kCommandLine, "--max_length",
              "expected at most the model's max_position_embeddings = " +
                  std::to_string(model.max_position_embeddings) + " from " +
                  (run.config_path.empty() ? model.name : run.config_path) + " (got " +
                  std::to_string(run.data.max_length) + ")");
}

// Derives total_batch_size (when 0, or from --gradient_accumulation) and gradient_accumulation, and
// returns the tokens of one optimizer step, total_batch_size * max_length.
int64_t resolve_batch_sizes(RunConfig& run, int world_size) {
  // Batching, as GaLore's torchrun_main: total = batch_size * world_size * gradient_accumulation.
  // Every product of counts below is checked: an int64 that wraps would train on a nonsense count.
  require_flag(product(run.data.batch_size, world_size).has_value(), "--batch_size",
               "at most " + std::to_string(kInt64Max / world_size) + " sequences per rank with " +
                   std::to_string(world_size) + " ranks (batch_size * world size is a 64-bit count)",
               run.data.batch_size);
  const int64_t sequences_per_micro_step = run.data.batch_size * world_size;
  require_flag(run.data.total_batch_size >= 0, "--total_batch_size",
               "0 (= batch_size * world_size) or a positive multiple of batch_size * world_size",
               run.data.total_batch_size);
  if (run.data.gradient_accumulation_given != 0) {
    // GaLore's --gradient_accumulation: the total follows from it, or must agree with a given one.
    require_flag(run.data.gradient_accumulation_given >= 1, "--gradient_accumulation",
                 "an integer >= 1 (micro-batches per optimizer step)", run.data.gradient_accumulation_given);
    require_flag(product(sequences_per_micro_step, run.data.gradient_accumulation_given).has_value(),
                 "--gradient_accumulation",
                 "at most " + std::to_string(kInt64Max / sequences_per_micro_step) + " with --batch_size * world size = " +
                     std::to_string(sequences_per_micro_step) + " (the total batch is a 64-bit count of sequences)",
                 run.data.gradient_accumulation_given);
    const int64_t implied_total = sequences_per_micro_step * run.data.gradient_accumulation_given;
    if (run.data.total_batch_size != 0 && run.data.total_batch_size != implied_total)
      fail_user(kCommandLine, "--gradient_accumulation / --total_batch_size",
                "disagree: --batch_size * world size * --gradient_accumulation = " +
                    std::to_string(run.data.batch_size) + " * " + std::to_string(world_size) + " * " +
                    std::to_string(run.data.gradient_accumulation_given) + " = " + std::to_string(implied_total) +
                    " sequences per step, but --total_batch_size is " + std::to_string(run.data.total_batch_size) +
                    "; give one of the two");
    run.data.total_batch_size = implied_total;
  }
  if (run.data.total_batch_size == 0) run.data.total_batch_size = sequences_per_micro_step;
  if (run.data.total_batch_size % sequences_per_micro_step != 0)
    fail_user(kCommandLine, "--total_batch_size",
              "expected a multiple of --batch_size * world size = " +
                  std::to_string(run.data.batch_size) + " * " + std::to_string(world_size) + " = " +
                  std::to_string(sequences_per_micro_step) + ", i.e. one of " +
                  (sequences_per_micro_step <= kInt64Max / 3
                       ? std::to_string(sequences_per_micro_step) + ", " + std::to_string(2 * sequences_per_micro_step) +
                             ", " + std::to_string(3 * sequences_per_micro_step) + ", ..."
                       : std::to_string(sequences_per_micro_step)) +
                  " (or change --batch_size) (got " + std::to_string(run.data.total_batch_size) + ")");
  run.data.gradient_accumulation = run.data.total_batch_size / sequences_per_micro_step;
  const std::optional<int64_t> tokens_per_step = product(run.data.total_batch_size, run.data.max_length);
  if (!tokens_per_step)
    fail_user(kCommandLine, "--total_batch_size / --max_length",
              "a step of " + std::to_string(run.data.total_batch_size) + " sequences of " +
                  std::to_string(run.data.max_length) + " tokens is more tokens than a 64-bit count holds (" +
                  std::to_string(kInt64Max) + "): lower --batch_size, --total_batch_size or --gradient_accumulation");
  return *tokens_per_step;
}

// num_training_steps from --max_train_tokens when given; then the run's token count must fit int64.
void resolve_training_steps(RunConfig& run, int64_t tokens_per_step) {
  if (run.max_train_tokens != 0) {
    // GaLore's --max_train_tokens, in tokens: steps of total_batch_size * max_length tokens, rounded up.
    require_flag(run.max_train_tokens >= 1, "--max_train_tokens", "a number of tokens >= 1 (e.g. 100M, 1B)",
                 run.max_train_tokens);
    run.num_training_steps = run.max_train_tokens / tokens_per_step + (run.max_train_tokens % tokens_per_step != 0);
  }
  require_flag(run.num_training_steps >= 1, "--num_training_steps", "an integer >= 1",
               run.num_training_steps);
  // The run's token count (tokens_seen, the logs' tokens) is steps * tokens per step, in int64.
  if (!product(run.num_training_steps, tokens_per_step)) {
    const int64_t most_steps = kInt64Max / tokens_per_step;
    const std::string step = " steps of " + std::to_string(tokens_per_step) +
                             " tokens (--total_batch_size * --max_length): the run's token count is a 64-bit integer";
    if (run.max_train_tokens != 0)
      fail_user(kCommandLine, "--max_train_tokens",
                "expected at most " + std::to_string(most_steps * tokens_per_step) + " tokens, " +
                    std::to_string(most_steps) + step + " (got " + std::to_string(run.max_train_tokens) +
                    ", which rounds up to one step more)");
    require_flag(false, "--num_training_steps", "at most " + std::to_string(most_steps) + step, run.num_training_steps);
  }
}

// Activation checkpointing and the fused optimizer step, and what the fused step cannot combine with.
// A comma-separated list flag's items ("" has none): each one of `choices` (else `not_one_of`, after
// the item in quotes, says what it is not and what to give), each once.
std::set<std::string> choice_set(const char* flag, const std::string& list, std::span<const char* const> choices,
                                 const std::string& not_one_of) {
  std::set<std::string> items;
  if (list.empty()) return items;
  for (const std::string& item : split_list(list)) {
    if (std::none_of(choices.begin(), choices.end(), [&](const char* choice) { return item == choice; }))
      fail_user(kCommandLine, flag, "\"" + item + "\" " + not_one_of);
    if (!items.insert(item).second) fail_user(kCommandLine, flag, "names \"" + item + "\" twice (" + list + ")");
  }
  return items;
}

// --recompute: known items, each once; "block" alone (it recomputes the whole layer, the others
// included) and then activation_checkpointing_every 1; the others not with block checkpointing.
void resolve_recompute(RunConfig& run) {
  if (run.recompute.empty()) return;
  const std::set<std::string> items =
      choice_set("--recompute", run.recompute, kRecomputeChoices,
                 "is not an operation it recomputes; give a comma-separated set of norm, swiglu, mlp, attention, or "
                 "block (the whole layer, as --activation_checkpointing), e.g. --recompute norm,swiglu");
  if (items.contains("block")) {
    if (items.size() > 1)
      fail_user(kCommandLine, "--recompute",
                "block recomputes the whole layer, the operations beside it (" + run.recompute +
                    ") included: give block alone, or the operations alone");
    if (run.activation_checkpointing_every > 1)
      fail_user(kCommandLine, "--recompute",
                "block recomputes every block, and --activation_checkpointing_every " +
                    std::to_string(run.activation_checkpointing_every) + " one block in " +
                    std::to_string(run.activation_checkpointing_every) + ": give one");
    run.activation_checkpointing_every = 1;
    return;
  }
  if (run.activation_checkpointing_every > 0)
    fail_user(kCommandLine, "--recompute",
              run.recompute + " recomputes operations inside every layer, and --activation_checkpointing whole "
              "layers: give one (a recomputed layer would recompute its operations twice)");
}

// --fused_ops: known items, each once, and a device that has them (an --device auto run that lands
// on the CPU is refused where the device is known: trainer/train_loop.cpp); --pad_matmul_dims one
// of its choices.
void check_compute_flags(const RunConfig& run) {
  const std::set<std::string> items =
      choice_set("--fused_ops", run.fused_ops, kFusedOpChoices,
                 "is not a fused operation; give a comma-separated set of: rms_norm (LibTorch's CUDA kernel), swiglu, "
                 "rotary, cross_entropy (ours), e.g. --fused_ops rms_norm,swiglu,rotary,cross_entropy");
  const bool known_padding = std::any_of(std::begin(kPadMatmulChoices), std::end(kPadMatmulChoices),
                                         [&](const char* choice) { return run.pad_matmul_dims == choice; });
  if (!known_padding)
    fail_user(kCommandLine, "--pad_matmul_dims",
              "expected auto (pad on a GPU where a dimension is not a multiple of 8), on or off (got \"" +
                  run.pad_matmul_dims + "\")");
  if (!items.empty() && run.device == DeviceChoice::cpu)
    fail_user(kCommandLine, "--fused_ops",
              run.fused_ops + " are CUDA kernels and this run is --device cpu: leave --fused_ops out on the CPU "
              "(its ATen forms give the same numbers as transformers)");
}

void check_memory_flags(const RunConfig& run, const ModelConfig& model) {
  require_flag(run.sharding.offload_threads >= 0 && run.sharding.offload_threads <= 4096, "--offload_threads",
               "a thread count in [1, 4096], or 0 for the rank's threads less one on a GPU",
               static_cast<int64_t>(run.sharding.offload_threads));
  require_flag(run.sharding.offload_delayed_update >= -1, "--offload_delayed_update",
               "a number of exact warm-up steps >= 0 (or -1: off)", run.sharding.offload_delayed_update);
  if (run.sharding.offload_delayed_update >= 0 && run.sharding.offload != Offload::optimizer)
    fail_user(kCommandLine, "--offload_delayed_update",
              "delays the host step of --offload optimizer: add --offload optimizer (not with parameters: the "
              "host rows are what the gathers read while the late update is written), or leave it out");
  if (run.sharding.offload_step != OffloadStep::host && !offloads_optimizer(run.sharding.offload))
    fail_user(kCommandLine, "--offload_step",
              std::string(to_string(run.sharding.offload_step)) +
                  " says when --offload optimizer's host step runs: add --offload optimizer, or leave it out");
  if (run.sharding.offload_step != OffloadStep::host && run.sharding.offload_delayed_update >= 0)
    fail_user(kCommandLine, "--offload_step",
              std::string(to_string(run.sharding.offload_step)) +
                  " applies each step's update before the next forward; --offload_delayed_update applies it a "
                  "step late: pick one");
  if (run.sharding.offload_step == OffloadStep::device && offloads_parameters(run.sharding.offload))
    fail_user(kCommandLine, "--offload_step",
              "device writes each unit's rows on the device, which --offload parameters keeps in host memory: "
              "use --offload optimizer, or --offload_step host");
  if (run.logging.offload_trace && !offloads_optimizer(run.sharding.offload))
    fail_user(kCommandLine, "--offload_trace",
              "records the schedule of --offload optimizer's host step: add --offload optimizer, or leave it out");
  if (run.sharding.offload_threads > 0 && !offloads_optimizer(run.sharding.offload))
    fail_user(kCommandLine, "--offload_threads",
              "sets the threads of the offloaded optimizer step: add --offload optimizer, or leave it out");
  require_flag(run.activation_checkpointing_every >= 0 && run.activation_checkpointing_every <= model.num_hidden_layers,
               "--activation_checkpointing_every",
               "a number of blocks in [1, num_hidden_layers = " + std::to_string(model.num_hidden_layers) +
                   "] (1: every block, as --activation_checkpointing)",
               run.activation_checkpointing_every);
  if (run.fuse_optimizer_with_backward && run.optimizer.grad_clipping > 0)
    fail_user(kCommandLine, "--fuse_optimizer_with_backward",
              "needs --grad_clipping 0 (got " + format_number(run.optimizer.grad_clipping) +
                  "): global-norm clipping scales every gradient by a factor known only once every unit's "
                  "gradient is reduced, and the fused step updates each unit as soon as its own is. Pass "
                  "--grad_clipping 0, or leave out --fuse_optimizer_with_backward to keep clipping");
  if (run.fuse_optimizer_with_backward && offloads_optimizer(run.sharding.offload))
    fail_user(kCommandLine, "--fuse_optimizer_with_backward",
              std::string("does not combine with --offload ") + to_string(run.sharding.offload) +
                  " yet: the offloaded step already runs per unit on the host as each unit's gradient lands; "
                  "use one of the two (--offload parameters alone combines with it)");
}

// When a run stops itself: the stall watchdog, the preemption grace, the divergence check.
void check_safeguard_flags(const RunConfig& run) {
  require_flag(run.stop_at_step >= 0 && run.stop_at_step < run.num_training_steps, "--stop_at_step",
               "0 (none) or a step before the run's last, " + std::to_string(run.num_training_steps) +
                   " (--num_training_steps): at the last step the run ends anyway",
               run.stop_at_step);
  if (!run.max_runtime.empty()) {
    std::string why;
    const std::optional<double> end = max_runtime_end_epoch(run.max_runtime, process_start_epoch(), &why);
    require_flag(end.has_value(), "--max_runtime",
                 "minutes from the start (a number > 0, e.g. 230 or 1.5) or an end time in local time, "
                 "YYYY-MM-DDTHH:MM[:SS] (e.g. 2026-11-26T18:00)",
                 "\"" + run.max_runtime + "\": " + why);
    require_flag(*end > now_epoch(), "--max_runtime", "an end that is still ahead", "\"" + run.max_runtime + "\", which has passed");
  }
  require_flag(std::isfinite(run.collective_timeout) && run.collective_timeout >= 0 && run.collective_timeout <= 1e7,
               "--collective_timeout",
               "a number of seconds >= 0 and at most 1e7 (0 turns the stall watchdog off)", run.collective_timeout);
  require_flag(run.collective_timeout == 0 || run.collective_timeout >= kShortestCollectiveTimeout,
               "--collective_timeout",
               "0 (off) or at least " + format_number(kShortestCollectiveTimeout) +
                   " seconds: heartbeats come every second and one is stale after 2.5, so a shorter timeout "
                   "ends a healthy job",
               run.collective_timeout);
  require_flag(std::isfinite(run.preemption_grace_seconds) && run.preemption_grace_seconds >= 0 &&
                   run.preemption_grace_seconds <= 1e7,
               "--preemption_grace_seconds", "a number of seconds >= 0 and at most 1e7 (0: no limit)",
               run.preemption_grace_seconds);
  require_flag(run.divergence_patience >= 0, "--divergence_patience",
               "a number of steps >= 0 (0 turns the divergence check off)", run.divergence_patience);
}

// The learning-rate schedule (warmup_steps filled in when not given) and the update's
// hyper-parameters every optimizer shares.
void resolve_schedule(RunConfig& run) {
  if (!run.optimizer.warmup_steps) run.optimizer.warmup_steps = default_warmup_steps(run.num_training_steps);
  require_flag(*run.optimizer.warmup_steps >= 0 && *run.optimizer.warmup_steps <= run.num_training_steps,
               "--warmup_steps",
               "an integer in [0, --num_training_steps = " + std::to_string(run.num_training_steps) +
                   "], or no --warmup_steps for the default min(20, num_training_steps / 10) = " +
                   std::to_string(default_warmup_steps(run.num_training_steps)),
               *run.optimizer.warmup_steps);
  require_flag(run.optimizer.min_lr_ratio >= 0 && run.optimizer.min_lr_ratio <= 1, "--min_lr_ratio",
               "a number in [0, 1]", run.optimizer.min_lr_ratio);
  require_flag(std::isfinite(run.optimizer.weight_decay) && run.optimizer.weight_decay >= 0, "--weight_decay",
               "a finite number >= 0", run.optimizer.weight_decay);
  require_flag(std::isfinite(run.optimizer.grad_clipping) && run.optimizer.grad_clipping >= 0, "--grad_clipping",
               "a finite number >= 0 (0 turns clipping off)", run.optimizer.grad_clipping);
  require_flag(run.optimizer.adam_beta1 >= 0 && run.optimizer.adam_beta1 < 1, "--adam_beta1", "a number in [0, 1)",
               run.optimizer.adam_beta1);
  require_flag(run.optimizer.adam_beta2 > 0 && run.optimizer.adam_beta2 < 1, "--adam_beta2", "a number in (0, 1)",
               run.optimizer.adam_beta2);
}

// The held-out evaluation; its token count must fit int64.
void check_evaluation_flags(const RunConfig& run, int world_size) {
  const int64_t sequences_per_micro_step = run.data.batch_size * world_size;
  require_flag(run.data.eval_fraction > 0 && run.data.eval_fraction < 1, "--eval_fraction",
               "a number in (0, 1)", run.data.eval_fraction);
  require_flag(run.data.eval_every >= 0, "--eval_every", "an integer >= 0 (0 = only at the end)",
               run.data.eval_every);
  // 0: not given (a given 0 on the command line is refused where it is parsed).
  require_flag(run.data.eval_batches >= 0, "--eval_batches", "an integer >= 1", run.data.eval_batches);
  require_flag(run.data.eval_sequences >= 0, "--eval_sequences", "an integer >= 1", run.data.eval_sequences);
  require_flag(run.data.eval_tokens >= 0, "--eval_tokens", "an integer >= 1", run.data.eval_tokens);
  std::vector<std::string> given;
  if (run.data.eval_sequences > 0) given.push_back("--eval_sequences");
  if (run.data.eval_tokens > 0) given.push_back("--eval_tokens");
  if (run.data.eval_batches > 0) given.push_back("--eval_batches");
  LLM_REQUIRE(given.size() <= 1, kCommandLine, given.empty() ? std::string() : given[0],
              "give one of --eval_sequences, --eval_tokens and --eval_batches, not " +
                  (given.size() > 1 ? given[0] + " and " + given[1] : std::string()) +
                  ": each sets how much an evaluation reads");
  // An evaluation counts its tokens, sequences * max_length (eval_batches: * batch_size * world
  // size first), in int64.
  require_flag(product(run.data.eval_batches, sequences_per_micro_step * run.data.max_length).has_value(),
               "--eval_batches",
               "at most " + std::to_string(kInt64Max / (sequences_per_micro_step * run.data.max_length)) +
                   " batches of " + std::to_string(sequences_per_micro_step * run.data.max_length) +
                   " tokens (an evaluation's token count is a 64-bit integer)",
               run.data.eval_batches);
  require_flag(product(run.data.eval_sequences, run.data.max_length).has_value(), "--eval_sequences",
               "at most " + std::to_string(kInt64Max / run.data.max_length) + " sequences of " +
                   std::to_string(run.data.max_length) + " tokens (an evaluation's token count is a 64-bit integer)",
               run.data.eval_sequences);
}

// How often to save and log, and where the run's files go.
void check_save_and_log_flags(const RunConfig& run) {
  require_flag(run.checkpoint.save_every >= 0, "--save_every", "an integer >= 0 (0 = only at the end)",
               run.checkpoint.save_every);
  require_flag(run.checkpoint.keep_last >= 0, "--keep_last", "an integer >= 0 (0 = keep all)",
               run.checkpoint.keep_last);
  require_flag(run.logging.log_every >= 1, "--log_every", "an integer >= 1", run.logging.log_every);
  require_flag(!run.logging.run_dir.empty(), "--run_dir", "a folder path", std::string("\"\""));
  require_flag(std::isfinite(run.logging.peak_tflops) && run.logging.peak_tflops >= 0, "--peak_tflops",
               "the device's dense peak in TFLOP/s (> 0), or 0 for the table of known GPUs / the measured CPU peak",
               run.logging.peak_tflops);
}

// The optimizer's name and its own flags (adam_eps filled in when not given); galore_adamw's rank
// against the model's widest projected matrix.
void resolve_optimizer(RunConfig& run, const ModelConfig& model) {
  if (const std::string reason = unknown_optimizer_reason(run.optimizer.name); !reason.empty())
    fail_user(kCommandLine, "--optimizer", reason);
  if (run.optimizer.adam_eps < 0) run.optimizer.adam_eps = run.optimizer.name == "adamw" ? 1e-8 : 1e-6;
  require_flag(std::isfinite(run.optimizer.adam_eps) && run.optimizer.adam_eps > 0, "--adam_eps",
               "a finite number > 0", run.optimizer.adam_eps);
  require_flag(is_choice(run.optimizer.subset_norm_params, kSubsetNormParamsChoices), "--subset_norm_params", "linear or all",
               "\"" + run.optimizer.subset_norm_params + "\"");
  require_flag(run.optimizer.galore_rank >= 1, "--rank", "an integer >= 1 (GaLore's projection rank)", run.optimizer.galore_rank);
  // The staggered schedule multiplies the gap by a parameter's index: int32 keeps that in range.
  require_flag(run.optimizer.update_proj_gap >= 1 && run.optimizer.update_proj_gap <= std::numeric_limits<int32_t>::max(),
               "--update_proj_gap", "an integer from 1 to 2147483647 (steps between projector updates)",
               run.optimizer.update_proj_gap);
  require_flag(std::isfinite(run.optimizer.galore_scale) && run.optimizer.galore_scale > 0, "--galore_scale",
               "a finite number > 0", run.optimizer.galore_scale);
  require_flag(is_choice(run.optimizer.galore_projector, kGaloreProjectorChoices), "--galore_projector",
               "svd or subspace", "\"" + run.optimizer.galore_projector + "\"");
  require_flag(run.optimizer.subspace_iterations >= 1 && run.optimizer.subspace_iterations <= kInt64Max / 3,
               "--subspace_iterations",
               "an integer from 1 to " + std::to_string(kInt64Max / 3) + " (the first refresh runs 3 times as many)",
               run.optimizer.subspace_iterations);
  require_flag(is_choice(run.optimizer.state_dtype, kOptimizerStateDtypeChoices), "--optimizer_state_dtype",
               "float32 or bfloat16", "\"" + run.optimizer.state_dtype + "\"");
  require_flag(is_choice(run.optimizer.proj_type, kProjTypeChoices), "--proj_type", "one of std, reverse_std, left, right",
               "\"" + run.optimizer.proj_type + "\"");
  if (run.optimizer.name == "galore_adamw") {
    // At or above the widest projected matrix's smaller dimension nothing is projected any more: every
    // matrix is kept whole, and GaLore's moments plus projector outgrow AdamW's moments.
    const GaloreWidestMatrix widest = galore_widest_matrix(model, run);
    if (!widest.name.empty() && run.optimizer.galore_rank >= widest.full_rank())
      fail_user(kCommandLine, "--rank",
                "expected an integer in [1, " + std::to_string(widest.full_rank() - 1) + "] for " + model.name +
                    " (got " + std::to_string(run.optimizer.galore_rank) + "): GaLore keeps a matrix at rank "
                    "min(--rank, rows, cols), and at " + std::to_string(widest.full_rank()) +
                    " or more every projected matrix is kept at full rank (the widest, " + widest.name + ", is " +
                    std::to_string(widest.rows) + " x " + std::to_string(widest.cols) +
                    "), where its moments and projector take more memory than AdamW's; pass --rank " +
                    std::to_string(widest.full_rank() - 1) + " or less (GaLore's runs use a quarter of "
                    "hidden_size, " + std::to_string(std::max<int64_t>(1, model.hidden_size / 4)) +
                    " here), or --optimizer adamw");
  }
}

// A folder this run creates (--run_dir, --tensorboard_dir) inside a checkpoint folder: in
// SAVE_DIR/step_<N> (or its .tmp), or in any step_<N> folder that holds a manifest.json (issue 44).
void refuse_folders_inside_checkpoints(const RunConfig& run) {
  for (const auto& [path, flag] : {std::pair{run.logging.run_dir, "--run_dir"}, {run.logging.tensorboard_dir, "--tensorboard_dir"}})
    if (!path.empty()) refuse_inside_checkpoint(path, flag, run.checkpoint.save_dir);
}

// --save_dir's companions and the folders of --save_dir, --continue_from and --init_from.
void check_checkpoint_flags(const RunConfig& run) {
  if (run.checkpoint.save_dir.empty() && run.checkpoint.save_every > 0)
    fail_user(kCommandLine, "--save_every",
              "saves a checkpoint every " + std::to_string(run.checkpoint.save_every) +
                  " steps, but there is no --save_dir to save them to: give --save_dir, or drop --save_every");
  if (run.checkpoint.save_dir.empty() && run.checkpoint.keep_last > 0)
    fail_user(kCommandLine, "--keep_last",
              "keeps the newest " + std::to_string(run.checkpoint.keep_last) +
                  " checkpoints, but there is no --save_dir holding any: give --save_dir, or drop --keep_last");
  if (run.checkpoint.async_save && run.checkpoint.save_dir.empty())
    fail_user(kCommandLine, "--async_save",
              "writes checkpoints in the background, but there is no --save_dir to write them to: give "
              "--save_dir, or drop --async_save");
  if (!run.checkpoint.save_dir.empty()) {
    // Checkpoints are folders under it: a file on the way would fail only at the first save.
    std::error_code error;
    fs::path existing = run.checkpoint.save_dir;
    while (!existing.empty() && !fs::exists(existing, error)) existing = existing.parent_path();
    if (!existing.empty() && !fs::is_directory(existing, error))
      fail_user(kCommandLine, "--save_dir",
                "expected a folder for the checkpoints (created when missing), but \"" + existing.string() +
                    "\" is a file (got \"" + run.checkpoint.save_dir + "\")");
  }
  if (!run.checkpoint.continue_from.empty() && !fs::is_directory(run.checkpoint.continue_from))
    fail_user(kCommandLine, "--continue_from",
              "expected an existing checkpoint folder (got \"" + run.checkpoint.continue_from + "\", which " +
                  (fs::exists(run.checkpoint.continue_from) ? "is not a folder" : "does not exist") + ")");
  if (!run.checkpoint.init_from.empty() && !run.checkpoint.continue_from.empty())
    fail_user(kCommandLine, "--init_from / --continue_from",
              "give one: --continue_from resumes a run of this trainer (its weights, optimizer state, step and data "
              "position), --init_from starts a new run from a transformers folder's weights (step 0, fresh "
              "optimizer state); after an --init_from run has saved, resume it with --continue_from alone");
  if (!run.checkpoint.init_from.empty() && !fs::is_directory(run.checkpoint.init_from))
    fail_user(kCommandLine, "--init_from",
              "expected a transformers save_pretrained folder (got \"" + run.checkpoint.init_from + "\", which " +
                  (fs::exists(run.checkpoint.init_from) ? "is not a folder" : "does not exist") + ")");
  refuse_folders_inside_checkpoints(run);
}

// --data: the synthetic corpus against the model's vocabulary, or token files that exist (data/token_corpus.h).
void check_data_source(const RunConfig& run, const ModelConfig& model) {
  require_flag(is_choice(run.data.window_start, kWindowStartChoices), "--window_start", "anywhere or document",
               "\"" + run.data.window_start + "\"");
  require_flag(run.data.memmap_dtype.empty() || is_choice(run.data.memmap_dtype, kMemmapDtypeChoices), "--memmap_dtype",
               "uint16 or uint32", "\"" + run.data.memmap_dtype + "\"");
  if (run.data.source == "synthetic" && model.vocab_size < SyntheticCorpusSpec{}.min_vocab_size())
    fail_user(run.config_path.empty() ? model.name : run.config_path, "vocab_size",
              "the synthetic corpus (--data synthetic, the default) needs a vocabulary of at least " +
                  std::to_string(SyntheticCorpusSpec{}.min_vocab_size()) + " tokens, since each token has " +
                  std::to_string(SyntheticCorpusSpec{}.branching) + " possible successors (got " +
                  std::to_string(model.vocab_size) + "): raise vocab_size in the config, or train on a token file "
                  "with --data FILE (made by `trainer prepare`)");
  std::vector<std::string> train_files;  // names an item that names nothing
  if (run.data.source != "synthetic") train_files = expand_data_spec(run.data.source);
  LLM_REQUIRE(run.data.window_start != "document" || run.data.source != "synthetic", kCommandLine, "--window_start",
              "document needs token files that record where documents start (Megatron datasets: `trainer prepare "
              "--format megatron` writes them); the synthetic corpus records none");
  if (!run.data.eval_source.empty()) {
    LLM_REQUIRE(run.data.eval_source != "synthetic", kCommandLine, "--eval_data",
                "the synthetic corpus has no held-out set of its own: leave --eval_data out (--eval_fraction holds "
                "out the last windows of --data)");
    // A file of --data in --eval_data: the eval loss would be measured on windows the run trains on,
    // and read as a held-out loss (issue 44). Refused, by the file itself however it is spelt.
    std::map<std::string, std::string> trained;
    for (const std::string& file : train_files) {
      std::error_code error;
      const fs::path canonical = fs::weakly_canonical(file, error);
      trained.emplace(error ? file : canonical.string(), file);
    }
    for (const std::string& file : expand_data_spec(run.data.eval_source, "--eval_data")) {
      std::error_code error;
      const fs::path canonical = fs::weakly_canonical(file, error);
      const auto found = trained.find(error ? file : canonical.string());
      if (found != trained.end())
        fail_user(kCommandLine, "--eval_data",
                  file + " is also a file of --data" + (found->second == file ? "" : " (as " + found->second + ")") +
                      ": its loss would be measured on windows the run trains on; give held-out token files, or "
                      "leave --eval_data out (--eval_fraction holds out the last windows of --data)");
    }
  }
}

}  // namespace

int64_t default_warmup_steps(int64_t num_training_steps) {
  return std::clamp<int64_t>(num_training_steps / 10, 0, 20);
}

void validate_run_config(RunConfig& run, const ModelConfig& model, int world_size) {
  if (world_size < 1)
    throw std::invalid_argument("validate_run_config: world_size must be >= 1, got " +
                                std::to_string(world_size));
  check_headline_flags(run, model);
  const int64_t tokens_per_step = resolve_batch_sizes(run, world_size);
  resolve_training_steps(run, tokens_per_step);
  resolve_recompute(run);
  check_compute_flags(run);
  check_memory_flags(run, model);
  check_safeguard_flags(run);
  resolve_schedule(run);
  check_evaluation_flags(run, world_size);
  check_save_and_log_flags(run);
  // "{run_dir}" at the start of --tensorboard_dir (the flag without a value) stands for --run_dir.
  if (run.logging.tensorboard_dir.rfind("{run_dir}", 0) == 0)
    run.logging.tensorboard_dir = run.logging.run_dir + run.logging.tensorboard_dir.substr(std::strlen("{run_dir}"));
  resolve_optimizer(run, model);
  // The device step runs each unit's step on its own (no collective over the host's communicator):
  // AdamW's is element-wise; AdamwSN's and GaLore's sum across ranks once the units are sharded.
  check_sharding_topology(run, world_size);
  if (run.sharding.offload_step == OffloadStep::device && run.optimizer.name != "adamw" &&
      shard_world(run, world_size) > 1)
    fail_user(kCommandLine, "--offload_step",
              "device steps each unit on its own, and " + run.optimizer.name + "'s step sums across the " +
                  std::to_string(shard_world(run, world_size)) + " ranks that shard it: use --optimizer adamw, "
                  "--sharding no_shard, or --offload_step host");
  if (model.tie_word_embeddings)
    fail_user(run.config_path, "tie_word_embeddings",
              "tied embeddings are not supported (the GaLore family is untied); set it to false");
  check_checkpoint_flags(run);
  check_data_source(run, model);
}

std::string unknown_optimizer_reason(const std::string& name) {
  if (name == "adamw" || name == "adamw_sn" || name == "galore_adamw") return "";
  // GaLore's and AdamW-SN's torchrun_main choices (case-insensitive there), with the nearest here.
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string nearest;
  if (lower == "adamw" || lower == "adamw_sn" || lower == "galore_adamw")
    nearest = "spell it in lower case, --optimizer " + lower;
  else if (lower == "galore_adamw8bit_per_layer")
    nearest = "GaLore's 8-bit GaLore-AdamW stepped per layer in backward is not built here (no 8-bit "
              "states); the nearest is --optimizer galore_adamw (32-bit states) with "
              "--fuse_optimizer_with_backward (each unit steps in backward, which needs --grad_clipping 0)";
  else if (lower == "galore_adamw8bit")
    nearest = "GaLore's 8-bit GaLore-AdamW is not built here (no 8-bit states); the nearest is "
              "--optimizer galore_adamw (32-bit states)";
  else if (lower == "adam")
    nearest = "GaLore's adam (torch.optim.Adam, L2 weight decay) is not built here; --optimizer adamw is "
              "the same update when --weight_decay is 0";
  else if (lower == "adam8bit")
    nearest = "GaLore's adam8bit (bitsandbytes' 8-bit Adam) is not built here; the nearest is --optimizer adamw";
  else if (lower == "rmsprop_sn")
    nearest = "AdamW-SN's RMSProp with subset-norm (no bias correction) is not built here; the nearest is "
              "--optimizer adamw_sn --adam_beta1 0 (RMSProp-SN, with Adam's bias correction of the "
              "second moment)";
  else if (lower == "adamw_snsm" || lower == "adagrad_snsm" || lower == "adagrad_sn")
    nearest = "AdamW-SN's " + lower + " (subspace momentum and/or AdaGrad accumulation) is not built here; "
              "the nearest is --optimizer adamw_sn";
  else if (lower == "sgd" || lower == "adagrad" || lower == "rmsprop" || lower == "adafactor" ||
           lower == "galore_adafactor")
    nearest = lower + " (a choice of GaLore's or AdamW-SN's torchrun_main) is not built here";
  return "expected one of adamw, adamw_sn, galore_adamw (got \"" + name + "\")" +
         (nearest.empty() ? std::string() : ": " + nearest);
}

}  // namespace llm
