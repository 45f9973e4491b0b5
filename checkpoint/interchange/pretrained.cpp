#include "checkpoint/interchange/pretrained.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/input_paths.h"
#include "common/log.h"
#include "checkpoint/interchange/hf_config.h"
#include "checkpoint/interchange/safetensors.h"
#include "model/units.h"
#include "common/json_file.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFlag = "--init_from";
constexpr const char* kResave =
    "load it in Python and save it again with model.save_pretrained(DIR, safe_serialization=True)";

nlohmann::json read_json(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  LLM_REQUIRE(in.good(), path.string(), "", "missing: " + what);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return parse_json_text(text, path.string());
  } catch (const nlohmann::json::exception& error) {
    fail_user(path.string(), "", std::string("not valid JSON: ") + error.what());
  }
}

// Rotary tables some transformers versions saved with the weights: recomputed here, not weights.
bool is_rotary_buffer(const std::string& name) {
  const std::string suffix = "rotary_emb.inv_freq";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A NaN or inf weight would only show as a non-finite loss at the first step, with advice about the
// learning rate: it is named here, as it is read (the file, the tensor, the first bad row and value).
// `values`: rows [first_row, first_row + values.size(0)) of the tensor, in the file's dtype.
void require_finite(const at::Tensor& values, const std::string& file, const std::string& name, int64_t first_row) {
  const at::Tensor bad = values.isfinite().logical_not();
  if (!bad.any().item<bool>()) return;
  const int64_t count = bad.sum().item<int64_t>();
  const at::Tensor flat_index = bad.reshape({-1}).nonzero().select(0, 0).select(0, 0);
  const int64_t first = flat_index.item<int64_t>();
  const int64_t row_elements = values.dim() > 1 ? values.numel() / values.size(0) : 1;
  const double value = values.reshape({-1})[first].item<double>();
  std::ostringstream what;
  what << "holds " << count << " non-finite value(s) (NaN or inf), the first " << value << " in row "
       << first_row + first / row_elements << ": the weights are damaged, or were saved "
       << "from a run that had diverged. Pass --init_from a folder of finite weights (export an earlier checkpoint)";
  fail_user(file, name, what.str());
}

}  // namespace

PretrainedFolder::PretrainedFolder(const std::string& folder, const ModelConfig& model, bool log_notes)
    : folder_(folder) {
  const fs::path root(folder);
  std::error_code error;
  LLM_REQUIRE(fs::is_directory(root, error), kFlag, folder,
              fs::exists(root, error) ? "is not a folder: pass a transformers save_pretrained folder"
                                      : "no such folder: pass a transformers save_pretrained folder");
  LLM_REQUIRE(fs::exists(root / "config.json", error), kFlag, folder,
              "not a transformers save_pretrained folder: it has no config.json");
  const fs::path config_path = root / "config.json";
  const nlohmann::json config = read_json(config_path, "config.json");
  check_hf_config(config, model, config_path.string());
  if (log_notes) {
    const int64_t ours = padding_row(model);
    if (config.contains("pad_token_id") && config.at("pad_token_id").is_number_integer() &&
        config.at("pad_token_id").get<int64_t>() != ours)
      log::warn("--init_from: {} has pad_token_id {}; --config {} makes row {} the padding row (no gradient "
                "reaches it)", config_path.string(), json_excerpt(config.at("pad_token_id")), model.name, ours);
  }

  // The tensors' files: an index naming shards, or one model.safetensors.
  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;  // by file name
  std::set<std::string> unindexed;  // names in the shards' headers but not in the index
  if (fs::exists(index_path, error)) {
    const nlohmann::json index = read_json(index_path, "the index of the shards");
    LLM_REQUIRE(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
                index_path.string(), "weight_map", "missing: expected {tensor name: shard file name}");
    for (const auto& [name, file] : index.at("weight_map").items()) {
      LLM_REQUIRE(file.is_string(), index_path.string(), "weight_map." + name, "expected a shard file name");
      const std::string file_name = file.get<std::string>();
      require_plain_name(file_name, index_path.string(), "weight_map." + name);
      auto opened = files.find(file_name);
      if (opened == files.end()) {
        const std::string not_regular = regular_file_problem(root / file_name);
        LLM_REQUIRE(not_regular != "is missing", (root / file_name).string(), "",
                    "missing: the index names it for " + name + " (and maybe others); the folder is incomplete");
        require_regular_file(root / file_name, index_path.string(), "weight_map." + name, "a shard of the weights");
        opened = files.emplace(file_name, std::make_shared<SafetensorsFile>((root / file_name).string())).first;
      }
      LLM_REQUIRE(opened->second->contains(name), opened->second->path(), name,
                  "missing from this shard, though " + index_path.filename().string() + " names it here");
      file_of_[name] = opened->second;
    }
    for (const auto& [file_name, file] : files)
      for (const auto& [name, entry] : file->entries())
        if (!file_of_.count(name)) unindexed.insert(name);
  } else if (fs::exists(single_path, error) || fs::is_symlink(single_path, error)) {
    require_regular_file(single_path, root.string(), "model.safetensors", "the weights");
    auto file = std::make_shared<SafetensorsFile>(single_path.string());
    for (const auto& [name, entry] : file->entries()) file_of_[name] = file;
  } else {
    for (const char* pickle : {"pytorch_model.bin.index.json", "pytorch_model.bin"})
      if (fs::exists(root / pickle, error))
        fail_user((root / pickle).string(), "",
                  "is a torch pickle file, which --init_from does not read (it reads safetensors, tensor by tensor): " +
                      std::string(kResave));
    fail_user(kFlag, folder,
              "holds no model.safetensors and no model.safetensors.index.json: not a transformers "
              "save_pretrained folder (or saved without its weights)");
  }

  // Exactly the model's tensors, by HF name and shape.
  std::set<std::string> expected;
  for (const UnitSpec& unit : describe_units(model))
    for (const ParameterSpec& parameter : unit.parameters) {
      expected.insert(parameter.name);
      auto found = file_of_.find(parameter.name);
      LLM_REQUIRE(found != file_of_.end(), kFlag, folder,
                  "has no tensor " + parameter.name + ", which --config " + model.name +
                      " has: the folder holds another model (or an incomplete save)");
      const SafetensorsEntry& entry = found->second->entries().at(parameter.name);
      LLM_REQUIRE(entry.shape == parameter.shape, found->second->path(), parameter.name,
                  "shape " + shape_text(entry.shape) + " there, " + shape_text(parameter.shape) + " in --config " +
                      model.name);
      LLM_REQUIRE(at::isFloatingType(entry.dtype), found->second->path(), parameter.name,
                  std::string("holds ") + c10::toString(entry.dtype) + " values, not floating point weights");
      weight_bytes_ += static_cast<int64_t>(entry.nbytes());
    }
  for (const auto& [name, file] : file_of_)
    if (!expected.count(name) && !is_rotary_buffer(name))
      fail_user(file->path(), name,
                "a tensor --config " + model.name + " has no parameter for (the folder holds another model, e.g. "
                "tied or biased, or extra heads): pass the matching --config");
  for (const std::string& name : unindexed)
    if (!is_rotary_buffer(name))
      fail_user(index_path.string(), name, "a shard holds this tensor but the index does not name it");
}

int64_t PretrainedFolder::load_rows(const UnitSpec& unit, const NamedTensors& parameters,
                                   const FlatShardLayout& layout) const {
  at::NoGradGuard no_grad;
  if (layout.parameters.size() != parameters.size())
    throw std::logic_error("load_rows: a layout of another unit than " + unit.name);
  int64_t bytes = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& [name, parameter] = parameters[i];
    const ShardedParameter& rows = layout.parameters[i];
    if (rows.name != name) throw std::logic_error("load_rows: layout row " + rows.name + " for parameter " + name);
    auto found = file_of_.find(name);
    LLM_REQUIRE(found != file_of_.end(), kFlag, folder_, "has no tensor " + name + " (unit " + unit.name + ")");
    if (rows.rows_held == 0) continue;  // padding only on this rank
    // One byte range at a time: the rows, then in the parameter's dtype on its device.
    const at::Tensor values = found->second->read_rows(name, rows.first_row, rows.rows_held);
    require_finite(values, found->second->path(), name, rows.first_row);
    parameter.narrow(0, rows.first_row, rows.rows_held).copy_(values);
    bytes += static_cast<int64_t>(values.nbytes());
  }
  return bytes;
}

std::unique_ptr<PretrainedFolder> open_init_from(const std::string& folder, const ModelConfig& model, bool log_notes) {
  if (folder.empty()) return nullptr;
  return std::make_unique<PretrainedFolder>(folder, model, log_notes);
}

}  // namespace llm
