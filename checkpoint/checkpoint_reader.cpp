// Reading a checkpoint (checkpoint/checkpoint.h, CheckpointReader): the manifest and every rank's
// index, checked against each other, and any range of a full tensor read from the parts that hold
// it, at any world size. Apart from writing (checkpoint.cpp) and the folders of a save_dir
// (checkpoint_folders.cpp, whose intact_manifest it opens a checkpoint with).
#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/interchange/safetensors.h"
#include "common/crc32c.h"
#include "common/errors.h"
#include "common/watchdog.h"
#include "common/json_file.h"

namespace llm {
namespace fs = std::filesystem;

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
      index = parse_json_text(text, path.string());
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
      for (const nlohmann::json& size : entry.at("shape"))
        if (!size.is_number_unsigned()) bad("shape holds " + json_excerpt(size) + ", not a size: the index is damaged");
      Tensor& tensor = tensors_[key];
      const std::vector<int64_t> shape = entry.at("shape").get<std::vector<int64_t>>();
      if (checked_element_count(shape) < 0)
        bad("shape " + shape_text(shape) + " holds more elements than any checkpoint does: the index is damaged");
      if (tensor.parts.empty()) tensor.full_shape = shape;
      if (shape != tensor.full_shape)
        bad("full shape " + shape_text(shape) + " here, " + shape_text(tensor.full_shape) + " in another rank's index");
      uint32_t crc = 0;
      if (!parse_crc_text(entry.at("crc32c").get<std::string>(), &crc))
        bad("crc32c " + json_excerpt(entry.at("crc32c")) + " is not a CRC-32C (8 hex digits): the index is damaged");
      tensor.parts.push_back({file_names_.size() - 1, entry.at("begin").get<int64_t>(), entry.at("count").get<int64_t>(), crc});
    }
  }
  // The ranks' parts of each tensor tile its shape exactly: a shape that claims more (or fewer)
  // elements than the parts hold is damage, refused here, before any reader allocates that shape.
  for (auto& [key, tensor] : tensors_) {
    std::sort(tensor.parts.begin(), tensor.parts.end(), [](const Part& a, const Part& b) { return a.begin < b.begin; });
    int64_t covered = 0;
    bool tiles = true;
    for (const Part& part : tensor.parts) {
      tiles = tiles && part.begin == covered && part.count >= 0 && part.count <= kMostElements - covered;
      if (tiles) covered += part.count;
    }
    LLM_REQUIRE(tiles && covered == checked_element_count(tensor.full_shape), folder_, key,
                "the index says shape " + shape_text(tensor.full_shape) + " (" +
                    std::to_string(checked_element_count(tensor.full_shape)) +
                    " elements) but the ranks' parts do not tile it: the checkpoint is damaged; use an earlier step_<N> folder");
  }
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
    // Optimizer state may be bf16 (--optimizer_state_dtype); the copy below converts to the
    // destination's dtype (bf16 -> fp32 exactly; fp32 -> bf16 to nearest even).
    const bool moment = key.ends_with(".exp_avg") || key.ends_with(".exp_avg_sq");
    LLM_REQUIRE(source.contains(key) &&
                    (source.entries().at(key).dtype == at::kFloat ||
                     (moment && source.entries().at(key).dtype == at::kBFloat16)) &&
                    source.entries().at(key).shape == std::vector<int64_t>{part.count},
                source.path(), key,
                std::string("expected a float32 ") + (moment ? "or bfloat16 " : "") + "part of " + std::to_string(part.count) +
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
