// Checkpoint files of a run: enough to resume exactly (same losses as an uninterrupted run).
//
// A checkpoint is a folder, written as FOLDER.tmp and renamed when complete, so a crash mid-save never
// leaves a half checkpoint under the final name:
//   model.pt            {HF parameter name: fp32 tensor}, torch.save format (Python: torch.load)
//   optimizer.pt        the optimizer's state_dict, same format
//   trainer_state.json  step, samples consumed, tokens seen, the model config, the run's seed and
//                       run id (written last)
// Every write is checked; a failed save removes FOLDER.tmp and is a UserError naming the file, so
// the previous checkpoint stays the newest. Every file, FOLDER.tmp before the rename and the save_dir
// after it are fsynced, so a power loss after "saved" cannot lose the folder or empty its files.
// --keep_last N then removes this run's oldest step folders beyond N (rank 0, after the save).
//
// --continue_from accepts a checkpoint folder or a --save_dir. In a save_dir, "newest" is the highest
// N among folders named exactly step_<N> (digits only: step_20.tmp, step_20.broken, step_x are not
// checkpoints) whose trainer_state.json parses and holds what the loader needs and whose tensor files
// exist; a broken newer folder is skipped with a warning naming it.
//
// Each run has a run id, drawn at a fresh start and kept on resume: a fresh run refuses a --save_dir
// that holds another run's checkpoints (its own would mix with them, and a later resume would pick
// whichever is newest), unless --continue_from names that save_dir.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "trainer/config.h"

namespace llm {

struct Checkpoint {
  std::map<std::string, at::Tensor> model;
  std::map<std::string, at::Tensor> optimizer;
  nlohmann::json trainer_state;
};

// Writes FOLDER.tmp, fsyncs and checks every file, fsyncs FOLDER.tmp, renames it to FOLDER and fsyncs
// the save_dir (and any folder above it this save created). A failure (a failed fsync included) is a
// UserError naming the file and --save_dir; FOLDER.tmp is removed and the new FOLDER never remains.
void save_checkpoint(const std::string& folder,
                     const std::vector<std::pair<std::string, at::Tensor>>& model_tensors,
                     const std::map<std::string, at::Tensor>& optimizer_state,
                     const nlohmann::json& trainer_state);

// --keep_last: once `saved` (a step_<N> folder of a save_dir) is complete, removes the oldest intact
// step_<N> folders of run `run_id` in that save_dir so that at most `keep_last` remain, `saved` among
// them (it is never removed, even beside a higher N left by an earlier part of the run); the others
// kept are the highest N. Another run's folders, folders that are not intact checkpoints, links and
// any other name are never touched. 0 keeps all. A folder that cannot be removed is a warning, not an
// error. Returns the folders removed.
std::vector<std::string> remove_old_checkpoints(const std::string& saved, const std::string& run_id,
                                                int64_t keep_last);

// A fresh run's id: 16 hex digits from the system's random source.
std::string new_run_id();

// Why FOLDER cannot be resumed from, or "" when it can: trainer_state.json missing, not JSON, or
// without step, samples_consumed, tokens_seen (integers) or model; model.pt or optimizer.pt missing
// or empty.
std::string checkpoint_problem(const std::string& folder);

// Resolves --continue_from: a folder holding trainer_state.json is the checkpoint itself; otherwise
// the newest intact step_<N> folder of it (see above). Each skipped folder is appended to `skipped`
// ("FOLDER: reason"). Throws UserError when no intact checkpoint is there.
std::string resolve_checkpoint_folder(const std::string& path, std::vector<std::string>* skipped = nullptr);

// What start-up learns about checkpoints, before anything is built or written.
struct CheckpointStart {
  std::string resume_folder;  // --continue_from resolved to one checkpoint folder; "" for a fresh run
  int64_t resume_step = 0;    // its step
  std::string run_id;         // its run id; "" for a fresh run or a checkpoint older than run ids
};

// The start-up checks of --continue_from and --save_dir, on every rank (warnings logged when
// `log_warnings`): --continue_from resolves to an intact checkpoint of this model config whose step is
// at most --num_training_steps; --save_dir (or, when missing, the folder it would be created in) can
// be written (a probe file, removed at once), and holds no checkpoint of another run unless
// --continue_from names it. Each failure is a UserError naming the flag and the folder.
CheckpointStart check_checkpoints_at_start(const RunConfig& run, const ModelConfig& model, bool log_warnings);

// UserError naming the checkpoint folder when its trainer_state.json's model config is not `model`'s,
// with the keys that differ.
void require_same_model(const std::string& folder, const nlohmann::json& trainer_state, const ModelConfig& model);

// Throws UserError naming the folder and file for a missing or unreadable file.
Checkpoint load_checkpoint(const std::string& folder);

}  // namespace llm
