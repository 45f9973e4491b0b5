// The command line: `trainer --config FILE [flags]` trains, `trainer prepare ...` makes a token file,
// `trainer report RUN_DIR...` aggregates the memory ledgers of run folders, and `trainer estimate
// --config FILE [training flags] --world_size N` predicts each rank's peak memory without running;
// `trainer export --from CHECKPOINT --to DIR` writes a checkpoint as a transformers folder.
//
// Parsing only turns argv into a RunConfig / PrepareOptions with CLI11 (flag names follow GaLore's
// torchrun_main.py where one exists); it checks syntax (known flags, numbers, choices) but not ranges
// or cross-field rules. main() then loads the model config and calls validate_run_config, which
// needs the model (max_length <= max_position_embeddings) and the world size.
//
// Every number is read whole by one strict reader (not CLI11's conversion): decimal digits only (010 is
// ten, 0x10 and +5 are not numbers), no clamping or wrapping (99999999999999999999 for an int64 flag,
// -1 for --seed, 10000000000B for --max_train_tokens are errors), finite (inf, nan and 1e999 are
// errors). An error names the flag, the text as typed and the range.
//
// --help is not an error: parse_command_line returns Kind::help with the help text, and main prints
// it and exits 0. Every syntax error is a UserError naming the flag.
//
// A flag given twice takes the last value, as argparse and torchrun users expect, so a launcher's
// defaults can be overridden by appending flags (launch/train.sh passes its own --batch_size first);
// a flag repeated with different values is reported in Command::warnings. List-valued options
// (`prepare --input`, `report RUN_DIR...`) keep every value.
//
// GaLore's and AdamW-SN's torchrun_main spellings (--model_config, --beta1, --gradient_accumulation,
// --max_train_tokens, --use_subset_norm_heuristics, --single_gpu, --name, --tags) are accepted; where
// their defaults or meanings differ from ours (pure bf16, no clipping, max_length 256, ...), ours win
// and Command::warnings says which flag gives theirs. Their optimizers we lack are a UserError naming
// the nearest flags (unknown_optimizer_reason).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/config.h"
#include "data/prepare.h"
#include "checkpoint/interchange/export.h"
#include "memory/estimate.h"

namespace llm {

struct ReportOptions {
  std::vector<std::string> run_dirs;  // run folders (each with metrics.jsonl and memory.rank<R>.jsonl)
  std::string out = "memory_report";  // writes OUT/memory_report.md and OUT/memory/*.svg
  // --techniques: run_dirs are technique runs (the first of each world size its baseline) and the
  // report is OUT/techniques.md and OUT/techniques/*.svg (memory/techniques.h), with the
  // --context_sweep runs' section when there are any.
  bool techniques = false;
  std::vector<std::string> context_sweep;
};

struct Command {
  enum class Kind { train, prepare, report, estimate, export_model, help } kind = Kind::train;
  RunConfig run;           // Kind::train and Kind::estimate
  PrepareOptions prepare;  // Kind::prepare
  ReportOptions report;    // Kind::report
  EstimateOptions estimate;  // Kind::estimate
  ExportOptions export_options;  // Kind::export_model (`trainer export`)
  std::string help_text;   // Kind::help: what `--help` prints (for `prepare --help`, its own flags)
  // "command line: --batch_size given 2 times (8, 16); using the last, 16": main logs them on rank 0.
  std::vector<std::string> warnings;
};

// Throws UserError ("command line: ..." naming the flag) on unknown flags, values that are not
// numbers or do not fit the flag's type, choices outside their list, --activation_checkpointing
// with a different --activation_checkpointing_every, a missing --config for training, for `prepare` a missing
// --input / --output, not exactly one of --tokenizer / --vocab_size or a --vocab_size outside
// [4, 2^31-1], and for `estimate` a --world_size, --ranks_per_node, --memory_budget_gib or
// --node_memory_gib outside its range (said in words).
Command parse_command_line(int argc, const char* const* argv);

// What --print_config shows: {"model": {"name", "num_parameters", "config": HF keys}, "run": flags}.
nlohmann::json resolved_config_json(const ModelConfig& model, const RunConfig& run);

}  // namespace llm
