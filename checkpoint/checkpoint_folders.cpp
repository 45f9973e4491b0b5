// The folders of a save_dir (checkpoint/checkpoint.h): a checkpoint's manifest read and verified,
// the newest intact step_<N> for --continue_from, what a save may replace or wipe, --keep_last, and
// the start-up checks of --continue_from and --save_dir. Apart from writing (checkpoint.cpp), which
// asks these checks before it replaces or wipes a folder, and from reading (checkpoint_reader.cpp).
#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/train_state.h"
#include "common/crc32c.h"
#include "common/errors.h"
#include "common/input_paths.h"
#include "common/log.h"
#include "common/output_files.h"
#include "config/training_settings.h"
#include "data/corpus_identity.h"
#include "data/token_corpus.h"
#include "common/json_file.h"

namespace llm {
namespace fs = std::filesystem;
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
  // A folder (or a device) opens as a stream and fails only when read, with the library's words; a
  // fifo blocks the reader.
  if (const std::string not_regular = regular_file_problem(path); !not_regular.empty() && not_regular != "is missing")
    fail_user(path.string(), "", not_regular + ": the folder is not a checkpoint");
  std::ifstream in(path);
  LLM_REQUIRE(in.good(), path.string(), "", "missing checkpoint file");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return parse_json_text(text, path.string());
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

}  // namespace

// Shared with the writing and the reader (checkpoint_internal.h).

std::string run_id_of(const nlohmann::json& trainer_state) {
  return trainer_state.is_object() && trainer_state.contains("run_id") && trainer_state.at("run_id").is_string()
             ? trainer_state.at("run_id").get<std::string>()
             : "";
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
                      (manifest.contains(key) ? json_excerpt(manifest.at(key)) : std::string("nothing")) + ")");
    };
    integer_at_least("world_size", 1);
    if (manifest.contains("optimizer_step")) integer_at_least("optimizer_step", 0);
    LLM_REQUIRE(!manifest.contains("run_id") || manifest.at("run_id").is_string(), "manifest.json", "run_id",
                "expected a string (got " + json_excerpt(manifest.value("run_id", nlohmann::json())) + ")");
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
    // A name, not a path: nothing outside the folder is stat'ed (common/input_paths.h).
    try {
      require_plain_name(name, "manifest.json", "files");
    } catch (const UserError& error) {
      *problem = error.what();
      return nullptr;
    }
    std::error_code error;
    const fs::path path = root / name;
    if (const std::string not_regular = regular_file_problem(path); !not_regular.empty()) {
      *problem = name + ": " + (not_regular == "is missing" ? std::string("missing") : not_regular) +
                 " (listed in manifest.json)";
      return nullptr;
    }
    const uint64_t size = fs::file_size(path, error);
    if (!listed.is_object() || !listed.contains("bytes") || !listed.at("bytes").is_number_unsigned() ||
        listed.at("bytes").get<uint64_t>() != size) {
      *problem = name + ": " + std::to_string(size) + " bytes, but manifest.json lists " +
                 (listed.is_object() && listed.contains("bytes") ? json_excerpt(listed.at("bytes")) : std::string("no size"));
      return nullptr;
    }
  }
  if (const std::string misnamed = step_name_problem(root, manifest); !misnamed.empty()) {
    *problem = misnamed;
    return nullptr;
  }
  return manifest;
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
    if (entry.is_symlink(error))  // even under a save's name: a save writes files, never links
      return "holds " + name + ", a symbolic link (to " + link_target(entry.path()) + "), which no save writes";
    if (!is_checkpoint_part(name) || !entry.is_regular_file(error))
      return "holds " + name + (entry.is_directory(error) ? ", a folder," : "") + ", which no save writes";
  }
  return "";
}

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

std::vector<std::string> remove_stale_staging(const std::string& saved, int64_t step) {
  std::vector<std::string> removed;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(parent_folder(saved), error)) {
    const int64_t staged = step_of_name(entry.path().filename().string(), ".tmp");
    if (staged < 0 || staged >= step || fs::is_symlink(entry.path(), error)) continue;
    if (const std::string problem = staging_problem(entry.path()); !problem.empty()) {
      log::warn("--save_dir: {} {}: not removed (a killed save's staging folder holds only a save's files)",
                entry.path().string(), problem);
      continue;
    }
    std::error_code removing;
    fs::remove_all(entry.path(), removing);
    if (removing)
      log::warn("--save_dir: could not remove {} ({}); remove it by hand", entry.path().string(), removing.message());
    else
      removed.push_back(entry.path().string());
  }
  return removed;
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
        differences += (differences.empty() ? "" : ", ") + key + " " + json_excerpt(saved.value(key, nlohmann::json())) +
                       " there, " + json_excerpt(value) + " here";
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

// The data file's size and the CRC-32C of its first MiB, as checkpoints saved before data_identity
// recorded it beside "data" ("data_file"), so that a resume from one can still tell a file changed in
// place from the same file; null for synthetic data or a file that cannot be read.
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

// Resuming on other data than the checkpoint's is sometimes meant (a new mix, a cleaned file) and
// sometimes a slip: it is said, not refused. The sampler position (samples consumed) carries over;
// what it points at in the new data is not what it pointed at in the old.
void warn_of_other_data(const RunConfig& run, const std::string& folder, const nlohmann::json& manifest) {
  if (!manifest.is_object() || !manifest.contains("data") || !manifest.at("data").is_string()) return;
  const std::string saved = manifest.at("data").get<std::string>();
  const std::string ours = run.data.source == "synthetic" ? run.data.source : absolute_data_spec(run.data.source);
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
                               ? json_excerpt(recorded.value("bytes", nlohmann::json())) + " bytes then, " +
                                     json_excerpt(now.at("bytes")) + " now"
                               : "the same size, but its first MiB differs";
  log::warn("--data: {} has changed since the checkpoint {} was saved ({}; manifest.json: data_file): the resume is "
            "not exact; {} over the file as it is now. If that is not meant, put back the file the run trained on",
            ours, folder, what, position);
}

// The checkpoint's corpus against this run's (data/corpus_identity.h): the same shards, wherever they
// are now, go on; other data (another shard list, a shard made again) is refused by name, unless
// --allow_other_data says it is meant, and then it is said. Every rank decides alike (the same files),
// so every rank stops alike. A checkpoint from before identities were recorded is only warned about.
// Returns this run's identity where it was read (null otherwise), for the run to record.
nlohmann::json check_same_data(const RunConfig& run, const ModelConfig& model, const std::string& folder,
                               const nlohmann::json& manifest, bool log_warnings) {
  if (!manifest.is_object() || !manifest.contains("data_identity")) {
    if (log_warnings) warn_of_other_data(run, folder, manifest);
    return nullptr;
  }
  const nlohmann::json then = manifest.at("data_identity");
  const bool synthetic_then = then.is_object() && then.value("synthetic", false);
  const bool synthetic_now = run.data.source == "synthetic";
  std::string difference;
  nlohmann::json now;
  if (synthetic_now) {
    if (!synthetic_then) difference = "it trained on token files, this run reads the synthetic corpus";
  } else if (synthetic_then && !then.contains("shards")) {
    difference = "it trained on the synthetic corpus, this run reads token files";
  } else {  // files, or the synthetic corpus's own token file (run_dir/synthetic.rank0.tok) read by name
    now = run_data_identity(*TokenCorpus::open(run.data.source, model.vocab_size, "--data",
                                               memmap_bytes(run.data.memmap_dtype)),
                            run.data.source,
                            run.data.window_start);
    difference = identity_difference(then, now);
  }
  if (difference.empty()) return now;
  const std::string saved = manifest.value("data", std::string("(not recorded)"));
  const std::string samples = std::to_string(manifest.value("samples_consumed", int64_t{0}));
  if (!run.data.allow_other_data)
    fail_user(kCommandLine, "--data",
              "the checkpoint " + folder + " was trained on other data than this run's (" + difference +
                  "; it read " + saved + "). Resume with the data it was trained on, or pass --allow_other_data " +
                  "to go on over this data from the checkpoint's position (" + samples + " samples consumed)");
  if (log_warnings)
    log::warn("--data: the checkpoint {} was trained on other data ({}; it read {}); --allow_other_data: the sampler "
              "goes on from the checkpoint's position ({} samples consumed) over this run's data",
              folder, difference, saved, samples);
  return now;
}

// A resume whose flags change what the checkpoint's run trained with (config/training_settings.h):
// exit 2 naming each difference, unless --allow_changed_flags (then each is said); a longer or
// shorter schedule is said.
void refuse_changed_training_settings(const RunConfig& run, const std::string& folder, const nlohmann::json& state,
                                      bool log_warnings) {
  if (!state.is_object() || !state.contains("run")) return;  // an older build's checkpoint
  // A "run" that is not an object would turn the check off without a word: damage, said.
  LLM_REQUIRE(state.at("run").is_object(), folder + "/manifest.json", "run",
              "expected an object of the flags that wrote the checkpoint (got " + json_excerpt(state.at("run")) +
                  "): the manifest is damaged or was edited; resume from an earlier step_<N> folder");
  const std::vector<SettingDifference> differences = training_setting_differences(state.at("run"), run);
  if (!differences.empty() && !run.checkpoint.allow_changed_flags)
    fail_user(folder + "/manifest.json", "run",
              "this run's flags change what the checkpoint's run trained with: " + describe_differences(differences) +
                  ". Resume with the checkpoint's values (its manifest.json's \"run\" holds them), start the new "
                  "experiment in a --save_dir of its own, or pass --allow_changed_flags if the change is meant");
  if (!log_warnings) return;
  if (!differences.empty())
    log::warn("--allow_changed_flags: resuming {} with changed flags: {}", folder, describe_differences(differences));
  if (const std::string change = schedule_length_change(state.at("run"), run); !change.empty())
    log::warn("resuming {}: {}", folder, change);
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
    refuse_changed_training_settings(run, start.resume_folder, state, log_warnings);
    if (state.is_object() && state.contains("step") && state.at("step").is_number_integer())
      start.resume_step = state.at("step").get<int64_t>();
    start.run_id = run_id_of(state);
    start.data_identity = check_same_data(run, model, start.resume_folder, state, log_warnings);
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

}  // namespace llm
