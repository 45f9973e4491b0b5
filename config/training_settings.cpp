#include "config/training_settings.h"
#include "common/json_file.h"

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

// The run's --warmup_steps is the default for its --num_training_steps (default_warmup_steps): left
// out, or given as that value, which trains the same.
bool follows_default_warmup(const json& run) {
  const json steps = run.value("num_training_steps", json()), warmup = run.value("warmup_steps", json());
  return steps.is_number_integer() && warmup.is_number_integer() &&
         warmup.get<int64_t>() == default_warmup_steps(steps.get<int64_t>());
}

}  // namespace

std::vector<SettingDifference> training_setting_differences(const json& saved_run, const RunConfig& run) {
  std::vector<SettingDifference> differences;
  if (!saved_run.is_object()) return differences;
  const json now = run.to_json();
  const auto compare = [&](const char* key) {
    // nlohmann's == compares numbers by value across its integer and float kinds (2 == 2.0).
    if (saved_run.contains(key) && saved_run.at(key) != now.at(key))
      differences.push_back({std::string("--") + key, json_excerpt(saved_run.at(key)), json_excerpt(now.at(key))});
  };
  for (const char* key : kTrainingKeys) {
    const std::string name = key;
    // --warmup_steps left to its default on both sides follows --num_training_steps, which a resume
    // may change (schedule_length_change says so); --precision means nothing in float32.
    if (name == "warmup_steps" && follows_default_warmup(saved_run) && follows_default_warmup(now)) continue;
    if (name == "precision" && saved_run.value("dtype", json()) == "float32" && now.at("dtype") == "float32") continue;
    compare(key);
  }
  // The held-out split decides which windows are trained on: --eval_data on one side only, or
  // another --eval_fraction of --data when neither has --eval_data. Its path alone is evaluation's.
  if (saved_run.contains("eval_data") && has_eval_data(saved_run) != has_eval_data(now))
    differences.push_back({"--eval_data", json_excerpt(saved_run.at("eval_data")), json_excerpt(now.at("eval_data"))});
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
  const bool warmup_follows = follows_default_warmup(saved_run) && follows_default_warmup(run.to_json()) &&
                              saved_run.value("warmup_steps", json()) != json(run.optimizer.warmup_steps.value());
  return "--num_training_steps " + std::to_string(run.num_training_steps) + " (the checkpoint's run had " +
         json_excerpt(saved_run.at("num_training_steps")) + "): the " + to_string(run.optimizer.scheduler) +
         " learning rate from here on follows the schedule of " + std::to_string(run.num_training_steps) + " steps" +
         (warmup_follows ? ", with the default --warmup_steps of that length (" + json_excerpt(saved_run.at("warmup_steps")) +
                               " then, " + std::to_string(run.optimizer.warmup_steps.value()) + " now)"
                         : std::string());
}

}  // namespace llm
