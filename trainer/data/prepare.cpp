// `trainer prepare`: stream text files through SentencePiece into a token file.
//
// Memory stays bounded whatever the corpus size: text is read in pieces (a line, or a bounded slice
// of a very long line cut at a space), batches of pieces are encoded in parallel and their ids go
// to disk through TokenFileWriter before the next batch is read, and tokenizer training samples at
// most kTrainingSentences pieces (SentencePiece's reservoir).
// A document is one line: EOS follows every non-empty line, so a file that is one long line is one
// document, and a JSONL-style corpus gets one document per record.
#include "trainer/data/prepare.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <unordered_map>

#include "common/errors.h"
#include "common/log.h"
#include "trainer/data/token_file.h"

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

// Reads a text file as pieces of at most max_piece_bytes, each a whole line or a slice of a long
// line cut at its last space (else at a UTF-8 character boundary).
class LinePieceReader {
 public:
  LinePieceReader(const std::string& path, size_t max_piece_bytes)
      : path_(path), max_piece_bytes_(max_piece_bytes), buffer_(1 << 20) {
    file_ = std::fopen(path.c_str(), "rb");
    if (file_ == nullptr)
      fail_user(path, "input", "cannot open (" + std::string(std::strerror(errno)) +
                                   "); check the path");
  }
  ~LinePieceReader() {
    if (file_ != nullptr) std::fclose(file_);
  }
  LinePieceReader(const LinePieceReader&) = delete;
  LinePieceReader& operator=(const LinePieceReader&) = delete;

  // Fills piece; ends_line tells whether it is the last piece of its line. False at end of file.
  bool next(std::string& piece, bool& ends_line) {
    piece = std::move(carry_);
    carry_.clear();
    for (;;) {
      if (position_ == filled_ && !refill()) {
        if (piece.empty() && !line_open_) return false;
        ends_line = true;  // last line without a trailing newline
        line_open_ = false;
        strip_carriage_return(piece);
        return true;
      }
      const char* start = buffer_.data() + position_;
      const size_t available = filled_ - position_;
      const auto* newline = static_cast<const char*>(std::memchr(start, '\n', available));
      const size_t take = newline != nullptr ? static_cast<size_t>(newline - start) : available;
      const size_t room = max_piece_bytes_ - piece.size();
      line_open_ = true;
      if (take <= room) {
        piece.append(start, take);
        position_ += take;
        if (newline == nullptr) continue;
        ++position_;
        ends_line = true;
        line_open_ = false;
        strip_carriage_return(piece);
        return true;
      }
      piece.append(start, room);
      position_ += room;
      cut_at_boundary(piece);
      ends_line = false;
      return true;
    }
  }

 private:
  bool refill() {
    filled_ = std::fread(buffer_.data(), 1, buffer_.size(), file_);
    position_ = 0;
    if (filled_ == 0 && std::ferror(file_))
      fail_user(path_, "input", "read error (" + std::string(std::strerror(errno)) + ")");
    return filled_ > 0;
  }
  static void strip_carriage_return(std::string& piece) {
    if (!piece.empty() && piece.back() == '\r') piece.pop_back();
  }
  // Moves the tail after the last space (or a split UTF-8 character) into carry_.
  void cut_at_boundary(std::string& piece) {
    size_t cut = piece.rfind(' ');
    if (cut == std::string::npos || cut == 0) {
      cut = piece.size();
      while (cut > 0 && (static_cast<unsigned char>(piece[cut - 1]) & 0xC0) == 0x80) --cut;
      if (cut > 0 && static_cast<unsigned char>(piece[cut - 1]) >= 0xC0) --cut;  // a lead byte
      if (cut == 0) cut = piece.size();  // not UTF-8 at all: cut anywhere
    }
    carry_.assign(piece, cut, std::string::npos);
    piece.resize(cut);
  }

  std::string path_;
  size_t max_piece_bytes_;
  std::FILE* file_ = nullptr;
  std::vector<char> buffer_;
  size_t position_ = 0;
  size_t filled_ = 0;
  bool line_open_ = false;  // bytes of the current line were returned or are in carry_
  std::string carry_;
};

// Feeds every input's pieces to the SentencePiece trainer, one file after another.
class TrainingSentences final : public sentencepiece::SentenceIterator {
 public:
  explicit TrainingSentences(const std::vector<std::string>& inputs) : inputs_(inputs) { Next(); }
  bool done() const override { return done_; }
  const std::string& value() const override { return sentence_; }
  sentencepiece::util::Status status() const override { return status_; }
  void Next() override {
    bool ends_line = false;
    for (;;) {
      if (reader_ == nullptr) {
        if (next_input_ == inputs_.size()) {
          done_ = true;
          return;
        }
        try {
          reader_ = std::make_unique<LinePieceReader>(inputs_[next_input_++], kTrainingPieceBytes);
        } catch (const UserError& error) {
          status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound,
                                                error.what());
          done_ = true;
          return;
        }
      }
      if (!reader_->next(sentence_, ends_line)) {
        reader_.reset();
        continue;
      }
      if (sentence_.find_first_not_of(" \t\r\f\v") != std::string::npos) return;
    }
  }

 private:
  const std::vector<std::string>& inputs_;
  size_t next_input_ = 0;
  std::unique_ptr<LinePieceReader> reader_;
  std::string sentence_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

void check_inputs(const PrepareOptions& options) {
  LLM_REQUIRE(!options.inputs.empty(), "prepare", "inputs",
              "no input text files were given; pass one or more text files");
  LLM_REQUIRE(!options.output.empty(), "prepare", "--output",
              "no output path was given; pass the token file to write, e.g. data/train.bin");
  for (const std::string& input : options.inputs) {
    std::error_code error;
    const auto status = std::filesystem::status(input, error);
    LLM_REQUIRE(std::filesystem::exists(status), input, "input",
                "does not exist; check the path of the text file");
    LLM_REQUIRE(std::filesystem::is_regular_file(status), input, "input",
                "is not a regular file; pass text files (one document per line)");
    LLM_REQUIRE(std::filesystem::file_size(input, error) > 0 && !error, input, "input",
                "is empty; remove it from the inputs or fill it with text");
  }
  const bool has_tokenizer = !options.tokenizer.empty();
  LLM_REQUIRE(has_tokenizer || options.vocab_size > 0, "prepare", "--tokenizer/--vocab_size",
              "neither was given; pass --tokenizer MODEL to encode with an existing SentencePiece "
              "model, or --vocab_size N to train one on the inputs");
  LLM_REQUIRE(!(has_tokenizer && options.vocab_size > 0), "prepare", "--tokenizer/--vocab_size",
              "both were given; --vocab_size trains a new tokenizer, so drop one of them");
  if (!has_tokenizer) {
    const std::string& type = options.model_type;
    LLM_REQUIRE(type == "bpe" || type == "unigram" || type == "char" || type == "word", "prepare",
                "--model_type", "\"" + type + "\" is not a SentencePiece model type; use bpe, "
                "unigram, char or word");
  }
}

// Trains a tokenizer on the inputs and writes it to OUTPUT.model (through a .tmp and a rename).
std::string train_tokenizer(const PrepareOptions& options) {
  const std::string model_path = options.output + ".model";
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
  TrainingSentences sentences(options.inputs);
  std::string serialized_model;
  const auto status =
      sentencepiece::SentencePieceTrainer::Train(arguments, &sentences, &serialized_model);
  if (!status.ok())
    fail_user("prepare", "tokenizer training",
              std::string(status.message()) + "; with little text lower --vocab_size (every "
              "piece must be seen in the text), or give more text");

  const std::string temporary_path = model_path + ".tmp";
  {
    std::ofstream out(temporary_path, std::ios::binary | std::ios::trunc);
    out.write(serialized_model.data(), static_cast<std::streamsize>(serialized_model.size()));
    out.flush();
    LLM_REQUIRE(out.good(), temporary_path, "write",
                "cannot write the tokenizer model; check that the folder exists and is writable");
  }
  std::error_code error;
  std::filesystem::rename(temporary_path, model_path, error);
  LLM_REQUIRE(!error, model_path, "write", "cannot rename " + temporary_path + " to it");
  return model_path;
}

// Encodes one text file into the writer and returns its token count. Pieces are read in batches
// of about kEncodeBatchBytes and encoded in parallel (the processor is const and thread-safe), then
// appended in file order, so the result is the same as a sequential pass.
int64_t encode_file(const sentencepiece::SentencePieceProcessor& processor,
                    const std::string& input, TokenFileWriter& writer) {
  const int end_of_document = processor.eos_id();  // -1 when the model has none
  const int64_t tokens_before = writer.num_tokens();
  LinePieceReader reader(input, kEncodePieceBytes);
  std::vector<std::string> pieces;
  std::vector<char> piece_ends_line;
  std::vector<std::vector<int>> piece_ids;
  std::vector<std::string> piece_errors;
  std::vector<int64_t> pending;
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
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < count; ++i) {
      const auto encoded = processor.Encode(pieces[i], &piece_ids[i]);
      if (!encoded.ok()) piece_errors[i] = encoded.message();
    }
    for (int64_t i = 0; i < count; ++i) {
      if (!piece_errors[i].empty())
        fail_user(input, "encode", piece_errors[i] + "; is the file UTF-8 text?");
      pending.insert(pending.end(), piece_ids[i].begin(), piece_ids[i].end());
      document_has_tokens = document_has_tokens || !piece_ids[i].empty();
      if (piece_ends_line[i] && document_has_tokens) {
        if (end_of_document >= 0) pending.push_back(end_of_document);
        document_has_tokens = false;
      }
    }
    writer.append(pending);
    pending.clear();
  }
  return writer.num_tokens() - tokens_before;
}

}  // namespace

PrepareResult prepare_token_file(const PrepareOptions& options) {
  check_inputs(options);
  PrepareResult result;
  result.tokenizer_path =
      options.tokenizer.empty() ? train_tokenizer(options) : options.tokenizer;

  const std::string& tokenizer_path = result.tokenizer_path;
  LLM_REQUIRE(std::filesystem::is_regular_file(tokenizer_path), tokenizer_path, "--tokenizer",
              "does not exist; pass a SentencePiece .model file (e.g. LLaMA's tokenizer.model) or "
              "--vocab_size N to train one");
  sentencepiece::SentencePieceProcessor processor;
  const auto loaded = processor.Load(tokenizer_path);
  if (!loaded.ok())
    fail_user(tokenizer_path, "--tokenizer",
              "is not a SentencePiece model (" + std::string(loaded.message()) + "); pass a "
              "SentencePiece .model file (a HF tokenizer.json is not one), or --vocab_size N to "
              "train one");
  result.vocab_size = processor.GetPieceSize();
  TokenFileWriter writer(options.output, result.vocab_size);
  for (const std::string& input : options.inputs) {
    const int64_t tokens_of_input = encode_file(processor, input, writer);
    LLM_REQUIRE(tokens_of_input > 0, input, "input",
                "holds no text (only blank lines); remove it from the inputs or fill it with text");
    log::info("prepare: " + input + ": " + std::to_string(tokens_of_input) + " tokens");
  }
  writer.finish();
  result.num_tokens = writer.num_tokens();
  log::info("prepare: wrote " + options.output + " (" + std::to_string(result.num_tokens) +
            " tokens, vocab " + std::to_string(result.vocab_size) + ", tokenizer " +
            tokenizer_path + ")");
  return result;
}

}  // namespace llm
