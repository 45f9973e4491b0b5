// The run's records: RUN_DIR/metrics.jsonl (trainer/metrics.h) and the memory ledger
// (memory/ledger.h), and the records a run writes once: the start (settings, sizes, where it
// resumed from), every rank's persistent state after the first step, and the end (the memory
// summary, the gather order, and how the run ended). Training feeds it; nothing here steers a step.
//
// It is the first thing a Training builds: the ledger's start-up window begins when it opens, so the
// start-up peak covers the data, the model and the optimizer that follow.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "memory/estimate_fit.h"
#include "memory/ledger.h"
#include "trainer/metrics.h"
#include "trainer/model_flops.h"

namespace llm {

class Communicator;
class ShardOptimizer;
class ShardedModel;
struct RuntimeContext;

// What the start record says beyond the run's settings.
struct RunStart {
  std::string communicator;                   // the device communicator's backend
  int64_t shard_parameter_bytes = 0;          // this rank's fp32 master rows
  int64_t optimizer_state_bytes = 0;          // this rank's optimizer state
  int64_t startup_peak_parameter_bytes = 0;   // parameter storage held at once while building
  int64_t largest_unit_parameter_bytes = 0;
  double corpus_unigram_entropy = 0;          // synthetic data only, else 0
  double corpus_entropy_rate = 0;
  int64_t start_step = 0;
  std::string run_id;
  std::string resumed_from;                   // "" for a fresh run
  bool offloaded = false;                     // --offload optimizer
  int offload_threads = 0;                    // its host step's threads (0: no offload)
  int64_t init_from_bytes = 0;                // --init_from: bytes of the folder this rank read
  std::string attention_backend;              // the SDPA kernel ATen picks for the layers' attention
};

class RunRecords {
 public:
  // A resumed run (--continue_from) appends to the run's history; a fresh one starts it.
  RunRecords(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context);

  MetricsLog& metrics() { return metrics_; }
  MemoryLedger& ledger() { return ledger_; }

  // The "start" record and the start-up log lines; on rank 0 the device's peak for the MFU figure
  // (trainer/model_flops.h) and, with --tensorboard_dir, the event file and the configuration as text.
  void start(const RunStart& start);
  // The step's MFU from its tokens per second (all ranks'); 0 where the peak is unknown or off rank 0.
  // A peak the step outpaces is replaced or capped first (trainer/model_flops.h: outpaced_peak), and a
  // "peak_flops" record (and TensorBoard text) says so: the MFU is never above 1.
  double model_flops_utilisation(int64_t step, double tokens_per_second);
  // With --tensorboard_dir, after the ledger's end of a logged step (a collective, on every rank): the
  // step's tracked peak and the categories at it, on rank 0 and the largest over ranks.
  void step_memory(int64_t step, Communicator& communicator);
  // Every rank's persistent training state, counted from the buffers that exist after a step (a
  // collective): one "sharded_state" record with a row per rank.
  void sharded_state(const ShardedModel& model, const ShardOptimizer& optimizer, Communicator& communicator);
  // A logged step's time and phases (rank 0 keeps them): the end compares their medians with the
  // predicted step (step_time_comparison).
  void observe_step(const StepRecord& record);
  // A preemption signal during start-up: the run stops before its first step.
  void preempted_before_first_step(int64_t start_step, int signal);
  // The end of the run (a collective): the memory ledger's summary (rank 0 writes
  // RUN_DIR/memory_report.md), the gather order, and an "end" record, or a "preempted" one when
  // preempted_by is a signal.
  void finish(int64_t steps, int64_t steps_run, const ShardedModel& model, Communicator& communicator,
              double final_loss, double final_eval_loss, int preempted_by, const std::string& preemption_checkpoint,
              const std::string& stopped_by);

 private:
  void finish_memory_ledger(int64_t steps_run, Communicator& communicator);
  // This run as `trainer estimate` takes it: world, device, ranks a node (from the ledger's hosts) and
  // the MFU's peak as --device_tflops.
  EstimateOptions estimate_options(int ranks_per_node) const;
  std::vector<LeverAdvice> lever_advice(const EstimateOptions& options) const;
  std::string peak_line(const RankMemorySummary& rank, const LeverAdvice* lever) const;
  // The measured step (the medians over the logged steps after the first, the last kStepTimeWindow
  // of them) beside the step time `trainer estimate` predicts for this run (memory/step_time.h);
  // null with fewer than two logged steps.
  nlohmann::json step_time_comparison(const EstimateOptions& options) const;
  void append_step_time_report(const nlohmann::json& comparison) const;

  const ModelConfig& model_config_;
  const RunConfig& run_;
  const RuntimeContext& context_;
  MetricsLog metrics_;
  MemoryLedger ledger_;
  double flops_per_token_ = 0;
  PeakFlops peak_;  // rank 0's, the MFU's from the start or since a step outpaced it; 0 elsewhere
  // Rank 0's logged steps after the first (seconds, phases), the last kStepTimeWindow: a long run's
  // records stay bounded.
  static constexpr size_t kStepTimeWindow = 1000;
  bool first_step_observed_ = false;
  std::deque<std::pair<double, PhaseSeconds>> step_phases_;
  nlohmann::json step_time_;                                   // step_time_comparison's, for the end record
};

}  // namespace llm
