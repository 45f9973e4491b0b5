// Pre-tokenized token files: a 64-byte header and then the ids.
//
// Header (little endian): bytes 0-7 magic "LLMTOKv1", u32 version (1), u32 bytes per token (2 or 4),
// u64 number of tokens, u64 vocabulary size, then zero padding to 64 bytes. The file size must be
// exactly 64 + tokens * bytes per token. Every id is checked below the vocab size on open (one pass,
// fast, so a bad file fails before training starts, not hours in).
//
// The file may change under a run (a copy over it, a truncation): training reads each window with
// pread(2) from the descriptor opened at start, not from a memory mapping, so a truncated file is a
// short read and an error, not a SIGBUS; each read checks the file's size against the size it was
// opened with and each id against the model's vocabulary, and a change is a UserError naming --data,
// the file and what changed (exit 2). A file replaced by rename is not a change: the descriptor still
// reads the file that was opened.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace llm {

inline constexpr char kTokenFileMagic[8] = {'L', 'L', 'M', 'T', 'O', 'K', 'v', '1'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderBytes = 64;

class TokenFile {
 public:
  // Opens and validates. Throws UserError (path + what is wrong + what to do) for a missing file,
  // wrong magic or version, bad token width, truncated or oversized file, an id >= the model's
  // vocab_size (pass model_vocab_size; the header's vocab must not exceed it either).
  static std::shared_ptr<TokenFile> open(const std::string& path, int64_t model_vocab_size);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return num_tokens_; }
  int64_t vocab_size() const { return vocab_size_; }
  int bytes_per_token() const { return bytes_per_token_; }
  int64_t token(int64_t index) const;
  // Copies tokens [start, start + out.size()) into out.
  void read(int64_t start, std::span<int64_t> out) const;
  const std::string& path() const { return path_; }

 private:
  TokenFile() = default;
  // The file changed since it was opened: a UserError naming --data, the file and what changed.
  [[noreturn]] void fail_changed(const std::string& what) const;
  std::string path_;
  int descriptor_ = -1;          // kept open for the run's reads
  size_t opened_bytes_ = 0;      // the file's size when opened and checked
  int64_t model_vocab_size_ = 0;
  int64_t num_tokens_ = 0;
  int64_t vocab_size_ = 0;
  int bytes_per_token_ = 0;
};

// Writes a token file; picks uint16 when vocab_size <= 65536, else uint32. Writes to path + ".tmp"
// then renames, so a crash never leaves a half-written file under the final name.
void write_token_file(const std::string& path, std::span<const int64_t> tokens, int64_t vocab_size);

// The streaming form of write_token_file, for corpora larger than memory: append ids in pieces,
// then finish() fills in the header's token count and renames path + ".tmp" to path. Destroyed
// without finish() (an exception on the way), it removes the temporary file.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, int64_t vocab_size);  // throws UserError
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(std::span<const int64_t> tokens);  // throws UserError on an id outside the vocab
  int64_t num_tokens() const { return num_tokens_; }
  void finish();

 private:
  std::string path_;
  std::string temporary_path_;
  std::FILE* file_ = nullptr;
  int64_t vocab_size_ = 0;
  int bytes_per_token_ = 0;
  int64_t num_tokens_ = 0;
  std::vector<unsigned char> buffer_;  // ids narrowed to the file's width
};

}  // namespace llm
