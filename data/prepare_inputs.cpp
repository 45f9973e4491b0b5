#include "data/prepare_inputs.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include "common/errors.h"
#include "common/output_files.h"
#include "data/token_corpus.h"
#include "data/text_input.h"
#include "data/token_file.h"

namespace llm {

std::string describe_inputs(const std::vector<std::string>& inputs) {
  std::string text;
  for (size_t i = 0; i < inputs.size() && i < 2; ++i) text += (i == 0 ? "" : ", ") + inputs[i];
  if (inputs.size() > 2) text += " and " + std::to_string(inputs.size() - 2) + " more";
  return text;
}

static void check_input(const std::string& input, const std::string& text_key) {
  namespace fs = std::filesystem;
  std::error_code error;
  const auto status = fs::status(input, error);
  LLM_REQUIRE(fs::exists(status), input, "--input",
              "does not exist; check the path of the text file");
  LLM_REQUIRE(fs::is_regular_file(status), input, "--input",
              std::string(fs::is_directory(status) ? "is a folder" : "is not a regular file") +
                  "; pass text files (one document per line)");
  LLM_REQUIRE(fs::file_size(input, error) > 0 && !error, input, "--input",
              "is empty; remove it from the inputs or fill it with text");
  std::ifstream in(input, std::ios::binary);
  LLM_REQUIRE(in.good(), input, "--input", "cannot be opened for reading; check its permissions");
  in.close();
  // The first bytes as the encoder will see them: through gzip or zstd when the file is compressed.
  const TextCompression compression = compression_of(input);
  const std::unique_ptr<ByteSource> source = ByteSource::open(input, "--input", text_key);
  std::string head(kTextProbeBytes, '\0');
  size_t got = 0;
  while (got < head.size()) {
    const size_t read = source->read(head.data() + got, head.size() - got);
    if (read == 0) break;
    got += read;
  }
  const bool whole_file = got < head.size();
  head.resize(got);
  // The check every byte of the file passes again as it is encoded (Utf8Check, data/text_input.h):
  // here the first bytes, before a tokenizer is trained, so that a binary file fails at once. A
  // character cut by the end of the probe is not held against the file.
  Utf8Check utf8;
  std::string why = utf8.feed(head.data(), head.size());
  if (why.empty() && whole_file) why = utf8.finish();
  const std::string what = compression == TextCompression::none      ? ""
                           : compression == TextCompression::parquet ? std::string(" (its \"") + text_key + "\" column)"
                                                                     : std::string(" (") + to_string(compression) + "-compressed)";
  LLM_REQUIRE(why.empty(), input, "--input",
              "is not UTF-8 text" + what + ": " + why + " in its first " + std::to_string(head.size()) +
                  " bytes; pass text (one document per line) or JSON Lines files, plain, gzip or zstd");
  LLM_REQUIRE(got > 0, input, "--input", "holds no text" + what + "; remove it from the inputs or fill it with text");
}

std::vector<std::string> expand_input_globs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code error;
    if (input.find_first_of("*?[") == std::string::npos || std::filesystem::exists(input, error)) {
      files.push_back(input);
      continue;
    }
    glob_t found{};
    const int status = ::glob(input.c_str(), GLOB_ERR, nullptr, &found);
    std::vector<std::string> matches;
    for (size_t i = 0; status == 0 && i < found.gl_pathc; ++i) matches.push_back(found.gl_pathv[i]);
    ::globfree(&found);
    LLM_REQUIRE(!matches.empty(), input, "--input", "the pattern matches no file; check the path");
    std::sort(matches.begin(), matches.end());
    files.insert(files.end(), matches.begin(), matches.end());
  }
  return files;
}

// True when both paths name one existing file (however spelt).
static bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  return std::filesystem::equivalent(a, b, error) && !error;
}

std::string trained_tokenizer_path(const PrepareOptions& options) {
  return options.shard_tokens > 0 ? (std::filesystem::path(options.output) / "tokenizer.model").string()
                                  : options.output + ".model";
}

// --shard_tokens: --output is a folder, new, empty, or (with --overwrite) an earlier prepare's (its
// index.json lists what it wrote; anything else in it is the user's and is never replaced).
static void check_shard_folder(const PrepareOptions& options) {
  namespace fs = std::filesystem;
  const fs::path folder = options.output;
  std::error_code error;
  const fs::path parent = fs::absolute(folder).parent_path();
  LLM_REQUIRE(fs::is_directory(parent, error), options.output, "--output",
              "its folder " + parent.string() + " does not exist; create it first or choose another --output");
  if (!fs::exists(fs::symlink_status(folder, error))) return;
  refuse_unless_absent_or(folder, OutputKind::folder, "--output (the shards' folder)");
  for (const std::string& input : options.inputs)
    LLM_REQUIRE(fs::absolute(input).parent_path() != fs::absolute(folder), options.output, "--output",
                "holds the --input " + input + ": the shards' folder must be another than the inputs'");
  if (fs::is_empty(folder, error)) return;
  LLM_REQUIRE(!fs::exists(folder / kUnfinishedPrepareFile, error) || options.overwrite, options.output, "--output",
              std::string("holds the shards of a `trainer prepare` that did not finish (killed, or out of space: ") +
                  kUnfinishedPrepareFile + " is there): pass --overwrite to replace them, or choose another folder");
  if (fs::exists(folder / kUnfinishedPrepareFile, error)) return;
  LLM_REQUIRE(fs::exists(folder / "index.json"), options.output, "--output",
              "is a folder that holds other files (no index.json of an earlier `trainer prepare`); choose a new or "
              "empty folder for the shards");
  LLM_REQUIRE(options.overwrite, options.output, "--output",
              "holds the shards of an earlier `trainer prepare` (index.json); pass --overwrite to replace them, or "
              "choose another folder");
}

// The token file and, when training, OUTPUT.model: never one of the inputs or the tokenizer, and
// an existing one only with --overwrite.
static void check_outputs(const PrepareOptions& options) {
  namespace fs = std::filesystem;
  if (options.shard_tokens > 0) return check_shard_folder(options);
  std::vector<std::string> outputs = {options.output};
  if (options.tokenizer.empty()) outputs.push_back(trained_tokenizer_path(options));
  if (options.format == "megatron" && options.output.ends_with(".bin"))
    outputs.push_back(options.output.substr(0, options.output.size() - 4) + ".idx");
  const fs::path folder = fs::path(options.output).parent_path();
  std::error_code error;
  LLM_REQUIRE(folder.empty() || fs::is_directory(folder, error), options.output, "--output",
              "its folder " + folder.string() + (fs::exists(folder, error) ? " is not a folder"
                                                                           : " does not exist") +
                  "; create the folder first or choose another --output");
  for (const std::string& output : outputs) {
    const auto status = fs::status(output, error);
    if (!fs::exists(status)) continue;
    const std::string what = output == options.output ? "" : " (the tokenizer trained for --output)";
    LLM_REQUIRE(!fs::is_directory(status), output, "--output",
                "is a folder" + what + "; pass the path of the token file to write, e.g. data/train.tok");
    // A device, fifo or socket: a write-then-rename would replace it with a regular file (even with
    // --overwrite, which means "replace my earlier output", never "replace /dev/full").
    refuse_unless_absent_or(output, OutputKind::file, "--output" + what);
    for (const std::string& input : options.inputs)
      LLM_REQUIRE(!same_file(output, input), output, "--output",
                  "is also an --input" + what + ": writing it would destroy the text it is made "
                  "from; choose another --output");
    LLM_REQUIRE(options.tokenizer.empty() || !same_file(output, options.tokenizer), output, "--output",
                "is the --tokenizer: writing it would destroy the model it is encoded with; "
                "choose another --output");
    LLM_REQUIRE(options.overwrite, output, "--output",
                "exists" + what + "; pass --overwrite to replace it, or choose another --output");
  }
}

void check_inputs(const PrepareOptions& options) {
  LLM_REQUIRE(!options.inputs.empty(), "prepare", "--input",
              "no input text files were given; pass one or more text files");
  LLM_REQUIRE(!options.output.empty(), "prepare", "--output",
              "no output path was given; pass the token file to write, e.g. data/train.bin");
  for (const std::string& input : options.inputs) check_input(input, options.text_key);
  // One file named twice (twice by name, by a name and a glob, or through a link) would be encoded
  // twice: every document of it doubled in the corpus (issue 44). Files by device and inode.
  std::map<std::pair<dev_t, ino_t>, std::string> seen;
  for (const std::string& input : options.inputs) {
    struct stat info {};
    if (::stat(input.c_str(), &info) != 0) continue;  // check_input said it is there
    const auto [first, added] = seen.emplace(std::make_pair(info.st_dev, info.st_ino), input);
    LLM_REQUIRE(added, input, "--input",
                "is named twice" + (first->second == input ? std::string() : " (also as " + first->second + ")") +
                    ": each input is encoded once; drop the repeated --input");
  }
  LLM_REQUIRE(options.format == "trainer" || options.format == "llmc" || options.format == "megatron", "prepare", "--format",
              "\"" + options.format + "\" is not a format prepare writes; use trainer (ours, .tok), llmc (llm.c's .bin) or "
              "megatron (Megatron-LM's .bin and .idx, which records documents)");
  LLM_REQUIRE(options.format != "megatron" || options.shard_tokens > 0 || options.output.ends_with(".bin"), options.output,
              "--format megatron/--output",
              "--format megatron writes a Megatron dataset, PREFIX.bin with PREFIX.idx beside it, so --output names "
              "the .bin (e.g. --output data/train.bin); for a " +
                  (options.output.ends_with(".tok") ? std::string(".tok, our format, drop --format megatron")
                                                    : std::string("file of our format, drop --format megatron and name it .tok")));
  LLM_REQUIRE(options.shard_tokens == 0 ||
                  (options.shard_tokens >= kMinShardTokens && options.shard_tokens <= kMaxShardTokens),
              "prepare", "--shard_tokens",
              "expected 0 (one file) or an integer in [" + std::to_string(kMinShardTokens) + ", " +
                  std::to_string(kMaxShardTokens) + "] (got " + std::to_string(options.shard_tokens) + ")");
  const bool has_tokenizer = !options.tokenizer.empty();
  LLM_REQUIRE(has_tokenizer || options.vocab_size > 0, "prepare", "--tokenizer/--vocab_size",
              "neither was given; pass --tokenizer MODEL to encode with an existing SentencePiece "
              "model, or --vocab_size N to train one on the inputs");
  LLM_REQUIRE(!(has_tokenizer && options.vocab_size > 0), "prepare", "--tokenizer/--vocab_size",
              "both were given; --vocab_size trains a new tokenizer, so drop one of them");
  if (has_tokenizer) {
    std::error_code error;
    const auto status = std::filesystem::status(options.tokenizer, error);
    LLM_REQUIRE(std::filesystem::is_regular_file(status), options.tokenizer, "--tokenizer",
                std::string(std::filesystem::is_directory(status) ? "is a folder"
                            : std::filesystem::exists(status)     ? "is not a regular file"
                                                                  : "does not exist") +
                    "; pass a SentencePiece .model file (e.g. LLaMA's tokenizer.model) or "
                    "--vocab_size N to train one");
  } else {
    LLM_REQUIRE(options.vocab_size >= kMinVocabSize && options.vocab_size <= kMaxVocabSize,
                "prepare", "--vocab_size",
                "expected an integer in [" + std::to_string(kMinVocabSize) + ", " +
                    std::to_string(kMaxVocabSize) + "]: SentencePiece reserves 3 pieces "
                    "(<unk>, <s>, </s>) and counts in int32 (got " +
                    std::to_string(options.vocab_size) + ")");
    const std::string& type = options.model_type;
    LLM_REQUIRE(type == "bpe" || type == "unigram" || type == "char" || type == "word", "prepare",
                "--model_type", "\"" + type + "\" is not a SentencePiece model type; use bpe, "
                "unigram, char or word");
  }
  check_outputs(options);
}

}  // namespace llm
