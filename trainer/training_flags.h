// The training flags of `trainer` (and of `trainer estimate`, whose command line falls through to
// them): add_training_flags adds them group by group, in the order `trainer --help` lists them, and
// apply_training_flags turns what was parsed into the RunConfig: GaLore's and AdamW-SN's spellings
// and the warnings where their defaults differ, the checks CLI11 cannot make (a flag of another
// optimizer, --activation_checkpointing against --activation_checkpointing_every), and the values
// read apart (the enums, --warmup_steps). Ranges and rules that need the model or the world size
// are validate_run_config's (config/config.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "config/config.h"
#include "trainer/flag_values.h"

namespace llm {

// What the training flags read outside RunConfig, and the options asked about after parsing. The
// options hold pointers into it: it stays where it was made until parsing is over.
struct TrainingFlags {
  explicit TrainingFlags(const RunConfig& defaults);
  TrainingFlags(const TrainingFlags&) = delete;
  TrainingFlags& operator=(const TrainingFlags&) = delete;

  // Records OPTION as a training flag (another verb given one refuses it) and returns it.
  CLI::Option* add(CLI::Option* option) {
    all.push_back(option);
    return option;
  }
  // Records OPTION as a training flag of optimizer OWNER only.
  void for_optimizer(const std::string& owner, CLI::Option* option) { of_optimizer.emplace_back(add(option), owner); }

  std::vector<CLI::Option*> all;  // every training flag, in --help's order
  // Flags of one optimizer, with its name: given with another, they would silently do nothing.
  std::vector<std::pair<CLI::Option*, std::string>> of_optimizer;

  // GaLore's and AdamW-SN's torchrun_main spellings (README "Command lines from GaLore and
  // AdamW-SN"): kept apart from ours so apply_training_flags knows such a command line was given.
  std::vector<CLI::Option*> reference;
  std::string model_config;
  double beta1 = 0;
  int64_t max_train_tokens = 0;
  bool single_gpu = false, use_subset_norm_heuristics = false;

  // Read as given, then turned into RunConfig fields by apply_training_flags.
  bool activation_checkpointing = false;
  int64_t checkpoint_every = 0;
  CLI::Option* checkpointing_flag = nullptr;
  CLI::Option* checkpoint_every_flag = nullptr;
  int64_t warmup_steps = 0;  // run.optimizer.warmup_steps stays unset unless the flag is given
  CLI::Option* warmup_flag = nullptr;
  bool no_prefetch;
  EnumFlag<ShardingStrategy> sharding;
  EnumFlag<Offload> offload;
  EnumFlag<OffloadStep> offload_step;
  EnumFlag<CommunicatorChoice> communicator;
  EnumFlag<Scheduler> scheduler;
  EnumFlag<DType> dtype;
  EnumFlag<Precision> precision;
  EnumFlag<DeviceChoice> device;
};

// Adds every training flag to APP, bound to RUN's fields or to FLAGS; the numbers through NUMBERS.
void add_training_flags(CLI::App& app, NumberFlags& numbers, TrainingFlags& flags, RunConfig& run);

// After parsing a training or estimate (ESTIMATE) command line: GaLore's and AdamW-SN's spellings
// into RUN, a warning in WARNINGS where their defaults differ from ours, then the checks CLI11
// cannot make (a UserError naming the flag) and FLAGS' values into RUN.
void apply_training_flags(const CLI::App& app, const TrainingFlags& flags, bool estimate, RunConfig& run,
                          std::vector<std::string>& warnings);

}  // namespace llm
