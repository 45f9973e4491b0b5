// Checkpoint files of a run: sharded (each rank writes only what it holds), atomic, and readable at
// any world size, with enough to resume exactly (same losses as an uninterrupted run).
//
// A checkpoint is a folder, written as FOLDER.tmp and renamed when complete, so a crash mid-save never
// leaves a half checkpoint under the final name:
//   rank<R>.safetensors  rank R's parts of the full tensors, each flat fp32: every parameter's master
//                        rows under its HF name, its part of each optimizer state tensor
//                        ("NAME.exp_avg", "NAME.exp_avg_sq", "NAME.projector": ShardOptimizer)
//   rank<R>.json         the index of rank R's file: per tensor, the full tensor's shape, where the
//                        part begins in it (flattened), its element count and its CRC-32C
//   manifest.json        written last, by rank 0: the run's position (step, samples consumed, tokens
//                        seen, seed: the whole of its random state), run id, world size, optimizer and
//                        its step, model config, the run's settings ("run"), data (the token file's
//                        absolute path, and in "data_file" its size and its first MiB's CRC-32C, so a
//                        resume on other or changed data is said), and every file's size and CRC-32C
// The parts of a full tensor tile it: every element is written by exactly one rank. No rank gathers
// anything to save: each writes views of its own buffers, one tensor at a time (on a GPU, one
// tensor's host copy at a time). Loading, each rank reads from the old ranks' files only the parts
// of its own rows (at any world size), checking each part's CRC-32C as it is read.
//
// Every write is checked and fsynced; a failed save (on any rank) removes FOLDER.tmp and is a
// UserError naming the file, so the previous checkpoint stays the newest. FOLDER.tmp is fsynced
// before the rename and the save_dir after it, so a power loss after "saved" cannot lose the folder or
// empty its files. --keep_last N then removes this run's oldest step folders beyond N (rank 0).
//
// --continue_from accepts a checkpoint folder or a --save_dir. In a save_dir, "newest" is the highest
// N among folders named exactly step_<N> (digits only: step_20.tmp, step_20.broken, step_x are not
// checkpoints) whose manifest verifies (it parses, every field the loader reads is there and in
// range, its step is N, and every file it lists is there with its size); a broken newer folder, one
// whose manifest says another step (a copy: `cp -r step_2 step_10`), and a step_<N> that is a
// symbolic link (it may lead into another run's save_dir) are skipped with a warning naming them.
//
// Nothing a save did not write is removed or replaced. A save puts its folder at step_<N> only where
// nothing is, or an intact checkpoint of the same run (a step saved again after resuming from an
// earlier one); it wipes step_<N>.tmp first only when that holds nothing but the files a save writes
// (what a killed save leaves). At start-up every step_<N> and step_<N>.tmp the run could write is
// checked so, and anything else there (a user's folder, an export, a link, a file, another run's
// checkpoint) refused naming it; what appears there during the run stops the save with the checkpoint
// complete in step_<N>.tmp and the message saying how to put it in place.
//
// Each run has a run id, drawn at a fresh start and kept on resume: a fresh run refuses a --save_dir
// that holds another run's checkpoints (its own would mix with them, and a later resume would pick
// whichever is newest), unless --continue_from names that save_dir.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "optim/shard_state.h"
#include "config/config.h"

namespace llm {

class Communicator;
class SafetensorsFile;

// Which files a rank writes into a save: by default its own, rank<R> (file_index -1: the
// communicator's rank). Hybrid sharding writes one copy of each replicated shard: the ranks of group 0
// write the files of their shard index, the other groups' ranks none (writes false). The manifest
// lists the writers' files, which must be numbered 0 .. W - 1, and says world_size W: a hybrid
// checkpoint of groups of S is a full_shard checkpoint of S ranks, and reshards as one.
struct SaveRole {
  bool writes = true;
  int file_index = -1;
};

// Writes FOLDER.tmp (rank 0 creates it; every rank writes its rank<R> files from `pieces`; rank 0
// writes the manifest, `manifest` with "format" and "files" added), fsyncs, renames it to FOLDER and
// fsyncs the save_dir (and any folder above it this save created). Collective: every rank learns
// whether the save succeeded. A failure on any rank (a failed fsync included) is a UserError on every
// rank (the failing rank's names the file and --save_dir); FOLDER.tmp is removed and the new FOLDER
// never remains. A FOLDER or FOLDER.tmp the save may not replace or wipe (see above) is a UserError
// naming it, left as it is (for FOLDER, with the complete checkpoint kept in FOLDER.tmp).
void save_checkpoint(const std::string& folder, const std::vector<StatePiece>& pieces, nlohmann::json manifest,
                     Communicator& communicator, SaveRole role = {});

// The same save with this rank's files written on a thread of its own (--async_save), while training
// goes on. The constructor creates FOLDER.tmp as save_checkpoint does (collective) and starts the
// thread on `pieces`, which it owns: host copies of the state, taken when the save was asked for (so
// later steps cannot change what is written). commit() (collective; every rank at the same step)
// waits for this rank's files, then writes the manifest and renames as save_checkpoint does, with the
// same errors. Until then FOLDER.tmp is not a checkpoint: a crash, or a destruction without commit()
// (which stops the write between tensors and joins the thread, so an error elsewhere is not held
// up by it), leaves the previous checkpoint the newest. LLM_DEBUG_SAVE_DELAY_SECONDS=S
// in the environment holds each background write back S seconds (to watch, or test, the overlap).
class BackgroundSave {
 public:
  // `preparation_failure`: this rank could not make its host copies; every rank fails together.
  BackgroundSave(std::string folder, std::vector<StatePiece> pieces, nlohmann::json manifest,
                 Communicator& communicator, std::exception_ptr preparation_failure = nullptr, SaveRole role = {});
  ~BackgroundSave();
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  bool written() const;  // this rank's files are done (written, or failed: commit() says which)
  void commit();
  const std::string& folder() const { return folder_; }

 private:
  struct Writing;
  std::string folder_;
  Communicator& communicator_;
  std::unique_ptr<Writing> writing_;
};

// A checkpoint folder opened for reading: the manifest and every rank's index (each index's CRC-32C
// checked against the manifest); each rank<R>.safetensors header is read when a part of it is first
// needed. Throws UserError naming the file for a missing, damaged or foreign file.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string folder);
  ~CheckpointReader();

  const std::string& folder() const { return folder_; }
  const nlohmann::json& manifest() const { return manifest_; }

  // Checks the checkpoint's tensors against `expected` (key -> full shape): each one there with that
  // shape, its parts tiling it, and no other; one UserError listing every problem (`what`: "the model
  // and the adamw state", for the message).
  void check(const std::map<std::string, FullStateShape>& expected, const std::string& what) const;
  // The full tensor's elements [begin, begin + destination.numel()) (flattened) into `destination`
  // (any device), from every part that overlaps them; each part's CRC-32C is checked.
  void read(const std::string& key, int64_t begin, const at::Tensor& destination) const;
  // The full tensor (fp32, on the host).
  at::Tensor read_full(const std::string& key) const;
  bool contains(const std::string& key) const { return tensors_.count(key) > 0; }
  std::vector<std::string> keys() const;

 private:
  struct Part {
    size_t file = 0;  // index into files_
    int64_t begin = 0, count = 0;
    uint32_t crc32c = 0;
  };
  struct Tensor {
    std::vector<int64_t> full_shape;
    std::vector<Part> parts;  // sorted by begin
  };
  const SafetensorsFile& file(size_t index) const;

  std::string folder_;
  nlohmann::json manifest_;
  std::vector<std::string> file_names_;  // rank<R>.safetensors, by rank
  mutable std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Tensor> tensors_;
};

// --keep_last: once `saved` (a step_<N> folder of a save_dir) is complete, removes the oldest intact
// step_<N> folders of run `run_id` in that save_dir so that at most `keep_last` remain, `saved` among
// them (it is never removed, even beside a higher N left by an earlier part of the run); the others
// kept are the highest N. Another run's folders, folders that are not intact checkpoints, links and
// any other name are never touched. 0 keeps all. A folder that cannot be removed is a warning, not an
// error. Returns the folders removed.
// Once `saved` (step_<N> of a save_dir this job holds locked) is complete: removes the staging
// folders step_<M>.tmp, M < N, that killed saves left (each a checkpoint's size), but only those that
// hold nothing a save does not write (checkpoint_folders.cpp's staging_problem); any other is left and
// said. Returns the folders removed (issue 44).
std::vector<std::string> remove_stale_staging(const std::string& saved, int64_t step);

std::vector<std::string> remove_old_checkpoints(const std::string& saved, const std::string& run_id,
                                                int64_t keep_last);

// A fresh run's id: 16 hex digits from the system's random source.
std::string new_run_id();

// Why FOLDER cannot be resumed from, or "" when it can: manifest.json missing (a folder of the
// earlier full-tensor format says so), not a file, not JSON, or without step, samples_consumed,
// tokens_seen (integers >= 0), world_size (>= 1), model or files, or with a seed, optimizer_step or
// run_id of the wrong type, each named by its key; a step_<N> folder whose manifest says another
// step; a file it lists missing or of another size.
std::string checkpoint_problem(const std::string& folder);

// Resolves --continue_from: a folder holding manifest.json is the checkpoint itself (refused when it
// is named step_<N> and its manifest says another step: renamed to its real step, it resumes);
// otherwise the newest intact step_<N> folder of it (see above). Each skipped folder is appended to
// `skipped` ("FOLDER: reason"). Throws UserError when no intact checkpoint is there.
std::string resolve_checkpoint_folder(const std::string& path, std::vector<std::string>* skipped = nullptr);

// What start-up learns about checkpoints, before anything is built or written.
struct CheckpointStart {
  std::string resume_folder;  // --continue_from resolved to one checkpoint folder; "" for a fresh run
  int64_t resume_step = 0;    // its step
  std::string run_id;         // its run id; "" for a fresh run
  nlohmann::json data_identity;  // this run's data as compared with the checkpoint's (run_data_identity); null if not read
};

// The start-up checks of --continue_from and --save_dir, on every rank (warnings logged when
// `log_warnings`): --continue_from resolves to an intact checkpoint of this model config whose step is
// at most --num_training_steps; --save_dir (or, when missing, the folder it would be created in) is a
// folder and can be written (a probe file, removed at once), holds no checkpoint of another run
// unless --continue_from names it, and nothing at a step_<N> or step_<N>.tmp this run could write
// that a save may not replace (see above). Each failure is a UserError naming the flag and the
// folder. A resume on another --data than the checkpoint's, or on its file changed since (its size or
// first MiB), is a warning naming both and saying that the sampler position carries over: a new data
// mix on resume is sometimes meant, so it is not refused.
CheckpointStart check_checkpoints_at_start(const RunConfig& run, const ModelConfig& model, bool log_warnings);

// UserError naming the checkpoint folder when its manifest's model config is not `model`'s, with the
// keys that differ.
void require_same_model(const std::string& folder, const nlohmann::json& manifest, const ModelConfig& model);

}  // namespace llm
