// `trainer prepare`: stream text files through SentencePiece into a token file.
//
// Memory stays bounded whatever the corpus size: text is read in pieces (a line, or a bounded slice
// of a very long line cut at a space), batches of pieces are encoded in parallel and their ids go
// to disk through TokenFileWriter before the next batch is read, and tokenizer training samples at
// most kTrainingSentences pieces (SentencePiece's reservoir).
// A document is a line of a text file or a record of a JSON Lines file (data/text_input.h): EOS
// follows every document that encodes to at least one token.
#include "data/prepare.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <span>
#include <thread>
#include <unordered_map>

#include "common/errors.h"
#include "common/input_paths.h"
#include "common/folder_lock.h"
#include "common/output_files.h"
#include "common/log.h"
#include <nlohmann/json.hpp>

#include "data/hf_tokenizer.h"
#include "data/prepare_inputs.h"
#include "data/text_input.h"
#include "data/token_corpus.h"
#include "data/token_file.h"
#include "common/json_file.h"

namespace llm {
namespace {

// Longest piece of a line handed to the encoder at once.
constexpr size_t kEncodePieceBytes = 1 << 20;
// Longest training sentence: below SentencePiece's max_sentence_length (4192 bytes by default),
// which would otherwise silently drop every longer line from training.
constexpr size_t kTrainingPieceBytes = 4096;
// Sentences SentencePiece keeps in memory for training (a uniform sample of the corpus).
constexpr int64_t kTrainingSentences = 2'000'000;
// Text encoded in parallel at once (and its ids held before they go to the token file).
constexpr size_t kEncodeBatchBytes = size_t{32} << 20;

// Feeds every input's pieces to the SentencePiece trainer, one file after another.
class TrainingSentences final : public sentencepiece::SentenceIterator {
 public:
  TrainingSentences(const std::vector<std::string>& inputs, const std::string& text_key)
      : inputs_(inputs), text_key_(text_key) {
    Next();
  }
  bool done() const override { return done_; }
  const std::string& value() const override { return sentence_; }
  sentencepiece::util::Status status() const override { return status_; }
  std::exception_ptr error() const { return error_; }
  void Next() override {
    bool ends_line = false;
    for (;;) {
      if (reader_ == nullptr) {
        if (next_input_ == inputs_.size()) {
          done_ = true;
          return;
        }
      }
      // A bad input (a byte that is not text anywhere in it, a bad record) stops the training and
      // is thrown again, as it was, once SentencePiece returns (train_tokenizer).
      try {
        if (reader_ == nullptr) reader_ = std::make_unique<DocumentReader>(inputs_[next_input_++], kTrainingPieceBytes, text_key_);
        if (!reader_->next(sentence_, ends_line)) {
          reader_.reset();
          continue;
        }
      } catch (const UserError& error) {
        error_ = std::current_exception();
        status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInvalidArgument, error.what());
        done_ = true;
        return;
      }
      if (sentence_.find_first_not_of(" \t\r\f\v") != std::string::npos) return;
    }
  }

 private:
  const std::vector<std::string>& inputs_;
  const std::string& text_key_;
  size_t next_input_ = 0;
  std::unique_ptr<DocumentReader> reader_;
  std::string sentence_;
  bool done_ = false;
  sentencepiece::util::Status status_;
  std::exception_ptr error_;
};

// SentencePiece's status text without its source location and failed condition:
// "./src/trainer_interface.cc(660) [a == b] Vocabulary size too high (40)." -> the sentence, and ""
// when there is nothing but the condition (its internals say nothing a user can act on).
std::string sentencepiece_text(const sentencepiece::util::Status& status) {
  std::string text = status.message();
  const std::string location = text.substr(0, text.find(' '));  // "./src/x.cc(660)" when there is one
  if (location.find(".cc(") != std::string::npos && location.back() == ')') {
    const size_t open = text.find(" [");
    const size_t close = open == std::string::npos ? std::string::npos : text.find("] ", open);
    text = close == std::string::npos ? "" : text.substr(close + 2);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '.')) text.pop_back();
  return text;
}

// The number after `marker` in text, or -1.
int64_t number_after(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) return -1;
  try {
    return std::stoll(text.substr(at + marker.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

// SentencePiece's training failures as ours: which flag, which files, what to change.
[[noreturn]] void fail_tokenizer_training(const PrepareOptions& options,
                                          const sentencepiece::util::Status& status) {
  const std::string inputs = describe_inputs(options.inputs);
  const std::string text = sentencepiece_text(status);
  const std::string asked = std::to_string(options.vocab_size);
  if (const int64_t most = number_after(text, "set it to a value <= "); most >= 0)
    fail_user(inputs, "--vocab_size",
              asked + " pieces is more than a " + options.model_type + " tokenizer can learn from "
              "this text: SentencePiece finds at most " + std::to_string(most) +
              "; pass --vocab_size " + std::to_string(most) + " or less, or give more text");
  if (const size_t at = text.find("required_chars"); at != std::string::npos) {
    const int64_t needed = number_after(text, " vs ");
    fail_user(inputs, "--vocab_size",
              asked + " pieces is fewer than this text needs: its distinct characters and 3 "
              "special pieces make " + (needed > 0 ? std::to_string(needed) : std::string("more")) +
              "; pass a larger --vocab_size (and more for merges)");
  }
  if (std::string(status.message()).find("sentences_.empty()") != std::string::npos)  // no sentence, a check
    fail_user(inputs, "--input",
              "holds no text to train a tokenizer on (only blank lines); fill the files with text");
  fail_user(inputs, "--vocab_size",
            "SentencePiece could not train a " + options.model_type + " tokenizer of " + asked +
            " pieces on this text" + (text.empty() ? "" : " (" + text + ")") +
            "; check --vocab_size and --model_type, or give more text");
}

// Trains a tokenizer on the inputs and writes it to OUTPUT.model (through a .tmp and a rename).
std::string train_tokenizer(const PrepareOptions& options) {
  const std::string model_path = trained_tokenizer_path(options);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const std::unordered_map<std::string, std::string> arguments = {
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"input_sentence_size", std::to_string(kTrainingSentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(std::min(threads, 16u))},
      {"minloglevel", "1"},  // SentencePiece's per-iteration progress lines: warnings only
  };
  // Plain strings into log::info: fmt-style calls need torch's fmt library at link time.
  log::info("prepare: training a " + options.model_type + " tokenizer with " +
            std::to_string(options.vocab_size) + " pieces on " +
            std::to_string(options.inputs.size()) + " file(s)");
  TrainingSentences sentences(options.inputs, options.text_key);
  std::string serialized_model;
  const auto status =
      sentencepiece::SentencePieceTrainer::Train(arguments, &sentences, &serialized_model);
  if (sentences.error()) std::rethrow_exception(sentences.error());
  if (!status.ok()) fail_tokenizer_training(options, status);

  write_file_atomically(model_path, serialized_model);  // never leaves a .tmp: the reason named
  return model_path;
}

// Where the ids go: one token file, or shards of --shard_tokens ids (each atomic, a new one opened
// when one is full) and, at the end, index.json (atomic) listing them; with --overwrite the earlier
// index's shards that this run did not write again are removed after the new index is in place.
class PreparedOutput {
 public:
  PreparedOutput(const PrepareOptions& options, int64_t vocab_size)
      : options_(options), vocab_size_(vocab_size),
        format_(options.format == "llmc"       ? TokenFormat::llmc
                : options.format == "megatron" ? TokenFormat::megatron
                                               : TokenFormat::trainer) {
    if (options.shard_tokens == 0) {
      writer_ = std::make_unique<TokenFileWriter>(options.output, vocab_size, format_);
      return;
    }
    // The shards an earlier prepare left (listed by its index.json, or by the unfinished marker of one
    // that was killed): removed once this one's index is in place, unless written again.
    namespace fs = std::filesystem;
    const fs::path folder = options.output;
    for (const char* listing : {"index.json", kUnfinishedPrepareFile}) {
      std::error_code error;
      if (!fs::exists(folder / listing, error)) continue;
      std::ifstream in(folder / listing);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const nlohmann::json old = parse_json_text(text, (folder / listing).string(), /*allow_exceptions=*/false);
      if (old.is_object() && old.contains("shards") && old.at("shards").is_array())
        for (const nlohmann::json& shard : old.at("shards")) {
          const nlohmann::json name = shard.is_object() ? shard.value("file", nlohmann::json()) : shard;
          if (name.is_string()) earlier_.push_back(name.get<std::string>());
        }
    }
    mark_unfinished();
  }
  // `ids` with the ends of the documents in it (offsets into ids, rising): Megatron's shards record
  // them and close at the first document end at or past --shard_tokens (whole documents a shard); the
  // other formats' shards hold exactly --shard_tokens ids.
  void append(std::span<const int64_t> ids, std::span<const size_t> document_ends) {
    if (format_ != TokenFormat::megatron) return append(ids);
    size_t done = 0;
    for (size_t end : document_ends) {
      append_to_shard(ids.subspan(done, end - done));
      writer_->end_document();
      done = end;
      if (options_.shard_tokens > 0 && writer_->num_tokens() >= options_.shard_tokens) close_shard();
    }
    if (done < ids.size()) append_to_shard(ids.subspan(done));  // a document that goes on in the next batch
  }
  void append(std::span<const int64_t> ids) {
    while (!ids.empty()) {
      if (writer_ == nullptr) open_shard();
      const auto room = options_.shard_tokens > 0 ? options_.shard_tokens - writer_->num_tokens()
                                                  : static_cast<int64_t>(ids.size());
      const auto take = std::min<int64_t>(room, static_cast<int64_t>(ids.size()));
      writer_->append(ids.subspan(0, static_cast<size_t>(take)));
      ids = ids.subspan(static_cast<size_t>(take));
      if (options_.shard_tokens > 0 && writer_->num_tokens() == options_.shard_tokens) close_shard();
    }
  }
  int64_t num_tokens() const { return done_tokens_ + (writer_ ? writer_->num_tokens() : 0); }
  // Finishes the last file and writes the index; returns the files written.
  std::vector<std::string> finish(const std::string& tokenizer) {
    if (options_.shard_tokens == 0) {
      writer_->finish();
      return {options_.output};
    }
    if (writer_ != nullptr) close_shard();
    namespace fs = std::filesystem;
    const fs::path folder = options_.output;
    const fs::path index = folder / "index.json";
    nlohmann::json listed = nlohmann::json::array();
    std::vector<std::string> files;
    for (const auto& [file, tokens] : shards_) {
      listed.push_back({{"file", file}, {"tokens", tokens}});
      files.push_back((folder / file).string());
    }
    nlohmann::json record = {{"format", to_string(format_)},   {"vocab_size", vocab_size_},
                             {"shard_tokens", options_.shard_tokens}, {"tokens", num_tokens()},
                             {"tokenizer", fs::absolute(tokenizer).string()}, {"shards", listed}};
    nlohmann::json inputs = nlohmann::json::array();
    for (const std::string& input : options_.inputs) inputs.push_back(fs::absolute(input).string());
    record["inputs"] = inputs;
    const std::string text = record.dump(1) + "\n";
    write_file_atomically(index, text);
    std::error_code error;
    // An earlier prepare's shard this one did not write again (and a Megatron shard's index): only
    // names a prepare gives its shards, so an index.json edited to list a user's file removes nothing.
    for (const std::string& file : earlier_)
      if (std::none_of(shards_.begin(), shards_.end(), [&](const auto& shard) { return shard.first == file; }) &&
          is_prepared_shard_name(file)) {
        fs::remove(folder / file, error);
        if (file.ends_with(".bin")) fs::remove(fs::path(folder / file).replace_extension(".idx"), error);
      }
    fs::remove(folder / kUnfinishedPrepareFile, error);  // the index is in place: finished
    return files;
  }

 private:
  void append_to_shard(std::span<const int64_t> ids) {
    if (writer_ == nullptr) open_shard();
    writer_->append(ids);
  }
  // The unfinished marker, listing every shard this prepare began and the earlier ones not yet removed:
  // what a later --overwrite removes if this one never finishes.
  void mark_unfinished() {
    nlohmann::json shards = nlohmann::json::array();
    for (const std::string& file : earlier_) shards.push_back(file);
    for (const auto& shard : shards_) shards.push_back(shard.first);
    write_file_atomically(std::filesystem::path(options_.output) / kUnfinishedPrepareFile,
                          nlohmann::json{{"shards", shards}}.dump() + "\n");
  }
  void open_shard() {
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%06zu.%s", shards_.size(), format_ == TokenFormat::trainer ? "tok" : "bin");
    shards_.emplace_back(name, 0);
    mark_unfinished();
    writer_ = std::make_unique<TokenFileWriter>((std::filesystem::path(options_.output) / name).string(), vocab_size_,
                                                format_);
  }
  void close_shard() {
    shards_.back().second = writer_->num_tokens();
    done_tokens_ += writer_->num_tokens();
    writer_->finish();
    writer_.reset();
  }

  const PrepareOptions& options_;
  int64_t vocab_size_;
  TokenFormat format_;
  std::unique_ptr<TokenFileWriter> writer_;
  std::vector<std::pair<std::string, int64_t>> shards_;  // file name, tokens
  std::vector<std::string> earlier_;  // the shard names an earlier prepare's index or marker listed
  int64_t done_tokens_ = 0;
};

// A progress line on stderr every few seconds while encoding: the decompressed MB read of the
// inputs' total on disk (a compressed input counts its decompressed bytes, so the share is shown
// only for plain inputs), MB/s and tokens/s since the start, as `pv` or tqdm would show them.
class Progress {
 public:
  explicit Progress(const std::vector<std::string>& inputs) : started_(std::chrono::steady_clock::now()) {
    for (const std::string& input : inputs) {
      std::error_code error;
      const auto bytes = std::filesystem::file_size(input, error);
      if (!error) disk_bytes_ += static_cast<int64_t>(bytes);
      plain_ = plain_ && compression_of(input) == TextCompression::none;
    }
    last_ = started_;
  }
  void add(int64_t bytes, int64_t tokens) {
    bytes_ += bytes;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::seconds(kEverySeconds)) return;
    last_ = now;
    report(tokens, false);
  }
  void finish(int64_t tokens) { report(tokens, true); }

 private:
  static constexpr int kEverySeconds = 5;
  void report(int64_t tokens, bool done) const {
    const double seconds = std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
    char line[256];
    const double mb = static_cast<double>(bytes_) / 1e6;
    if (plain_ && disk_bytes_ > 0 && !done)
      std::snprintf(line, sizeof(line), "prepare: %.1f of %.1f MB (%.0f %%), %.1f MB/s, %.0f tokens/s, %lld tokens", mb,
                    static_cast<double>(disk_bytes_) / 1e6, 100.0 * static_cast<double>(bytes_) / static_cast<double>(disk_bytes_),
                    mb / seconds, static_cast<double>(tokens) / seconds, static_cast<long long>(tokens));
    else
      std::snprintf(line, sizeof(line), "prepare: %s%.1f MB of text in %.1f s, %.1f MB/s, %.0f tokens/s, %lld tokens",
                    done ? "done: " : "", mb, seconds, mb / seconds, static_cast<double>(tokens) / seconds,
                    static_cast<long long>(tokens));
    log::info(line);
  }
  std::chrono::steady_clock::time_point started_, last_;
  int64_t bytes_ = 0, disk_bytes_ = 0;
  bool plain_ = true;
};

// Encodes one text file into the writer and returns its token count. Pieces are read in batches
// of about kEncodeBatchBytes and encoded in parallel (the processor is const and thread-safe), then
// appended in file order, so the result is the same as a sequential pass.
// The tokenizer prepare encodes with: a SentencePiece model (encoded here, in parallel across the
// threads) or a Hugging Face tokenizer.json (encoded by the tokenizers library in its helper).
struct Encoder {
  const sentencepiece::SentencePieceProcessor* sentencepiece = nullptr;
  HfTokenizer* hugging_face = nullptr;
  int end_of_document() const {
    return sentencepiece ? sentencepiece->eos_id() : static_cast<int>(hugging_face->end_of_document());
  }
};

int64_t encode_file(const Encoder& encoder, const std::string& input,
                    const std::string& text_key, PreparedOutput& writer, Progress& progress) {
  const int end_of_document = encoder.end_of_document();  // -1 when the tokenizer has none
  const int64_t tokens_before = writer.num_tokens();
  DocumentReader reader(input, kEncodePieceBytes, text_key);
  int64_t reported_bytes = 0;
  std::vector<std::string> pieces;
  std::vector<char> piece_ends_line;
  std::vector<std::vector<int>> piece_ids;
  std::vector<std::string> piece_errors;
  std::vector<int64_t> pending;
  std::vector<size_t> pending_document_ends;  // offsets into pending
  bool document_has_tokens = false;
  bool more = true;
  while (more) {
    pieces.clear();
    piece_ends_line.clear();
    size_t batch_bytes = 0;
    std::string piece;
    bool ends_line = false;
    while (batch_bytes < kEncodeBatchBytes && (more = reader.next(piece, ends_line))) {
      batch_bytes += piece.size();
      pieces.push_back(std::move(piece));
      piece_ends_line.push_back(ends_line);
    }
    const auto count = static_cast<int64_t>(pieces.size());
    piece_ids.resize(pieces.size());
    piece_errors.assign(pieces.size(), std::string());
    if (encoder.hugging_face != nullptr) piece_ids = encoder.hugging_face->encode(pieces);
    const sentencepiece::SentencePieceProcessor* processor = encoder.sentencepiece;
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < (processor != nullptr ? count : 0); ++i) {
      const auto encoded = processor->Encode(pieces[i], &piece_ids[i]);
      if (!encoded.ok()) {
        const std::string text = sentencepiece_text(encoded);
        piece_errors[i] = text.empty() ? "its encoder failed" : text;
      }
    }
    for (int64_t i = 0; i < count; ++i) {
      if (!piece_errors[i].empty())
        fail_user(input, "--input", "the tokenizer cannot encode it (" + piece_errors[i] +
                                        "); is the file UTF-8 text?");
      pending.insert(pending.end(), piece_ids[i].begin(), piece_ids[i].end());
      document_has_tokens = document_has_tokens || !piece_ids[i].empty();
      if (piece_ends_line[i] && document_has_tokens) {
        if (end_of_document >= 0) pending.push_back(end_of_document);
        pending_document_ends.push_back(pending.size());
        document_has_tokens = false;
      }
    }
    writer.append(pending, pending_document_ends);
    pending.clear();
    pending_document_ends.clear();
    progress.add(reader.bytes_read() - reported_bytes, writer.num_tokens());
    reported_bytes = reader.bytes_read();
  }
  return writer.num_tokens() - tokens_before;
}

}  // namespace

PrepareResult prepare_token_file(const PrepareOptions& given) {
  PrepareOptions options = given;
  options.inputs = expand_input_globs(given.inputs);
  check_inputs(options);
  // One writer per output (issue 44: two prepares on one --output both reported success): the
  // second is refused, naming the first, before anything is written.
  const std::unique_ptr<FolderLock> lock = FolderLock::output(options.output, "--output");
  if (options.shard_tokens > 0) std::filesystem::create_directories(options.output);
  PrepareResult result;
  result.tokenizer_path =
      options.tokenizer.empty() ? train_tokenizer(options) : options.tokenizer;

  const std::string& tokenizer_path = result.tokenizer_path;
  sentencepiece::SentencePieceProcessor processor;
  std::unique_ptr<HfTokenizer> hugging_face;
  Encoder encoder;
  if (is_hf_tokenizer(tokenizer_path)) {
    hugging_face = std::make_unique<HfTokenizer>(tokenizer_path);
    encoder.hugging_face = hugging_face.get();
    result.vocab_size = hugging_face->vocab_size();
    if (hugging_face->end_of_document() < 0)
      log::warn("prepare: " + tokenizer_path + " has none of </s>, <|end_of_text|>, <|endoftext|>, <eos>: documents "
                "are not separated in the token file");
  } else {
    const auto loaded = processor.Load(tokenizer_path);
    if (!loaded.ok())
      fail_user(tokenizer_path, "--tokenizer",
                "is not a SentencePiece model" +
                    (sentencepiece_text(loaded).empty() ? "" : " (" + sentencepiece_text(loaded) + ")") +
                    "; pass a SentencePiece .model file or a Hugging Face tokenizer.json, or --vocab_size N to "
                    "train one");
    encoder.sentencepiece = &processor;
    result.vocab_size = processor.GetPieceSize();
  }
  PreparedOutput writer(options, result.vocab_size);
  Progress progress(options.inputs);
  for (const std::string& input : options.inputs) {
    const int64_t tokens_of_input = encode_file(encoder, input, options.text_key, writer, progress);
    LLM_REQUIRE(tokens_of_input > 0, input, "--input",
                "holds no text (only blank lines); remove it from the inputs or fill it with text");
    log::info("prepare: " + input + ": " + std::to_string(tokens_of_input) + " tokens");
  }
  result.num_tokens = writer.num_tokens();
  result.shards = writer.finish(tokenizer_path);
  progress.finish(result.num_tokens);
  log::info("prepare: wrote " + (options.shard_tokens > 0 ? std::to_string(result.shards.size()) + " shard(s) and index.json in " : std::string()) +
            options.output + " (" + std::to_string(result.num_tokens) + " tokens, vocab " +
            std::to_string(result.vocab_size) + ", " + (options.format == "llmc" ? "llm.c's format" : options.format == "megatron" ? "Megatron's format" : "our format") +
            ", tokenizer " + tokenizer_path + ")");
  return result;
}

}  // namespace llm
