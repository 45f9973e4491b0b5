// Token files: validation on open (through a mapping, dropped afterwards), checked little-endian
// reads of windows (pread), atomic writes.
//
// Everything a bad file can do wrong is caught here, once, before training starts: the sampler and
// the model then trust every id they read.
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "common/errors.h"
#include "common/output_files.h"

static_assert(std::endian::native == std::endian::little,
              "token files are little endian and read in place; a big-endian host needs swaps");

namespace llm {
namespace {

// Byte offsets of the header fields (see token_file.h).
constexpr size_t kMagicOffset = 0;
constexpr size_t kVersionOffset = 8;
constexpr size_t kBytesPerTokenOffset = 12;
constexpr size_t kNumTokensOffset = 16;
constexpr size_t kVocabSizeOffset = 24;

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

// Owns a file descriptor only until the mapping exists (the mapping outlives the descriptor).
struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// Returns the position of the first id >= vocab, or -1 when all are valid.
template <typename Id>
int64_t first_id_at_or_above(const unsigned char* tokens, int64_t count, int64_t vocab) {
  const Id* ids = reinterpret_cast<const Id*>(tokens);
  // Scan in blocks with a branch-free maximum (vectorises), then locate the culprit in the block.
  constexpr int64_t kBlock = 1 << 16;
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t end = std::min(count, begin + kBlock);
    Id block_max = 0;
    for (int64_t i = begin; i < end; ++i) block_max = ids[i] > block_max ? ids[i] : block_max;
    if (static_cast<int64_t>(block_max) < vocab) continue;
    for (int64_t i = begin; i < end; ++i)
      if (static_cast<int64_t>(ids[i]) >= vocab) return i;
  }
  return -1;
}

}  // namespace

std::shared_ptr<TokenFile> TokenFile::open(const std::string& path, int64_t model_vocab_size) {
  const std::string remedy_regenerate = "regenerate it with `trainer prepare`";
  LLM_REQUIRE(model_vocab_size > 0, path, "model vocab",
              "the model's vocab_size is " + std::to_string(model_vocab_size) +
                  "; set a positive vocab_size in the model config");

  FileDescriptor file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0)
    fail_user(path, "token file",
              "cannot open (" + errno_text() + "); check --data, or create the file with "
              "`trainer prepare` (or use the synthetic corpus)");
  struct stat info {};
  if (::fstat(file.fd, &info) != 0)
    fail_user(path, "token file", "cannot stat (" + errno_text() + ")");
  LLM_REQUIRE(S_ISREG(info.st_mode), path, "token file",
              "is not a regular file; pass the path of a token file written by `trainer prepare`");
  const size_t file_bytes = static_cast<size_t>(info.st_size);
  LLM_REQUIRE(file_bytes >= kTokenFileHeaderBytes, path, "header",
              "the file has " + std::to_string(file_bytes) + " bytes, fewer than the " +
                  std::to_string(kTokenFileHeaderBytes) + "-byte header: it is truncated or not a "
                  "token file; " + remedy_regenerate);

  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, file.fd, 0);
  if (mapping == MAP_FAILED)
    fail_user(path, "token file", "cannot memory-map (" + errno_text() + ")");
  // The mapping is for this one validating pass only; unmapped on every way out.
  struct Mapping {
    void* address;
    size_t bytes;
    ~Mapping() { ::munmap(address, bytes); }
  } validating{mapping, file_bytes};
  std::shared_ptr<TokenFile> result(new TokenFile());
  result->path_ = path;
  result->opened_bytes_ = file_bytes;
  result->model_vocab_size_ = model_vocab_size;
  ::madvise(mapping, file_bytes, MADV_SEQUENTIAL);

  const auto* bytes = static_cast<const unsigned char*>(mapping);
  const bool magic_matches =
      std::memcmp(bytes + kMagicOffset, kTokenFileMagic, sizeof(kTokenFileMagic)) == 0;
  LLM_REQUIRE(magic_matches, path, "header",
              "wrong magic (expected \"LLMTOKv1\"): this is not a token file; " +
                  remedy_regenerate);
  const uint32_t version = load_little_endian<uint32_t>(bytes + kVersionOffset);
  LLM_REQUIRE(version == kTokenFileVersion, path, "header",
              "version " + std::to_string(version) + " is not supported (this trainer reads " +
                  std::to_string(kTokenFileVersion) + "); " + remedy_regenerate);
  const uint32_t bytes_per_token = load_little_endian<uint32_t>(bytes + kBytesPerTokenOffset);
  LLM_REQUIRE(bytes_per_token == 2 || bytes_per_token == 4, path, "header",
              "bytes per token is " + std::to_string(bytes_per_token) +
                  " (must be 2 or 4): the header is corrupt; " + remedy_regenerate);
  const uint64_t num_tokens = load_little_endian<uint64_t>(bytes + kNumTokensOffset);
  const uint64_t header_vocab = load_little_endian<uint64_t>(bytes + kVocabSizeOffset);

  const uint64_t payload_bytes = file_bytes - kTokenFileHeaderBytes;
  const bool size_matches = num_tokens <= payload_bytes / bytes_per_token &&
                            num_tokens * bytes_per_token == payload_bytes;
  if (!size_matches) {
    const bool truncated = num_tokens > payload_bytes / bytes_per_token;
    fail_user(path, "size",
              "the header promises " + std::to_string(num_tokens) + " tokens of " +
                  std::to_string(bytes_per_token) + " bytes (" +
                  std::to_string(kTokenFileHeaderBytes) + " + tokens * width bytes) but the file "
                  "has " + std::to_string(file_bytes) + " bytes: " +
                  (truncated ? "it is truncated (an interrupted copy or write?)"
                             : "it has trailing bytes after the last token") +
                  "; " + remedy_regenerate);
  }
  LLM_REQUIRE(header_vocab <= static_cast<uint64_t>(model_vocab_size), path, "vocab",
              "the file was tokenized with a vocabulary of " + std::to_string(header_vocab) +
                  " ids but the model has vocab_size " + std::to_string(model_vocab_size) +
                  "; use a model config whose vocab_size is at least " +
                  std::to_string(header_vocab) + ", or re-tokenize with a matching tokenizer");

  const unsigned char* tokens = bytes + kTokenFileHeaderBytes;
  result->num_tokens_ = static_cast<int64_t>(num_tokens);
  result->vocab_size_ = static_cast<int64_t>(header_vocab);
  result->bytes_per_token_ = static_cast<int>(bytes_per_token);

  const int64_t bad_position =
      bytes_per_token == 2 ? first_id_at_or_above<uint16_t>(tokens, result->num_tokens_, model_vocab_size)
                           : first_id_at_or_above<uint32_t>(tokens, result->num_tokens_, model_vocab_size);
  if (bad_position >= 0)
    fail_user(path, "token " + std::to_string(bad_position),
              "id " +
                  std::to_string(bytes_per_token == 2
                                     ? load_little_endian<uint16_t>(tokens + static_cast<size_t>(bad_position) * 2)
                                     : load_little_endian<uint32_t>(tokens + static_cast<size_t>(bad_position) * 4)) +
                  " is not below the model's "
              "vocab_size " + std::to_string(model_vocab_size) + " (first bad id of " +
                  std::to_string(num_tokens) + " tokens); the file is corrupt or was tokenized "
                  "for a bigger vocabulary: re-tokenize it or use a matching model config");
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
  const off_t offset = static_cast<off_t>(kTokenFileHeaderBytes + static_cast<size_t>(start) * width);
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
      fail_changed("token " + std::to_string(start + i) + " is now id " + std::to_string(out[i]) +
                   ", not below the model's vocab_size " + std::to_string(model_vocab_size_) +
                   " (every id was when the run opened it)");
  }
}

TokenFileWriter::TokenFileWriter(const std::string& path, int64_t vocab_size)
    : path_(path), temporary_path_(path + ".tmp"), vocab_size_(vocab_size) {
  LLM_REQUIRE(vocab_size > 0 && vocab_size <= (int64_t{1} << 32), path, "vocab",
              "vocab_size " + std::to_string(vocab_size) + " must be in [1, 2^32]");
  bytes_per_token_ = vocab_size <= 65536 ? 2 : 4;
  refuse_unless_absent_or(path_, OutputKind::file, "token file");  // the rename below would replace it
  file_ = std::fopen(temporary_path_.c_str(), "wb");
  if (file_ == nullptr)
    fail_user(temporary_path_, "write",
              "cannot create the file (" + errno_text() + "); check that the folder exists and "
              "is writable");
  // The header's token count is written by finish(); a crash leaves a .tmp that never opens.
  const unsigned char placeholder[kTokenFileHeaderBytes] = {};
  if (std::fwrite(placeholder, 1, sizeof(placeholder), file_) != sizeof(placeholder)) {
    const std::string reason = errno_text();
    std::fclose(file_);  // the destructor does not run for a constructor that throws
    std::remove(temporary_path_.c_str());
    fail_user(temporary_path_, "write", "writing failed (" + reason + "); is the disk full?");
  }
}

TokenFileWriter::~TokenFileWriter() {
  if (file_ == nullptr) return;
  std::fclose(file_);
  std::remove(temporary_path_.c_str());
}

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
  unsigned char header[kTokenFileHeaderBytes] = {};
  std::memcpy(header + kMagicOffset, kTokenFileMagic, sizeof(kTokenFileMagic));
  store_little_endian<uint32_t>(header + kVersionOffset, kTokenFileVersion);
  store_little_endian<uint32_t>(header + kBytesPerTokenOffset,
                                static_cast<uint32_t>(bytes_per_token_));
  store_little_endian<uint64_t>(header + kNumTokensOffset, static_cast<uint64_t>(num_tokens_));
  store_little_endian<uint64_t>(header + kVocabSizeOffset, static_cast<uint64_t>(vocab_size_));
  const bool written = std::fseek(file_, 0, SEEK_SET) == 0 &&
                       std::fwrite(header, 1, sizeof(header), file_) == sizeof(header) &&
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
