#include "trainer/checkpoint.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "common/errors.h"
#include "common/log.h"
#include "trainer/train_state.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

constexpr const char* kCommandLine = "command line";

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

void write_tensor_file(const fs::path& path, const std::map<std::string, at::Tensor>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.detach().to(at::kCPU).contiguous());
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  write_checked(path, bytes.data(), bytes.size());
}

std::map<std::string, at::Tensor> read_tensor_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  LLM_REQUIRE(in.good(), path.string(), "", "missing or unreadable checkpoint file");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const c10::Error& error) {
    // LibTorch's message without its C++ stack trace, which says nothing to a user.
    fail_user(path.string(), "",
              std::string("not a readable tensor file (") + error.what_without_backtrace() +
                  "); the checkpoint is damaged or incomplete: resume from an earlier step_N folder");
  } catch (const std::exception& error) {
    fail_user(path.string(), "", std::string("not a readable tensor file (") + error.what() + ")");
  }
  LLM_REQUIRE(value.isGenericDict(), path.string(), "", "expected a dict of name -> tensor");
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : value.toGenericDict()) {
    LLM_REQUIRE(item.key().isString() && item.value().isTensor(), path.string(), "",
                "expected a dict of name -> tensor");
    tensors.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  return tensors;
}

}  // namespace

void save_checkpoint(const std::string& folder,
                     const std::vector<std::pair<std::string, at::Tensor>>& model_tensors,
                     const std::map<std::string, at::Tensor>& optimizer_state,
                     const nlohmann::json& trainer_state) {
  const fs::path final_path(folder);
  const fs::path staging = final_path.string() + ".tmp";
  const fs::path save_dir = parent_folder(final_path);
  // The folders this save creates (save_dir and the ones above it that are missing): each one's
  // entry in its parent is synced too, up to the first folder that already existed.
  std::error_code ignored;
  fs::path existing = save_dir;
  while (!fs::exists(existing, ignored) && parent_folder(existing) != existing) existing = parent_folder(existing);
  fs::remove_all(staging, ignored);
  bool renamed = false;
  try {
    std::error_code error;
    fs::create_directories(staging, error);
    if (error)
      fail_user(staging.string(), "--save_dir", "cannot create the checkpoint folder (" + error.message() + ")");
    std::map<std::string, at::Tensor> model;
    for (const auto& [name, tensor] : model_tensors) model.emplace(name, tensor.to(at::kFloat));
    write_tensor_file(staging / "model.pt", model);
    write_tensor_file(staging / "optimizer.pt", optimizer_state);
    // Last: a folder with a complete trainer_state.json has its tensor files.
    const std::string state = trainer_state.dump(2) + "\n";
    write_checked(staging / "trainer_state.json", state.data(), state.size());
    // The files' entries before the rename, the rename itself after it: a power loss then leaves
    // either the previous state or the complete step folder.
    fsync_folder(staging);
    fs::remove_all(final_path, error);
    if (!error) fs::rename(staging, final_path, error);
    if (error)
      fail_user(final_path.string(), "--save_dir", "cannot put the checkpoint in place (" + error.message() + ")");
    renamed = true;
    for (fs::path folder_above = save_dir;; folder_above = parent_folder(folder_above)) {
      fsync_folder(folder_above);
      if (folder_above == existing || parent_folder(folder_above) == folder_above) break;
    }
  } catch (...) {
    fs::remove_all(staging, ignored);
    // Not known to be on disk: not a checkpoint the message may call complete.
    if (renamed) fs::remove_all(final_path, ignored);
    throw;
  }
}

std::string new_run_id() {
  std::random_device source;
  const uint64_t value = (static_cast<uint64_t>(source()) << 32) ^ source();
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

namespace {

// The checkpoint's trainer_state.json; a UserError naming the file when it is missing or not JSON.
nlohmann::json read_trainer_state(const fs::path& folder) {
  const fs::path path = folder / "trainer_state.json";
  std::ifstream in(path);
  LLM_REQUIRE(in.good(), path.string(), "", "missing checkpoint file");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    fail_user(path.string(), "", std::string("not valid JSON: ") + error.what());
  }
}

// The step_<N> folders of a save_dir, N digits only, highest N first.
std::vector<std::pair<int64_t, fs::path>> step_folders(const fs::path& save_dir) {
  std::vector<std::pair<int64_t, fs::path>> folders;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(save_dir, error)) {
    const std::string name = entry.path().filename().string();
    const std::string digits = name.rfind("step_", 0) == 0 ? name.substr(5) : "";
    const bool all_digits = std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits.empty() || digits.size() > 18 || !all_digits) continue;
    if (!entry.is_directory(error)) continue;
    folders.emplace_back(std::stoll(digits), entry.path());
  }
  std::sort(folders.begin(), folders.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return folders;
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

}  // namespace

namespace {

// An intact checkpoint's trainer_state.json; null with the reason in `problem` for any other folder.
nlohmann::json intact_trainer_state(const fs::path& root, std::string* problem) {
  nlohmann::json state;
  try {
    state = read_trainer_state(root);
    TrainState::from_json(state, "trainer_state.json");
  } catch (const UserError& error) {
    *problem = error.what();
    return nullptr;
  }
  if (!state.contains("model") || !state.at("model").is_object()) {
    *problem = "trainer_state.json: model: missing";
    return nullptr;
  }
  for (const char* file : {"model.pt", "optimizer.pt"}) {
    std::error_code error;
    if (!fs::is_regular_file(root / file, error) || fs::file_size(root / file, error) == 0) {
      *problem = std::string(file) + ": missing or empty";
      return nullptr;
    }
  }
  return state;
}

}  // namespace

std::string checkpoint_problem(const std::string& folder) {
  std::string problem;
  intact_trainer_state(folder, &problem);
  return problem;
}

std::string resolve_checkpoint_folder(const std::string& path, std::vector<std::string>* skipped) {
  LLM_REQUIRE(fs::is_directory(path), "--continue_from", path, "no such folder");
  if (fs::exists(fs::path(path) / "trainer_state.json")) return path;
  const auto folders = step_folders(path);
  for (const auto& [step, folder] : folders) {
    const std::string problem = checkpoint_problem(folder.string());
    if (problem.empty()) return folder.string();
    const std::string note = folder.string() + ": " + problem;
    if (skipped != nullptr)
      skipped->push_back(note);
    else
      log::warn("--continue_from: skipping {} (not an intact checkpoint)", note);
  }
  fail_user("--continue_from", path,
            folders.empty() ? "neither a checkpoint (no trainer_state.json) nor a folder of step_<N> checkpoints"
                            : "none of its " + std::to_string(folders.size()) +
                                  " step_<N> folder(s) is an intact checkpoint (the newest: " +
                                  checkpoint_problem(folders.front().second.string()) + ")");
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
    const nlohmann::json state = intact_trainer_state(folder, &problem);
    if (state.is_null() || run_id_of(state) != run_id) continue;  // not intact: belongs to no run
    if (kept < keep_last) {
      ++kept;
      continue;
    }
    // trainer_state.json first, as it was written last: a removal cut short leaves a folder that is
    // no checkpoint (skipped with a warning), never one that looks intact and is not.
    fs::remove(folder / "trainer_state.json", error);
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

void require_same_model(const std::string& folder, const nlohmann::json& trainer_state, const ModelConfig& model) {
  const nlohmann::json saved = trainer_state.value("model", nlohmann::json());
  const nlohmann::json ours = model.to_json();
  if (saved == ours) return;
  std::string differences;
  if (saved.is_object())
    for (const auto& [key, value] : ours.items())
      if (saved.value(key, nlohmann::json()) != value)
        differences += (differences.empty() ? "" : ", ") + key + " " + saved.value(key, nlohmann::json()).dump() +
                       " there, " + value.dump() + " here";
  fail_user(folder, "trainer_state.json: model",
            "the checkpoint was made for another model config" +
                (differences.empty() ? std::string() : " (" + differences + ")") + " than --config " + model.name +
                ": resume it with its own config, or give this run another --save_dir / --continue_from");
}

CheckpointStart check_checkpoints_at_start(const RunConfig& run, const ModelConfig& model, bool log_warnings) {
  CheckpointStart start;
  if (!run.checkpoint.continue_from.empty()) {
    std::vector<std::string> skipped;
    start.resume_folder = resolve_checkpoint_folder(run.checkpoint.continue_from, &skipped);
    if (log_warnings)
      for (const std::string& note : skipped)
        log::warn("--continue_from: skipping {} (not an intact checkpoint)", note);
    // The loader checks the rest (every field, every tensor) and names the file.
    const nlohmann::json state = read_trainer_state(start.resume_folder);
    if (state.is_object() && state.contains("model")) require_same_model(start.resume_folder, state, model);
    if (state.is_object() && state.contains("step") && state.at("step").is_number_integer())
      start.resume_step = state.at("step").get<int64_t>();
    start.run_id = run_id_of(state);
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
  if (!run.checkpoint.continue_from.empty() && same_folder(run.checkpoint.continue_from, save_dir)) return start;
  for (const auto& [step, folder] : step_folders(save_dir)) {
    // A folder that is not an intact checkpoint belongs to no run; a save of its step replaces it.
    std::string problem;
    const nlohmann::json state = intact_trainer_state(folder, &problem);
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
  return start;
}

Checkpoint load_checkpoint(const std::string& folder) {
  Checkpoint checkpoint;
  const fs::path root(folder);
  checkpoint.trainer_state = read_trainer_state(root);
  checkpoint.model = read_tensor_file(root / "model.pt");
  checkpoint.optimizer = read_tensor_file(root / "optimizer.pt");
  return checkpoint;
}

}  // namespace llm
