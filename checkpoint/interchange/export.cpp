#include "checkpoint/interchange/export.h"

#include <sentencepiece_processor.h>

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/folder_lock.h"
#include "common/log.h"
#include "common/output_files.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/interchange/hf_config.h"
#include "checkpoint/interchange/safetensors.h"
#include "memory/categories.h"
#include "model/units.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

// The names an export writes: what --overwrite replaces, and nothing else.
bool is_export_file(const std::string& name) {
  const bool shard = name.rfind("model-", 0) == 0 && name.size() > 12 &&
                     name.compare(name.size() - 12, 12, ".safetensors") == 0 && name.find("-of-") != std::string::npos;
  return shard || name == "model.safetensors" || name == "model.safetensors.index.json" || name == "config.json" ||
         name == "generation_config.json" || name == "tokenizer.model";
}

// --to: created when missing; an existing file, or a folder with files in it, is refused (unless
// --overwrite). Checked before the checkpoint is read; nothing is changed until it has been.
void check_destination(const ExportOptions& options) {
  const fs::path to(options.to);
  std::error_code error;
  // A file, a device (/dev/null), a fifo: never replaced, --overwrite or not.
  refuse_unless_absent_or(to, OutputKind::folder, "--to");
  if (!fs::is_directory(to, error) || options.overwrite) return;
  std::vector<fs::path> entries;
  for (const auto& entry : fs::directory_iterator(to, error)) entries.push_back(entry.path());
  if (!entries.empty())
    fail_user(kCommandLine, "--to",
              "\"" + options.to + "\" is a folder with " + std::to_string(entries.size()) + " file(s) in it (e.g. " +
                  entries.front().filename().string() +
                  "); pass an empty or new folder, or --overwrite to replace an earlier export there");
}

// Creates --to, or with --overwrite removes what an earlier export wrote there (so a single-file
// export never sits beside an earlier export's shards), leaving any other file alone.
void prepare_destination(const ExportOptions& options) {
  const fs::path to(options.to);
  std::error_code error;
  if (fs::is_directory(to, error)) {
    std::vector<fs::path> stale;
    for (const auto& entry : fs::directory_iterator(to, error))
      if (is_export_file(entry.path().filename().string())) stale.push_back(entry.path());
    // Only files an export wrote are removed: a folder or a link under such a name is the user's.
    for (const fs::path& path : stale)
      refuse_unless_absent_or(path, OutputKind::file, "--to --overwrite: " + path.filename().string());
    for (const fs::path& path : stale)
      if (!fs::remove(path, error) && error)
        fail_user(kCommandLine, "--to", "cannot remove the earlier export's " + path.string() + " (" + error.message() + ")");
    return;
  }
  fs::create_directories(to, error);
  if (error) fail_user(kCommandLine, "--to", "cannot create \"" + options.to + "\" (" + error.message() + ")");
}

// The checkpoint folder --from names, with --from in the resolver's messages (it words them for
// --continue_from, which accepts the same folders).
std::string resolve_from(const std::string& from) {
  try {
    return resolve_checkpoint_folder(from);
  } catch (const UserError& error) {
    std::string message = error.what();
    const std::string resolver_flag = "--continue_from: ";
    if (message.rfind(resolver_flag, 0) == 0) message = "--from: " + message.substr(resolver_flag.size());
    throw UserError(message);
  }
}

// The SentencePiece model to export and where it came from, or "" with the reason in `why_not`.
std::string tokenizer_to_export(const ExportOptions& options, const nlohmann::json& manifest,
                                const std::string& checkpoint, std::string* why_not) {
  if (!options.tokenizer.empty()) return options.tokenizer;
  const nlohmann::json data = manifest.value("data", nlohmann::json());
  if (!data.is_string()) {
    *why_not = checkpoint + "/manifest.json does not record the run's --data (a checkpoint from before "
               "`trainer export`); pass --tokenizer MODEL to export the one its token file was made with";
    return "";
  }
  const std::string source = data.get<std::string>();
  if (source == "synthetic") {
    *why_not = "the run trained on --data synthetic, token ids that no tokenizer made";
    return "";
  }
  const std::string beside = source + ".model";
  std::error_code error;
  if (fs::is_regular_file(beside, error)) return beside;
  *why_not = "the run's token file " + source + " has no " + fs::path(beside).filename().string() +
             " beside it (`trainer prepare --vocab_size` keeps the tokenizer it trains there; one given with "
             "--tokenizer is not recorded); pass --tokenizer MODEL to export the one it was encoded with";
  return "";
}

// Copies a SentencePiece model to DIR/tokenizer.model after loading it (a file that is not one, or
// has more pieces than the model has ids, is refused).
uint64_t copy_tokenizer(const std::string& source, int64_t vocab_size, const fs::path& destination) {
  sentencepiece::SentencePieceProcessor processor;
  const auto loaded = processor.Load(source);
  LLM_REQUIRE(loaded.ok(), source, "--tokenizer",
              "is not a SentencePiece model (" + std::string(loaded.ToString()) + ")");
  LLM_REQUIRE(processor.GetPieceSize() <= vocab_size, source, "--tokenizer",
              "has " + std::to_string(processor.GetPieceSize()) + " pieces, more than the model's vocab_size " +
                  std::to_string(vocab_size) + ": it is not the tokenizer this model was trained with");
  std::ifstream in(source, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_file_atomically(destination, bytes);
  return bytes.size();
}

}  // namespace

uint64_t parse_byte_size(const std::string& text) {
  size_t digits_end = 0;
  while (digits_end < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits_end])) || text[digits_end] == '.'))
    ++digits_end;
  if (digits_end == 0 || std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(digits_end), '.') > 1)
    return 0;
  std::string unit = text.substr(digits_end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const struct { const char* name; double bytes; } units[] = {
      {"", 1},       {"B", 1},           {"KB", 1e3},        {"MB", 1e6},        {"GB", 1e9},
      {"TB", 1e12},  {"KIB", 1024.0},    {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  for (const auto& [name, bytes] : units)
    if (unit == name) {
      const double value = std::stod(text.substr(0, digits_end)) * bytes;
      return value >= 1 && value < 1.8e19 ? static_cast<uint64_t>(value) : 0;
    }
  return 0;
}

uint64_t export_checkpoint(const ExportOptions& options) {
  LLM_REQUIRE(options.dtype == "float32" || options.dtype == "bfloat16", kCommandLine, "--dtype",
              "expected float32 or bfloat16 (got " + options.dtype + ")");
  LLM_REQUIRE(options.max_shard_size > 0, kCommandLine, "--max_shard_size", "expected a size above 0");
  const std::string folder = resolve_from(options.from);
  if (!options.tokenizer.empty()) {
    std::error_code error;
    LLM_REQUIRE(fs::is_regular_file(options.tokenizer, error), kCommandLine, "--tokenizer",
                "\"" + options.tokenizer + "\" is not a file: pass a SentencePiece .model file");
  }
  check_destination(options);
  // One writer per --to (issue 44: two exports to one folder left one's config beside the other's
  // weights): the second is refused, naming the first, before anything is read or written.
  const std::unique_ptr<FolderLock> lock = FolderLock::output(options.to, "--to");
  const CheckpointReader checkpoint(folder);
  const std::string manifest_path = folder + "/manifest.json";
  LLM_REQUIRE(checkpoint.manifest().contains("model"), manifest_path, "model",
              "missing: the checkpoint does not say which model it holds");
  const ModelConfig model = parse_model_config(checkpoint.manifest().at("model"), manifest_path);
  const at::ScalarType dtype = options.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;

  // Every parameter in unit order, checked against the checkpoint before anything is written; each is
  // read (from every rank's part of it) only as it is written.
  struct Planned {
    SafetensorsEntry entry;
    int64_t numel = 0;
  };
  std::vector<Planned> planned;
  for (const UnitSpec& unit : describe_units(model))
    for (const ParameterSpec& parameter : unit.parameters) {
      LLM_REQUIRE(checkpoint.contains(parameter.name), folder, parameter.name,
                  "missing tensor: the checkpoint is damaged or incomplete; export an earlier step_<N>");
      planned.push_back({{parameter.name, dtype, parameter.shape}, c10::multiply_integers(parameter.shape)});
    }

  // transformers' split: a tensor starts a new file when it would take the current one past the
  // limit; a tensor above the limit alone is a file of its own.
  std::vector<std::vector<size_t>> files(1);
  uint64_t file_bytes = 0, total_tensor_bytes = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    const uint64_t bytes = static_cast<uint64_t>(planned[i].numel) * c10::elementSize(dtype);
    if (!files.back().empty() && file_bytes + bytes > options.max_shard_size) {
      files.emplace_back();
      file_bytes = 0;
    }
    files.back().push_back(i);
    file_bytes += bytes;
    total_tensor_bytes += bytes;
  }

  prepare_destination(options);
  const fs::path to(options.to);
  uint64_t written = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t f = 0; f < files.size(); ++f) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", f + 1, files.size());
    const std::string file_name = files.size() == 1 ? "model.safetensors" : name;
    std::vector<SafetensorsEntry> entries;
    for (size_t i : files[f]) entries.push_back(planned[i].entry);
    SafetensorsWriter writer((to / file_name).string(), entries);
    for (size_t i : files[f]) {
      // Read, converted to --dtype and written one tensor at a time.
      writer.write(planned[i].entry.name, checkpoint.read_full(planned[i].entry.name).view(planned[i].entry.shape));
      weight_map[planned[i].entry.name] = file_name;
    }
    const uint64_t bytes = writer.finish();
    written += bytes;
    log::info("export: wrote {} ({} tensors, {})", writer.path(), files[f].size(),
              human_bytes(static_cast<int64_t>(bytes)));
  }
  if (files.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total_tensor_bytes}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    write_file_atomically(to / "model.safetensors.index.json", text);
    written += text.size();
  }
  for (const auto& [file_name, json] : {std::pair{"generation_config.json", hf_generation_config_json(model)},
                                        std::pair{"config.json", hf_config_json(model, options.dtype)}}) {
    const std::string text = json.dump(2) + "\n";
    write_file_atomically(to / file_name, text);
    written += text.size();
  }
  std::string why_not;
  const std::string tokenizer = tokenizer_to_export(options, checkpoint.manifest(), folder, &why_not);
  if (tokenizer.empty()) {
    log::warn("export: no tokenizer exported: {}", why_not);
  } else {
    written += copy_tokenizer(tokenizer, model.vocab_size, to / "tokenizer.model");
    log::info("export: wrote {} (from {})", (to / "tokenizer.model").string(), tokenizer);
  }
  const int64_t step = checkpoint.manifest().value("step", int64_t{-1});
  log::info("export: {} (step {}, {} parameters, {}) -> {}: {} in all", folder, step, model.num_parameters(),
            options.dtype, options.to, human_bytes(static_cast<int64_t>(written)));
  return written;
}

}  // namespace llm
