// `trainer report RUN_DIR [RUN_DIR ...] [--out DIR]`: reads each run folder's metrics.jsonl (the
// start record names the run: model, optimizer, dtype, sharding, world size; train records give
// tokens/s; the end record the final loss) and memory.rank<R>.jsonl files, and writes
//   OUT/memory_report.md   runs side by side: peak per rank by category, across-rank statistics
//                          with imbalance flags, tokens/s, final loss, estimate beside measured
//   OUT/memory/*.svg       per run, each rank's memory over the peak step stacked by category;
//                          for all runs, the peak per rank per run
// Hand-written SVG (memory/svg.h), no dependencies. A missing folder, a folder without
// metrics.jsonl or without memory ledgers is a UserError naming it (exit 2); so is a damaged file,
// named with its line: empty or truncated, a line that is not a JSON object, a field of the wrong
// type, a world size below 1, a negative byte count, a ledger without a step or with a peak of 0 (a
// report of such a run would hold nonsense percentages).
// A run whose metrics.jsonl has no end record (still running, or killed) is reported as unfinished,
// with its last step of --num_training_steps, in the report and on stdout: its last loss is not a
// final loss. OUT must not be a run folder (its own memory_report.md would be replaced) and must be a
// folder if it exists; every file is written checked (write_file_atomically): exit 2 otherwise.
#pragma once

#include <string>
#include <vector>

namespace llm {

void write_memory_report(const std::vector<std::string>& run_dirs, const std::string& out_dir);

}  // namespace llm
