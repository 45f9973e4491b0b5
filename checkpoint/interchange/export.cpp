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
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/folder_lock.h"
#include "common/log.h"
#include "common/output_files.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/interchange/hf_config.h"
#include "checkpoint/interchange/safetensors.h"
#include "data/hf_tokenizer.h"
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
         name == "generation_config.json" || name == "tokenizer.model" || name == "tokenizer.json" ||
         name == "tokenizer_config.json";
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

// The tokenizer to export: --tokenizer's, or "" with the reason in `why_not`. Nothing outside the
// checkpoint folder is looked at on the manifest's word (issue 44: a name read from a file stays
// inside its folder): the run's --data path the manifest records is only named, with the file
// `trainer prepare --vocab_size` keeps beside it, for the user to pass.
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
  *why_not = "no --tokenizer given; the run trained on " + source + ": pass --tokenizer " + source +
             ".model if `trainer prepare --vocab_size` trained it there (or the SentencePiece .model or "
             "tokenizer.json the data was encoded with; a shard folder's index.json names it). A path "
             "read from the checkpoint is not followed";
  return "";
}

// The tokenizer an export writes, checked before anything is written (issue 44: a file that was not
// one failed after the weights were written). Two kinds, the two `trainer prepare` encodes with: a
// SentencePiece model, written as tokenizer.model (LLaMA's; transformers' LlamaTokenizer reads it
// by config.json's model_type), or a Hugging Face tokenizer.json (LLaMA 3's, GPT-2's), written as
// tokenizer.json with a tokenizer_config.json naming PreTrainedTokenizerFast, so that
// AutoTokenizer.from_pretrained(DIR) encodes exactly as prepare did. Either must fit the model's
// vocabulary.
struct ExportedTokenizer {
  std::string source;
  bool hugging_face = false;
};

ExportedTokenizer checked_tokenizer(const std::string& source, int64_t vocab_size) {
  int64_t pieces = 0;
  const bool hugging_face = is_hf_tokenizer(source);
  if (hugging_face) {
    pieces = HfTokenizer(source).vocab_size();  // the library reads it, or a UserError naming it
  } else {
    sentencepiece::SentencePieceProcessor processor;
    const auto loaded = processor.Load(source);
    LLM_REQUIRE(loaded.ok(), source, "--tokenizer",
                "is neither a SentencePiece model nor a Hugging Face tokenizer.json (SentencePiece: " +
                    std::string(loaded.ToString()) + "): export writes the one as tokenizer.model and the other as "
                    "tokenizer.json; pass the tokenizer the token file was made with");
    pieces = processor.GetPieceSize();
  }
  LLM_REQUIRE(pieces <= vocab_size, source, "--tokenizer",
              "has " + std::to_string(pieces) + " pieces, more than the model's vocab_size " +
                  std::to_string(vocab_size) + ": it is not the tokenizer this model was trained with");
  return {source, hugging_face};
}

// Writes the checked tokenizer into DIR; returns the bytes written.
uint64_t write_tokenizer(const ExportedTokenizer& tokenizer, const fs::path& to) {
  std::ifstream in(tokenizer.source, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLM_REQUIRE(in.good() || in.eof(), tokenizer.source, "--tokenizer", "cannot be read");
  const fs::path destination = to / (tokenizer.hugging_face ? "tokenizer.json" : "tokenizer.model");
  write_file_atomically(destination, bytes);
  uint64_t written = bytes.size();
  if (tokenizer.hugging_face) {
    const std::string config = nlohmann::json{{"tokenizer_class", "PreTrainedTokenizerFast"}}.dump(2) + "\n";
    write_file_atomically(to / "tokenizer_config.json", config);
    written += config.size();
  }
  log::info("export: wrote {} (from {})", destination.string(), tokenizer.source);
  return written;
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
                "\"" + options.tokenizer + "\" is not a file: pass a SentencePiece .model file or a tokenizer.json");
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
  std::string why_not;
  const std::string tokenizer_source = tokenizer_to_export(options, checkpoint.manifest(), folder, &why_not);
  const std::optional<ExportedTokenizer> tokenizer =
      tokenizer_source.empty() ? std::nullopt : std::optional(checked_tokenizer(tokenizer_source, model.vocab_size));

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
  if (tokenizer) {
    written += write_tokenizer(*tokenizer, to);
  } else {
    log::warn("export: no tokenizer exported: {}", why_not);
  }
  const int64_t step = checkpoint.manifest().value("step", int64_t{-1});
  log::info("export: {} (step {}, {} parameters, {}) -> {}: {} in all", folder, step, model.num_parameters(),
            options.dtype, options.to, human_bytes(static_cast<int64_t>(written)));
  return written;
}

}  // namespace llm
