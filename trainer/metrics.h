// Logs a person reads and files a program reads: one human line per step from rank 0 (with a
// progress bar and ETA under it when stdout is a terminal), and the same numbers as JSON lines in
// RUN_DIR/metrics.jsonl. Tests and scripts read the JSONL, never the columns of stdout.
//
// metrics.jsonl records, one per line, each with an "event" field:
//   {"event":"start", "model":{...}, "run":{...}, "world_size":N, "device":"cpu", ...}
//   {"event":"train", "step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_time_s",
//    "tokens_seen", "peak_rss_bytes", ["peak_cuda_allocated_bytes",] "peak_memory_bytes",
//    "peak_memory_source", "projector_s", "phase_s": {"forward", "backward", "collectives",
//    "optimizer", "other"}}  (phase_s: where the step's time went, common/step_timer.h; mfu:
//    trainer/model_flops.h, 0 when the device's peak is unknown, never above 1; peak_memory_bytes is
//    the step line's figure, named by peak_memory_source: "rss" on CPU, "cuda_allocated" on CUDA)
//   {"event":"eval", "step", "eval_loss", "eval_tokens"}
//   {"event":"peak_flops", "step", "peak_flops", "peak_flops_source", "capped", "stale_peak_flops",
//    "stale_peak_flops_source"}  a step outpaced the MFU's peak (trainer/model_flops.h): the peak from
//    that step on, and the one it replaces
//   {"event":"memory", "ranks":[{...}]}  every rank's memory summary (memory/ledger.h)
//   {"event":"gather_schedule", "strategy", "prefetch", "side_stream", "units",
//    "peak_gathered_units", "schedule_peak_gathered_units", "inline_gathers", "prefetches"}
//   {"event":"end", "steps", "final_loss", "final_eval_loss", "elapsed_s", ...}
//   {"event":"preempted", "step", "signal", "checkpoint"}  instead of "end" when a signal stopped the
//    run (trainer/preemption.h); "checkpoint" is null without --save_dir
// A resumed run (--continue_from) appends to the file: a new "start" record (with "start_step" and
// "run_id") follows the history before it, and may repeat steps after its checkpoint's.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/output_files.h"

#include "common/step_timer.h"
#include "sharding/communicator.h"
#include "trainer/step_ranks.h"
#include "trainer/tensorboard.h"

namespace llm {

struct StepRecord {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  double step_seconds = 0;
  int64_t tokens_seen = 0;
  int64_t peak_memory_bytes = 0;  // the step line's figure: the CUDA allocator's peak, or the peak RSS on CPU
  bool peak_on_cuda = false;      // which of the two peak_memory_bytes is
  int64_t peak_rss_bytes = 0;     // the process's peak resident set
  double mfu = 0;                 // model FLOPs utilisation (trainer/model_flops.h); 0: peak unknown
  double projector_seconds = 0;  // GaLore projector recomputation within the step (0 otherwise)
  // The step's time by phase (they add up to step_seconds), or on CUDA the step before's (phase_step:
  // the events are read a step late, common/step_timer.h); nothing after a CUDA run's first step.
  std::optional<PhaseSeconds> phase_seconds;
  int64_t phase_step = 0;
  int64_t host_reads = 0;        // reads of device values in the step: each drains a GPU (common/device.h)
  PhaseSeconds host_phase_seconds{};  // the same phases by the host clock (step_timer.h)
  // --offload optimizer: the host step's time and the compute thread's waits for it
  // (offload/optimizer_offload.h, OffloadTimes), since the last record.
  bool offloaded = false;
  double offload_host_step_seconds = 0, offload_wait_seconds = 0;
  // The bytes this rank sent, and the seconds its collectives took, inside its group (the world when
  // not hybrid) and across the groups (hybrid), in the step (Communicator::take_traffic).
  LinkTraffic group, across;
  LinkTraffic node;  // --backward_gather_size: the backward's gathers inside the node (hpZ)
  bool hybrid = false;
  std::optional<Straggler> straggler;  // a rank much slower than the others at this step (step_ranks.h)
};

class MetricsLog {
 public:
  // Only the writer (rank 0) prints and writes; other ranks' calls do nothing. The progress bar is
  // drawn only for a single process on a terminal: under mpirun stdout is a pseudo-terminal even
  // when mpirun's own output goes to a file, so a bar there would litter logs.
  // append: a resumed run adds to the file (its history before the checkpoint stays); otherwise the
  // file starts empty.
  MetricsLog(const std::string& jsonl_path, bool is_writer, bool single_process, bool append = false);
  void write(const nlohmann::json& record);
  void log_step(const StepRecord& record);
  // The last step's phases where they are read a step late (CUDA): a "phases" record, and TensorBoard's time/ scalars.
  void log_late_phases(int64_t step, const PhaseSeconds& seconds);
  void log_eval(int64_t step, double eval_loss, int64_t eval_tokens);
  void log_line(const std::string& text);  // a human line that keeps the progress bar intact

  // TensorBoard (--tensorboard_dir): once attached, every train and eval record is also written as
  // scalars (the tags are listed in the README), and these add what has no JSONL line of its own.
  void attach_tensorboard(std::unique_ptr<TensorBoardWriter> writer);
  TensorBoardWriter* tensorboard() { return tensorboard_.get(); }
  void checkpoint_written(int64_t step, const std::string& folder);

 private:
  void draw_progress(int64_t step, int64_t total);
  bool is_writer_;
  bool interactive_;
  bool bar_drawn_ = false;
  RunFile jsonl_;  // every line checked (common/output_files.h)
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // rank 0 with --tensorboard_dir, else null
  void log_phases_to_tensorboard(int64_t step, const PhaseSeconds& seconds);
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

std::string format_duration(double seconds);  // "1h02m03s"

}  // namespace llm
