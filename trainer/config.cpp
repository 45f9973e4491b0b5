#include "trainer/config.h"

#include <cmath>
#include <filesystem>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace llm {

using nlohmann::json;

const char* to_string(Scheduler value) {
  switch (value) {
    case Scheduler::cosine: return "cosine";
    case Scheduler::linear: return "linear";
    case Scheduler::constant: return "constant";
  }
  return "?";
}

const char* to_string(DType value) {
  switch (value) {
    case DType::float32: return "float32";
    case DType::bfloat16: return "bfloat16";
  }
  return "?";
}

const char* to_string(DeviceChoice value) {
  switch (value) {
    case DeviceChoice::auto_select: return "auto";
    case DeviceChoice::cpu: return "cpu";
    case DeviceChoice::cuda: return "cuda";
  }
  return "?";
}

const char* to_string(Precision value) {
  switch (value) {
    case Precision::pure: return "pure";
    case Precision::mixed: return "mixed";
  }
  return "?";
}

json RunConfig::to_json() const {
  return json{
      {"config", config_path},
      {"lr", lr},
      {"batch_size", batch_size},
      {"total_batch_size", total_batch_size},
      {"gradient_accumulation", gradient_accumulation},
      {"max_length", max_length},
      {"num_training_steps", num_training_steps},
      {"warmup_steps", warmup_steps},
      {"scheduler", to_string(scheduler)},
      {"min_lr_ratio", min_lr_ratio},
      {"weight_decay", weight_decay},
      {"grad_clipping", grad_clipping},
      {"adam_beta1", adam_beta1},
      {"adam_beta2", adam_beta2},
      {"adam_eps", adam_eps},
      {"dtype", to_string(dtype)},
      {"precision", to_string(precision)},
      {"optimizer", optimizer},
      {"subset_size", subset_size},
      {"subset_norm_params", subset_norm_params},
      {"rank", galore_rank},
      {"update_proj_gap", update_proj_gap},
      {"galore_scale", galore_scale},
      {"proj_type", proj_type},
      {"galore_stagger", galore_stagger},
      {"galore_projector", galore_projector},
      {"subspace_iterations", subspace_iterations},
      {"seed", seed},
      {"data", data},
      {"eval_fraction", eval_fraction},
      {"eval_every", eval_every},
      {"eval_batches", eval_batches},
      {"save_every", save_every},
      {"save_dir", save_dir},
      {"continue_from", continue_from},
      {"run_dir", run_dir},
      {"device", to_string(device)},
      {"sharding", llm::to_string(sharding)},
      {"prefetch", prefetch},
      {"log_every", log_every},
      {"print_config", print_config},
      {"memory_snapshot", memory_snapshot},
  };
}

RunConfig run_config_from_json(const json& object, const std::string& source) {
  RunConfig run;
  if (!object.is_object()) fail_user(source, "run", "expected a JSON object of run settings (got " + describe_json_value(object) + ")");
  auto read = [&](const char* key, auto& field) {
    auto found = object.find(key);
    if (found == object.end() || found->is_null()) return;
    try {
      field = found->get<std::remove_reference_t<decltype(field)>>();
    } catch (const json::exception&) {
      fail_user(source, std::string("run.") + key, "has the wrong type (got " + describe_json_value(*found) + ")");
    }
  };
  // Enums are written by to_string(); read them back through the same spellings.
  auto read_enum = [&](const char* key, auto& field, auto... values) {
    std::string text;
    read(key, text);
    if (text.empty()) return;
    bool matched = false;
    ((text == to_string(values) ? (field = values, matched = true) : false), ...);
    if (!matched) fail_user(source, std::string("run.") + key, "unknown value \"" + text + "\"");
  };
  read("config", run.config_path);
  read("lr", run.lr);
  read("batch_size", run.batch_size);
  read("total_batch_size", run.total_batch_size);
  read("gradient_accumulation", run.gradient_accumulation);
  read("max_length", run.max_length);
  read("num_training_steps", run.num_training_steps);
  read("warmup_steps", run.warmup_steps);
  read_enum("scheduler", run.scheduler, Scheduler::cosine, Scheduler::linear, Scheduler::constant);
  read("min_lr_ratio", run.min_lr_ratio);
  read("weight_decay", run.weight_decay);
  read("grad_clipping", run.grad_clipping);
  read("adam_beta1", run.adam_beta1);
  read("adam_beta2", run.adam_beta2);
  read("adam_eps", run.adam_eps);
  read_enum("dtype", run.dtype, DType::float32, DType::bfloat16);
  read_enum("precision", run.precision, Precision::pure, Precision::mixed);
  read("optimizer", run.optimizer);
  read("subset_size", run.subset_size);
  read("subset_norm_params", run.subset_norm_params);
  read("rank", run.galore_rank);
  read("update_proj_gap", run.update_proj_gap);
  read("galore_scale", run.galore_scale);
  read("proj_type", run.proj_type);
  read("galore_stagger", run.galore_stagger);
  read("galore_projector", run.galore_projector);
  read("subspace_iterations", run.subspace_iterations);
  read("seed", run.seed);
  read("data", run.data);
  read("eval_fraction", run.eval_fraction);
  read("eval_every", run.eval_every);
  read("eval_batches", run.eval_batches);
  read("save_every", run.save_every);
  read("save_dir", run.save_dir);
  read("continue_from", run.continue_from);
  read("run_dir", run.run_dir);
  read_enum("device", run.device, DeviceChoice::auto_select, DeviceChoice::cpu, DeviceChoice::cuda);
  read_enum("sharding", run.sharding, ShardingStrategy::full_shard, ShardingStrategy::shard_grad_op,
            ShardingStrategy::no_shard);
  read("prefetch", run.prefetch);
  read("log_every", run.log_every);
  read("print_config", run.print_config);
  read("memory_snapshot", run.memory_snapshot);
  return run;
}

namespace {

// Range checks for one flag: "command line: --FLAG: expected ... (got X)".
constexpr const char* kCommandLine = "command line";

void require_flag(bool ok, const char* flag, const std::string& expected, const std::string& got) {
  if (!ok) fail_user(kCommandLine, flag, "expected " + expected + " (got " + got + ")");
}
void require_flag(bool ok, const char* flag, const std::string& expected, double got) {
  require_flag(ok, flag, expected, format_number(got));
}
void require_flag(bool ok, const char* flag, const std::string& expected, int64_t got) {
  require_flag(ok, flag, expected, std::to_string(got));
}

}  // namespace

void validate_run_config(RunConfig& run, const ModelConfig& model, int world_size) {
  namespace fs = std::filesystem;
  if (world_size < 1)
    throw std::invalid_argument("validate_run_config: world_size must be >= 1, got " +
                                std::to_string(world_size));

  require_flag(std::isfinite(run.lr) && run.lr > 0, "--lr", "a finite number > 0", run.lr);
  require_flag(run.batch_size >= 1, "--batch_size", "an integer >= 1 (sequences per rank)",
               run.batch_size);
  require_flag(run.max_length >= 2, "--max_length",
               "an integer >= 2 (each sequence needs an input and a next-token target)",
               run.max_length);
  if (run.max_length > model.max_position_embeddings)
    fail_user(kCommandLine, "--max_length",
              "expected at most the model's max_position_embeddings = " +
                  std::to_string(model.max_position_embeddings) + " from " +
                  (run.config_path.empty() ? model.name : run.config_path) + " (got " +
                  std::to_string(run.max_length) + ")");
  require_flag(run.num_training_steps >= 1, "--num_training_steps", "an integer >= 1",
               run.num_training_steps);
  require_flag(run.warmup_steps >= 0 && run.warmup_steps <= run.num_training_steps,
               "--warmup_steps",
               "an integer in [0, --num_training_steps = " +
                   std::to_string(run.num_training_steps) + "]",
               run.warmup_steps);
  require_flag(run.min_lr_ratio >= 0 && run.min_lr_ratio <= 1, "--min_lr_ratio",
               "a number in [0, 1]", run.min_lr_ratio);
  require_flag(std::isfinite(run.weight_decay) && run.weight_decay >= 0, "--weight_decay",
               "a finite number >= 0", run.weight_decay);
  require_flag(std::isfinite(run.grad_clipping) && run.grad_clipping >= 0, "--grad_clipping",
               "a finite number >= 0 (0 turns clipping off)", run.grad_clipping);
  require_flag(run.adam_beta1 >= 0 && run.adam_beta1 < 1, "--adam_beta1", "a number in [0, 1)",
               run.adam_beta1);
  require_flag(run.adam_beta2 > 0 && run.adam_beta2 < 1, "--adam_beta2", "a number in (0, 1)",
               run.adam_beta2);
  require_flag(run.eval_fraction > 0 && run.eval_fraction < 1, "--eval_fraction",
               "a number in (0, 1)", run.eval_fraction);
  require_flag(run.eval_every >= 0, "--eval_every", "an integer >= 0 (0 = only at the end)",
               run.eval_every);
  require_flag(run.eval_batches >= 1, "--eval_batches", "an integer >= 1", run.eval_batches);
  require_flag(run.save_every >= 0, "--save_every", "an integer >= 0 (0 = only at the end)",
               run.save_every);
  require_flag(run.log_every >= 1, "--log_every", "an integer >= 1", run.log_every);
  require_flag(!run.run_dir.empty(), "--run_dir", "a folder path", std::string("\"\""));

  // Batching, as GaLore's torchrun_main: total = batch_size * world_size * gradient_accumulation.
  const int64_t sequences_per_micro_step = run.batch_size * world_size;
  require_flag(run.total_batch_size >= 0, "--total_batch_size",
               "0 (= batch_size * world_size) or a positive multiple of batch_size * world_size",
               run.total_batch_size);
  if (run.total_batch_size == 0) run.total_batch_size = sequences_per_micro_step;
  if (run.total_batch_size % sequences_per_micro_step != 0)
    fail_user(kCommandLine, "--total_batch_size",
              "expected a multiple of --batch_size * world size = " +
                  std::to_string(run.batch_size) + " * " + std::to_string(world_size) + " = " +
                  std::to_string(sequences_per_micro_step) + ", i.e. one of " +
                  std::to_string(sequences_per_micro_step) + ", " +
                  std::to_string(2 * sequences_per_micro_step) + ", " +
                  std::to_string(3 * sequences_per_micro_step) +
                  ", ... (or change --batch_size) (got " + std::to_string(run.total_batch_size) +
                  ")");
  run.gradient_accumulation = run.total_batch_size / sequences_per_micro_step;

  require_flag(run.optimizer == "adamw" || run.optimizer == "adamw_sn" || run.optimizer == "galore_adamw",
               "--optimizer", "one of adamw, adamw_sn, galore_adamw", "\"" + run.optimizer + "\"");
  if (run.adam_eps < 0) run.adam_eps = run.optimizer == "adamw" ? 1e-8 : 1e-6;
  require_flag(std::isfinite(run.adam_eps) && run.adam_eps > 0, "--adam_eps",
               "a finite number > 0", run.adam_eps);
  require_flag(run.subset_norm_params == "linear" || run.subset_norm_params == "all",
               "--subset_norm_params", "linear or all", "\"" + run.subset_norm_params + "\"");
  require_flag(run.galore_rank >= 1, "--rank", "an integer >= 1 (GaLore's projection rank)", run.galore_rank);
  require_flag(run.update_proj_gap >= 1, "--update_proj_gap",
               "an integer >= 1 (steps between projector updates)", run.update_proj_gap);
  require_flag(std::isfinite(run.galore_scale) && run.galore_scale > 0, "--galore_scale",
               "a finite number > 0", run.galore_scale);
  require_flag(run.galore_projector == "svd" || run.galore_projector == "subspace", "--galore_projector",
               "svd or subspace", "\"" + run.galore_projector + "\"");
  require_flag(run.subspace_iterations >= 1, "--subspace_iterations", "an integer >= 1",
               run.subspace_iterations);
  require_flag(run.proj_type == "std" || run.proj_type == "reverse_std" || run.proj_type == "left" ||
                   run.proj_type == "right",
               "--proj_type", "one of std, reverse_std, left, right", "\"" + run.proj_type + "\"");

  if (!run.continue_from.empty() && !fs::is_directory(run.continue_from))
    fail_user(kCommandLine, "--continue_from",
              "expected an existing checkpoint folder (got \"" + run.continue_from + "\", which " +
                  (fs::exists(run.continue_from) ? "is not a folder" : "does not exist") + ")");
  if (run.data != "synthetic" && !fs::is_regular_file(run.data))
    fail_user(kCommandLine, "--data",
              "expected \"synthetic\" or an existing token file made by `trainer prepare` (got \"" +
                  run.data + "\", which is not a file)");
}

}  // namespace llm
