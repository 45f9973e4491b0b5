// The per-rank memory ledger: where this rank's bytes are, by category, at the phase boundaries of
// every step, with the allocator's peak between boundaries; written to RUN_DIR/memory.rank<R>.jsonl,
// gathered over the communicator at the end of the run into RUN_DIR/memory_report.md.
//
// Sources. The tracked total is the allocator the training device allocates from: LibTorch's CPU
// allocator through the counting wrapper of common/host_memory.h on a CPU run, the CUDA caching
// allocator's allocated bytes on a GPU run. Beside it every point carries the host allocator's
// bytes, the process's resident set, and on CUDA the reserved and pinned bytes.
//
// Categories (memory/categories.h). The owned ones are counted from the buffers the trainer
// holds at that moment (shards, gradient shards, gathered compute copies, full gradients not yet
// reduced, optimizer state, the batch and rotary tables); activations are the tracked total minus
// all of them, so the six add up to the tracked total by construction. At the optimizer point no
// activation is alive, and the owned buffers alone must explain the tracked total: the test of that
// is what makes the remainder trustworthy elsewhere.
//
// Windows. Each point also records the allocator's peak since the previous point (its "window"):
// the gather buffers, reduce-scatter buffers, autograd temporaries and optimizer temporaries that
// live and die inside a phase. The step's peak is the largest window peak; the run's peak the
// largest step's. Both peaks are reset at each point (CUDA's resetPeakStats), so the step line takes
// its peak from the ledger (step_line_peak_bytes) rather than from the allocator.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "common/output_files.h"

#include "common/owned_bytes.h"
#include "memory/categories.h"

namespace llm {

class Communicator;

// The owned categories (activations left at 0 for the ledger to fill in) from what the owners report
// (common/owned_bytes.h: the sharded model's units, the optimizer). other_bytes: owned buffers of no
// other category (the batch, rotary tables).
MemoryCategories owned_categories(const OwnedBytes& owned, int64_t other_bytes);

class MemoryLedger {
 public:
  // Opens RUN_DIR/memory.rank<R>.jsonl and writes its start record (run_info is copied into it);
  // `append` (a resumed run) keeps the records already there, so the file holds one segment per start.
  // Construct it before the model is built: the window up to the first step is the start-up peak.
  MemoryLedger(const std::string& run_dir, int rank, int world_size, c10::Device device,
               const nlohmann::json& run_info, bool append = false);

  void begin_step(int64_t step);
  void set_micro_batch(int64_t micro) { micro_ = micro; }
  // A timeline point: phase "forward", "backward", "eval" (with the unit), "optimizer",
  // "checkpoint" (without). `owned`'s activations are ignored and replaced by the remainder.
  void point(const std::string& phase, const std::string& unit, const MemoryCategories& owned);
  // Writes the step record (peaks of the step's windows).
  void end_step();

  // The figure of the per-step log line: the device allocator's run peak on CUDA (the ledger resets
  // the allocator's own peak at every point), the process's peak RSS on CPU.
  int64_t step_line_peak_bytes() const;
  RankMemorySummary summary() const;
  // The last step's figures (its tracked peak, the categories at it, where it was), once end_step ran.
  const RankMemorySummary& last_step_summary() const { return step_summary_; }
  // Collective: every rank's summary, gathered with one all-reduce of a table (ranks x figures).
  // Rank 0 writes RUN_DIR/memory_report.md under `title` and prints the across-ranks table. Every rank writes its
  // end record. Returns the summaries of all ranks on every rank.
  std::vector<RankMemorySummary> finish(Communicator& communicator, const std::string& title,
                                        const std::string& description);

 private:
  int64_t tracked_bytes() const;
  int64_t tracked_window_peak() const;
  void reset_windows();
  int phase_index(const std::string& label);

  std::string run_dir_;
  int rank_;
  int world_size_;
  c10::Device device_;
  RunFile out_;  // memory.rank<R>.jsonl, every line checked (common/output_files.h)
  int64_t step_ = 0, micro_ = 0, sequence_ = 0;
  int64_t startup_peak_bytes_ = 0;
  bool startup_recorded_ = false;
  // The step being recorded and the run so far.
  RankMemorySummary step_summary_, run_summary_;
  int64_t step_points_ = 0, steps_recorded_ = 0;
  int64_t device_run_peak_ = 0;
  std::vector<std::string> phase_labels_;  // in order of first appearance: the same on every rank
};

}  // namespace llm
