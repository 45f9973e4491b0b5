// One rank's training (trainer/train_loop.h runs it): the class and the records of its step, shared by
// the set-up and the run loop (trainer/train_loop.cpp) and the step itself (trainer/train_step.cpp).
// Internal to trainer/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/train_state.h"
#include "common/step_timer.h"
#include "common/watchdog.h"
#include "data/batches.h"
#include "memory/categories.h"
#include "memory/ledger.h"
#include "model/llama.h"
#include "offload/optimizer_offload.h"
#include "optim/shard_optimizer.h"
#include "sharding/sharded_model.h"
#include "trainer/divergence.h"
#include "trainer/run_checkpoints.h"
#include "trainer/run_records.h"
#include "trainer/step_ranks.h"
#include "trainer/train_loop.h"

namespace llm {

// The token file the run reads, and for synthetic data its entropies (the loss's floor).
struct Corpus {
  std::shared_ptr<TokenCorpus> tokens;  // every shard of --data, in order
  double unigram_entropy = 0;
  double entropy_rate = 0;
  std::vector<WeightedCorpus> sources;  // what the sampler draws from: `tokens` alone, or a mixture's sources
};

// One optimizer step's outcome, for the step line and metrics.jsonl.
struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0;
  // The step's phases, or reading late on CUDA (common/step_timer.h) the step before's: phase_step says
  // which; nothing after a CUDA run's first step.
  std::optional<PhaseSeconds> phase_seconds;
  int64_t phase_step = 0;
  int64_t host_reads = 0;  // reads of device values the step made (common/device.h)
  // What the step's collectives carried: over the communicator the units are sharded over (hybrid:
  // inside the group) and, hybrid only, across the groups (sharding/communicator.h).
  LinkTraffic group, across;
  LinkTraffic node;  // --backward_gather_size: the backward's gathers inside the node
};

// Everything one rank's training holds. The constructor is the set-up, in the order the memory
// ledger needs (the run's records first: the ledger's window up to the first step is the start-up
// peak), then the data, the sharded model (each unit initialised and sharded as it is built), the
// optimizer and a resumed state; train_step() is one optimizer step, and run() the steps with what
// follows each. Checkpoints have their owner (trainer/run_checkpoints.h), and so have the run's
// records (trainer/run_records.h).
class Training {
 public:
  Training(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context);
  TrainingOutcome run();

 private:
  StepResult train_step(int64_t step);
  // The step's parts (trainer/train_step.cpp).
  at::Tensor forward_backward(int64_t step);  // the micro-batches; returns their loss sum (double, on the device)
  void step_device_unit(size_t unit, double lr, double scale);  // one unit's optimizer step on the device
  void stop_unless_finite(int64_t step, const StepResult& result) const;  // throws TrainingError
  void stop_if_diverged(int64_t step, const StepResult& result);         // throws TrainingError
  void update(double lr, double scale);
  // What follows a step, in run()'s order.
  void log_step(int64_t step, const StepResult& result, double seconds);
  double evaluate_and_record(int64_t step);  // the held-out loss
  // What the ranks agree on at a step's end, in one collective: a preemption signal any of them
  // received, whether the background save in flight is written on every rank, and whether a run
  // file failed to be written on any rank.
  struct StepEnd {
    int signal = 0;
    bool save_written = true;
    bool write_failed = false;
    bool time_up = false;  // --max_runtime: one more step and a save would pass it (on some rank)
  };
  StepEnd agree_at_step_end(int64_t step, double step_seconds);
  // --max_runtime's save estimate: the last waited save's seconds, or before any the checkpoint's
  // bytes at 200 MB/s plus a second.
  double save_seconds_estimate() const;
  // The step's checkpoint, when one is due (--save_every, the last step, a preemption or a write
  // failure), and the completion of a background save.
  void save_at_step_end(int64_t step, bool last, const StepEnd& end, TrainingOutcome& outcome);
  double evaluate(int64_t* tokens);
  void shard_when_built(const UnitSpec& unit, NamedTensors parameters);
  MemoryCategories owned_now() const;
  RunStart start_record() const;

  const ModelConfig& model_config_;
  const RunConfig& run_;
  const RuntimeContext& context_;
  const c10::Device device_;
  Communicator& communicator_;       // every rank: the loss's average, the records, the saves
  Communicator& host_communicator_;  // host tensors: offload's collectives, the preemption agreement
  StragglerWatch stragglers_;        // over host_communicator_, at each logged step
  // What the units are sharded over (hybrid: this rank's group; else the world), for the device's and
  // for host tensors, and hybrid's replicas across the groups (nullptr otherwise).
  Communicator& shard_communicator_;
  Communicator& host_shard_communicator_;
  Communicator* replicas_;
  // What the optimizer's collectives and the gradient norm go over: the shard communicator, or with
  // --shard_optimizer_across_groups every rank in the world layout's order.
  Communicator& optimizer_communicator_;
  const bool autocast_;  // bf16 mixed: fp32 parameters, bf16 autocast in the forward
  const bool prepared_;
  RunRecords records_;  // metrics.jsonl and the memory ledger
  MemoryLedger& ledger_;
  Corpus corpus_;
  std::shared_ptr<TokenCorpus> held_out_;  // --eval_data; nullptr: the tail of corpus_ is held out
  BatchSampler train_batches_, eval_batches_;
  StepTimer timer_;
  CrossEntropyForm loss_form_ = CrossEntropyForm::blocked;  // --fused_ops cross_entropy: single_pass
  ShardedModel sharded_;
  int64_t startup_peak_bytes_ = 0, largest_unit_bytes_ = 0;  // parameter storage while building
  int64_t init_from_bytes_ = 0;  // --init_from: bytes of the folder this rank read (its rows)
  UnitContext unit_context_;
  LlamaForCausalLM model_;
  // --offload optimizer: the optimizer over host masters, stepped by offload_; otherwise over the
  // units' own shards. Declared after sharded_: destroyed (its worker stopped) before it.
  std::unique_ptr<OptimizerOffload> offload_;
  std::unique_ptr<ShardOptimizer> device_optimizer_;
  RunFile offload_trace_;  // --offload_trace
  void write_offload_trace();
  ShardOptimizer& optimizer() const { return offload_ ? offload_->optimizer() : *device_optimizer_; }
  TrainState state_;
  std::unique_ptr<RunCheckpoints> checkpoints_;  // after the optimizer: it holds views of its state
  // --collective_timeout: the one main() runs from start-up (context.watchdog), or one of our own
  // from the first step when there is none (in-process tests).
  StallWatchdog* watchdog_ = nullptr;
  std::unique_ptr<StallWatchdog> own_watchdog_;
  int64_t current_step_ = 0;
  int64_t start_step_ = 0;
  double run_end_epoch_ = 0;        // --max_runtime's end (common/run_deadline.h); 0: none
  double last_save_seconds_ = -1;   // the last save the loop waited for; < 0: none yet
  int64_t eval_sequences_ = 0;  // held-out sequences one evaluation reads, across the job (evaluate)
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


}  // namespace llm
