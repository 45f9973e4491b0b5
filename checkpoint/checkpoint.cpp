// Writing a checkpoint (checkpoint/checkpoint.h): each rank's files, checked and fsynced, then the
// manifest last and the folder renamed into place; in line (save_checkpoint) or with this rank's
// files on a thread of its own (BackgroundSave). Apart from the folders of a save_dir
// (checkpoint_folders.cpp: which step_<N> is the newest, what a save may replace, the start-up checks)
// and from reading (checkpoint_reader.cpp).
#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <thread>

#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/interchange/safetensors.h"
#include "common/crc32c.h"
#include "common/errors.h"
#include "common/output_files.h"
#include "common/watchdog.h"
#include "sharding/communicator.h"
#include "sharding/world.h"

namespace llm {
namespace fs = std::filesystem;

// Shared with the folders and the reader (checkpoint_internal.h).

// The folder holding `path`; "." for a bare name.
fs::path parent_folder(const fs::path& path) { return path.has_parent_path() ? path.parent_path() : fs::path("."); }

std::string rank_file(int rank, const char* extension) { return "rank" + std::to_string(rank) + extension; }

// The parts of a save that BackgroundSave::Writing holds too (so outside the anonymous namespace).
// A save between its start and its end: where it writes, and where its fsyncs stop.
struct SaveFolders {
  fs::path final_path, staging, save_dir;
  // The first folder at or above save_dir that existed before this save: each folder the save
  // creates (save_dir and the ones above it that were missing) has its entry in its parent synced
  // too, up to this one.
  fs::path existing;
};

// This rank's files once written: {safetensors bytes, its CRC-32C, index bytes, its CRC-32C}, or why not.
struct WrittenPart {
  std::array<int64_t, 4> files{};
  std::exception_ptr failure;
  SaveRole role;  // resolved: file_index >= 0
};

namespace {

constexpr const char* kNotSaved =
    "the checkpoint was not saved and the newest complete one is still the previous step_<N> folder";

// A save that cannot reach the disk is a UserError naming the file or folder; the previous
// checkpoint stays the newest.
// `call` names the system call when it is not the obvious one ("fsync: ").
[[noreturn]] void fail_save(const fs::path& path, const std::string& what_failed, const std::string& call,
                            int error_number) {
  fail_user(path.string(), "--save_dir",
            what_failed + " (" + call + std::strerror(error_number) +
                "): disk full, over quota or not writable? The checkpoint was not saved; the newest complete one is "
                "still the previous step_<N> folder");
}

// A failed write (disk full, quota, a folder made read-only meanwhile) is a UserError naming the
// file. The bytes are fsynced before the close is checked, so that once the save says "saved" a power
// loss cannot leave the file empty or short; a failed fsync is a failed write.
void write_checked(const fs::path& path, const char* data, size_t size) {
  const int fd = open_output_file(path, O_WRONLY | O_TRUNC, "--save_dir");
  if (fd < 0) {
    const int error_number = errno;  // before any argument's construction can change it
    fail_save(path, "could not be written", "", error_number);
  }
  if (const int error_number = write_fully(fd, data, size); error_number != 0) {
    ::close(fd);
    fail_save(path, "could not be written", "", error_number);
  }
  if (::fsync(fd) != 0) {
    const int error_number = errno;
    ::close(fd);
    fail_save(path, "could not be written", "fsync: ", error_number);
  }
  if (::close(fd) != 0) {
    const int error_number = errno;
    fail_save(path, "could not be written", "", error_number);
  }
}

// Makes a folder's entries durable: the files created in it, a folder renamed into it. Some file
// systems cannot sync a folder at all and say EINVAL (PostgreSQL's fsync_fname tolerates it the same
// way); any other failure is a failed save.
void fsync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int error_number = errno;
    fail_save(folder, "could not be synced to disk", "open: ", error_number);
  }
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int error_number = errno;
    ::close(fd);
    fail_save(folder, "could not be synced to disk", "fsync: ", error_number);
  }
  ::close(fd);
}

// Whether any rank failed: every rank passes whether it did, and all learn the same.
bool any_rank_failed(bool failed, Communicator& communicator) {
  at::Tensor flag = at::full({1}, failed ? 1 : 0, at::TensorOptions().dtype(at::kLong).device(communicator.device()));
  communicator.all_reduce(flag, ReduceOp::sum);
  return flag.item<int64_t>() != 0;
}

// After a collective said some rank failed: this rank's own error, or one saying which rank's
// message to read.
[[noreturn]] void fail_after_agreement(const std::exception_ptr& own, const fs::path& folder, const std::string& what) {
  if (own) std::rethrow_exception(own);
  // The failing rank's message names the file.
  fail_after_another_rank(folder.string() + ": --save_dir: another rank could not " + what + " (its message says why); " +
                          kNotSaved);
}

// This rank's two files: the parts (one tensor at a time) and their index. Returns {safetensors bytes,
// its CRC-32C, index bytes, its CRC-32C}.
// `cancelled` (a background save given up): stop between tensors.
std::array<int64_t, 4> write_rank_files(const fs::path& staging, int rank, int world_size,
                                        const std::vector<StatePiece>& pieces,
                                        const std::atomic<bool>* cancelled = nullptr) {
  std::vector<SafetensorsEntry> entries;
  for (const StatePiece& piece : pieces) entries.push_back({piece.key, piece.values.scalar_type(), {piece.values.numel()}});
  SafetensorsWriter writer((staging / rank_file(rank, ".safetensors")).string(), entries);
  nlohmann::json tensors = nlohmann::json::object();
  for (const StatePiece& piece : pieces) {
    if (cancelled != nullptr && cancelled->load(std::memory_order_relaxed))
      throw std::runtime_error("the background save was given up");
    const uint32_t crc = writer.write(piece.key, piece.values);
    StallWatchdog::mark_alive();  // a save that advances is progress, however long it takes (watchdog.h)
    tensors[piece.key] = {{"shape", piece.full_shape}, {"begin", piece.begin}, {"count", piece.values.numel()},
                          {"crc32c", crc_text(crc)}};
  }
  const uint64_t bytes = writer.finish();
  const std::string index =
      nlohmann::json{{"format", kFormat}, {"rank", rank}, {"world_size", world_size}, {"tensors", tensors}}.dump(1) + "\n";
  write_checked(staging / rank_file(rank, ".json"), index.data(), index.size());
  return {static_cast<int64_t>(bytes), writer.crc32c(), static_cast<int64_t>(index.size()),
          crc32c(index.data(), index.size())};
}

// 1. Rank 0 makes an empty staging folder; the others write into it only once it exists (collective).
// `failure`: this rank could not get ready (a background save's host copy); every rank learns it here.
SaveFolders begin_save(const std::string& folder, Communicator& communicator, std::exception_ptr failure = nullptr) {
  SaveFolders save{fs::path(folder), fs::path(folder + ".tmp"), parent_folder(fs::path(folder)), {}};
  std::error_code ignored;
  save.existing = save.save_dir;
  while (!fs::exists(save.existing, ignored) && parent_folder(save.existing) != save.existing)
    save.existing = parent_folder(save.existing);
  if (communicator.rank() == 0 && failure == nullptr) try {
      // Only a killed save's leftovers are wiped (staging_problem says why); the start-up check
      // refused anything else that was there, so this finds what appeared during the run.
      if (const std::string problem = staging_problem(save.staging); !problem.empty())
        fail_user(save.staging.string(), "--save_dir",
                  problem + ": it was left as it is (a save never wipes what it did not write), and " + kNotSaved +
                      ". Move it out of the save_dir and resume with --continue_from");
      fs::remove_all(save.staging, ignored);
      std::error_code error;
      fs::create_directories(save.staging, error);
      if (error)
        fail_user(save.staging.string(), "--save_dir", "cannot create the checkpoint folder (" + error.message() + ")");
    } catch (...) {
      failure = std::current_exception();
    }
  if (any_rank_failed(failure != nullptr, communicator))
    fail_after_agreement(failure, save.staging, "start the save (make its folder, or copy its state to host memory)");
  return save;
}

// This rank's role with its file index resolved (the communicator's rank when not given).
SaveRole resolved(SaveRole role, const Communicator& communicator) {
  if (role.file_index < 0) role.file_index = communicator.rank();
  return role;
}

// 2. This rank's own files (no collective: an asynchronous save runs it on its own thread); nothing for
// a rank that writes none. `files_written`: how many ranks write (the index's world_size).
WrittenPart write_part(const SaveFolders& save, SaveRole role, int files_written, const std::vector<StatePiece>& pieces,
                       const std::atomic<bool>* cancelled = nullptr) {
  WrittenPart part;
  part.role = role;
  if (!role.writes) return part;
  try {
    part.files = write_rank_files(save.staging, role.file_index, files_written, pieces, cancelled);
  } catch (const UserError& error) {
    part.failure = std::make_exception_ptr(UserError(std::string(error.what()) + "; " + kNotSaved));
  } catch (...) {
    part.failure = std::current_exception();
  }
  return part;
}

// 3. The files' sizes and checksums to rank 0, which writes the manifest last and puts the folder in
// place (collective).
void commit_save(const SaveFolders& save, const WrittenPart& part, nlohmann::json manifest, Communicator& communicator) {
  const int rank = communicator.rank(), world_size = communicator.world_size();
  std::exception_ptr failure = part.failure;
  std::error_code ignored;
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(communicator.device());
  const at::Tensor mine = at::tensor({failure ? int64_t{1} : int64_t{0}, part.role.writes ? int64_t{1} : int64_t{0},
                                      int64_t{part.role.file_index}, part.files[0], part.files[1], part.files[2],
                                      part.files[3]},
                                     longs);
  at::Tensor everyone = at::empty({7 * world_size}, longs);
  communicator.all_gather(mine, everyone);
  const at::Tensor files = everyone.view({world_size, 7}).cpu();
  if (files.select(1, 0).sum().item<int64_t>() != 0) {
    if (rank == 0) fs::remove_all(save.staging, ignored);
    communicator.barrier();  // the staging folder is gone before any rank ends the job
    fail_after_agreement(failure, save.staging, "write its part");
  }

  bool renamed = false, keep_staging = false;
  if (rank == 0) try {
      nlohmann::json listed = nlohmann::json::object();
      int64_t writers = 0;
      for (int r = 0; r < world_size; ++r) writers += files[r][1].item<int64_t>();
      std::vector<bool> numbered(static_cast<size_t>(writers), false);
      for (int r = 0; r < world_size; ++r) {
        const auto row = files[r];
        if (row[1].item<int64_t>() == 0) continue;  // a replica: its shard is written by group 0
        const int64_t index = row[2].item<int64_t>();
        if (index < 0 || index >= writers || numbered[static_cast<size_t>(index)])
          throw std::logic_error("save: the writers' file indices are not 0 .. " + std::to_string(writers - 1));
        numbered[static_cast<size_t>(index)] = true;
        listed[rank_file(static_cast<int>(index), ".safetensors")] = {
            {"bytes", row[3].item<int64_t>()}, {"crc32c", crc_text(static_cast<uint32_t>(row[4].item<int64_t>()))}};
        listed[rank_file(static_cast<int>(index), ".json")] = {
            {"bytes", row[5].item<int64_t>()}, {"crc32c", crc_text(static_cast<uint32_t>(row[6].item<int64_t>()))}};
      }
      manifest["world_size"] = writers;  // the files' world: a hybrid save's is one group's
      manifest["format"] = kFormat;
      manifest["format_version"] = kFormatVersion;
      manifest["files"] = listed;
      const std::string text = manifest.dump(2) + "\n";
      write_checked(save.staging / "manifest.json", text.data(), text.size());
      // The files' entries before the rename, the rename itself after it: a power loss then leaves
      // either the previous state or the complete step folder.
      fsync_folder(save.staging);
      // What appeared at FOLDER during the run (the start-up check refused what was there before) and
      // is not this run's own checkpoint of the step is never removed: the save stops, complete in
      // FOLDER.tmp, and says how to put it in place.
      if (const std::string problem = replace_problem(save.final_path, run_id_of(manifest)); !problem.empty()) {
        keep_staging = true;
        fail_user(save.final_path.string(), "--save_dir",
                  problem + ": it was left as it is (a save never removes or replaces what is not this run's "
                  "checkpoint of the step). This step's checkpoint is complete in " + save.staging.string() +
                  ": move " + save.final_path.string() + " out of the save_dir, rename " + save.staging.string() +
                  " to it, and resume with --continue_from");
      }
      std::error_code error;
      fs::remove_all(save.final_path, error);
      if (!error) fs::rename(save.staging, save.final_path, error);
      if (error)
        fail_user(save.final_path.string(), "--save_dir", "cannot put the checkpoint in place (" + error.message() + ")");
      renamed = true;
      for (fs::path folder_above = save.save_dir;; folder_above = parent_folder(folder_above)) {
        fsync_folder(folder_above);
        if (folder_above == save.existing || parent_folder(folder_above) == folder_above) break;
      }
    } catch (...) {
      failure = std::current_exception();
      if (!keep_staging) fs::remove_all(save.staging, ignored);
      // Not known to be on disk: not a checkpoint the message may call complete.
      if (renamed) fs::remove_all(save.final_path, ignored);
    }
  if (any_rank_failed(failure != nullptr, communicator))
    fail_after_agreement(failure, save.final_path, "complete the save");
}

}  // namespace

// How many ranks write files (collective): every rank's count of itself, summed.
int count_writers(const SaveRole& role, Communicator& communicator) {
  at::Tensor writes = at::full({1}, role.writes ? 1 : 0, at::TensorOptions().dtype(at::kLong).device(communicator.device()));
  communicator.all_reduce(writes, ReduceOp::sum);
  return static_cast<int>(writes.item<int64_t>());
}

void save_checkpoint(const std::string& folder, const std::vector<StatePiece>& pieces, nlohmann::json manifest,
                     Communicator& communicator, SaveRole role) {
  role = resolved(role, communicator);
  const int writers = count_writers(role, communicator);
  const SaveFolders save = begin_save(folder, communicator);
  const WrittenPart part = write_part(save, role, writers, pieces);
  commit_save(save, part, std::move(manifest), communicator);
}

struct BackgroundSave::Writing {
  SaveFolders folders;
  std::vector<StatePiece> pieces;
  nlohmann::json manifest;
  WrittenPart part;
  std::atomic<bool> written{false};
  std::atomic<bool> cancelled{false};  // destroyed uncommitted: the write stops between tensors
  std::thread thread;
};

BackgroundSave::BackgroundSave(std::string folder, std::vector<StatePiece> pieces, nlohmann::json manifest,
                               Communicator& communicator, std::exception_ptr preparation_failure, SaveRole role)
    : folder_(std::move(folder)), communicator_(communicator), writing_(std::make_unique<Writing>()) {
  role = resolved(role, communicator_);
  const int writers = count_writers(role, communicator_);
  writing_->folders = begin_save(folder_, communicator_, preparation_failure);
  writing_->pieces = std::move(pieces);
  writing_->manifest = std::move(manifest);
  writing_->part.role = role;
  if (!role.writes) {  // a replica's save: nothing to write, done at once
    writing_->written.store(true, std::memory_order_release);
    return;
  }
  Writing* writing = writing_.get();
  // A debugging knob: each background write starts this much later (what the tests use to show that
  // training goes on meanwhile and that the host copies are what gets written).
  const char* delay_text = std::getenv("LLM_DEBUG_SAVE_DELAY_SECONDS");
  const double delay = delay_text == nullptr ? 0.0 : std::strtod(delay_text, nullptr);
  writing_->thread = std::thread([writing, role, writers, delay] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(delay);
    // It stands for a slow disk whose writes advance: progress to the watchdog meanwhile, as each
    // tensor written is.
    while (std::chrono::steady_clock::now() < until && !writing->cancelled.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      StallWatchdog::mark_alive();
    }
    writing->part = write_part(writing->folders, role, writers, writing->pieces, &writing->cancelled);
    writing->pieces.clear();  // the host copies go as soon as they are on disk
    writing->written.store(true, std::memory_order_release);
  });
}

BackgroundSave::~BackgroundSave() {
  if (writing_ && writing_->thread.joinable()) {
    writing_->cancelled.store(true, std::memory_order_relaxed);
    writing_->thread.join();
  }
}

bool BackgroundSave::written() const { return writing_->written.load(std::memory_order_acquire); }

void BackgroundSave::commit() {
  if (writing_->thread.joinable()) writing_->thread.join();
  commit_save(writing_->folders, writing_->part, std::move(writing_->manifest), communicator_);
}

std::string new_run_id() {
  std::random_device source;
  const uint64_t value = (static_cast<uint64_t>(source()) << 32) ^ source();
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace llm
