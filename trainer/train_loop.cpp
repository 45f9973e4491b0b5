#include "trainer/train_loop.h"

#include <torch/cuda.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/interchange/pretrained.h"
#include "common/device.h"
#include "common/errors.h"
#include "common/padded_tensor.h"
#include "common/log.h"
#include "common/memory_stats.h"
#include "common/output_files.h"
#include "common/run_deadline.h"
#include "config/optimizer_setup.h"
#include "data/corpus_identity.h"
#include "data/document_windows.h"
#include "data/synthetic.h"
#include "sharding/world.h"
#include "common/autocast.h"
#include "trainer/preemption.h"
#include "trainer/training.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kSyntheticCorpusSeed = 1234;  // the corpus is fixed; --seed varies init and order
constexpr int64_t kSnapshotSteps = 2;            // --memory_snapshot: history through these steps

// --data's (or --eval_data's) shards. Every rank must read the same corpus: were a glob or folder to
// list other files on another node, the ranks' window orders would differ and their windows overlap.
std::shared_ptr<TokenCorpus> open_data(const std::string& spec, const std::string& flag, const ModelConfig& model,
                                       const RunConfig& run) {
  std::shared_ptr<TokenCorpus> corpus = TokenCorpus::open(spec, model.vocab_size, flag, memmap_bytes(run.data.memmap_dtype));
  const std::string mine =
      std::to_string(corpus->shards().size()) + " shard(s) of " + std::to_string(corpus->size()) + " tokens";
  const std::vector<std::string> every_rank = all_gather_text(mine);
  for (size_t rank = 1; rank < every_rank.size(); ++rank)
    LLM_REQUIRE(every_rank[rank] == every_rank.front(), "command line", flag,
                "the ranks read different data: rank 0 " + every_rank.front() + ", rank " + std::to_string(rank) + " " +
                    every_rank[rank] + " (a glob or folder that lists other files on another node?); give every rank "
                    "the same files");
  return corpus;
}

// --eval_data's held-out corpus, or nullptr: the last --eval_fraction of --data's windows then.
std::shared_ptr<TokenCorpus> open_held_out(const RunConfig& run, const ModelConfig& model) {
  if (run.data.eval_source.empty()) return nullptr;
  StallWatchdog::mark("start-up: opening the data");
  return open_data(run.data.eval_source, "--eval_data", model, run);
}

Corpus open_corpus(const RunConfig& run, const ModelConfig& model, const RuntimeContext& context) {
  StallWatchdog::mark("start-up: opening the data");
  if (run.data.source != "synthetic") {
    Corpus corpus;
    corpus.tokens = open_data(run.data.source, "--data", model, run);
    const std::vector<DataSource> sources = data_sources(run.data.source);
    const auto corpora = TokenCorpus::split_sources(corpus.tokens, run.data.source);
    for (size_t s = 0; s < sources.size(); ++s) {
      corpus.sources.push_back({corpora[s], sources[s].weight});
      // Built once here, read by both the train and the eval sampler.
      if (run.data.window_start == "document")
        corpus.sources.back().documents = std::make_shared<const DocumentWindows>(corpora[s], run.data.max_length + 1);
    }
    return corpus;
  }
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
  // The one file by its path, not read as a --data list (a run folder's path may hold a comma).
  std::shared_ptr<TokenCorpus> tokens = std::make_shared<TokenCorpus>(
      std::vector<std::shared_ptr<TokenFile>>{TokenFile::open(path, model.vocab_size)}, path);
  return {tokens, corpus.unigram_entropy_nats, corpus.entropy_rate_nats, {{tokens, 1.0}}};
}

WindowStart window_start(const RunConfig& run) {
  return run.data.window_start == "document" ? WindowStart::document : WindowStart::anywhere;
}

// Before anything is written: --memory_snapshot on a CPU rank is a UserError, and the run folder exists.
bool prepare_run(const RunConfig& run, c10::Device device) {
  if (run.logging.memory_snapshot) start_device_memory_history(device, 100000);
  fs::create_directories(run.logging.run_dir);
  return true;
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

}  // namespace

Training::Training(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context)
    : model_config_(model_config),
      run_(run),
      context_(context),
      device_(context.device),
      communicator_(*context.communicator),
      host_communicator_(context.host_communicator ? *context.host_communicator : *context.communicator),
      shard_communicator_(context.shard_communicator ? *context.shard_communicator : communicator_),
      host_shard_communicator_(context.host_shard_communicator ? *context.host_shard_communicator : host_communicator_),
      replicas_(context.replicas),
      optimizer_communicator_(context.optimizer_communicator ? *context.optimizer_communicator : shard_communicator_),
      autocast_(run.precision.dtype == DType::bfloat16 && run.precision.mode == Precision::mixed),
      prepared_(prepare_run(run, device_)),
      records_(model_config, run, context),
      ledger_(records_.ledger()),
      corpus_(open_corpus(run, model_config, context)),
      held_out_(open_held_out(run, model_config)),
      train_batches_(corpus_.sources, Split::train, run.data.max_length, run.data.eval_fraction, run.seed, context.rank,
                     context.world_size, run.data.batch_size, /*whole_corpus=*/held_out_ != nullptr, window_start(run)),
      eval_batches_(held_out_ ? std::vector<WeightedCorpus>{{held_out_, 1.0}} : corpus_.sources, Split::eval, run.data.max_length, run.data.eval_fraction,
                    run.seed, context.rank, context.world_size, run.data.batch_size,
                    /*whole_corpus=*/held_out_ != nullptr, window_start(run)),
      timer_(device_),
      sharded_(shard_communicator_,
               {within_group(run.sharding.strategy), run.sharding.prefetch,
                run.precision.dtype == DType::bfloat16 && run.precision.mode == Precision::pure ? at::kBFloat16 : at::kFloat,
                resident_units_allowed() && !model_config.matmul_padded(), offloads_parameters(run.sharding.offload),
                bf16_gradient_shards(run, context.world_size), replicas_, context.backward_gather,
                run.sharding.optimizer_across_groups, context.host_replicas}),
      model_(seeded(model_config, run.seed),
             [this](const UnitSpec& unit, NamedTensors parameters) { shard_when_built(unit, std::move(parameters)); }),
      divergence_(run.divergence_patience, run.optimizer.warmup_steps.value(), model_config.vocab_size) {
  for (size_t u = 0; u < sharded_.unit_count(); ++u)
    sharded_.set_forward(u, [this, u](const at::Tensor& input) {
      return model_->forward_unit(u, input, unit_context_);
    });
  sharded_.set_timer(&timer_);
  model_->set_recompute(recompute_set(run.recompute));  // --recompute's operations (model/recompute.h)
  model_->set_grouped_projections(run.grouped_projections);
  if (const FusedOps fused = fused_ops_set(run.fused_ops); fused.any()) {  // --fused_ops (model/layer_ops.h)
    if (!device_.is_cuda())
      fail_user(kCommandLine, "--fused_ops",
                run.fused_ops + " are CUDA kernels and this run's device is " + device_.str() +
                    ": leave --fused_ops out on the CPU (its ATen forms give the same numbers as transformers)");
    if (fused.rms_norm) model_->set_rms_norm_form(RmsNormForm::fused);
    if (fused.swiglu) model_->set_swiglu_form(SwigluForm::fused);
    if (fused.rotary) model_->set_fused_rotary(true);
    if (fused.cross_entropy) loss_form_ = CrossEntropyForm::single_pass;
  }
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
  const bool sharded_across_ranks =
      optimizer_communicator_.world_size() > 1 && run.sharding.strategy != ShardingStrategy::no_shard;
  // The optimizer's collectives go over the communicator of the device its state is on: the host's
  // with offload (NCCL cannot carry host tensors); the group's under hybrid sharding (each group steps
  // its shards alike: a GaLore projector is the same in every group).
  if (offloads_optimizer(run.sharding.offload)) {
    OffloadOptions options;
    options.worker_threads = run.sharding.offload_threads;
    options.delayed_after = run.sharding.offload_delayed_update;
    options.mode = run.sharding.offload_step == OffloadStep::speculative ? OffloadStepMode::speculative
                   : run.sharding.offload_step == OffloadStep::device    ? OffloadStepMode::device
                                                                          : OffloadStepMode::host;
    options.trace = run.logging.offload_trace;
    // With the optimizer across the groups, both in the world layout's order (its own communicators).
    Communicator& host_optimizer =
        context.host_optimizer_communicator ? *context.host_optimizer_communicator
        : context.optimizer_communicator    ? optimizer_communicator_
                                            : host_shard_communicator_;
    options.device_across = sharded_across_ranks ? &optimizer_communicator_ : nullptr;
    offload_ = std::make_unique<OptimizerOffload>(sharded_, optimizer_settings(run), unit_update_rules(sharded_, run),
                                                  sharded_across_ranks ? &host_optimizer : nullptr, options);
    if (run.logging.offload_trace)
      offload_trace_.open(std::filesystem::path(run.logging.run_dir) /
                              ("offload_trace.rank" + std::to_string(context.rank) + ".jsonl"),
                          /*append=*/!run.checkpoint.continue_from.empty());
  } else {
    device_optimizer_ = build_optimizer(run, sharded_, sharded_across_ranks ? &optimizer_communicator_ : nullptr);
  }
  if (run.fuse_optimizer_with_backward)
    for (size_t u = 0; u < sharded_.unit_count(); ++u) {
      // A unit's gradient shard lives from its reduction to its step (fused_step), as with offload.
      sharded_.unit(u).make_gradient_transient();
      device_optimizer_->set_unit_gradient(u, at::Tensor());
    }
  eval_sequences_ = eval_sequences_of_job(run.data, context.world_size);
  // --eval_batches keeps its earlier meaning (micro-batches per rank, wrapping over the held-out
  // windows); a job-wide count reads each held-out window at most once.
  if (run.data.eval_batches == 0 && eval_sequences_ > eval_batches_.num_windows()) {
    if (context.rank == 0)
      log::info("evaluation: {} sequences asked, the held-out split has {}: each evaluation reads all {}",
                eval_sequences_, eval_batches_.num_windows(), eval_batches_.num_windows());
    eval_sequences_ = eval_batches_.num_windows();
  }
  state_.seed = run.seed;
  checkpoints_ = std::make_unique<RunCheckpoints>(model_config, run, context,
                                                  CheckpointedState{sharded_, offload_.get(), optimizer(), state_, train_batches_},
                                                  records_.metrics());
  if (!run.checkpoint.continue_from.empty())
    checkpoints_->resume(context.resume_folder.empty() ? resolve_checkpoint_folder(run.checkpoint.continue_from)
                                                       : context.resume_folder);
  // The synthetic corpus is recorded as the token file it was written to (marked synthetic): a resume
  // that reads that file by name is on the same data.
  // A resume's start-up check has read it already (check_checkpoints_at_start).
  nlohmann::json identity = context.data_identity.is_null()
                                ? run_data_identity(*corpus_.tokens, run.data.source, run.data.window_start)
                                : context.data_identity;
  if (run.data.source == "synthetic") identity["synthetic"] = true;
  checkpoints_->set_data_identity(std::move(identity));
  checkpoints_->agree_on_run_id();
  start_step_ = state_.step;
  records_.start(start_record());
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
  // The shards, the layout and --init_from see each parameter without the compute side's pads.
  std::vector<std::vector<int64_t>> logical_shapes;
  NamedTensors logical_parameters;
  for (size_t i = 0; i < parameters.size(); ++i) {
    logical_shapes.push_back(unit.parameters[i].shape);
    logical_parameters.emplace_back(parameters[i].first, logical_view(unit.parameters[i].shape, parameters[i].second));
  }
  if (context_.init_from != nullptr)  // this rank's rows replace the seeded init (the rest is dropped at sharding)
    init_from_bytes_ += context_.init_from->load_rows(unit, logical_parameters,
                                                      sharded_.layout_for(unit.name, parameters, logical_shapes));
  int64_t held = unit_bytes;
  for (size_t u = 0; u < sharded_.unit_count(); ++u) held += sharded_.unit(u).compute_parameter_bytes();
  startup_peak_bytes_ = std::max(startup_peak_bytes_, held);
  largest_unit_bytes_ = std::max(largest_unit_bytes_, unit_bytes);
  sharded_.add_unit(unit.name, std::move(parameters), nullptr, std::move(logical_shapes));
}

TrainingOutcome Training::run() {
  TrainingOutcome outcome;
  outcome.steps = start_step_;
  outcome.corpus_unigram_entropy = corpus_.unigram_entropy;
  outcome.corpus_entropy_rate = corpus_.entropy_rate;
  watchdog_ = context_.watchdog;
  if (watchdog_ == nullptr) {
    own_watchdog_ = watch_for_stalls(run_, context_.rank, context_.world_size, process_identity().host);
    watchdog_ = own_watchdog_.get();
  }
  // A preemption signal during start-up (the handlers are in from main()'s first line): stop before
  // the first step, which with its save might not fit in what is left of the grace period.
  if (const int signal = preemption_agreed(host_communicator_); signal != 0) {
    outcome.preempted_by = signal;
    outcome.preempted_before_first_step = true;
    records_.preempted_before_first_step(start_step_, signal);
    return outcome;
  }
  LLM_REQUIRE(run_.stop_at_step == 0 || run_.stop_at_step > start_step_, "command line", "--stop_at_step",
              std::to_string(run_.stop_at_step) + " is not after the step this run resumes from, " +
                  std::to_string(start_step_) + ": give a later step, or leave the flag out");
  if (!run_.max_runtime.empty())
    run_end_epoch_ = max_runtime_end_epoch(run_.max_runtime, process_start_epoch()).value_or(0);
  // A run file that cannot be written stops every rank together at a step's end, after a last save
  // (common/output_files.h); not one rank alone mid-step.
  defer_write_failures(true);
  for (int64_t step = start_step_ + 1; step <= run_.num_training_steps; ++step) {
    current_step_ = step;
    watchdog_->progress(step, "step start");
    const auto started = std::chrono::steady_clock::now();
    shard_communicator_.take_traffic();  // what went before (the last evaluation, a save) is not the step's
    if (replicas_) replicas_->take_traffic();
    if (context_.backward_gather) context_.backward_gather->take_traffic();
    StepResult result = train_step(step);
    result.group = shard_communicator_.take_traffic();
    if (replicas_) result.across = replicas_->take_traffic();
    if (context_.backward_gather) result.node = context_.backward_gather->take_traffic();
    // The step's time is the step's span: the one-off record of the sharded state below (a file
    // written after the first step) is not part of it, so the phases add up to it.
    const double seconds = seconds_since(started);
    if (step == start_step_ + 1) records_.sharded_state(sharded_, optimizer(), communicator_);
    outcome.steps = step;
    outcome.final_loss = result.loss;
    const bool last = step == run_.num_training_steps;
    if (step % run_.logging.log_every == 0 || last) log_step(step, result, seconds);
    if ((run_.data.eval_every > 0 && step % run_.data.eval_every == 0) || last)
      outcome.final_eval_loss = evaluate_and_record(step);
    const StepEnd end = agree_at_step_end(step, seconds);
    if (!last) outcome.preempted_by = end.signal;  // at the last step the run ends anyway: only the write failures count
    if (!last && outcome.preempted_by == 0 && (end.time_up || step == run_.stop_at_step))
      outcome.stopped_by = end.time_up ? "--max_runtime" : "--stop_at_step";
    save_at_step_end(step, last, end, outcome);
    ledger_.end_step();
    if (step % run_.logging.log_every == 0 || last) records_.step_memory(step, communicator_);
    // Once: after the second step (or the last, if fewer). Recording stops there, so a later
    // snapshot would replace this one with one whose history is gone.
    if (run_.logging.memory_snapshot && step == std::min(start_step_ + kSnapshotSteps, run_.num_training_steps)) {
      write_device_memory_snapshot(
          device_, (fs::path(run_.logging.run_dir) / ("memory_snapshot.rank" + std::to_string(context_.rank) + ".pickle")).string());
      stop_device_memory_history(device_);
    }
    if (end.write_failed) stop_for_write_failure(step, "", "");  // no --save_dir
    if (outcome.preempted_by != 0 || !outcome.stopped_by.empty()) break;
  }
  defer_write_failures(false);
  if (offload_) {
    offload_->wait_all();  // the masters hold the last step before anything reads them
    write_offload_trace();  // the last step's host steps
    offload_trace_.close();
  }
  watchdog_->progress(outcome.steps, "finish");
  if (const std::optional<PhaseSeconds> last = timer_.flush())  // read late (CUDA): the last step's phases
    records_.metrics().log_late_phases(outcome.steps, *last);
  records_.finish(outcome.steps, outcome.steps - start_step_, sharded_, communicator_, outcome.final_loss,
                  outcome.final_eval_loss, outcome.preempted_by, outcome.preemption_checkpoint, outcome.stopped_by);
  own_watchdog_.reset();  // training ended: its heartbeat file goes (main's goes when main ends)
  watchdog_ = nullptr;
  return outcome;
}

void Training::log_step(int64_t step, const StepResult& result, double seconds) {
  const int64_t tokens_per_step = run_.data.total_batch_size * run_.data.max_length;
  StepRecord record;
  record.step = step;
  record.total_steps = run_.num_training_steps;
  record.loss = result.loss;
  record.lr = result.lr;
  record.grad_norm = result.grad_norm;
  record.tokens_per_second = static_cast<double>(tokens_per_step) / seconds;
  record.step_seconds = seconds;
  record.tokens_seen = state_.tokens_seen;
  record.peak_memory_bytes = ledger_.step_line_peak_bytes();
  record.peak_on_cuda = device_.is_cuda();
  record.peak_rss_bytes = peak_resident_bytes();
  record.mfu = records_.model_flops_utilisation(step, record.tokens_per_second);
  record.projector_seconds = optimizer().last_projector_seconds();
  record.phase_seconds = result.phase_seconds;
  record.phase_step = result.phase_step;
  record.host_reads = result.host_reads;
  record.host_phase_seconds = timer_.host_seconds();
  record.group = result.group;
  record.across = result.across;
  record.node = result.node;
  record.hybrid = replicas_ != nullptr;
  // The slow rank, by its step less its time inside the model's collectives (every rank here).
  record.straggler = stragglers_.observe(host_communicator_, seconds - result.group.seconds - result.across.seconds);
  if (record.straggler && context_.rank == 0)
    log::warn("step {}: rank {} is a straggler: {:.3f} s of its steps outside the collectives (its median over up to {} logged steps), the others' {:.3f} s",
              step, record.straggler->rank, record.straggler->compute_seconds, kStragglerWindow,
              record.straggler->median_seconds);
  if (offload_) {
    const OffloadTimes times = offload_->take_times();
    record.offloaded = true;
    record.offload_host_step_seconds = times.host_step_seconds;
    record.offload_wait_seconds = times.wait_seconds;
    write_offload_trace();
  }
  records_.observe_step(record);
  records_.metrics().log_step(record);
}

// One line per event: the step it belongs to, its order, what happened to which unit, on which thread.
void Training::write_offload_trace() {
  for (const OffloadEvent& event : offload_->take_trace()) {
    if (!offload_trace_.is_open()) continue;
    nlohmann::json line{{"seq", event.sequence}, {"step", event.step}, {"what", event.what},
                        {"thread", event.worker ? "worker" : "main"}, {"seconds", event.seconds}};
    if (event.bytes > 0) line["bytes"] = event.bytes;
    if (event.unit >= 0) {
      line["unit"] = event.unit;
      line["name"] = sharded_.unit(static_cast<size_t>(event.unit)).name();
    }
    offload_trace_.write_line(line.dump());
  }
}

double Training::evaluate_and_record(int64_t step) {
  if (offload_) offload_->settle();  // --offload_delayed_update: the evaluation sees this step's weights
  int64_t eval_tokens = 0;
  const double loss = evaluate(&eval_tokens);
  ledger_.point("eval", "", owned_now());
  records_.metrics().log_eval(step, loss, eval_tokens);
  return loss;
}

// Preemption (trainer/preemption.h): the ranks agree on a signal any of them received, and all stop
// after this step, saving it when there is a --save_dir. An asynchronous save completes at the first
// boundary where every rank has written its files (the same all-reduce says so), or before the next
// save, a preemption or the end.
Training::StepEnd Training::agree_at_step_end(int64_t step, double step_seconds) {
  watchdog_->progress(step, "step end");
  StepEnd end;
  end.save_written = checkpoints_->background_save_written();
  end.write_failed = write_failure_pending();
  // --max_runtime: stop now when the next step and then a save would not end before the limit.
  end.time_up = run_end_epoch_ > 0 && now_epoch() + step_seconds + save_seconds_estimate() >= run_end_epoch_;
  end.signal = preemption_agreed(host_communicator_, checkpoints_->saving_in_background() ? &end.save_written : nullptr,
                                 &end.write_failed, run_end_epoch_ > 0 ? &end.time_up : nullptr);
  return end;
}

double Training::save_seconds_estimate() const {
  if (run_.checkpoint.save_dir.empty()) return 0;
  if (last_save_seconds_ >= 0) return last_save_seconds_;
  int64_t bytes = optimizer().state_bytes();
  for (size_t u = 0; u < sharded_.unit_count(); ++u) bytes += static_cast<int64_t>(sharded_.unit(u).compute_parameter_bytes());
  return static_cast<double>(bytes) / 200e6 + 1.0;
}

void Training::save_at_step_end(int64_t step, bool last, const StepEnd& end, TrainingOutcome& outcome) {
  const bool periodic_save = run_.checkpoint.save_every > 0 && step % run_.checkpoint.save_every == 0;
  const bool stopping = outcome.preempted_by != 0 || !outcome.stopped_by.empty();
  const bool save_now = !run_.checkpoint.save_dir.empty() && (periodic_save || last || stopping || end.write_failed);
  if (checkpoints_->saving_in_background() && (end.save_written || save_now)) {  // save_now covers the last step and a preemption
    watchdog_->progress(step, "checkpoint");
    checkpoints_->finish_background_save(current_step_);
  }
  if (!save_now) return;
  watchdog_->progress(step, "checkpoint");
  // The last step's save, a preemption's and a write failure's are waited for: nothing comes after them.
  if (run_.checkpoint.async_save && !last && !stopping && !end.write_failed) {
    checkpoints_->start_background_save(step);
  } else if (end.write_failed) {
    std::string folder, problem;
    try {
      folder = checkpoints_->save(step);
    } catch (const UserError& error) {  // the same disk, full as well: the message says both
      problem = error.what();
    }
    stop_for_write_failure(step, folder, problem);
  } else {
    const auto started = std::chrono::steady_clock::now();
    const std::string folder = checkpoints_->save(step);
    last_save_seconds_ = seconds_since(started);
    if (stopping) outcome.preemption_checkpoint = folder;
  }
  watchdog_->progress(step, "checkpoint");
  ledger_.point("checkpoint", "", owned_now());
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

// The ledger's owned buffers: what the units and the optimizer report, plus the batch and the
// rotary tables (memory/ledger.h).
MemoryCategories Training::owned_now() const {
  OwnedBytes owned = sharded_.owned_bytes();
  owned += offload_ ? offload_->owned_bytes() : device_optimizer_->owned_bytes();
  const int64_t rotary = distinct_storage_bytes(
      {model_->rotary_cos_cache(), model_->rotary_sin_cache(), unit_context_.cos, unit_context_.sin});
  return owned_categories(owned, live_batch_bytes_ + rotary);
}

RunStart Training::start_record() const {
  RunStart start;
  start.communicator = communicator_.backend_name();
  for (size_t u = 0; u < sharded_.unit_count(); ++u) start.shard_parameter_bytes += sharded_.unit(u).layout().shard_numel * 4;
  start.optimizer_state_bytes = optimizer().state_bytes();
  start.startup_peak_parameter_bytes = startup_peak_bytes_;
  start.largest_unit_parameter_bytes = largest_unit_bytes_;
  start.corpus_unigram_entropy = corpus_.unigram_entropy;
  start.corpus_entropy_rate = corpus_.entropy_rate;
  start.start_step = start_step_;
  start.run_id = checkpoints_->run_id();
  start.resumed_from = checkpoints_->resumed_from();
  start.offloaded = offload_ != nullptr;
  start.offload_threads = offload_ ? offload_->worker_threads() : 0;
  start.init_from_bytes = init_from_bytes_;
  // What attention runs on (the layers' compute dtype: bf16 under autocast and in pure bf16).
  start.attention_backend = attention_backend(
      model_config_.num_attention_heads, model_config_.num_key_value_heads, run_.data.max_length,
      model_config_.head_dim(), run_.precision.dtype == DType::bfloat16 ? at::kBFloat16 : at::kFloat, device_);
  return start;
}

std::unique_ptr<StallWatchdog> watch_for_stalls(const RunConfig& run, int rank, int world_size, const std::string& host) {
  // One process has no collective to wait in: a long step there is only slow, not a stall.
  const bool watched = world_size > 1 && run.collective_timeout > 0;
  return std::make_unique<StallWatchdog>(run.logging.run_dir, rank, world_size, watched ? run.collective_timeout : 0.0,
                                         watched ? all_gather_text(host) : std::vector<std::string>());
}

c10::Device select_device(DeviceChoice choice, int local_rank) {
  const bool have_cuda = torch::cuda::is_available();
  if (choice == DeviceChoice::cuda) {
    LLM_REQUIRE(have_cuda, "--device", "cuda",
                "no CUDA device is visible" +
                    (cuda_runtime_loaded() ? std::string() : " (" + cuda_runtime_absence() + ")") +
                    "; use --device cpu or auto");
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
  // --pad_matmul_dims: the modules, the gathers and the estimate's activations at the compute width.
  Training training(with_matmul_padding(model_config, run.pad_matmul_dims, context.device.is_cuda()), run, context);
  return training.run();
}

}  // namespace llm
