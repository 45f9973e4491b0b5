#include "config/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
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

const char* to_string(Offload value) {
  switch (value) {
    case Offload::none: return "none";
    case Offload::optimizer: return "optimizer";
    case Offload::parameters: return "parameters";
    case Offload::optimizer_and_parameters: return "optimizer,parameters";
  }
  return "?";
}

const char* to_string(CommunicatorChoice value) {
  switch (value) {
    case CommunicatorChoice::auto_select: return "auto";
    case CommunicatorChoice::nccl: return "nccl";
    case CommunicatorChoice::mpi: return "mpi";
  }
  return "?";
}

const char* to_string(OffloadStep value) {
  switch (value) {
    case OffloadStep::host: return "host";
    case OffloadStep::speculative: return "speculative";
    case OffloadStep::device: return "device";
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
      {"lr", optimizer.lr},
      {"batch_size", data.batch_size},
      {"total_batch_size", data.total_batch_size},
      {"gradient_accumulation", data.gradient_accumulation},
      {"max_length", data.max_length},
      {"num_training_steps", num_training_steps},
      {"max_train_tokens", max_train_tokens},
      {"divergence_patience", divergence_patience},
      {"collective_timeout", collective_timeout},
      {"preemption_grace_seconds", preemption_grace_seconds},
      {"stop_at_step", stop_at_step},
      {"max_runtime", max_runtime},
      {"skip_memory_check", skip_memory_check},
      {"activation_checkpointing_every", activation_checkpointing_every},
      {"fuse_optimizer_with_backward", fuse_optimizer_with_backward},
      {"warmup_steps", optimizer.warmup_steps ? json(*optimizer.warmup_steps) : json(nullptr)},  // null: not yet resolved
      {"scheduler", to_string(optimizer.scheduler)},
      {"min_lr_ratio", optimizer.min_lr_ratio},
      {"weight_decay", optimizer.weight_decay},
      {"grad_clipping", optimizer.grad_clipping},
      {"adam_beta1", optimizer.adam_beta1},
      {"adam_beta2", optimizer.adam_beta2},
      {"adam_eps", optimizer.adam_eps},
      {"dtype", to_string(precision.dtype)},
      {"precision", to_string(precision.mode)},
      {"optimizer", optimizer.name},
      {"subset_size", optimizer.subset_size},
      {"subset_norm_params", optimizer.subset_norm_params},
      {"rank", optimizer.galore_rank},
      {"update_proj_gap", optimizer.update_proj_gap},
      {"galore_scale", optimizer.galore_scale},
      {"proj_type", optimizer.proj_type},
      {"galore_stagger", optimizer.galore_stagger},
      {"galore_projector", optimizer.galore_projector},
      {"subspace_iterations", optimizer.subspace_iterations},
      {"optimizer_state_dtype", optimizer.state_dtype},
      {"seed", seed},
      {"data", data.source},
      {"eval_data", data.eval_source},
      {"allow_other_data", data.allow_other_data},
      {"window_start", data.window_start},
      {"recompute", recompute},
      {"fused_ops", fused_ops},
      {"pad_matmul_dims", pad_matmul_dims},
      {"grouped_projections", grouped_projections},
      {"memmap_dtype", data.memmap_dtype},
      {"eval_fraction", data.eval_fraction},
      {"eval_every", data.eval_every},
      {"eval_sequences", data.eval_sequences},
      {"eval_tokens", data.eval_tokens},
      {"eval_batches", data.eval_batches},
      {"save_every", checkpoint.save_every},
      {"save_dir", checkpoint.save_dir},
      {"keep_last", checkpoint.keep_last},
      {"async_save", checkpoint.async_save},
      {"continue_from", checkpoint.continue_from},
      {"allow_changed_flags", checkpoint.allow_changed_flags},
      {"init_from", checkpoint.init_from},
      {"run_dir", logging.run_dir},
      {"device", to_string(device)},
      {"sharding", llm::to_string(sharding.strategy)},
      {"shard_group_size", sharding.group_size},
      {"backward_gather_size", sharding.backward_gather_size},
      {"shard_optimizer_across_groups", sharding.optimizer_across_groups},
      {"prefetch", sharding.prefetch},
      {"offload", to_string(sharding.offload)},
      {"offload_threads", sharding.offload_threads},
      {"offload_delayed_update", sharding.offload_delayed_update},
      {"offload_step", to_string(sharding.offload_step)},
      {"communicator", to_string(sharding.communicator)},
      {"log_every", logging.log_every},
      {"print_config", logging.print_config},
      {"memory_snapshot", logging.memory_snapshot},
      {"offload_trace", logging.offload_trace},
      {"on_write_error", logging.on_write_error},
      {"name", logging.name},
      {"tags", logging.tags},
      {"tensorboard_dir", logging.tensorboard_dir},
      {"peak_tflops", logging.peak_tflops},
  };
}

RunConfig run_config_from_json(const json& object, const std::string& source) {
  RunConfig run;
  if (!object.is_object()) fail_user(source, "run", "expected a JSON object of run settings (got " + describe_json_value(object) + ")");
  // Numbers are read whole: nlohmann's get<int64_t>() would truncate 2.5 to 2 and wrap 2^64-1 to -1.
  auto read = [&](const char* key, auto& field) {
    using Field = std::remove_reference_t<decltype(field)>;
    auto found = object.find(key);
    if (found == object.end() || found->is_null()) return;
    const auto wrong = [&](const std::string& expected) {
      fail_user(source, std::string("run.") + key, "expected " + expected + " (got " + describe_json_value(*found) + ")");
    };
    if constexpr (std::is_integral_v<Field> && !std::is_same_v<Field, bool>) {
      if (!found->is_number_integer()) wrong("an integer");
      const bool fits = found->is_number_unsigned()
                            ? found->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<Field>::max())
                            : found->get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<Field>::min());
      if (!fits)
        wrong("an integer from " + std::to_string(std::numeric_limits<Field>::min()) + " to " +
              std::to_string(std::numeric_limits<Field>::max()));
    } else if constexpr (std::is_floating_point_v<Field>) {
      if (!found->is_number()) wrong("a number");
    }
    try {
      field = found->get<Field>();
    } catch (const json::exception&) {
      wrong(std::is_same_v<Field, bool> ? "true or false" : std::is_same_v<Field, std::string> ? "a string" : "a list of strings");
    }
  };
  // Enums are written by to_string(); read them back through the same spellings (config.h's lists).
  auto read_enum = [&](const char* key, auto& field, const auto& values) {
    std::string text;
    read(key, text);
    if (text.empty()) return;
    const auto match =
        std::find_if(values.begin(), values.end(), [&](auto value) { return text == to_string(value); });
    if (match == values.end()) fail_user(source, std::string("run.") + key, "unknown value \"" + text + "\"");
    field = *match;
  };
  read("config", run.config_path);
  read("lr", run.optimizer.lr);
  read("batch_size", run.data.batch_size);
  read("total_batch_size", run.data.total_batch_size);
  read("gradient_accumulation", run.data.gradient_accumulation);
  read("max_length", run.data.max_length);
  read("num_training_steps", run.num_training_steps);
  read("max_train_tokens", run.max_train_tokens);
  read("divergence_patience", run.divergence_patience);
  read("collective_timeout", run.collective_timeout);
  read("preemption_grace_seconds", run.preemption_grace_seconds);
  read("stop_at_step", run.stop_at_step);
  read("max_runtime", run.max_runtime);
  read("skip_memory_check", run.skip_memory_check);
  read("activation_checkpointing_every", run.activation_checkpointing_every);
  read("fuse_optimizer_with_backward", run.fuse_optimizer_with_backward);
  int64_t warmup_steps = -1;
  read("warmup_steps", warmup_steps);
  if (object.contains("warmup_steps") && !object.at("warmup_steps").is_null()) run.optimizer.warmup_steps = warmup_steps;
  read_enum("scheduler", run.optimizer.scheduler, kSchedulerValues);
  read("min_lr_ratio", run.optimizer.min_lr_ratio);
  read("weight_decay", run.optimizer.weight_decay);
  read("grad_clipping", run.optimizer.grad_clipping);
  read("adam_beta1", run.optimizer.adam_beta1);
  read("adam_beta2", run.optimizer.adam_beta2);
  read("adam_eps", run.optimizer.adam_eps);
  read_enum("dtype", run.precision.dtype, kDTypeValues);
  read_enum("precision", run.precision.mode, kPrecisionValues);
  read("optimizer", run.optimizer.name);
  read("subset_size", run.optimizer.subset_size);
  read("subset_norm_params", run.optimizer.subset_norm_params);
  read("rank", run.optimizer.galore_rank);
  read("update_proj_gap", run.optimizer.update_proj_gap);
  read("galore_scale", run.optimizer.galore_scale);
  read("proj_type", run.optimizer.proj_type);
  read("galore_stagger", run.optimizer.galore_stagger);
  read("galore_projector", run.optimizer.galore_projector);
  read("subspace_iterations", run.optimizer.subspace_iterations);
  read("optimizer_state_dtype", run.optimizer.state_dtype);
  read("seed", run.seed);
  read("data", run.data.source);
  read("eval_data", run.data.eval_source);
  read("allow_other_data", run.data.allow_other_data);
  read("allow_changed_flags", run.checkpoint.allow_changed_flags);
  read("window_start", run.data.window_start);
  read("recompute", run.recompute);
  read("fused_ops", run.fused_ops);
  read("pad_matmul_dims", run.pad_matmul_dims);
  read("grouped_projections", run.grouped_projections);
  read("memmap_dtype", run.data.memmap_dtype);
  read("eval_fraction", run.data.eval_fraction);
  read("eval_every", run.data.eval_every);
  read("eval_sequences", run.data.eval_sequences);
  read("eval_tokens", run.data.eval_tokens);
  read("eval_batches", run.data.eval_batches);
  read("save_every", run.checkpoint.save_every);
  read("save_dir", run.checkpoint.save_dir);
  read("keep_last", run.checkpoint.keep_last);
  read("async_save", run.checkpoint.async_save);
  read("continue_from", run.checkpoint.continue_from);
  read("init_from", run.checkpoint.init_from);
  read("run_dir", run.logging.run_dir);
  read_enum("device", run.device, kDeviceChoiceValues);
  read_enum("sharding", run.sharding.strategy, kShardingValues);
  read("shard_group_size", run.sharding.group_size);
  read("backward_gather_size", run.sharding.backward_gather_size);
  read("shard_optimizer_across_groups", run.sharding.optimizer_across_groups);
  read("prefetch", run.sharding.prefetch);
  if (object.contains("offload") && object["offload"] == kOffloadBothReversed)
    run.sharding.offload = Offload::optimizer_and_parameters;
  else
    read_enum("offload", run.sharding.offload, kOffloadValues);
  read("offload_threads", run.sharding.offload_threads);
  read("offload_delayed_update", run.sharding.offload_delayed_update);
  read_enum("offload_step", run.sharding.offload_step, kOffloadStepValues);
  read_enum("communicator", run.sharding.communicator, kCommunicatorValues);
  read("log_every", run.logging.log_every);
  read("print_config", run.logging.print_config);
  read("memory_snapshot", run.logging.memory_snapshot);
  read("offload_trace", run.logging.offload_trace);
  read("on_write_error", run.logging.on_write_error);
  if (!is_choice(run.logging.on_write_error, kWriteErrorChoices))
    fail_user(source, "on_write_error", "expected \"stop\" or \"warn\" (got \"" + run.logging.on_write_error + "\")");
  read("name", run.logging.name);
  read("tags", run.logging.tags);
  read("tensorboard_dir", run.logging.tensorboard_dir);
  read("peak_tflops", run.logging.peak_tflops);
  return run;
}

namespace {

// create_run_dir's errors name the flag: "command line: --run_dir: ...".

}  // namespace

void create_run_dir(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  const std::string what_to_pass = "pass a folder for the run's outputs (created when missing)";
  // The longest part of the path that exists must be a folder: a file there is the usual mistake.
  fs::path existing = run_dir;
  while (!existing.empty() && !fs::exists(existing, error)) existing = existing.parent_path();
  if (!existing.empty() && !fs::is_directory(existing, error))
    fail_user(kCommandLine, "--run_dir",
              existing == fs::path(run_dir)
                  ? "\"" + run_dir + "\" is an existing file, not a folder; " + what_to_pass
                  : "\"" + run_dir + "\" goes through \"" + existing.string() + "\", which is a file, not a "
                    "folder; " + what_to_pass);
  fs::create_directories(run_dir, error);
  if (error)
    fail_user(kCommandLine, "--run_dir",
              "cannot create \"" + run_dir + "\" (" + error.message() + "); " + what_to_pass +
                  " somewhere you can write");
  if (const std::string problem = folder_write_problem(run_dir); !problem.empty())
    fail_user(kCommandLine, "--run_dir",
              "cannot write into \"" + run_dir + "\" (" + problem + "); " + what_to_pass +
                  " somewhere you can write");
}

std::string folder_write_problem(const std::string& folder) {
  // Each rank its own name (host and pid): ranks probe the same folder at the same time.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string probe = (std::filesystem::path(folder) /
                             (".trainer_write_probe." + std::string(host) + "." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return std::strerror(errno);
  const bool written = ::write(fd, "x", 1) == 1;
  const std::string problem = written ? "" : std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return problem;
}

}  // namespace llm
