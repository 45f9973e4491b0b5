// `trainer prepare`: stream text files through SentencePiece into a token file.
//
// Memory stays bounded whatever the corpus size: text is read in pieces (a line, or a bounded slice
// of a very long line cut at a space), batches of pieces are encoded in parallel and their ids go
// to disk through TokenFileWriter before the next batch is read, and tokenizer training samples at
// most kTrainingSentences pieces (SentencePiece's reservoir).
// A document is one line: EOS follows every non-empty line, so a file that is one long line is one
// document, and a JSONL-style corpus gets one document per record.
#include "data/prepare.h"

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
#include "common/output_files.h"
#include "common/log.h"
#include "data/token_file.h"

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
      fail_user(path, "--input", "cannot open (" + std::string(std::strerror(errno)) +
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
      fail_user(path_, "--input", "read error (" + std::string(std::strerror(errno)) + ")");
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

// The inputs for a message: "a.txt", "a.txt, b.txt", or "a.txt, b.txt and 3 more".
std::string describe_inputs(const std::vector<std::string>& inputs) {
  std::string text;
  for (size_t i = 0; i < inputs.size() && i < 2; ++i) text += (i == 0 ? "" : ", ") + inputs[i];
  if (inputs.size() > 2) text += " and " + std::to_string(inputs.size() - 2) + " more";
  return text;
}

// Why these first bytes of a file are not UTF-8 text, or "" when they are. A character cut by the
// end of the probe is not held against the file.
std::string why_not_text(const std::string& bytes, bool whole_file) {
  const size_t size = bytes.size();
  size_t i = 0;
  while (i < size) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead == 0)
      return "a NUL byte at byte " + std::to_string(i) + " (a binary file, or UTF-16 text?)";
    if (lead < 0x80) {
      ++i;
      continue;
    }
    // Lead bytes of 2-, 3- and 4-byte characters; C0, C1 and F5..FF never start one.
    const size_t length = lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3
                        : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
    bool valid = length > 0;
    if (valid && i + length > size && !whole_file) break;  // cut by the probe
    valid = valid && i + length <= size;
    for (size_t k = 1; valid && k < length; ++k)
      valid = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (valid) {  // no overlong forms, surrogates or code points above U+10FFFF
      const auto second = static_cast<unsigned char>(bytes[i + 1]);
      valid = !(lead == 0xE0 && second < 0xA0) && !(lead == 0xED && second > 0x9F) &&
              !(lead == 0xF0 && second < 0x90) && !(lead == 0xF4 && second > 0x8F);
    }
    if (!valid) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", lead);
      return "invalid UTF-8 at byte " + std::to_string(i) + " (" + hex +
             "; Latin-1 or another encoding? convert it with iconv -t UTF-8)";
    }
    i += length;
  }
  return "";
}

void check_input(const std::string& input) {
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
  std::string head(kTextProbeBytes, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  const std::string why = why_not_text(head, in.eof());
  LLM_REQUIRE(why.empty(), input, "--input",
              "is not UTF-8 text: " + why + " in its first " + std::to_string(head.size()) +
                  " bytes; pass text files (one document per line)");
}

// True when both paths name one existing file (however spelt).
bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  return std::filesystem::equivalent(a, b, error) && !error;
}

// The token file and, when training, OUTPUT.model: never one of the inputs or the tokenizer, and
// an existing one only with --overwrite.
void check_outputs(const PrepareOptions& options) {
  namespace fs = std::filesystem;
  std::vector<std::string> outputs = {options.output};
  if (options.tokenizer.empty()) outputs.push_back(options.output + ".model");
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
  for (const std::string& input : options.inputs) check_input(input);
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
  if (!status.ok()) fail_tokenizer_training(options, status);

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
      if (!encoded.ok()) {
        const std::string text = sentencepiece_text(encoded);
        piece_errors[i] = text.empty() ? "its encoder failed" : text;
      }
    }
    for (int64_t i = 0; i < count; ++i) {
      if (!piece_errors[i].empty())
        fail_user(input, "--input", "SentencePiece cannot encode it (" + piece_errors[i] +
                                        "); is the file UTF-8 text?");
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
  sentencepiece::SentencePieceProcessor processor;
  const auto loaded = processor.Load(tokenizer_path);
  if (!loaded.ok())
    fail_user(tokenizer_path, "--tokenizer",
              "is not a SentencePiece model" +
                  (sentencepiece_text(loaded).empty() ? "" : " (" + sentencepiece_text(loaded) + ")") +
                  "; pass a "
              "SentencePiece .model file (a HF tokenizer.json is not one), or --vocab_size N to "
              "train one");
  result.vocab_size = processor.GetPieceSize();
  TokenFileWriter writer(options.output, result.vocab_size);
  for (const std::string& input : options.inputs) {
    const int64_t tokens_of_input = encode_file(processor, input, writer);
    LLM_REQUIRE(tokens_of_input > 0, input, "--input",
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
