#include "config/training_settings.h"

#include <array>

#include <nlohmann/json.hpp>

namespace llm {

using nlohmann::json;

namespace {

// The keys of RunConfig::to_json (each one its flag's name) that are always compared.
constexpr std::array kTrainingKeys = {
    "optimizer", "lr", "warmup_steps", "scheduler", "min_lr_ratio", "weight_decay", "grad_clipping",
    "adam_beta1", "adam_beta2", "adam_eps", "optimizer_state_dtype", "subset_size", "subset_norm_params",
    "rank", "update_proj_gap", "galore_scale", "proj_type", "galore_stagger", "galore_projector",
    "subspace_iterations", "seed", "total_batch_size", "max_length", "dtype", "precision", "offload_delayed_update"};

bool has_eval_data(const json& run) {
  return run.contains("eval_data") && run.at("eval_data").is_string() && !run.at("eval_data").get<std::string>().empty();
}

}  // namespace

std::vector<SettingDifference> training_setting_differences(const json& saved_run, const RunConfig& run) {
  std::vector<SettingDifference> differences;
  if (!saved_run.is_object()) return differences;
  const json now = run.to_json();
  const auto compare = [&](const char* key) {
    // nlohmann's == compares numbers by value across its integer and float kinds (2 == 2.0).
    if (saved_run.contains(key) && saved_run.at(key) != now.at(key))
      differences.push_back({std::string("--") + key, saved_run.at(key).dump(), now.at(key).dump()});
  };
  for (const char* key : kTrainingKeys) compare(key);
  // The held-out split decides which windows are trained on: --eval_data on one side only, or
  // another --eval_fraction of --data when neither has --eval_data. Its path alone is evaluation's.
  if (saved_run.contains("eval_data") && has_eval_data(saved_run) != has_eval_data(now))
    differences.push_back({"--eval_data", saved_run.at("eval_data").dump(), now.at("eval_data").dump()});
  else if (!has_eval_data(saved_run) && !has_eval_data(now))
    compare("eval_fraction");
  return differences;
}

std::string describe_differences(const std::vector<SettingDifference>& differences) {
  std::string text;
  for (const SettingDifference& difference : differences)
    text += (text.empty() ? "" : "; ") + difference.flag + " (the checkpoint's " + difference.saved + ", this run's " +
            difference.now + ")";
  return text;
}

std::string schedule_length_change(const json& saved_run, const RunConfig& run) {
  if (!saved_run.is_object() || !saved_run.contains("num_training_steps") ||
      saved_run.at("num_training_steps") == json(run.num_training_steps) || run.optimizer.scheduler == Scheduler::constant)
    return "";
  return "--num_training_steps " + std::to_string(run.num_training_steps) + " (the checkpoint's run had " +
         saved_run.at("num_training_steps").dump() + "): the " + to_string(run.optimizer.scheduler) +
         " learning rate from here on follows the schedule of " + std::to_string(run.num_training_steps) + " steps";
}

}  // namespace llm
