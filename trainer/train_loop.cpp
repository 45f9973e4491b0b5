#include "trainer/train_loop.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "common/device.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/memory_stats.h"
#include "common/output_files.h"
#include "common/step_timer.h"
#include "offload/optimizer_offload.h"
#include "sharding/sharded_model.h"
#include "sharding/world.h"
#include "trainer/autocast.h"
#include "checkpoint/checkpoint.h"
#include "data/batches.h"
#include "data/synthetic.h"
#include "trainer/divergence.h"
#include "checkpoint/interchange/pretrained.h"
#include "memory/ledger.h"
#include "trainer/metrics.h"
#include "model/llama.h"
#include "config/optimizer_setup.h"
#include "trainer/preemption.h"
#include "trainer/schedule.h"
#include "checkpoint/train_state.h"
#include "common/watchdog.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kSyntheticCorpusSeed = 1234;  // the corpus is fixed; --seed varies init and order
constexpr int64_t kSnapshotSteps = 2;            // --memory_snapshot: history through these steps

struct Corpus {
  std::shared_ptr<TokenFile> tokens;
  double unigram_entropy = 0;
  double entropy_rate = 0;
};

Corpus open_corpus(const RunConfig& run, const ModelConfig& model, const RuntimeContext& context) {
  StallWatchdog::mark("start-up: opening the data");
  if (run.data.source != "synthetic") return {TokenFile::open(run.data.source, model.vocab_size)};
  SyntheticCorpusSpec spec;
  spec.vocab_size = model.vocab_size;
  spec.seed = kSyntheticCorpusSeed;
  SyntheticCorpus corpus = generate_synthetic_corpus(spec);
  // Every rank generates the same corpus; each writes its own copy, so no rank waits on a file.
  const std::string path =
      (fs::path(run.logging.run_dir) / ("synthetic.rank" + std::to_string(context.rank) + ".tok")).string();
  write_token_file(path, corpus.tokens, model.vocab_size);
  log::info("synthetic corpus: {} tokens, unigram entropy {:.3f} nats, entropy floor {:.3f} nats",
            corpus.tokens.size(), corpus.unigram_entropy_nats, corpus.entropy_rate_nats);
  return {TokenFile::open(path, model.vocab_size), corpus.unigram_entropy_nats,
          corpus.entropy_rate_nats};
}

// On a GPU the batch goes through page-locked memory and its copy is queued without waiting (a
// pageable copy makes the host wait for the GPU); the caching host allocator keeps the page-locked
// block until the copy has read it.
Batch to_device(Batch batch, c10::Device device) {
  if (!device.is_cuda()) return {batch.input_ids.to(device), batch.labels.to(device)};
  return {batch.input_ids.pin_memory().to(device, /*non_blocking=*/true),
          batch.labels.pin_memory().to(device, /*non_blocking=*/true)};
}

// The mean over ranks of a value each rank holds on its device as a double (a loss summed over
// micro-batches in double, as the host would), read on the host once: the step's one read of it.
double average_over_ranks(const at::Tensor& value, Communicator& communicator) {
  at::Tensor tensor = value.reshape({1});
  if (communicator.world_size() > 1) {
    tensor = tensor.to(at::kFloat);
    communicator.all_reduce(tensor, ReduceOp::average);
  }
  return read_to_host(tensor);
}

// Global L2 norm over every rank's gradient shard. no_shard ranks each hold the whole gradient: no
// reduction then. Each unit's squared norm (a dot product of its flat shard with itself: one pass, no
// temporary) was taken as the shard was reduced (ShardedUnit::gradient_squares), so with offload the
// shard may be gone to host memory already; the sum runs in unit order, as one pass over the shards
// at the end of the step would.
double global_gradient_norm(ShardedModel& model, Communicator& communicator) {
  at::Tensor squares = at::zeros({1}, model.unit(0).gradient_squares().options());
  for (size_t u = 0; u < model.unit_count(); ++u) squares += model.unit(u).gradient_squares();
  if (model.options().strategy != ShardingStrategy::no_shard) communicator.all_reduce(squares, ReduceOp::sum);
  return std::sqrt(read_to_host(squares));
}

// What the gradients are multiplied by to clip them to max_norm (torch's clip_grad_norm_ rule); 1
// when they are within it or clipping is off.
double clip_coefficient(double norm, double max_norm) {
  if (max_norm > 0 && std::isfinite(norm)) {
    const double coefficient = max_norm / (norm + 1e-6);
    if (coefficient < 1.0) return coefficient;
  }
  return 1.0;
}

// Before anything is written: --memory_snapshot on a CPU rank is a UserError, and the run folder exists.
bool prepare_run(const RunConfig& run, c10::Device device) {
  if (run.logging.memory_snapshot) start_device_memory_history(device, 100000);
  fs::create_directories(run.logging.run_dir);
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

// The run id every rank records: the resumed checkpoint's, else the one rank 0 draws.
std::string agree_on_run_id(const std::string& resumed) {
  return resumed.empty() ? all_gather_text(new_run_id()).front() : resumed;
}

// LLM_DEBUG_NO_RESIDENT_UNITS=1: a unit that is its own whole shard (one rank, no_shard) still
// gathers, prefetches and reduces like a sharded one, so one rank on one GPU runs those paths. The
// results are the same bits; only the work and the memory differ (docs/gpu.md).
bool resident_units_allowed() {
  const char* knob = std::getenv("LLM_DEBUG_NO_RESIDENT_UNITS");
  return knob == nullptr || std::string(knob) != "1";
}

// Every rank builds the same initial weights from the seed.
const ModelConfig& seeded(const ModelConfig& config, uint64_t seed) {
  at::manual_seed(seed);
  return config;
}

// One optimizer step's outcome, for the step line and metrics.jsonl.
struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0;
  PhaseSeconds phase_seconds{};
  int64_t host_reads = 0;  // reads of device values the step made (common/device.h)
};

// Everything one rank's training holds. The constructor is the set-up, in the order the memory
// ledger needs (the ledger first: the window up to the first step is the start-up peak), then the
// data, the sharded model (each unit initialised and sharded as it is built), the optimizer and a
// resumed state; train_step() is one optimizer step; the rest (evaluation, checkpoints, accounting)
// sits beside it.
class Training {
 public:
  Training(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context);
  TrainingOutcome run();

 private:
  StepResult train_step(int64_t step);
  double evaluate(int64_t* tokens);
  std::string save(int64_t step);  // the step's checkpoint folder
  // --async_save: the step's save on a background thread (from host copies of the state), and its
  // completion at a later step boundary that every rank agrees on.
  void start_background_save(int64_t step);
  void finish_background_save();
  struct Checkpoint {
    std::string folder;
    std::vector<StatePiece> pieces;  // views of this rank's buffers
    nlohmann::json manifest;
  };
  Checkpoint checkpoint_of(int64_t step);
  std::vector<StatePiece> master_pieces(size_t unit) const;
  // A save of step `step` completed at the end of step `completed_at`, having held the training loop
  // up `blocked_seconds` in all: a "checkpoint" record, the log line and --keep_last (rank 0).
  void saved(const std::string& folder, int64_t step, int64_t completed_at, double blocked_seconds);
  void resume(const std::string& folder);
  void shard_when_built(const UnitSpec& unit, NamedTensors parameters);
  MemoryCategories owned_now() const;
  void record_start();
  void record_sharded_bytes();
  void finish_memory_ledger(int64_t steps_run);
  nlohmann::json gather_schedule_record() const;

  const ModelConfig& model_config_;
  const RunConfig& run_;
  const RuntimeContext& context_;
  const c10::Device device_;
  Communicator& communicator_;
  Communicator& host_communicator_;  // host tensors: offload's collectives, the preemption agreement
  const bool autocast_;  // bf16 mixed: fp32 parameters, bf16 autocast in the forward
  const bool prepared_;
  MetricsLog metrics_;
  MemoryLedger ledger_;
  Corpus corpus_;
  BatchSampler train_batches_, eval_batches_;
  StepTimer timer_;
  ShardedModel sharded_;
  int64_t startup_peak_bytes_ = 0, largest_unit_bytes_ = 0;  // parameter storage while building
  int64_t init_from_bytes_ = 0;  // --init_from: bytes of the folder this rank read (its rows)
  UnitContext unit_context_;
  LlamaForCausalLM model_;
  // --offload optimizer: the optimizer over host masters, stepped by offload_; otherwise over the
  // units' own shards. Declared after sharded_: destroyed (its worker stopped) before it.
  std::unique_ptr<OptimizerOffload> offload_;
  std::unique_ptr<ShardOptimizer> device_optimizer_;
  ShardOptimizer& optimizer() const { return offload_ ? offload_->optimizer() : *device_optimizer_; }
  TrainState state_;
  // --collective_timeout: the one main() runs from start-up (context.watchdog), or one of our own
  // from the first step when there is none (in-process tests).
  StallWatchdog* watchdog_ = nullptr;
  std::unique_ptr<StallWatchdog> own_watchdog_;
  at::Tensor save_copy_;  // --async_save: the host copy of this rank's checkpoint, kept from the first save
  std::unique_ptr<BackgroundSave> background_save_;  // --async_save: the save in flight, if any
  int64_t background_save_step_ = 0;
  double background_save_blocked_ = 0;  // seconds the loop spent starting it
  int64_t current_step_ = 0;
  std::string run_id_;              // drawn at a fresh start, kept on resume (manifest.json)
  std::string resumed_from_;        // the checkpoint folder resumed from; "" for a fresh run
  int64_t start_step_ = 0;
  int64_t live_batch_bytes_ = 0;
  DivergenceWatch divergence_;
  // --fuse_optimizer_with_backward: each unit steps at its gradient_shard_ready, at this step's lr.
  void fused_step(size_t unit);
  double fused_lr_ = 0;
  double lr_at(int64_t step) const;  // the schedule's lr of update `step`
  // What to change when a run stops for a NaN or divergence: the flags and their values now (not
  // --grad_clipping with the fused step, which refuses it).
  std::string what_to_change() const;
  // A run file could not be written on some rank (--on_write_error stop; the ranks agreed at step
  // `step`'s end): ends every rank with exit 2, the failing one naming the file. `saved`: the last
  // checkpoint written for it ("" when none), `save_problem` why not.
  [[noreturn]] void stop_for_write_failure(int64_t step, const std::string& saved, const std::string& save_problem);
  std::string non_finite_gradients() const;  // the units whose squared gradient norm is not finite
};

Training::Training(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context)
    : model_config_(model_config),
      run_(run),
      context_(context),
      device_(context.device),
      communicator_(*context.communicator),
      host_communicator_(context.host_communicator ? *context.host_communicator : *context.communicator),
      autocast_(run.precision.dtype == DType::bfloat16 && run.precision.mode == Precision::mixed),
      prepared_(prepare_run(run, device_)),
      // A resumed run appends to the run's history (a fresh one starts it).
      metrics_((fs::path(run.logging.run_dir) / "metrics.jsonl").string(), context.rank == 0, context.world_size == 1,
               !run.checkpoint.continue_from.empty()),
      ledger_(run.logging.run_dir, context.rank, context.world_size, device_,
              {{"model", model_config.name}, {"optimizer", run.optimizer.name}, {"dtype", to_string(run.precision.dtype)},
               {"precision", to_string(run.precision.mode)}, {"sharding", to_string(run.sharding.strategy)}},
              !run.checkpoint.continue_from.empty()),
      corpus_(open_corpus(run, model_config, context)),
      train_batches_(corpus_.tokens, Split::train, run.data.max_length, run.data.eval_fraction, run.seed, context.rank,
                     context.world_size, run.data.batch_size),
      eval_batches_(corpus_.tokens, Split::eval, run.data.max_length, run.data.eval_fraction, run.seed, context.rank,
                    context.world_size, run.data.batch_size),
      timer_(device_),
      sharded_(communicator_,
               {run.sharding.strategy, run.sharding.prefetch,
                run.precision.dtype == DType::bfloat16 && run.precision.mode == Precision::pure ? at::kBFloat16 : at::kFloat,
                resident_units_allowed()}),
      model_(seeded(model_config, run.seed),
             [this](const UnitSpec& unit, NamedTensors parameters) { shard_when_built(unit, std::move(parameters)); }),
      divergence_(run.divergence_patience, run.optimizer.warmup_steps.value(), model_config.vocab_size) {
  for (size_t u = 0; u < sharded_.unit_count(); ++u)
    sharded_.set_forward(u, [this, u](const at::Tensor& input) {
      return model_->forward_unit(u, input, unit_context_);
    });
  sharded_.set_timer(&timer_);
  if (run.activation_checkpointing_every > 0) {
    // The recompute runs under the forward's autocast (bf16 mixed).
    sharded_.set_recomputed_units(recomputed_units(describe_units(model_config), run.activation_checkpointing_every));
    sharded_.set_recompute_scope([this](const std::function<void()>& recompute) {
      AutocastRegion region(device_.type(), at::kBFloat16, autocast_);
      recompute();
    });
  }
  sharded_.add_listener([this](UnitEvent event, size_t u, Pass pass) {
    if (watchdog_)
      watchdog_->progress(current_step_,
                          event == UnitEvent::after_backward || event == UnitEvent::gradient_shard_ready ? "backward"
                          : pass == Pass::train                                                          ? "forward"
                                                                                                          : "eval",
                          static_cast<int>(u));
    if (offload_ && event == UnitEvent::before_shard_read) offload_->wait_unit(u);
    if (offload_ && event == UnitEvent::gradient_shard_ready) offload_->gradient_ready(u);
    if (run_.fuse_optimizer_with_backward && event == UnitEvent::gradient_shard_ready) fused_step(u);
    if (event == UnitEvent::after_forward)
      ledger_.point(pass == Pass::train ? "forward" : "eval", sharded_.unit(u).name(), owned_now());
    else if (event == UnitEvent::after_backward)
      ledger_.point("backward", sharded_.unit(u).name(), owned_now());
  });
  const bool sharded_across_ranks = context.world_size > 1 && run.sharding.strategy != ShardingStrategy::no_shard;
  // The optimizer's collectives go over the communicator of the device its state is on: the host's
  // with offload (NCCL cannot carry host tensors).
  if (run.sharding.offload == Offload::optimizer)
    offload_ = std::make_unique<OptimizerOffload>(sharded_, optimizer_settings(run), unit_update_rules(sharded_, run),
                                                  sharded_across_ranks ? &host_communicator_ : nullptr);
  else
    device_optimizer_ = build_optimizer(run, sharded_, sharded_across_ranks ? &communicator_ : nullptr);
  if (run.fuse_optimizer_with_backward)
    for (size_t u = 0; u < sharded_.unit_count(); ++u) {
      // A unit's gradient shard lives from its reduction to its step (fused_step), as with offload.
      sharded_.unit(u).make_gradient_transient();
      device_optimizer_->set_unit_gradient(u, at::Tensor());
    }
  state_.seed = run.seed;
  if (!run.checkpoint.continue_from.empty())
    resume(context.resume_folder.empty() ? resolve_checkpoint_folder(run.checkpoint.continue_from) : context.resume_folder);
  run_id_ = agree_on_run_id(run_id_);
  start_step_ = state_.step;
  record_start();
}

// Each unit is initialised, moved to the device and sharded as soon as it is built, before the next
// one is allocated: no rank ever holds the whole unsharded model (no_shard aside, by design).
void Training::shard_when_built(const UnitSpec& unit, NamedTensors parameters) {
  StallWatchdog::mark("start-up: building the model");
  int64_t unit_bytes = 0;
  {
    at::NoGradGuard no_grad;
    for (auto& [name, parameter] : parameters) {
      parameter.set_data(parameter.to(device_));
      unit_bytes += static_cast<int64_t>(parameter.storage().nbytes());
    }
  }
  init_unit_weights(unit, parameters, model_config_.initializer_range, run_.seed);
  if (context_.init_from != nullptr)  // this rank's rows replace the seeded init (the rest is dropped at sharding)
    init_from_bytes_ += context_.init_from->load_rows(unit, parameters, sharded_.layout_for(unit.name, parameters));
  int64_t held = unit_bytes;
  for (size_t u = 0; u < sharded_.unit_count(); ++u) held += sharded_.unit(u).compute_parameter_bytes();
  startup_peak_bytes_ = std::max(startup_peak_bytes_, held);
  largest_unit_bytes_ = std::max(largest_unit_bytes_, unit_bytes);
  sharded_.add_unit(unit.name, std::move(parameters));
}

// One optimizer step: each micro-batch's forward and backward (the last one reduces every unit's
// gradients into its shard as its backward ends), the loss averaged over ranks, global-norm clipping,
// the optimizer unit by unit, and the compute shards refreshed from the masters.
// With --fuse_optimizer_with_backward a unit's step runs as soon as its gradient shard is reduced
// (gradient_shard_ready, in the last micro-batch's backward), at the step's lr, and its shard is freed
// right after; clipping is off (validated), so nothing waits for the global norm. A non-finite loss
// stops the run before the last backward (one host read); a non-finite gradient is found by the
// step's one finiteness check, after the units stepped: the run stops naming those units, and nothing
// of the step is saved (a read per unit would drain the GPU once per unit).
double Training::lr_at(int64_t step) const {
  return run_.optimizer.lr * lr_multiplier(run_.optimizer.scheduler, step, run_.optimizer.warmup_steps.value(),
                                           run_.num_training_steps, run_.optimizer.min_lr_ratio);
}

std::string Training::what_to_change() const {
  std::ostringstream out;
  out << "Lower --lr (now " << run_.optimizer.lr << "), ";
  if (!run_.fuse_optimizer_with_backward)
    out << "set --grad_clipping (now " << run_.optimizer.grad_clipping << (run_.optimizer.grad_clipping > 0 ? "" : ", e.g. 1.0")
        << "), ";
  out << "raise --warmup_steps (now " << run_.optimizer.warmup_steps.value() << "), or use --dtype float32";
  return out.str();
}

std::string Training::non_finite_gradients() const {
  std::string names;
  for (size_t u = 0; u < sharded_.unit_count(); ++u)
    if (!std::isfinite(sharded_.unit(u).gradient_squares().item<double>()))
      names += (names.empty() ? "" : ", ") + sharded_.unit(u).name();
  return names.empty() ? "no unit of this rank" : names;
}

void Training::fused_step(size_t unit) {
  ShardedUnit& sharded = sharded_.unit(unit);
  StepTimer::Scope timed(&timer_, StepPhase::optimizer);
  sharded.wait_reduced();  // the step reads the shard on the compute stream
  device_optimizer_->set_unit_gradient(unit, sharded.gradient_shard());
  device_optimizer_->step_unit(unit, fused_lr_);
  device_optimizer_->set_unit_gradient(unit, at::Tensor());
  sharded.publish_shard();
  sharded.take_gradient_shard();  // the last reference: the shard is freed here
}

StepResult Training::train_step(int64_t step) {
  timer_.begin_step();
  ledger_.begin_step(step);
  const bool fused = run_.fuse_optimizer_with_backward;
  if (fused) {
    fused_lr_ = lr_at(step);
    device_optimizer_->begin_step();
  }
  const int64_t reads_before = host_reads();
  // The micro-batches' losses, summed on the device in double (what the host's sum of their values
  // gave): read once, at the end of the step.
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (int64_t micro = 0; micro < run_.data.gradient_accumulation; ++micro) {
    Batch batch = to_device(train_batches_.next(), device_);
    ledger_.set_micro_batch(micro);
    live_batch_bytes_ = static_cast<int64_t>(batch.input_ids.nbytes() + batch.labels.nbytes());
    Activations boundaries;
    {
      AutocastRegion region(device_.type(), at::kBFloat16, autocast_);
      boundaries = sharded_.forward(batch.input_ids, Pass::train);
    }
    at::Tensor loss;
    {
      StepTimer::Scope timed(&timer_, StepPhase::forward);
      loss = causal_lm_loss(boundaries.back().output, batch.labels);
      loss_sum += loss.detach().to(at::kDouble);
    }
    const bool last = micro + 1 == run_.data.gradient_accumulation;
    const double checked_sum = fused && last ? read_to_host(loss_sum) : 0.0;
    if (!std::isfinite(checked_sum)) {
      std::ostringstream message;
      message << "step " << step << ": the loss is " << checked_sum / static_cast<double>(run_.data.gradient_accumulation)
              << " on this rank; training stopped before the fused backward updated anything. " << what_to_change();
      throw TrainingError(message.str());
    }
    sharded_.backward(boundaries, loss / static_cast<double>(run_.data.gradient_accumulation), /*reduce=*/last);
  }
  live_batch_bytes_ = 0;

  StepResult result;
  {
    StepTimer::Scope timed(&timer_, StepPhase::collectives);
    result.loss = average_over_ranks(loss_sum / static_cast<double>(run_.data.gradient_accumulation), communicator_);
  }
  {
    StepTimer::Scope timed(&timer_, StepPhase::optimizer);
    result.grad_norm = global_gradient_norm(sharded_, communicator_);
    if (!std::isfinite(result.loss) || !std::isfinite(result.grad_norm)) {
      std::ostringstream message;
      message << "step " << step << ": the loss is " << result.loss << " and the gradient norm " << result.grad_norm;
      if (fused)  // only now, on the way out: the units whose gradient is not finite
        message << "; the gradient is not finite in " << non_finite_gradients()
                << " (--fuse_optimizer_with_backward updated the units in this backward; nothing of this step is saved). ";
      else
        message << "; training stopped before the weights were corrupted. "
                << describe_weights_at_divergence(  // names a non-finite (or out-of-range) weight tensor
                       sharded_, [this](size_t u) { return offload_ ? offload_->master(u) : sharded_.unit(u).master_shard(); },
                       communicator_, step == start_step_ + 1);
      message << what_to_change();
      throw TrainingError(message.str());
    }
    if (const std::optional<std::string> reason = divergence_.observe(step, result.loss, result.grad_norm)) {
      // Before this step's update (the fused step made it in backward) and any checkpoint of it.
      std::ostringstream message;
      message << "step " << step << ": training has diverged: " << *reason << ". "
              << (fused ? "This step's update, made in backward by --fuse_optimizer_with_backward, is not saved. "
                        : "Stopped before this step's update. ")
              << what_to_change() << "; --divergence_patience 0 turns this check off";
      throw TrainingError(message.str());
    }
    result.lr = lr_at(step);
    const double scale = clip_coefficient(result.grad_norm, run_.optimizer.grad_clipping);
    if (fused) {
      // Every unit stepped in backward (fused_step), at this lr; scale is 1 (no clipping).
    } else if (offload_) {
      offload_->step(result.lr, scale);  // each unit's host step; the next forward waits per unit
    } else {
      if (scale != 1.0)
        for (size_t u = 0; u < sharded_.unit_count(); ++u) sharded_.unit(u).gradient_shard().mul_(scale);
      device_optimizer_->begin_step();
      for (const UnitAction& action : sharded_.plan().optimizer_pass())
        device_optimizer_->step_unit(action.unit, result.lr);
      sharded_.publish_shards();
    }
  }
  ledger_.point("optimizer", "", owned_now());
  state_.step = step;
  state_.samples_consumed = train_batches_.samples_consumed();
  state_.tokens_seen += run_.data.total_batch_size * run_.data.max_length;
  result.phase_seconds = timer_.end_step();
  result.host_reads = host_reads() - reads_before;
  return result;
}

TrainingOutcome Training::run() {
  TrainingOutcome outcome{start_step_, 0, 0, corpus_.unigram_entropy, corpus_.entropy_rate, 0, {}};
  const int64_t tokens_per_step = run_.data.total_batch_size * run_.data.max_length;
  // One process has no collective to wait in: a long step there is only slow, not a stall.
  const bool watched = context_.world_size > 1 && run_.collective_timeout > 0;
  watchdog_ = context_.watchdog;
  if (watchdog_ == nullptr) {
    own_watchdog_ = std::make_unique<StallWatchdog>(run_.logging.run_dir, context_.rank, context_.world_size,
                                                    watched ? run_.collective_timeout : 0.0,
                                                    // every rank's host: another node's heartbeats may be unreadable here
                                                    watched ? all_gather_text(process_identity().host)
                                                            : std::vector<std::string>());
    watchdog_ = own_watchdog_.get();
  }
  // A preemption signal during start-up (the handlers are in from main()'s first line): stop before
  // the first step, which with its save might not fit in what is left of the grace period.
  if (const int signal = preemption_agreed(host_communicator_); signal != 0) {
    outcome.preempted_by = signal;
    outcome.preempted_before_first_step = true;
    metrics_.write({{"event", "preempted"}, {"step", start_step_}, {"signal", signal_name(signal)},
                    {"checkpoint", nlohmann::json()}, {"before_first_step", true}});
    return outcome;
  }
  // A run file that cannot be written stops every rank together at a step's end, after a last save
  // (common/output_files.h); not one rank alone mid-step.
  defer_write_failures(true);
  for (int64_t step = start_step_ + 1; step <= run_.num_training_steps; ++step) {
    current_step_ = step;
    watchdog_->progress(step, "step start");
    const auto started = std::chrono::steady_clock::now();
    const StepResult result = train_step(step);
    if (step == start_step_ + 1) record_sharded_bytes();
    const double seconds = seconds_since(started);
    outcome.steps = step;
    outcome.final_loss = result.loss;
    const bool last = step == run_.num_training_steps;
    if (step % run_.logging.log_every == 0 || last) {
      StepRecord record{step, run_.num_training_steps, result.loss, result.lr, result.grad_norm,
                        static_cast<double>(tokens_per_step) / seconds, seconds, state_.tokens_seen,
                        ledger_.step_line_peak_bytes(), optimizer().last_projector_seconds(), result.phase_seconds,
                        result.host_reads, timer_.host_seconds()};
      if (offload_) {
        const OffloadTimes times = offload_->take_times();
        record.offloaded = true;
        record.offload_host_step_seconds = times.host_step_seconds;
        record.offload_wait_seconds = times.wait_seconds;
      }
      metrics_.log_step(record);
    }
    if ((run_.data.eval_every > 0 && step % run_.data.eval_every == 0) || last) {
      int64_t eval_tokens = 0;
      outcome.final_eval_loss = evaluate(&eval_tokens);
      ledger_.point("eval", "", owned_now());
      metrics_.log_eval(step, outcome.final_eval_loss, eval_tokens);
    }
    // Preemption (trainer/preemption.h): the ranks agree on a signal any of them received, and all
    // stop after this step, saving it when there is a --save_dir. At the last step the run ends anyway.
    // An asynchronous save completes at the first boundary where every rank has written its files
    // (the same all-reduce says so), or before the next save, a preemption or the end.
    watchdog_->progress(step, "step end");
    bool written = background_save_ == nullptr || background_save_->written();
    bool write_failed = write_failure_pending();
    const int signal = preemption_agreed(host_communicator_, background_save_ ? &written : nullptr, &write_failed);
    if (!last) outcome.preempted_by = signal;  // at the last step the run ends anyway: only the write failures count
    const bool periodic_save = run_.checkpoint.save_every > 0 && step % run_.checkpoint.save_every == 0;
    const bool save_now =
        !run_.checkpoint.save_dir.empty() && (periodic_save || last || outcome.preempted_by != 0 || write_failed);
    if (background_save_ && (written || save_now)) {  // save_now covers the last step and a preemption
      watchdog_->progress(step, "checkpoint");
      finish_background_save();
    }
    if (save_now) {
      watchdog_->progress(step, "checkpoint");
      // The last step's save, a preemption's and a write failure's are waited for: nothing comes after them.
      if (run_.checkpoint.async_save && !last && outcome.preempted_by == 0 && !write_failed) {
        start_background_save(step);
      } else if (write_failed) {
        std::string folder, problem;
        try {
          folder = save(step);
        } catch (const UserError& error) {  // the same disk, full as well: the message says both
          problem = error.what();
        }
        stop_for_write_failure(step, folder, problem);
      } else {
        const std::string folder = save(step);
        if (outcome.preempted_by != 0) outcome.preemption_checkpoint = folder;
      }
      watchdog_->progress(step, "checkpoint");
      ledger_.point("checkpoint", "", owned_now());
    }
    ledger_.end_step();
    // Once: after the second step (or the last, if fewer). Recording stops there, so a later
    // snapshot would replace this one with one whose history is gone.
    if (run_.logging.memory_snapshot && step == std::min(start_step_ + kSnapshotSteps, run_.num_training_steps)) {
      write_device_memory_snapshot(
          device_, (fs::path(run_.logging.run_dir) / ("memory_snapshot.rank" + std::to_string(context_.rank) + ".pickle")).string());
      stop_device_memory_history(device_);
    }
    if (write_failed) stop_for_write_failure(step, "", "");  // no --save_dir
    if (outcome.preempted_by != 0) break;
  }
  defer_write_failures(false);
  if (offload_) offload_->wait_all();  // the masters hold the last step before anything reads them
  watchdog_->progress(outcome.steps, "finish");
  finish_memory_ledger(outcome.steps - start_step_);
  metrics_.write(gather_schedule_record());
  if (outcome.preempted_by != 0)
    metrics_.write({{"event", "preempted"}, {"step", outcome.steps}, {"signal", signal_name(outcome.preempted_by)},
                    {"checkpoint", outcome.preemption_checkpoint.empty() ? nlohmann::json()
                                                                          : nlohmann::json(outcome.preemption_checkpoint)}});
  else
    metrics_.write({{"event", "end"}, {"steps", outcome.steps}, {"final_loss", outcome.final_loss},
                    {"final_eval_loss", outcome.final_eval_loss}, {"peak_memory_bytes", ledger_.step_line_peak_bytes()}});
  own_watchdog_.reset();  // training ended: its heartbeat file goes (main's goes when main ends)
  watchdog_ = nullptr;
  return outcome;
}

double Training::evaluate(int64_t* tokens) {
  at::NoGradGuard no_grad;
  eval_batches_.seek(0);
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (int64_t i = 0; i < run_.data.eval_batches; ++i) {
    Batch batch = to_device(eval_batches_.next(), device_);
    Activations boundaries;
    {
      AutocastRegion region(device_.type(), at::kBFloat16, autocast_);
      boundaries = sharded_.forward(batch.input_ids, Pass::eval);
    }
    sum += causal_lm_loss(boundaries.back().output, batch.labels).to(at::kDouble);
    *tokens += batch.labels.numel() * communicator_.world_size();
  }
  sharded_.release_all();
  return average_over_ranks(sum / static_cast<double>(run_.data.eval_batches), communicator_);
}

// Sharded checkpoints (checkpoint/checkpoint.h): every rank writes its own master rows and optimizer
// state, views of its buffers (the offloaded ones in host memory); nothing is gathered. Under
// no_shard every rank holds the same whole state, and rank 0 alone writes it.
// Unit u's master rows as parts of the full parameters: each parameter's real rows (padding rows
// are not saved), a view of the master shard (the host master with offload).
std::vector<StatePiece> Training::master_pieces(size_t u) const {
  const at::Tensor master = offload_ ? offload_->master(u) : sharded_.unit(u).master_shard();
  std::vector<StatePiece> pieces;
  for (const ShardedParameter& p : sharded_.unit(u).layout().parameters)
    if (p.rows_held > 0)
      pieces.push_back({p.name, p.full_shape, p.first_row * p.cols, master.narrow(0, p.shard_offset, p.rows_held * p.cols)});
  return pieces;
}

Training::Checkpoint Training::checkpoint_of(int64_t step) {
  if (offload_) offload_->wait_all();
  Checkpoint checkpoint;
  if (context_.rank == 0 || run_.sharding.strategy != ShardingStrategy::no_shard) {
    for (size_t u = 0; u < sharded_.unit_count(); ++u)
      for (StatePiece& piece : master_pieces(u)) checkpoint.pieces.push_back(std::move(piece));
    for (StatePiece& piece : optimizer().state_pieces()) checkpoint.pieces.push_back(std::move(piece));
  }
  checkpoint.manifest = state_.to_json();
  checkpoint.manifest["run_id"] = run_id_;
  checkpoint.manifest["world_size"] = context_.world_size;
  checkpoint.manifest["optimizer"] = run_.optimizer.name;
  checkpoint.manifest["optimizer_step"] = optimizer().steps_taken();
  checkpoint.manifest["model"] = model_config_.to_json();
  checkpoint.manifest["run"] = run_.to_json();  // the settings that wrote it, for the record
  // `trainer export` looks for the tokenizer `trainer prepare` trained beside the token file.
  checkpoint.manifest["data"] =
      run_.data.source == "synthetic" ? run_.data.source : fs::absolute(run_.data.source).string();
  checkpoint.folder = (fs::path(run_.checkpoint.save_dir) / ("step_" + std::to_string(step))).string();
  return checkpoint;
}

void Training::stop_for_write_failure(int64_t step, const std::string& saved, const std::string& save_problem) {
  defer_write_failures(false);
  const std::string& save_dir = run_.checkpoint.save_dir;
  const std::string checkpoint =
      !saved.empty()    ? "step " + std::to_string(step) + " is saved in " + saved + ": once the disk has room, resume "
                                                                                   "with the same flags and --continue_from " + save_dir
      : save_dir.empty() ? "nothing was saved (no --save_dir)"
                         : "the last checkpoint could not be written either (" + save_problem + ")";
  const std::string hint = " (--on_write_error warn trains on without the file)";
  if (const std::unique_ptr<WriteError> mine = take_pending_write_failure())
    throw UserError(std::string(mine->what()) + "; stopped after step " + std::to_string(step) + "; " + checkpoint + hint);
  fail_after_another_rank("another rank could not write a run file (its message names it); stopped after step " +
                          std::to_string(step) + "; " + checkpoint + hint);
}

std::string Training::save(int64_t step) {
  const auto started = std::chrono::steady_clock::now();
  Checkpoint checkpoint = checkpoint_of(step);
  save_checkpoint(checkpoint.folder, checkpoint.pieces, std::move(checkpoint.manifest), communicator_);
  saved(checkpoint.folder, step, step, seconds_since(started));
  return checkpoint.folder;
}

void Training::saved(const std::string& folder, int64_t step, int64_t completed_at, double blocked_seconds) {
  metrics_.write({{"event", "checkpoint"}, {"step", step}, {"folder", folder}, {"completed_at_step", completed_at},
                  {"background", completed_at != step}, {"blocked_s", blocked_seconds}});
  if (context_.rank != 0) return;
  if (completed_at == step)
    log::info("saved checkpoint {}", folder);
  else
    log::info("saved checkpoint {} (written in the background during steps {}-{})", folder, step + 1, completed_at);
  for (const std::string& removed : remove_old_checkpoints(folder, run_id_, run_.checkpoint.keep_last))
    log::info("removed checkpoint {} (--keep_last {})", removed, run_.checkpoint.keep_last);
}

// The pieces are copied to host memory first, so the steps that follow cannot change what is written:
// into one flat buffer made at the first save and kept (a save completes before the next starts),
// page-locked on a GPU for the copy's speed, at its exact size (common/memory_stats.h). A rank that
// cannot make its copy (out of host memory) fails the save on every rank at its first collective.
void Training::start_background_save(int64_t step) {
  const auto started = std::chrono::steady_clock::now();
  Checkpoint checkpoint = checkpoint_of(step);
  int64_t elements = 0;
  for (const StatePiece& piece : checkpoint.pieces) elements += piece.values.numel();
  std::exception_ptr failure;
  try {
    at::NoGradGuard no_grad;
    if (!save_copy_.defined() || save_copy_.numel() < elements) {
      save_copy_ = at::Tensor();  // the smaller one goes first
      save_copy_ = exact_host_buffer(elements, at::kFloat, offload_ ? c10::Device(c10::kCPU) : device_);
    }
    int64_t offset = 0;
    for (StatePiece& piece : checkpoint.pieces) {
      at::Tensor copy = save_copy_.narrow(0, offset, piece.values.numel()).view(piece.values.sizes());
      copy.copy_(piece.values);
      piece.values = std::move(copy);
      offset += piece.values.numel();
    }
  } catch (...) {
    failure = std::current_exception();
    checkpoint.pieces.clear();
  }
  background_save_ = std::make_unique<BackgroundSave>(checkpoint.folder, std::move(checkpoint.pieces),
                                                      std::move(checkpoint.manifest), communicator_, failure);
  background_save_step_ = step;
  background_save_blocked_ = seconds_since(started);
  log::info("saving checkpoint {} in the background (a host copy of {} on this rank)", checkpoint.folder,
            human_bytes(elements * 4));
}

void Training::finish_background_save() {
  const auto started = std::chrono::steady_clock::now();
  background_save_->commit();
  const std::string folder = background_save_->folder();
  background_save_.reset();
  saved(folder, background_save_step_, current_step_, background_save_blocked_ + seconds_since(started));
}

// A checkpoint of any world size: each rank reads its own rows of every parameter and its part of
// the optimizer state from the saved ranks' parts (CheckpointReader), and the run's position.
void Training::resume(const std::string& folder) {
  StallWatchdog::mark("start-up: reading the checkpoint");
  const CheckpointReader checkpoint(folder);
  const nlohmann::json& manifest = checkpoint.manifest();
  require_same_model(folder, manifest, model_config_);
  const std::string manifest_path = folder + "/manifest.json";
  const TrainState saved = TrainState::from_json(manifest, manifest_path);
  const std::string saved_optimizer = manifest.value("optimizer", std::string());
  LLM_REQUIRE(saved_optimizer == run_.optimizer.name, manifest_path, "optimizer",
              "the checkpoint was written by --optimizer " + saved_optimizer + "; resume with it (got --optimizer " +
                  run_.optimizer.name + ")");
  LLM_REQUIRE(manifest.contains("optimizer_step") && manifest.at("optimizer_step").is_number_unsigned(), manifest_path,
              "optimizer_step", "missing or not an integer >= 0");
  if (manifest.contains("seed") && saved.seed != run_.seed)
    log::warn("resuming a run saved with --seed {} under --seed {}: the data order from here on is --seed {}'s",
              saved.seed, run_.seed, run_.seed);
  std::map<std::string, FullStateShape> expected = optimizer().full_state_shapes();
  for (size_t u = 0; u < sharded_.unit_count(); ++u)
    for (const ShardedParameter& p : sharded_.unit(u).layout().parameters) expected[p.name] = {p.full_shape};
  checkpoint.check(expected, "the model and its " + run_.optimizer.name + " state");

  for (size_t u = 0; u < sharded_.unit_count(); ++u) {
    (offload_ ? offload_->master(u) : sharded_.unit(u).master_shard()).zero_();  // padding rows stay zero
    for (const StatePiece& piece : master_pieces(u)) checkpoint.read(piece.key, piece.begin, piece.values);
    if (offload_) offload_->publish(u);
  }
  if (!offload_) sharded_.publish_shards();
  optimizer().load_state_pieces(
      [&](const std::string& key, int64_t begin, const at::Tensor& destination) { checkpoint.read(key, begin, destination); },
      manifest.at("optimizer_step").get<int64_t>());
  train_batches_.seek(saved.samples_consumed);
  state_.step = saved.step;
  state_.samples_consumed = saved.samples_consumed;
  state_.tokens_seen = saved.tokens_seen;
  run_id_ = manifest.value("run_id", run_id_);
  resumed_from_ = folder;
  log::info("resumed from {} at step {} (saved by {} rank(s))", folder, saved.step, manifest.value("world_size", 0));
}

// The ledger's owned buffers: what the units and the optimizer report, plus the batch and the
// rotary tables (memory/ledger.h).
MemoryCategories Training::owned_now() const {
  OwnedBytes owned = sharded_.owned_bytes();
  owned += offload_ ? offload_->owned_bytes() : device_optimizer_->owned_bytes();
  const int64_t rotary = distinct_storage_bytes(
      {model_->rotary_cos_cache(), model_->rotary_sin_cache(), unit_context_.cos, unit_context_.sin});
  return owned_categories(owned, live_batch_bytes_ + rotary);
}

void Training::record_start() {
  int64_t shard_bytes = 0;
  for (size_t u = 0; u < sharded_.unit_count(); ++u) shard_bytes += sharded_.unit(u).layout().shard_numel * 4;
  metrics_.write({{"event", "start"}, {"model", model_config_.to_json()}, {"run", run_.to_json()},
                  {"world_size", context_.world_size}, {"device", device_.str()},
                  {"host_threads", at::get_num_threads()}, {"communicator", communicator_.backend_name()}, {"sharding", to_string(run_.sharding.strategy)},
                  {"parameters", model_config_.num_parameters()}, {"shard_parameter_bytes", shard_bytes},
                  {"optimizer", run_.optimizer.name}, {"optimizer_state_bytes", optimizer().state_bytes()},
                  {"startup_peak_parameter_bytes", startup_peak_bytes_},
                  {"largest_unit_parameter_bytes", largest_unit_bytes_},
                  {"corpus_unigram_entropy", corpus_.unigram_entropy},
                  {"corpus_entropy_rate", corpus_.entropy_rate}, {"start_step", start_step_}, {"run_id", run_id_},
                  {"resumed_from", resumed_from_.empty() ? nlohmann::json() : nlohmann::json(resumed_from_)}});
  log::info("model {}: {:.2f}M parameters on {} x {} ({}, {}, {} host threads per rank), {} steps of {} sequences x {} tokens",
            model_config_.name, model_config_.num_parameters() / 1e6, context_.world_size, device_.str(),
            communicator_.backend_name(), to_string(run_.sharding.strategy), at::get_num_threads(),
            run_.num_training_steps, run_.data.total_batch_size,
            run_.data.max_length);
  log::info("optimizer {}: {} of state on this rank{}", run_.optimizer.name, human_bytes(optimizer().state_bytes()),
            offload_ ? ", in host memory with the fp32 masters (--offload optimizer)" : "");
  if (context_.init_from != nullptr)
    log::info("--init_from {}: read this rank's rows, {} bytes ({}) of the folder's {} bytes of weights",
              context_.init_from->folder(), init_from_bytes_, human_bytes(init_from_bytes_),
              context_.init_from->weight_bytes());
}

// Every rank's persistent training state, counted from the buffers that exist (after a step): one
// "sharded_state" record with a row per rank.
void Training::record_sharded_bytes() {
  const int world = communicator_.world_size(), rank = communicator_.rank();
  int64_t parameters = 0, gradients = 0, materialized = 0;
  for (size_t u = 0; u < sharded_.unit_count(); ++u) {
    const ShardedUnit& unit = sharded_.unit(u);
    // The device's persistent rows: the master, or once offloaded the compute-dtype copy.
    parameters += static_cast<int64_t>(unit.master_offloaded() ? unit.compute_shard().nbytes() : unit.master_shard().nbytes());
    // 0 with offload: the shard is transient, gone to host memory after each backward.
    gradients += unit.gradient_shard().defined() ? static_cast<int64_t>(unit.gradient_shard().nbytes()) : 0;
    materialized += unit.compute_parameter_bytes();
  }
  at::Tensor table = at::zeros({world, 4}, at::TensorOptions().dtype(at::kLong).device(communicator_.device()));
  table[rank] = at::tensor({parameters, gradients, optimizer().state_bytes(), materialized}, at::kLong)
                    .to(communicator_.device());
  if (world > 1) communicator_.all_reduce(table, ReduceOp::sum);
  table = table.to(at::kCPU);
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r)
    ranks.push_back({{"rank", r}, {"parameter_shard_bytes", table[r][0].item<int64_t>()},
                     {"gradient_shard_bytes", table[r][1].item<int64_t>()},
                     {"optimizer_state_bytes", table[r][2].item<int64_t>()},
                     {"materialized_parameter_bytes", table[r][3].item<int64_t>()}});
  metrics_.write({{"event", "sharded_state"}, {"ranks", ranks}});
}

// The end of the run's ledger (collective): rank 0 writes RUN_DIR/memory_report.md, and every rank's
// summary and every node's host figures go into metrics.jsonl as one "memory" record.
void Training::finish_memory_ledger(int64_t steps_run) {
  std::ostringstream description;
  description << "Run `" << run_.logging.run_dir << "`: " << model_config_.name << ", " << run_.optimizer.name << ", "
              << to_string(run_.precision.dtype)
              << (run_.precision.dtype == DType::bfloat16 ? std::string(" (") + to_string(run_.precision.mode) + ")" : "") << ", "
              << to_string(run_.sharding.strategy) << ", " << context_.world_size << " rank(s) on " << device_.str()
              << ", batch " << run_.data.batch_size << " x " << run_.data.max_length << " tokens, " << steps_run << " step(s).";
  const std::vector<RankMemorySummary> summaries = ledger_.finish(communicator_, "Memory report", description.str());
  nlohmann::json ranks = nlohmann::json::array(), nodes = nlohmann::json::array();
  for (const RankMemorySummary& rank : summaries) ranks.push_back(rank.to_json());
  for (const NodeMemorySummary& node : by_node(summaries)) nodes.push_back(node.to_json());
  metrics_.write({{"event", "memory"}, {"ranks", ranks}, {"nodes", nodes}});
}

// The end-of-run record of the gather order: tests read the peak from it.
nlohmann::json Training::gather_schedule_record() const {
  const GatherSchedule& schedule = sharded_.plan().gathers();
  return {{"event", "gather_schedule"},
          {"strategy", to_string(sharded_.options().strategy)},
          // One rank or no_shard: every unit is its own shard and is never gathered.
          {"units_resident", sharded_.unit_count() > 0 && sharded_.unit(0).resident()},
          {"prefetch", schedule.prefetch()},
          {"side_stream", sharded_.has_gather_stream()},
          {"units", schedule.unit_count()},
          {"peak_gathered_units", sharded_.peak_gathered_units()},
          {"schedule_peak_gathered_units", schedule.peak_gathered_units()},
          {"inline_gathers", schedule.inline_gathers()},
          {"prefetches", schedule.prefetches()}};
}

}  // namespace

c10::Device select_device(DeviceChoice choice, int local_rank) {
  const bool have_cuda = torch::cuda::is_available();
  if (choice == DeviceChoice::cuda) {
    LLM_REQUIRE(have_cuda, "--device", "cuda", "no CUDA device is visible; use --device cpu or auto");
    const int count = static_cast<int>(torch::cuda::device_count());
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
  }
  if (choice == DeviceChoice::auto_select && have_cuda) return select_device(DeviceChoice::cuda, local_rank);
  return c10::Device(c10::kCPU);
}

std::optional<std::string> ranks_sharing_a_gpu(const std::vector<std::string>& gpus) {
  for (size_t a = 0; a < gpus.size(); ++a)
    for (size_t b = a + 1; b < gpus.size(); ++b)
      if (!gpus[a].empty() && gpus[a] == gpus[b])
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " both compute on GPU " + gpus[a] +
               ", and NCCL cannot put two ranks on one GPU: start at most one rank per GPU of a host (launch/train.sh "
               "starts one per visible GPU), give each rank its own GPU (CUDA_VISIBLE_DEVICES, srun --gpus-per-task), "
               "or share the GPUs over --communicator mpi (slow: for tests)";
  return std::nullopt;
}

TrainingOutcome train(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context) {
  Training training(model_config, run, context);
  return training.run();
}

}  // namespace llm
