// Which of a run's settings decide what it trains, so that a resume may not change them unnoticed
// (issue 44). A checkpoint's manifest keeps the settings that wrote it (manifest["run"], the flat
// object of RunConfig::to_json); a resume with other values of these is refused at start-up naming
// each one, unless --allow_changed_flags says the change is meant.
//
// Compared, because they change the numbers a step computes or the samples it reads:
//   the update: --optimizer, --lr, --warmup_steps, --scheduler, --min_lr_ratio, --weight_decay,
//     --grad_clipping, --adam_beta1, --adam_beta2, --adam_eps, --optimizer_state_dtype, and the
//     optimizers' own (--subset_size, --subset_norm_params, --rank, --update_proj_gap, --galore_scale,
//     --proj_type, --galore_stagger, --galore_projector, --subspace_iterations);
//   the samples: --seed (the data order), --total_batch_size, --max_length, and the held-out split (--eval_fraction without --eval_data; --eval_data given
//     on one side only, which decides whether every window of --data is trained on);
//   the arithmetic: --dtype, --precision, --offload_delayed_update (its late updates are other numbers).
// Compared elsewhere: the model (--config's contents, require_same_model: always refused) and the
// data (--data's shards, their formats as read with --memmap_dtype, and --window_start:
// data/corpus_identity.h, refused unless --allow_other_data). --optimizer is compared here, and a
// resume into another optimizer's state stays refused even with --allow_changed_flags (its state
// does not fit: RunCheckpoints::resume).
// Not compared, because the steps are the same with either value: how the work is laid out
// (world size, --batch_size and --gradient_accumulation at one --total_batch_size, --sharding,
// --offload, --no_prefetch, --communicator, --device, --activation_checkpointing, --recompute,
// --fused_ops, --pad_matmul_dims, --grouped_projections, --offload_threads,
// --fuse_optimizer_with_backward), what is watched and kept
// (--run_dir, --log_every, --eval_every, --eval_sequences/_tokens/_batches, --eval_data's path,
// --tensorboard_dir, --name, --tags, --peak_tflops, --save_every, --save_dir, --keep_last,
// --async_save, --on_write_error, --memory_snapshot), and when it stops (--num_training_steps and
// --max_train_tokens, --stop_at_step, --max_runtime, --divergence_patience, --collective_timeout,
// --preemption_grace_seconds, --skip_memory_check). --num_training_steps is the length of the
// schedule under cosine and linear: training longer (or shorter) is a common, meant change, so it is
// allowed and said (schedule_length_change), and so is --warmup_steps left to its default on both
// sides, which follows it. --precision is not compared when both runs are float32 (it means nothing
// there).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/config.h"

namespace llm {

// One setting a resume would change: the flag (--lr), its value in the checkpoint and in this run,
// as JSON text ("0.01", "\"cosine\"").
struct SettingDifference {
  std::string flag;
  std::string saved;
  std::string now;
};

// The training settings (the list above) whose value in `saved_run` (a manifest's "run" object)
// differs from `run`'s (validated). A key the checkpoint lacks (an older build's) is not compared;
// a `saved_run` that is not an object gives none.
std::vector<SettingDifference> training_setting_differences(const nlohmann::json& saved_run, const RunConfig& run);

// "--lr (the checkpoint's 0.01, this run's 0.02); --seed (...)".
std::string describe_differences(const std::vector<SettingDifference>& differences);

// "" when --num_training_steps is the checkpoint's, or the schedule does not depend on it (constant);
// else a sentence saying that the learning rate from here on follows the new
// length's schedule.
std::string schedule_length_change(const nlohmann::json& saved_run, const RunConfig& run);

}  // namespace llm
