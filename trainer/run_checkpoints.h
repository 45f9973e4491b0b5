// The run's checkpoints (checkpoint/checkpoint.h is their format): what a save holds, every rank's
// master rows and optimizer state as views of its buffers (nothing is gathered; under no_shard every
// rank holds the same whole state and rank 0 alone writes it) with the manifest (the position, the
// run id, the settings); saves made in place or on a background thread (--async_save) and completed
// at a later step boundary; --keep_last; and the resume from a checkpoint of any world size.
//
// Training decides when to save (trainer/train_loop.cpp); this decides what and how.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "optim/shard_state.h"

namespace llm {

class BackgroundSave;
class BatchSampler;
class MetricsLog;
class OptimizerOffload;
class ShardOptimizer;
class ShardedModel;
struct RuntimeContext;
struct TrainState;
struct SaveRole;

// The training state a checkpoint holds and a resume fills: views of the Training's own members.
struct CheckpointedState {
  ShardedModel& model;
  OptimizerOffload* offload;   // --offload optimizer: the masters and the optimizer state in host memory; else nullptr
  ShardOptimizer& optimizer;
  TrainState& position;
  BatchSampler& train_batches;  // a resume moves it to the samples the saved run had consumed
};

class RunCheckpoints {
 public:
  RunCheckpoints(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context,
                 CheckpointedState state, MetricsLog& metrics);
  ~RunCheckpoints();  // a background save not yet completed is cancelled (its writer stops between tensors)
  RunCheckpoints(const RunCheckpoints&) = delete;
  RunCheckpoints& operator=(const RunCheckpoints&) = delete;

  // Reads the model's rows, the optimizer state and the position from `folder`, and takes its run id.
  void resume(const std::string& folder);
  // The run id every rank records: the resumed checkpoint's, else the one rank 0 draws.
  void agree_on_run_id();
  const std::string& run_id() const { return run_id_; }
  const std::string& resumed_from() const { return resumed_from_; }  // "" for a fresh run
  // What each save records of the corpus trained on (data/corpus_identity.h; the synthetic corpus's
  // token file, with "synthetic": true), checked by a resume.
  void set_data_identity(nlohmann::json identity) { data_identity_ = std::move(identity); }

  // Saves step `step` and returns its folder; a "checkpoint" record, the log line and --keep_last.
  std::string save(int64_t step);
  // --async_save: copies the state to host memory and writes it on a background thread.
  void start_background_save(int64_t step);
  bool saving_in_background() const { return background_save_ != nullptr; }
  bool background_save_written() const;  // this rank's files of the save in flight are done
  // Completes the save in flight at the end of step `completed_at` (every rank together).
  void finish_background_save(int64_t completed_at);

 private:
  struct Checkpoint {
    std::string folder;
    std::vector<StatePiece> pieces;  // views of this rank's buffers
    nlohmann::json manifest;
  };
  Checkpoint checkpoint_of(int64_t step);
  SaveRole save_role() const;  // which files this rank writes (hybrid: group 0, by shard)
  std::vector<StatePiece> master_pieces(size_t unit) const;
  at::Tensor master(size_t unit) const;  // unit's fp32 master shard (the host master with offload)
  // A save of step `step` completed at the end of step `completed_at`, having held the training loop
  // up `blocked_seconds` in all: a "checkpoint" record, the log line and --keep_last (rank 0).
  void saved(const std::string& folder, int64_t step, int64_t completed_at, double blocked_seconds);

  const ModelConfig& model_config_;
  const RunConfig& run_;
  const RuntimeContext& context_;
  CheckpointedState state_;
  MetricsLog& metrics_;
  std::string run_id_;        // drawn at a fresh start, kept on resume (manifest.json)
  std::string resumed_from_;  // the checkpoint folder resumed from; "" for a fresh run
  nlohmann::json data_identity_;
  at::Tensor save_copy_;  // --async_save: the host copy of this rank's checkpoint, kept from the first save
  std::unique_ptr<BackgroundSave> background_save_;  // --async_save: the save in flight, if any
  int64_t background_save_step_ = 0;
  double background_save_blocked_ = 0;  // seconds the loop spent starting it
};

}  // namespace llm
