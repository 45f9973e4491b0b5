// What the checkpoint's three source files share; internal to checkpoint/ (everything else includes
// checkpoint/checkpoint.h):
//   checkpoint.cpp          writing a checkpoint: save_checkpoint, BackgroundSave, new_run_id
//   checkpoint_folders.cpp  the folders of a save_dir: manifests, the newest intact step_<N>, what a
//                           save may replace or wipe, --keep_last, the start-up checks
//   checkpoint_reader.cpp   CheckpointReader
// The format's names are here, and the checks of a folder that a save makes before it replaces or
// wipes one (the same the start-up check makes) and the reader makes before it reads one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace llm {

constexpr const char* kFormat = "llm-trainer sharded checkpoint";
constexpr int kFormatVersion = 1;

// Defined in checkpoint.cpp.
std::filesystem::path parent_folder(const std::filesystem::path& path);  // "." for a bare name
std::string rank_file(int rank, const char* extension);                  // "rank3" + ".json"

// Defined in checkpoint_folders.cpp, where each one's comment says more.
// An intact checkpoint's manifest; null with the reason in `problem` for any other folder.
nlohmann::json intact_manifest(const std::filesystem::path& root, std::string* problem);
// Why a save of run `run_id` may not put its folder at `final_path`; "" when it may.
std::string replace_problem(const std::filesystem::path& final_path, const std::string& run_id);
// Why a save may not wipe its staging folder STEP.tmp; "" when it may (absent, or a killed save's).
std::string staging_problem(const std::filesystem::path& staging);
// A manifest's run id; "" when it has none.
std::string run_id_of(const nlohmann::json& trainer_state);

}  // namespace llm
