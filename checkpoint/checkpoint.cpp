#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <thread>

#include "common/crc32c.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/output_files.h"
#include "sharding/communicator.h"
#include "sharding/world.h"
#include "checkpoint/interchange/safetensors.h"
#include "checkpoint/train_state.h"
#include "common/watchdog.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

constexpr const char* kCommandLine = "command line";

// Defined with the readers below.
std::string replace_problem(const fs::path& final_path, const std::string& run_id);
std::string staging_problem(const fs::path& staging);
std::string run_id_of(const nlohmann::json& trainer_state);
nlohmann::json data_fingerprint(const nlohmann::json& data);

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
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error_number = errno;  // before any argument's construction can change it
    fail_save(path, "could not be written", "", error_number);
  }
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const int error_number = written < 0 ? errno : EIO;
      ::close(fd);
      fail_save(path, "could not be written", "", error_number);
    }
    data += written;
    size -= static_cast<size_t>(written);
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

// The folder holding `path`; "." for a bare name.
fs::path parent_folder(const fs::path& path) { return path.has_parent_path() ? path.parent_path() : fs::path("."); }

constexpr const char* kFormat = "llm-trainer sharded checkpoint";
constexpr const char* kNotSaved =
    "the checkpoint was not saved and the newest complete one is still the previous step_<N> folder";
constexpr int kFormatVersion = 1;

std::string rank_file(int rank, const char* extension) { return "rank" + std::to_string(rank) + extension; }

std::string crc_text(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", crc);
  return text;
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
  for (const StatePiece& piece : pieces) entries.push_back({piece.key, at::kFloat, {piece.values.numel()}});
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
};

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

// 2. This rank's own files (no collective: an asynchronous save runs it on its own thread).
WrittenPart write_part(const SaveFolders& save, int rank, int world_size, const std::vector<StatePiece>& pieces,
                       const std::atomic<bool>* cancelled = nullptr) {
  WrittenPart part;
  try {
    part.files = write_rank_files(save.staging, rank, world_size, pieces, cancelled);
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
  const at::Tensor mine = at::tensor(
      {failure ? int64_t{1} : int64_t{0}, part.files[0], part.files[1], part.files[2], part.files[3]}, longs);
  at::Tensor everyone = at::empty({5 * world_size}, longs);
  communicator.all_gather(mine, everyone);
  const at::Tensor files = everyone.view({world_size, 5}).cpu();
  if (files.select(1, 0).sum().item<int64_t>() != 0) {
    if (rank == 0) fs::remove_all(save.staging, ignored);
    communicator.barrier();  // the staging folder is gone before any rank ends the job
    fail_after_agreement(failure, save.staging, "write its part");
  }

  bool renamed = false, keep_staging = false;
  if (rank == 0) try {
      nlohmann::json listed = nlohmann::json::object();
      for (int r = 0; r < world_size; ++r) {
        const auto row = files[r];
        listed[rank_file(r, ".safetensors")] = {{"bytes", row[1].item<int64_t>()},
                                                {"crc32c", crc_text(static_cast<uint32_t>(row[2].item<int64_t>()))}};
        listed[rank_file(r, ".json")] = {{"bytes", row[3].item<int64_t>()},
                                         {"crc32c", crc_text(static_cast<uint32_t>(row[4].item<int64_t>()))}};
      }
      manifest["format"] = kFormat;
      manifest["format_version"] = kFormatVersion;
      manifest["files"] = listed;
      if (const nlohmann::json data = data_fingerprint(manifest.value("data", nlohmann::json())); !data.is_null())
        manifest["data_file"] = data;
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

void save_checkpoint(const std::string& folder, const std::vector<StatePiece>& pieces, nlohmann::json manifest,
                     Communicator& communicator) {
  const SaveFolders save = begin_save(folder, communicator);
  const WrittenPart part = write_part(save, communicator.rank(), communicator.world_size(), pieces);
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
                               Communicator& communicator, std::exception_ptr preparation_failure)
    : folder_(std::move(folder)), communicator_(communicator), writing_(std::make_unique<Writing>()) {
  writing_->folders = begin_save(folder_, communicator_, preparation_failure);
  writing_->pieces = std::move(pieces);
  writing_->manifest = std::move(manifest);
  Writing* writing = writing_.get();
  const int rank = communicator_.rank(), world_size = communicator_.world_size();
  // A debugging knob: each background write starts this much later (what the tests use to show that
  // training goes on meanwhile and that the host copies are what gets written).
  const char* delay_text = std::getenv("LLM_DEBUG_SAVE_DELAY_SECONDS");
  const double delay = delay_text == nullptr ? 0.0 : std::strtod(delay_text, nullptr);
  writing_->thread = std::thread([writing, rank, world_size, delay] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(delay);
    // It stands for a slow disk whose writes advance: progress to the watchdog meanwhile, as each
    // tensor written is.
    while (std::chrono::steady_clock::now() < until && !writing->cancelled.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      StallWatchdog::mark_alive();
    }
    writing->part = write_part(writing->folders, rank, world_size, writing->pieces, &writing->cancelled);
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

namespace {

// The checkpoint's manifest.json; a UserError naming the file when it is missing, not a file or not
// JSON. A folder of the earlier format (trainer_state.json, model.pt, optimizer.pt: full tensors) is
// named as such.
nlohmann::json read_manifest(const fs::path& folder) {
  const fs::path path = folder / "manifest.json";
  std::error_code error;
  if (!fs::exists(path, error) && fs::exists(folder / "trainer_state.json", error))
    fail_user(path.string(), "",
              "missing: the folder holds a checkpoint of the earlier full-tensor format (trainer_state.json, model.pt, "
              "optimizer.pt), which this trainer no longer reads; resume it with the trainer that wrote it");
  // A folder (or a device) opens as a stream and fails only when read, with the library's words.
  const std::string kind = describe_path_kind(path);
  LLM_REQUIRE(kind.empty() || kind == "a regular file", path.string(), "",
              "is " + kind + ", not a file: the folder is not a checkpoint");
  std::ifstream in(path);
  LLM_REQUIRE(in.good(), path.string(), "", "missing checkpoint file");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& parse_error) {
    fail_user(path.string(), "", std::string("not valid JSON: ") + parse_error.what());
  }
}

// An entry of a save_dir named step_<N> (N digits only), whatever it is: a folder, a link, a file.
struct StepEntry {
  int64_t step = 0;
  fs::path path;
  bool link = false;    // a symbolic link (never adopted, never replaced: see resolve_checkpoint_folder)
  bool folder = false;  // a folder, or a link to one
};

// The step number of a name "step_<N>" (suffix "" ) or "step_<N><suffix>"; -1 for any other name.
int64_t step_of_name(const std::string& name, const std::string& suffix = "") {
  if (name.rfind("step_", 0) != 0 || name.size() <= 5 + suffix.size()) return -1;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return -1;
  const std::string digits = name.substr(5, name.size() - 5 - suffix.size());
  const bool all_digits = std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits.empty() || digits.size() > 18 || !all_digits) return -1;
  return std::stoll(digits);
}

// The step_<N> entries of a save_dir, highest N first.
std::vector<StepEntry> step_entries(const fs::path& save_dir) {
  std::vector<StepEntry> entries;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(save_dir, error)) {
    const int64_t step = step_of_name(entry.path().filename().string());
    if (step < 0) continue;
    entries.push_back({step, entry.path(), entry.is_symlink(error), entry.is_directory(error)});
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return entries;
}

// The step_<N> folders of a save_dir that are real folders (not links), highest N first.
std::vector<std::pair<int64_t, fs::path>> step_folders(const fs::path& save_dir) {
  std::vector<std::pair<int64_t, fs::path>> folders;
  for (const StepEntry& entry : step_entries(save_dir))
    if (entry.folder && !entry.link) folders.emplace_back(entry.step, entry.path);
  return folders;
}

std::string link_target(const fs::path& link) {
  std::error_code error;
  const fs::path target = fs::read_symlink(link, error);
  return error ? std::string("somewhere unreadable") : target.string();
}

std::string run_id_of(const nlohmann::json& trainer_state) {
  return trainer_state.is_object() && trainer_state.contains("run_id") && trainer_state.at("run_id").is_string()
             ? trainer_state.at("run_id").get<std::string>()
             : "";
}

bool same_folder(const std::string& a, const std::string& b) {
  std::error_code error;
  return fs::equivalent(a, b, error);
}

// The last name of a folder's path, "a/step_4/" included.
std::string folder_name(const fs::path& folder) {
  return folder.has_filename() ? folder.filename().string() : folder.parent_path().filename().string();
}

// A step_<N> folder whose manifest says another step: a copy or a rename (`cp -r step_2 step_10`).
// Taken for step N, it would make every later resume, --keep_last and export pick it as the newest,
// and a requeued job redo the steps between forever; "" when the name and the manifest agree (or
// the folder is not named step_<N>).
std::string step_name_problem(const fs::path& folder, const nlohmann::json& manifest) {
  const int64_t named = step_of_name(folder_name(folder));
  if (named < 0 || !manifest.is_object() || !manifest.contains("step") || !manifest.at("step").is_number_integer())
    return "";
  const int64_t step = manifest.at("step").get<int64_t>();
  if (step == named || step < 0) return "";  // a negative step is a problem of its own (TrainState)
  return "manifest.json: step: " + std::to_string(step) + ", but the folder is named step_" + std::to_string(named) +
         " (a copy or a rename of step_" + std::to_string(step) + "?): it is not a checkpoint of step " +
         std::to_string(named);
}

// An intact checkpoint's manifest; null with the reason in `problem` for any other folder. Every
// field the loader reads is checked here, so that a hand-edited manifest is named with its key.
nlohmann::json intact_manifest(const fs::path& root, std::string* problem) {
  nlohmann::json manifest;
  try {
    manifest = read_manifest(root);
    LLM_REQUIRE(manifest.is_object(), "manifest.json", "", "expected a JSON object");
    TrainState::from_json(manifest, "manifest.json");
    const auto integer_at_least = [&](const char* key, int64_t least) {
      LLM_REQUIRE(manifest.contains(key) && manifest.at(key).is_number_integer() &&
                      manifest.at(key).get<int64_t>() >= least,
                  "manifest.json", key,
                  "expected an integer >= " + std::to_string(least) + " (got " +
                      (manifest.contains(key) ? manifest.at(key).dump() : std::string("nothing")) + ")");
    };
    integer_at_least("world_size", 1);
    if (manifest.contains("optimizer_step")) integer_at_least("optimizer_step", 0);
    LLM_REQUIRE(!manifest.contains("run_id") || manifest.at("run_id").is_string(), "manifest.json", "run_id",
                "expected a string (got " + manifest.value("run_id", nlohmann::json()).dump() + ")");
  } catch (const UserError& error) {
    *problem = error.what();
    return nullptr;
  }
  for (const char* key : {"model", "files"})
    if (!manifest.contains(key) || !manifest.at(key).is_object() || manifest.at(key).empty()) {
      *problem = std::string("manifest.json: ") + key + ": missing";
      return nullptr;
    }
  for (const auto& [name, listed] : manifest.at("files").items()) {
    std::error_code error;
    const fs::path path = root / name;
    if (!fs::is_regular_file(path, error)) {
      *problem = name + ": missing (listed in manifest.json)";
      return nullptr;
    }
    const uint64_t size = fs::file_size(path, error);
    if (!listed.is_object() || !listed.contains("bytes") || !listed.at("bytes").is_number_unsigned() ||
        listed.at("bytes").get<uint64_t>() != size) {
      *problem = name + ": " + std::to_string(size) + " bytes, but manifest.json lists " +
                 (listed.is_object() && listed.contains("bytes") ? listed.at("bytes").dump() : std::string("no size"));
      return nullptr;
    }
  }
  if (const std::string misnamed = step_name_problem(root, manifest); !misnamed.empty()) {
    *problem = misnamed;
    return nullptr;
  }
  return manifest;
}

// The data file's size and the CRC-32C of its first MiB, recorded beside "data" so that a resume can
// tell a file changed in place (`trainer prepare` run again with another tokenizer or text) from
// the same file; null for synthetic data or a file that cannot be read. One MiB, not the whole
// file: a save must not read tens of GB, and a re-made token file differs in its size or its start.
nlohmann::json data_fingerprint(const nlohmann::json& data) {
  if (!data.is_string() || data.get<std::string>() == "synthetic") return nullptr;
  const fs::path path = data.get<std::string>();
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return nullptr;
  const uint64_t bytes = fs::file_size(path, error);
  std::ifstream in(path, std::ios::binary);
  std::string head(static_cast<size_t>(std::min<uint64_t>(bytes, 1 << 20)), '\0');
  if (error || !in.read(head.data(), static_cast<std::streamsize>(head.size()))) return nullptr;
  return {{"bytes", bytes}, {"crc32c_first_mib", crc_text(crc32c(head.data(), head.size()))}};
}

// A few of a folder's entries, for a message: "notes.txt, config.json, ..." ("nothing" when empty).
std::string some_entries(const fs::path& folder) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string text;
  for (size_t i = 0; i < names.size() && i < 3; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > 3) text += ", ...";
  return text.empty() ? "nothing" : text;
}

// Why a save of run `run_id` may not put its folder at `final_path` (replacing what is there); ""
// when nothing is there or an intact checkpoint of that same run is (a step saved again, as when a
// run resumed from an earlier step). Never replaced: a link, a file, a folder that is not an intact
// checkpoint (a user's notes, an export), another run's checkpoint.
std::string replace_problem(const fs::path& final_path, const std::string& run_id) {
  const std::string kind = describe_path_kind(final_path);
  if (kind.empty()) return "";
  std::error_code error;
  if (fs::is_symlink(final_path, error)) return "is a symbolic link to " + link_target(final_path);
  if (kind != "a folder") return "is " + kind;
  std::string problem;
  const nlohmann::json manifest = intact_manifest(final_path, &problem);
  if (manifest.is_null())
    return "is not an intact checkpoint (it holds " + some_entries(final_path) + "; " + problem + ")";
  const std::string id = run_id_of(manifest);
  if (run_id.empty() || id != run_id)
    return "is a checkpoint of " + (id.empty() ? std::string("a run from before run ids") : "run " + id) +
           (run_id.empty() ? std::string(", not of this fresh run") : ", not of this run (" + run_id + ")");
  return "";
}

// The files a save writes into its staging folder: manifest.json, rank<R>.json, rank<R>.safetensors,
// and the NAME.tmp each is written through.
bool is_checkpoint_part(const std::string& file_name) {
  std::string name = file_name;
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) name.resize(name.size() - 4);
  if (name == "manifest.json") return true;
  const size_t dot = name.find('.');
  if (name.rfind("rank", 0) != 0 || dot == std::string::npos || dot == 4) return false;
  const bool digits = std::all_of(name.begin() + 4, name.begin() + static_cast<std::ptrdiff_t>(dot),
                                  [](char c) { return c >= '0' && c <= '9'; });
  return digits && (name.substr(dot) == ".json" || name.substr(dot) == ".safetensors");
}

// A save's staging folder STEP.tmp is wiped before the save writes into it. A save killed mid-write
// (a crash, a preempted job) leaves exactly such a folder holding only the files a save writes, and
// the next save of that step writes them all again: wiping that is what lets a requeued job go on
// without a hand clean-up. Anything else in it (a user's file, a folder, a link) was not written by a
// save, so the folder is left as it is and the save refused, naming it.
std::string staging_problem(const fs::path& staging) {
  const std::string kind = describe_path_kind(staging);
  if (kind.empty()) return "";
  std::error_code error;
  if (fs::is_symlink(staging, error)) return "is a symbolic link to " + link_target(staging);
  if (kind != "a folder") return "is " + kind;
  for (const auto& entry : fs::directory_iterator(staging, error)) {
    const std::string name = entry.path().filename().string();
    if (!is_checkpoint_part(name) || entry.is_symlink(error) || !entry.is_regular_file(error))
      return "holds " + name + ", which no save writes";
  }
  return "";
}

}  // namespace

std::string checkpoint_problem(const std::string& folder) {
  std::string problem;
  intact_manifest(folder, &problem);
  return problem;
}

std::string resolve_checkpoint_folder(const std::string& path, std::vector<std::string>* skipped) {
  LLM_REQUIRE(fs::is_directory(path), "--continue_from", path, "no such folder");
  if (fs::exists(fs::path(path) / "manifest.json") || fs::exists(fs::path(path) / "trainer_state.json")) {
    // Named directly, a step_<N> folder whose manifest says another step is refused rather than
    // resumed: it would be resumed at its manifest's step, and its name would keep it the newest
    // for every later resume, --keep_last and export (a requeued job would redo the steps between
    // forever). Renamed to its real step, it resumes.
    std::string problem;
    const nlohmann::json manifest = intact_manifest(path, &problem);
    if (manifest.is_null() && problem == step_name_problem(path, read_manifest(path)))
      fail_user("--continue_from", path,
                problem + ". Rename it to step_" + std::to_string(read_manifest(path).at("step").get<int64_t>()) +
                    " (or resume from the folder it was copied from)");
    return path;
  }
  const auto entries = step_entries(path);
  size_t candidates = 0;
  const auto skip = [&](const std::string& note) {
    if (skipped != nullptr)
      skipped->push_back(note);
    else
      log::warn("--continue_from: skipping {} (not an intact checkpoint)", note);
  };
  for (const StepEntry& entry : entries) {
    if (!entry.folder) continue;  // a file named step_<N>: no checkpoint, and nothing to say
    ++candidates;
    // A link may lead into another run's save_dir: adopting it would resume (and then --keep_last
    // and save beside) that run's checkpoint under this one's name.
    if (entry.link) {
      skip(entry.path.string() + ": a symbolic link to " + link_target(entry.path) +
           ", not adopted (pass --continue_from " + link_target(entry.path) + " to resume from it)");
      continue;
    }
    const std::string problem = checkpoint_problem(entry.path.string());
    if (problem.empty()) return entry.path.string();
    skip(entry.path.string() + ": " + problem);
  }
  const fs::path newest = candidates == 0 ? fs::path()
                                          : std::find_if(entries.begin(), entries.end(), [](const StepEntry& e) {
                                              return e.folder;
                                            })->path;
  fail_user("--continue_from", path,
            candidates == 0 ? "neither a checkpoint (no manifest.json) nor a folder of step_<N> checkpoints"
                            : "none of its " + std::to_string(candidates) +
                                  " step_<N> folder(s) is an intact checkpoint (the newest: " +
                                  (fs::is_symlink(newest) ? "a symbolic link to " + link_target(newest)
                                                          : checkpoint_problem(newest.string())) +
                                  ")");
}

std::vector<std::string> remove_old_checkpoints(const std::string& saved, const std::string& run_id,
                                                int64_t keep_last) {
  std::vector<std::string> removed;
  if (keep_last <= 0 || run_id.empty()) return removed;
  int64_t kept = 1;  // `saved`
  for (const auto& [step, folder] : step_folders(parent_folder(saved))) {  // highest N first
    std::error_code error;
    // A link may point into another folder: never followed, never removed.
    if (same_folder(folder.string(), saved) || fs::is_symlink(folder, error)) continue;
    std::string problem;
    const nlohmann::json state = intact_manifest(folder, &problem);
    if (state.is_null() || run_id_of(state) != run_id) continue;  // not intact: belongs to no run
    if (kept < keep_last) {
      ++kept;
      continue;
    }
    // manifest.json first, as it was written last: a removal cut short leaves a folder that is no
    // checkpoint (skipped with a warning), never one that looks intact and is not.
    fs::remove(folder / "manifest.json", error);
    if (!error) fs::remove_all(folder, error);
    if (error) {
      log::warn("--keep_last: could not remove the old checkpoint {} ({}); remove it by hand", folder.string(),
                error.message());
      continue;
    }
    removed.push_back(folder.string());
  }
  return removed;
}

void require_same_model(const std::string& folder, const nlohmann::json& manifest, const ModelConfig& model) {
  const nlohmann::json saved = manifest.value("model", nlohmann::json());
  const nlohmann::json ours = model.to_json();
  if (saved == ours) return;
  std::string differences;
  if (saved.is_object())
    for (const auto& [key, value] : ours.items())
      if (saved.value(key, nlohmann::json()) != value)
        differences += (differences.empty() ? "" : ", ") + key + " " + saved.value(key, nlohmann::json()).dump() +
                       " there, " + value.dump() + " here";
  fail_user(folder, "manifest.json: model",
            "the checkpoint was made for another model config" +
                (differences.empty() ? std::string() : " (" + differences + ")") + " than --config " + model.name +
                ": resume it with its own config, or give this run another --save_dir / --continue_from");
}

namespace {

// A fresh run, or one resuming from elsewhere, into a save_dir holding another run's checkpoints.
void refuse_another_runs_checkpoints(const RunConfig& run, const CheckpointStart& start) {
  const std::string& save_dir = run.checkpoint.save_dir;
  for (const auto& [step, folder] : step_folders(save_dir)) {
    // A folder that is not an intact checkpoint belongs to no run; where a save would go, it is
    // refused by refuse_what_the_saves_would_replace.
    std::string problem;
    const nlohmann::json state = intact_manifest(folder, &problem);
    if (state.is_null()) continue;
    const std::string id = run_id_of(state);
    if (!run.checkpoint.continue_from.empty() && id == start.run_id) continue;
    const std::string whose = id.empty() ? "a run from before run ids" : "run " + id;
    const std::string ours = run.checkpoint.continue_from.empty() ? ""
                             : start.run_id.empty()               ? "; this run resumes a checkpoint without a run id"
                                                                  : "; this run resumes run " + start.run_id;
    fail_user(kCommandLine, "--save_dir",
              "\"" + save_dir + "\" holds checkpoints of another run (" + folder.filename().string() + ", " + whose +
                  ours + "): this run's checkpoints would mix with them and a resume would pick whichever is "
                  "newest. Resume that run with --continue_from " + save_dir + ", or pass another --save_dir");
  }
}

// The step_<N> and step_<N>.tmp entries of --save_dir that this run could write (N after the step it
// starts from, up to --num_training_steps: --save_every, the last step, a preemption), refused unless
// a save may replace them: a save would otherwise stop mid-run (commit_save), or wipe them.
void refuse_what_the_saves_would_replace(const RunConfig& run, const CheckpointStart& start) {
  const std::string& save_dir = run.checkpoint.save_dir;
  const auto written_by_this_run = [&](int64_t step) { return step > start.resume_step && step <= run.num_training_steps; };
  const std::string what_to_do = ". Move it out of --save_dir, or pass another --save_dir";
  for (const StepEntry& entry : step_entries(save_dir)) {
    if (!written_by_this_run(entry.step)) continue;
    if (const std::string problem = replace_problem(entry.path, start.run_id); !problem.empty())
      fail_user(kCommandLine, "--save_dir",
                "\"" + entry.path.string() + "\" " + problem + ": this run saves step " + std::to_string(entry.step) +
                    " there, and a save never removes or replaces what is not this run's checkpoint of the step" +
                    what_to_do);
  }
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(save_dir, error)) {
    const int64_t step = step_of_name(entry.path().filename().string(), ".tmp");
    if (step < 0 || !written_by_this_run(step)) continue;
    if (const std::string problem = staging_problem(entry.path()); !problem.empty())
      fail_user(kCommandLine, "--save_dir",
                "\"" + entry.path().string() + "\" " + problem + ": a save of step " + std::to_string(step) +
                    " stages its files there and would wipe it first (it wipes only what a killed save left)" +
                    what_to_do);
  }
}

// Resuming on other data than the checkpoint's is sometimes meant (a new mix, a cleaned file) and
// sometimes a slip: it is said, not refused. The sampler position (samples consumed) carries over;
// what it points at in the new data is not what it pointed at in the old.
void warn_of_other_data(const RunConfig& run, const std::string& folder, const nlohmann::json& manifest) {
  if (!manifest.is_object() || !manifest.contains("data") || !manifest.at("data").is_string()) return;
  const std::string saved = manifest.at("data").get<std::string>();
  const std::string ours = run.data.source == "synthetic" ? run.data.source : fs::absolute(run.data.source).string();
  const int64_t samples = manifest.value("samples_consumed", int64_t{0});
  const std::string position = "the sampler goes on from the checkpoint's position (" + std::to_string(samples) +
                               " samples consumed, --seed " + std::to_string(run.seed) + "'s order)";
  const nlohmann::json recorded = manifest.value("data_file", nlohmann::json());
  if (saved != ours && !same_folder(saved, ours)) {
    const bool copy = recorded.is_object() && data_fingerprint(ours) == recorded;
    log::warn("--data: the checkpoint {} was trained on {} (manifest.json: data), this run reads {}{}: {} over {}, "
              "not where {} left off. If that is not meant, resume with --data {}",
              folder, saved, ours, copy ? " (of the same size and first MiB: a copy?)" : "", position, ours, saved,
              saved);
    return;
  }
  if (!recorded.is_object()) return;  // saved before the file's size was recorded
  const nlohmann::json now = data_fingerprint(ours);
  if (now.is_null() || now == recorded) return;
  const std::string what = now.value("bytes", uint64_t{0}) != recorded.value("bytes", uint64_t{0})
                               ? recorded.value("bytes", nlohmann::json()).dump() + " bytes then, " +
                                     now.at("bytes").dump() + " now"
                               : "the same size, but its first MiB differs";
  log::warn("--data: {} has changed since the checkpoint {} was saved ({}; manifest.json: data_file): the resume is "
            "not exact; {} over the file as it is now. If that is not meant, put back the file the run trained on",
            ours, folder, what, position);
}

}  // namespace

CheckpointStart check_checkpoints_at_start(const RunConfig& run, const ModelConfig& model, bool log_warnings) {
  CheckpointStart start;
  if (!run.checkpoint.continue_from.empty()) {
    std::vector<std::string> skipped;
    start.resume_folder = resolve_checkpoint_folder(run.checkpoint.continue_from, &skipped);
    if (log_warnings)
      for (const std::string& note : skipped)
        log::warn("--continue_from: skipping {} (not an intact checkpoint)", note);
    // Every field before any is used (the loader checks every tensor, and names the file).
    if (const std::string problem = checkpoint_problem(start.resume_folder); !problem.empty())
      fail_user(start.resume_folder, "", "not a complete checkpoint: " + problem +
                                             ". Resume from another step_<N> folder (--continue_from the save_dir "
                                             "takes the newest intact one)");
    const nlohmann::json state = read_manifest(start.resume_folder);
    if (state.is_object() && state.contains("model")) require_same_model(start.resume_folder, state, model);
    if (state.is_object() && state.contains("step") && state.at("step").is_number_integer())
      start.resume_step = state.at("step").get<int64_t>();
    start.run_id = run_id_of(state);
    if (log_warnings) warn_of_other_data(run, start.resume_folder, state);
    if (start.resume_step > run.num_training_steps)
      fail_user(kCommandLine, "--num_training_steps",
                "the checkpoint " + start.resume_folder + " is at step " + std::to_string(start.resume_step) +
                    ", beyond the " + std::to_string(run.num_training_steps) +
                    " steps asked for: pass --num_training_steps above " + std::to_string(start.resume_step) +
                    " to train on");
  }
  const std::string& save_dir = run.checkpoint.save_dir;
  if (save_dir.empty()) return start;
  // The folder that will be written: save_dir, or the nearest existing folder above it, where it
  // will be created (validate_run_config refused a file on the way).
  std::error_code error;
  fs::path existing = save_dir;
  while (!existing.empty() && !fs::exists(existing, error)) existing = existing.parent_path();
  if (existing.empty()) existing = ".";
  if (const std::string problem = folder_write_problem(existing.string()); !problem.empty())
    fail_user(kCommandLine, "--save_dir",
              existing == fs::path(save_dir)
                  ? "cannot write into \"" + save_dir + "\" (" + problem + "); pass a folder you can write"
                  : "cannot create \"" + save_dir + "\": cannot write into \"" + existing.string() + "\" (" + problem +
                        "); pass a folder you can write");
  if (existing != fs::path(save_dir)) return start;
  refuse_unless_absent_or(save_dir, OutputKind::folder, "--save_dir");
  if (run.checkpoint.continue_from.empty() || !same_folder(run.checkpoint.continue_from, save_dir))
    refuse_another_runs_checkpoints(run, start);
  refuse_what_the_saves_would_replace(run, start);
  return start;
}

CheckpointReader::CheckpointReader(std::string folder) : folder_(std::move(folder)) {
  const fs::path root(folder_);
  std::string problem;
  manifest_ = intact_manifest(root, &problem);
  if (manifest_.is_null()) fail_user(folder_, "", "not a complete checkpoint: " + problem);
  LLM_REQUIRE(manifest_.value("format", std::string()) == kFormat &&
                  manifest_.value("format_version", 0) == kFormatVersion && manifest_.contains("world_size") &&
                  manifest_.at("world_size").is_number_unsigned(),
              (root / "manifest.json").string(), "format",
              std::string("expected \"") + kFormat + "\" version " + std::to_string(kFormatVersion) +
                  " with a world_size: not written by this trainer, or by another version of it");
  const int64_t world_size = manifest_.at("world_size").get<int64_t>();
  const nlohmann::json& listed = manifest_.at("files");
  for (int64_t r = 0; r < world_size; ++r) {
    const std::string name = rank_file(static_cast<int>(r), ".json");
    const fs::path path = root / name;
    LLM_REQUIRE(listed.contains(name) && listed.contains(rank_file(static_cast<int>(r), ".safetensors")),
                (root / "manifest.json").string(), "files",
                "lists no " + name + " or " + rank_file(static_cast<int>(r), ".safetensors") + " for rank " +
                    std::to_string(r) + " of its world size " + std::to_string(world_size));
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string expected_crc = listed.at(name).value("crc32c", std::string());
    LLM_REQUIRE(crc_text(crc32c(text.data(), text.size())) == expected_crc, path.string(), "",
                "its CRC-32C is " + crc_text(crc32c(text.data(), text.size())) + ", manifest.json lists " + expected_crc +
                    ": the file is damaged; resume from an earlier step_<N> folder");
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& parse_error) {
      fail_user(path.string(), "", std::string("not valid JSON: ") + parse_error.what());
    }
    LLM_REQUIRE(index.is_object() && index.value("rank", int64_t{-1}) == r && index.contains("tensors") &&
                    index.at("tensors").is_object(),
                path.string(), "", "expected the index of rank " + std::to_string(r) + " ({\"rank\", \"tensors\"})");
    file_names_.push_back(rank_file(static_cast<int>(r), ".safetensors"));
    for (const auto& [key, entry] : index.at("tensors").items()) {
      const auto bad = [&](const std::string& what) { fail_user(path.string(), key, what); };
      if (!entry.is_object() || !entry.contains("shape") || !entry.contains("begin") || !entry.contains("count") ||
          !entry.contains("crc32c") || !entry.at("shape").is_array() || !entry.at("begin").is_number_unsigned() ||
          !entry.at("count").is_number_unsigned() || !entry.at("crc32c").is_string())
        bad("expected {\"shape\": [...], \"begin\", \"count\", \"crc32c\"}");
      Tensor& tensor = tensors_[key];
      const std::vector<int64_t> shape = entry.at("shape").get<std::vector<int64_t>>();
      if (tensor.parts.empty()) tensor.full_shape = shape;
      if (shape != tensor.full_shape)
        bad("full shape " + shape_text(shape) + " here, " + shape_text(tensor.full_shape) + " in another rank's index");
      tensor.parts.push_back({file_names_.size() - 1, entry.at("begin").get<int64_t>(), entry.at("count").get<int64_t>(),
                              static_cast<uint32_t>(std::stoul(entry.at("crc32c").get<std::string>(), nullptr, 16))});
    }
  }
  for (auto& [key, tensor] : tensors_)
    std::sort(tensor.parts.begin(), tensor.parts.end(), [](const Part& a, const Part& b) { return a.begin < b.begin; });
  files_.resize(file_names_.size());
}

CheckpointReader::~CheckpointReader() = default;

const SafetensorsFile& CheckpointReader::file(size_t index) const {
  if (!files_[index]) files_[index] = std::make_unique<SafetensorsFile>((fs::path(folder_) / file_names_[index]).string());
  return *files_[index];
}

void CheckpointReader::check(const std::map<std::string, FullStateShape>& expected, const std::string& what) const {
  std::vector<std::string> problems;
  for (const auto& [key, full] : expected) {
    const auto found = tensors_.find(key);
    if (found == tensors_.end()) {
      problems.push_back("'" + key + "' is missing");
      continue;
    }
    if (found->second.full_shape != full.shape) {
      problems.push_back("'" + key + "' has shape " + shape_text(found->second.full_shape) + " but " + full.what +
                         " has shape " + shape_text(full.shape));
      continue;
    }
    const int64_t numel = c10::multiply_integers(full.shape);
    int64_t covered = 0;
    for (const Part& part : found->second.parts) {
      if (part.begin != covered) break;
      covered += part.count;
    }
    if (covered != numel)
      problems.push_back("the parts of '" + key + "' do not tile its " + std::to_string(numel) + " elements (" +
                         std::to_string(covered) + " covered from the start)");
  }
  for (const auto& [key, tensor] : tensors_)
    if (!expected.count(key)) problems.push_back("'" + key + "' is unexpected");
  if (problems.empty()) return;
  std::string message = "cannot load " + what + " from it: ";
  for (size_t i = 0; i < problems.size() && i < 12; ++i) message += (i ? "; " : "") + problems[i];
  if (problems.size() > 12) message += "; and " + std::to_string(problems.size() - 12) + " more";
  fail_user(folder_, "",
            message + ". Was the checkpoint written by the same --optimizer and its flags (--rank, --proj_type, "
                      "--subset_size, --adam_beta1) for the same model?");
}

void CheckpointReader::read(const std::string& key, int64_t begin, const at::Tensor& destination) const {
  StallWatchdog::mark_alive();  // a long read is progress (common/watchdog.h)
  const auto found = tensors_.find(key);
  LLM_REQUIRE(found != tensors_.end(), folder_, key, "no such tensor in the checkpoint");
  const at::Tensor flat = destination.view({-1});
  const int64_t end = begin + flat.numel();
  int64_t filled = 0;
  for (const Part& part : found->second.parts) {
    const int64_t from = std::max(begin, part.begin), to = std::min(end, part.begin + part.count);
    if (from >= to) continue;
    const SafetensorsFile& source = file(part.file);
    LLM_REQUIRE(source.contains(key) && source.entries().at(key).dtype == at::kFloat &&
                    source.entries().at(key).shape == std::vector<int64_t>{part.count},
                source.path(), key,
                "expected a float32 part of " + std::to_string(part.count) +
                    " elements, as its index says; the file is damaged: resume from an earlier step_<N> folder");
    const at::Tensor values = source.read(key);
    const uint32_t crc = crc32c(values.data_ptr(), values.nbytes());
    LLM_REQUIRE(crc == part.crc32c, source.path(), key,
                "its bytes have CRC-32C " + crc_text(crc) + ", the index lists " + crc_text(part.crc32c) +
                    ": the file is damaged; resume from an earlier step_<N> folder");
    flat.narrow(0, from - begin, to - from).copy_(values.narrow(0, from - part.begin, to - from));
    filled += to - from;
  }
  LLM_REQUIRE(filled == flat.numel(), folder_, key,
              "elements [" + std::to_string(begin) + ", " + std::to_string(end) + ") are not all in the checkpoint");
}

std::vector<std::string> CheckpointReader::keys() const {
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : tensors_) keys.push_back(key);
  return keys;
}

at::Tensor CheckpointReader::read_full(const std::string& key) const {
  const auto found = tensors_.find(key);
  LLM_REQUIRE(found != tensors_.end(), folder_, key, "no such tensor in the checkpoint");
  at::Tensor full = at::empty(found->second.full_shape, at::TensorOptions().dtype(at::kFloat));
  read(key, 0, full);
  return full;
}

}  // namespace llm
