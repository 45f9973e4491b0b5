// Checkpoint files of a run: enough to resume exactly (same losses as an uninterrupted run).
//
// A checkpoint is a folder, written as FOLDER.tmp and renamed when complete, so a crash mid-save never
// leaves a half checkpoint under the final name:
//   model.pt            {HF parameter name: fp32 tensor}, torch.save format (Python: torch.load)
//   optimizer.pt        the optimizer's state_dict, same format
//   trainer_state.json  step, samples consumed, tokens seen, the model config and the run's seed
// --continue_from accepts a checkpoint folder or a --save_dir holding step_<N> folders (the highest
// N is taken).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace llm {

struct Checkpoint {
  std::map<std::string, at::Tensor> model;
  std::map<std::string, at::Tensor> optimizer;
  nlohmann::json trainer_state;
};

void save_checkpoint(const std::string& folder,
                     const std::vector<std::pair<std::string, at::Tensor>>& model_tensors,
                     const std::map<std::string, at::Tensor>& optimizer_state,
                     const nlohmann::json& trainer_state);

// Resolves a save_dir to its newest step_<N> folder; throws UserError when none is there.
std::string resolve_checkpoint_folder(const std::string& path);

// Throws UserError naming the folder and file for a missing or unreadable file.
Checkpoint load_checkpoint(const std::string& folder);

}  // namespace llm
