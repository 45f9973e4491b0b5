// A training run folder as `trainer report` reads it: the settings from metrics.jsonl's start
// record, tokens/s and the final loss from its train and end records, each rank's memory summary and
// timeline from memory.rank<R>.jsonl, and `trainer estimate`'s prediction for the same settings.
// Shared by the memory report (report.cpp) and the techniques report (techniques.cpp).
//
// read_run: a missing folder, a folder without metrics.jsonl or without memory ledgers is a
// UserError naming it (exit 2); so is a damaged file, named with its line: empty or truncated, a
// line that is not a JSON object, a field of the wrong type, a world size below 1, a negative byte
// count, a ledger without a step or with a peak of 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "memory/categories.h"
#include "memory/estimate.h"
#include "memory/svg.h"

namespace llm {

struct RunRecord {
  std::string dir, label;
  nlohmann::json start;
  ModelConfig model;
  RunConfig run;
  int world = 1;
  std::string device;
  int64_t steps = 0;
  int64_t planned_steps = 0;  // --num_training_steps of the run's last start
  // How metrics.jsonl ends: "end" (finished), "preempted", or "" when the last start has neither (the
  // run is still going, or was killed): its final_loss is then the last step's loss, not the end's.
  std::string ended;
  double tokens_per_second = 0;
  // The bytes rank 0 sent a step inside its shard group and across groups, and the seconds in those
  // collectives: medians over the train records after the first (a run written before the step
  // record carried "links" has none: has_links false). straggler_steps: the steps whose record named
  // a straggler.
  struct Link {
    double bytes = 0, seconds = 0;
  };
  Link group, across, node;  // node: --backward_gather_size's backward gathers
  bool has_links = false;
  int64_t straggler_steps = 0;
  double final_loss = 0, final_eval_loss = 0;
  std::vector<RankMemorySummary> ranks;
  std::vector<RankTimeline> timeline;  // every rank's points of the step with rank 0's peak
  // Each rank's largest window peak over the points of training phases (forward, backward,
  // optimizer) and over those of evaluation (forward without autograd), over all steps; 0 for none.
  std::vector<int64_t> train_peak_per_rank, eval_peak_per_rank;
  int64_t timeline_step = 0;
  bool has_estimate = false;
  std::string estimate_error;
  MemoryEstimate estimate;
};

RunRecord read_run(const std::string& dir);

// The run's label made safe for a file name.
std::string file_label(const std::string& label);
std::string format_ratio(double value);                         // "+1.23 %"
std::string format_number(double value, const char* format);   // snprintf
int64_t largest_peak(const RunRecord& run);                     // the largest rank's measured peak
int64_t largest_estimate(const RunRecord& run);                 // the largest rank's estimated peak
// "" for a finished run, else "unfinished (last step 3 of 200; no end record in metrics.jsonl: still
// running, or killed)" or "preempted at step 3 of 200".
std::string unfinished_note(const RunRecord& run);
// The final loss, or the last step's marked as not final: "2.3456 (unfinished, last step 3 of 200)".
std::string final_loss_text(const RunRecord& run);
// Writes a whole file through write_file_atomically (common/output_files.h): a path that exists and
// is not a regular file is refused, and a failed write is a UserError naming the file and --out.
void write_file(const std::string& path, const std::string& content);

}  // namespace llm
