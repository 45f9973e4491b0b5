// Token files: the header checked on open (data/token_formats.cpp), windows read with pread and
// every id checked as it is read, and our format written atomically.
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "common/errors.h"
#include "common/input_paths.h"
#include "common/output_files.h"
#include "data/token_formats.h"

static_assert(std::endian::native == std::endian::little,
              "token files are little endian and read in place; a big-endian host needs swaps");

namespace llm {
namespace {

template <typename T>
T load_little_endian(const unsigned char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

template <typename T>
void store_little_endian(unsigned char* bytes, T value) {
  std::memcpy(bytes, &value, sizeof(T));
}

std::string errno_text() { return std::strerror(errno); }

// Owns a file descriptor until the TokenFile takes it.
struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

const char* to_string(TokenFormat format) {
  switch (format) {
    case TokenFormat::trainer: return "trainer";
    case TokenFormat::llmc: return "llm.c";
    case TokenFormat::megatron: return "megatron";
    case TokenFormat::numpy: return "npy";
    case TokenFormat::raw: return "raw";
  }
  return "?";
}

std::shared_ptr<TokenFile> TokenFile::open(const std::string& path, int64_t model_vocab_size, int memmap_bytes,
                                           const std::string& flag) {
  LLM_REQUIRE(model_vocab_size > 0, path, "model vocab",
              "the model's vocab_size is " + std::to_string(model_vocab_size) +
                  "; set a positive vocab_size in the model config");
  // A Megatron dataset is named by its .bin or its .idx; the ids are in the .bin.
  const std::string ids_path = megatron_pair(path).first.empty() ? path : megatron_pair(path).first;
  FileDescriptor file;
  // O_NONBLOCK: a fifo opens at once and is refused below, instead of blocking for a writer.
  file.fd = ::open(ids_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file.fd < 0)
    fail_user(ids_path, "token file",
              "cannot open (" + errno_text() + "); check " + flag + ", or create the file with "
              "`trainer prepare` (or use the synthetic corpus)");
  struct stat info {};
  if (::fstat(file.fd, &info) != 0)
    fail_user(ids_path, "token file", "cannot stat (" + errno_text() + ")");
  LLM_REQUIRE(S_ISREG(info.st_mode), ids_path, "token file",
              regular_file_problem(ids_path) + "; pass the path of a token file written by `trainer prepare`");
  const size_t file_bytes = static_cast<size_t>(info.st_size);
  const TokenLayout layout = read_token_layout(path, file.fd, file_bytes, model_vocab_size, memmap_bytes);

  std::shared_ptr<TokenFile> result(new TokenFile());
  result->path_ = layout.ids_path;
  result->format_ = layout.format;
  result->opened_bytes_ = file_bytes;
  result->payload_offset_ = layout.payload_offset;
  result->model_vocab_size_ = model_vocab_size;
  result->num_tokens_ = layout.num_tokens;
  result->vocab_size_ = layout.vocab_size;
  result->bytes_per_token_ = layout.bytes_per_token;
  if (layout.format == TokenFormat::megatron) {
    result->index_path_ = layout.index_path;
    result->sequences_ = layout.sequences;
    result->num_documents_ = layout.document_entries == 0 ? 0 : static_cast<int64_t>(layout.document_entries) - 1;
  }
  ::posix_fadvise(file.fd, 0, 0, POSIX_FADV_RANDOM);  // training reads windows in shuffled order
  result->descriptor_ = file.fd;
  file.fd = -1;  // the object's now
  return result;
}

TokenFile::~TokenFile() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

void TokenFile::fail_changed(const std::string& what) const {
  fail_user("--data", path_,
            "the file changed while this run reads it: " + what +
                ". Training cannot go on with it: restore the file (or write a new one under another name and "
                "rename it over this one, which a run never sees), then resume from the newest checkpoint");
}

void TokenFile::document_starts(int64_t first, std::span<int64_t> out) const {
  const auto count = static_cast<int64_t>(out.size());
  if (first < 0 || count > num_documents_ || first > num_documents_ - count)
    throw std::out_of_range(path_ + ": documents [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") outside [0, " + std::to_string(std::max<int64_t>(num_documents_, 0)) + ")");
  if (count == 0) return;
  FileDescriptor index;
  index.fd = ::open(index_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (index.fd < 0) fail_changed("its index " + index_path_ + " cannot be opened (" + errno_text() + ")");
  // Document d starts at sequence entries[d]: the token its byte pointer names (the end of the file
  // for the sequence count itself). Documents are one sequence each in practice, so the pointers
  // asked for lie together and are read in one piece.
  std::vector<int64_t> sequence(out.size());
  read_exactly(index.fd, index_path_, megatron_documents_offset(sequences_) + static_cast<size_t>(first) * 8,
               sequence.data(), out.size() * 8);
  for (size_t d = 0; d < out.size(); ++d)  // as checked on open, unless the index changed since
    if (sequence[d] < 0 || static_cast<uint64_t>(sequence[d]) > sequences_ || (d > 0 && sequence[d] < sequence[d - 1]))
      fail_changed("its index " + index_path_ + " no longer holds the document index checked on open");
  const int64_t low = sequence.front();
  const int64_t high = std::min<int64_t>(sequence.back(), static_cast<int64_t>(sequences_) - 1);
  std::vector<int64_t> pointers(static_cast<size_t>(std::max<int64_t>(0, high - low + 1)));
  if (!pointers.empty())
    read_exactly(index.fd, index_path_, megatron_pointers_offset(sequences_) + static_cast<size_t>(low) * 8,
                 pointers.data(), pointers.size() * 8);
  for (size_t d = 0; d < out.size(); ++d)
    out[d] = static_cast<uint64_t>(sequence[d]) >= sequences_
                 ? num_tokens_
                 : pointers[static_cast<size_t>(sequence[d] - low)] / bytes_per_token_;
}

int64_t TokenFile::token(int64_t index) const {
  int64_t id = 0;
  read(index, std::span<int64_t>(&id, 1));
  return id;
}

void TokenFile::read(int64_t start, std::span<int64_t> out) const {
  const int64_t count = static_cast<int64_t>(out.size());
  if (start < 0 || count > num_tokens_ || start > num_tokens_ - count)
    throw std::out_of_range(path_ + ": tokens [" + std::to_string(start) + ", " +
                            std::to_string(start + count) + ") outside [0, " +
                            std::to_string(num_tokens_) + ")");
  struct stat info {};
  if (::fstat(descriptor_, &info) == 0 && static_cast<size_t>(info.st_size) != opened_bytes_)
    fail_changed("it had " + std::to_string(opened_bytes_) + " bytes when the run opened it and has " +
                 std::to_string(info.st_size) + " now (" +
                 (static_cast<size_t>(info.st_size) < opened_bytes_ ? "truncated" : "grown") + ")");
  const size_t width = static_cast<size_t>(bytes_per_token_);
  thread_local std::vector<unsigned char> bytes;
  bytes.resize(static_cast<size_t>(count) * width);
  const off_t offset = static_cast<off_t>(payload_offset_ + static_cast<size_t>(start) * width);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(descriptor_, bytes.data() + done, bytes.size() - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_user("--data", path_, "cannot read (" + errno_text() + ")");
    if (n == 0)
      fail_changed("it ends before token " + std::to_string(start + static_cast<int64_t>(done / width)) + " of " +
                   std::to_string(num_tokens_) + " (truncated)");
    done += static_cast<size_t>(n);
  }
  for (int64_t i = 0; i < count; ++i) {
    const unsigned char* at = bytes.data() + static_cast<size_t>(i) * width;
    out[i] = width == 2 ? load_little_endian<uint16_t>(at) : load_little_endian<uint32_t>(at);
    if (out[i] >= model_vocab_size_)
      fail_user(path_, "token " + std::to_string(start + i) + " (byte " +
                           std::to_string(payload_offset_ + static_cast<size_t>(start + i) * width) + ")",
                "id " + std::to_string(out[i]) + " is not below the model's vocab_size " +
                    std::to_string(model_vocab_size_) + ": the file is corrupt or was tokenized for a bigger "
                    "vocabulary; re-tokenize it or use a matching model config");
  }
}

TokenFileWriter::TokenFileWriter(const std::string& path, int64_t vocab_size, TokenFormat format)
    : path_(path), temporary_path_(path + ".tmp"), format_(format), vocab_size_(vocab_size) {
  LLM_REQUIRE(format != TokenFormat::numpy && format != TokenFormat::raw, path, "--format",
              std::string("writes ours, llm.c's or Megatron's format, not ") + to_string(format));
  header_bytes_ = format == TokenFormat::llmc ? kLlmcHeaderBytes : format == TokenFormat::megatron ? 0 : kTokenFileHeaderBytes;
  if (format == TokenFormat::megatron) {
    LLM_REQUIRE(path.ends_with(".bin"), path, "--output",
                "a Megatron dataset is PREFIX.bin with PREFIX.idx beside it: name the .bin (e.g. data/train.bin)");
    LLM_REQUIRE(vocab_size <= std::numeric_limits<int32_t>::max(), path, "vocab",
                "vocab_size " + std::to_string(vocab_size) + " does not fit Megatron's int32 ids");
    index_path_ = path.substr(0, path.size() - 4) + ".idx";
    refuse_unless_absent_or(index_path_, OutputKind::file, "token file's index");
  }
  LLM_REQUIRE(vocab_size > 0 && vocab_size <= (int64_t{1} << 32), path, "vocab",
              "vocab_size " + std::to_string(vocab_size) + " must be in [1, 2^32]");
  bytes_per_token_ = vocab_size <= 65536 ? 2 : 4;
  refuse_unless_absent_or(path_, OutputKind::file, "token file");  // the rename below would replace it
  file_ = open_output_stream(temporary_path_, "token file");
  if (file_ == nullptr)
    fail_user(temporary_path_, "write",
              "cannot create the file (" + errno_text() + "); check that the folder exists and "
              "is writable");
  // The header's token count is written by finish(); a crash leaves a .tmp that never opens.
  const std::vector<unsigned char> placeholder(header_bytes_, 0);
  if (std::fwrite(placeholder.data(), 1, placeholder.size(), file_) != placeholder.size()) {
    const std::string reason = errno_text();
    std::fclose(file_);  // the destructor does not run for a constructor that throws
    std::remove(temporary_path_.c_str());
    fail_user(temporary_path_, "write", "writing failed (" + reason + "); is the disk full?");
  }
}

TokenFileWriter::~TokenFileWriter() {
  if (!index_path_.empty()) std::remove((index_path_ + ".tmp").c_str());
  if (file_ == nullptr) return;
  std::fclose(file_);
  std::remove(temporary_path_.c_str());
}

void TokenFileWriter::end_document() {
  const int64_t length = num_tokens_ - documented_tokens_;
  if (format_ != TokenFormat::megatron || length == 0) return;
  LLM_REQUIRE(length <= std::numeric_limits<int32_t>::max(), path_, "document " + std::to_string(sequence_lengths_.size()),
              std::to_string(length) + " tokens do not fit Megatron's int32 sequence length");
  sequence_lengths_.push_back(static_cast<int32_t>(length));
  documented_tokens_ = num_tokens_;
}

namespace {

// Megatron-LM's index (megatron/core/datasets/indexed_dataset.py, _IndexWriter), one sequence per
// document, written to PATH.tmp then renamed.
void write_megatron_index(const std::string& path, int bytes_per_token, const std::vector<int32_t>& lengths) {
  const std::string temporary = path + ".tmp";
  std::FILE* file = open_output_stream(temporary, "token file's index");
  if (file == nullptr) fail_user(temporary, "write", "cannot create the file (" + errno_text() + ")");
  std::vector<unsigned char> bytes(9 + 8 + 1 + 8 + 8);
  std::memcpy(bytes.data(), "MMIDIDX\0\0", 9);
  store_little_endian<uint64_t>(bytes.data() + 9, 1);
  bytes[17] = bytes_per_token == 2 ? 8 : 4;  // uint16, int32
  store_little_endian<uint64_t>(bytes.data() + 18, lengths.size());
  store_little_endian<uint64_t>(bytes.data() + 26, lengths.size() + 1);
  std::vector<int64_t> pointers(lengths.size()), documents(lengths.size() + 1);
  int64_t at = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    pointers[i] = at;
    at += static_cast<int64_t>(lengths[i]) * bytes_per_token;
    documents[i + 1] = static_cast<int64_t>(i + 1);
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size() &&
                       std::fwrite(lengths.data(), 4, lengths.size(), file) == lengths.size() &&
                       std::fwrite(pointers.data(), 8, pointers.size(), file) == pointers.size() &&
                       std::fwrite(documents.data(), 8, documents.size(), file) == documents.size();
  const std::string reason = errno_text();
  if (std::fclose(file) != 0 || !written) {
    std::remove(temporary.c_str());
    fail_user(temporary, "write", "writing failed (" + reason + "); is the disk full?");
  }
}

}  // namespace

void TokenFileWriter::append(std::span<const int64_t> tokens) {
  LLM_REQUIRE(file_ != nullptr, path_, "write", "append after finish()");
  buffer_.resize(tokens.size() * static_cast<size_t>(bytes_per_token_));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t id = tokens[i];
    if (id < 0 || id >= vocab_size_)
      fail_user(path_, "token " + std::to_string(num_tokens_ + static_cast<int64_t>(i)),
                "id " + std::to_string(id) + " is outside [0, " + std::to_string(vocab_size_) +
                    "); the tokenizer and vocab_size disagree");
    if (bytes_per_token_ == 2)
      store_little_endian<uint16_t>(buffer_.data() + 2 * i, static_cast<uint16_t>(id));
    else
      store_little_endian<uint32_t>(buffer_.data() + 4 * i, static_cast<uint32_t>(id));
  }
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size())
    fail_user(temporary_path_, "write", "writing failed (" + errno_text() + "); is the disk full?");
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void TokenFileWriter::finish() {
  LLM_REQUIRE(file_ != nullptr, path_, "write", "finish() called twice");
  std::vector<unsigned char> bytes(header_bytes_, 0);
  unsigned char* header = bytes.data();
  if (format_ == TokenFormat::llmc) {
    LLM_REQUIRE(num_tokens_ <= std::numeric_limits<int32_t>::max(), path_, "--shard_tokens",
                std::to_string(num_tokens_) + " tokens do not fit llm.c's int32 count; write shards of at most "
                "2147483647 tokens (--shard_tokens)");
    const bool narrow = bytes_per_token_ == 2;
    store_little_endian<int32_t>(header, narrow ? kLlmcGpt2Magic : kLlmcLlama3Magic);
    store_little_endian<int32_t>(header + 4, narrow ? 1 : 7);
    store_little_endian<int32_t>(header + 8, static_cast<int32_t>(num_tokens_));
  } else if (format_ == TokenFormat::megatron) {
    end_document();  // a last document without its end
    write_megatron_index(index_path_, bytes_per_token_, sequence_lengths_);
  } else {
    std::memcpy(header + kMagicOffset, kTokenFileMagic, sizeof(kTokenFileMagic));
    store_little_endian<uint32_t>(header + kVersionOffset, kTokenFileVersion);
    store_little_endian<uint32_t>(header + kBytesPerTokenOffset, static_cast<uint32_t>(bytes_per_token_));
    store_little_endian<uint64_t>(header + kNumTokensOffset, static_cast<uint64_t>(num_tokens_));
    store_little_endian<uint64_t>(header + kVocabSizeOffset, static_cast<uint64_t>(vocab_size_));
  }
  const bool written = std::fseek(file_, 0, SEEK_SET) == 0 &&
                       std::fwrite(header, 1, bytes.size(), file_) == bytes.size() &&
                       std::fflush(file_) == 0;
  const std::string reason = errno_text();
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!written || !closed) {
    std::remove(temporary_path_.c_str());
    fail_user(temporary_path_, "write", "writing failed (" + reason + "); is the disk full?");
  }
  std::error_code error;
  std::filesystem::rename(temporary_path_, path_, error);
  if (error) {
    const std::string rename_reason = error.message();
    std::filesystem::remove(temporary_path_, error);
    fail_user(path_, "write",
              "cannot rename " + temporary_path_ + " to it (" + rename_reason + ")");
  }
  if (!index_path_.empty()) {  // the .bin first: until its .idx is there, no reader takes it for a dataset
    std::filesystem::rename(index_path_ + ".tmp", index_path_, error);
    LLM_REQUIRE(!error, index_path_, "write", "cannot rename " + index_path_ + ".tmp to it (" + error.message() + ")");
  }
}

void write_token_file(const std::string& path, std::span<const int64_t> tokens,
                      int64_t vocab_size) {
  TokenFileWriter writer(path, vocab_size);
  constexpr size_t kChunk = 1 << 20;  // narrow in chunks: never a second full copy in memory
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk)
    writer.append(tokens.subspan(begin, std::min(kChunk, tokens.size() - begin)));
  writer.finish();
}

}  // namespace llm
