#include "trainer/checkpoint.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/errors.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

void write_tensor_file(const fs::path& path, const std::map<std::string, at::Tensor>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.detach().to(at::kCPU).contiguous());
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw SystemError("cannot write " + path.string() + ": disk full or no permission?");
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
  fs::remove_all(staging);
  fs::create_directories(staging);
  std::map<std::string, at::Tensor> model;
  for (const auto& [name, tensor] : model_tensors) model.emplace(name, tensor.to(at::kFloat));
  write_tensor_file(staging / "model.pt", model);
  write_tensor_file(staging / "optimizer.pt", optimizer_state);
  std::ofstream(staging / "trainer_state.json") << trainer_state.dump(2) << '\n';
  fs::remove_all(final_path);
  fs::rename(staging, final_path);
}

std::string resolve_checkpoint_folder(const std::string& path) {
  LLM_REQUIRE(fs::is_directory(path), "--continue_from", path, "no such folder");
  if (fs::exists(fs::path(path) / "trainer_state.json")) return path;
  long long best_step = -1;
  fs::path best;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step_", 0) != 0 || name.ends_with(".tmp")) continue;
    if (!fs::exists(entry.path() / "trainer_state.json")) continue;
    try {
      long long step = std::stoll(name.substr(5));
      if (step > best_step) best_step = step, best = entry.path();
    } catch (const std::exception&) {
    }
  }
  LLM_REQUIRE(best_step >= 0, "--continue_from", path,
              "neither a checkpoint (no trainer_state.json) nor a folder of step_<N> checkpoints");
  return best.string();
}

Checkpoint load_checkpoint(const std::string& folder) {
  Checkpoint checkpoint;
  const fs::path root(folder);
  std::ifstream state_file(root / "trainer_state.json");
  LLM_REQUIRE(state_file.good(), (root / "trainer_state.json").string(), "", "missing checkpoint file");
  try {
    checkpoint.trainer_state = nlohmann::json::parse(state_file);
  } catch (const nlohmann::json::exception& error) {
    fail_user((root / "trainer_state.json").string(), "", std::string("not valid JSON: ") + error.what());
  }
  checkpoint.model = read_tensor_file(root / "model.pt");
  checkpoint.optimizer = read_tensor_file(root / "optimizer.pt");
  return checkpoint;
}

}  // namespace llm
