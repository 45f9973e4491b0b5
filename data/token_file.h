// Token files (the shards of --data, data/token_corpus.h): an array of uint16 or uint32 ids after a
// header, in one of four formats, told apart by their first bytes:
//   - ours ("trainer"): a 64-byte header, little endian: bytes 0-7 magic "LLMTOKv1", u32 version (1),
//     u32 bytes per token (2 or 4), u64 number of tokens, u64 vocabulary size, zero padding. Written
//     by `trainer prepare` (write_token_file, TokenFileWriter below).
//   - llm.c / modded-nanogpt ("llm.c"): a 256 x int32 header: magic 20240520, version 1, token count;
//     uint16 ids (GPT-2); or magic 20240801, version 7, token count; uint32 ids (llm.c's LLaMA 3).
//   - Megatron-LM / GPT-NeoX indexed dataset ("megatron"): PATH.bin holds the ids and PATH.idx the
//     index (magic "MMIDIDX\0\0", u64 version 1, u8 dtype code: 8 uint16 or 4 int32, u64 sequence
//     count, u64 document count, int32 sequence lengths, int64 byte pointers, int64 document
//     indices). --data names either file; the sequences must lie end to end in the .bin, in order.
//   - NumPy ("npy"): a .npy file (numpy.save) of a 1-D C-order array of '<u2' or '<u4'.
//   - headerless ("raw"): OLMo's token files (named .npy, written through numpy.memmap: ids and
//     nothing else) carry no dtype; with --memmap_dtype uint16 or uint32 (OLMo's data.memmap_dtype), a
//     file whose first bytes are none of the formats above is read as such ids (its size a whole
//     number of them). Without the flag such a file is a wrong magic, naming the flag.
// Only Megatron's records where documents start (its .idx's document index: --window_start document,
// data/document_windows.h); its document index is checked on open as its sequences are.
// The file size must be exactly the header's (or index's) promise. Headers are checked on open; ids
// are checked as windows are read, so a corpus of 10^12 tokens opens by its headers alone: an id not
// below the model's vocab_size is a UserError naming the file and the token's offset (exit 2).
//
// The file may change under a run (a copy over it, a truncation): training reads each window with
// pread(2) from the descriptor opened at start, not from a memory mapping, so a truncated file is a
// short read and an error, not a SIGBUS; each read checks the file's size against the size it was
// opened with, and a change is a UserError naming --data, the file and what changed (exit 2). A file
// replaced by rename is not a change: the descriptor still reads the file that was opened.
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

enum class TokenFormat { trainer, llmc, megatron, numpy, raw };
const char* to_string(TokenFormat format);  // "trainer", "llm.c", "megatron", "npy", "raw"

class TokenFile {
 public:
  // Opens and validates the header. Throws UserError (path + what is wrong + what to do) for a
  // missing file, a format it does not know, wrong magic or version, bad token width, a truncated or
  // oversized file, a Megatron index that disagrees with its .bin, or (ours) a header vocabulary
  // above the model's vocab_size.
  // memmap_bytes: 2 or 4 to read a file in no known format as headerless ids of that width
  // (--memmap_dtype); 0: such a file is an error.
  // flag: the flag that named the file (--data, --eval_data), for the messages.
  static std::shared_ptr<TokenFile> open(const std::string& path, int64_t model_vocab_size, int memmap_bytes = 0,
                                         const std::string& flag = "--data");
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return num_tokens_; }
  TokenFormat format() const { return format_; }
  // The vocabulary the file declares (ours), else 0: the other formats do not record it.
  int64_t vocab_size() const { return vocab_size_; }
  int bytes_per_token() const { return bytes_per_token_; }
  int64_t token(int64_t index) const;
  // The documents the file records: Megatron's document index (the other formats mark documents with
  // an end token, if at all, and record no boundaries): their number, or -1 where none are recorded.
  int64_t num_documents() const { return num_documents_; }
  // The first token of documents [first, first + out.size()), in order (never falling; an empty
  // document starts where the next one does). Read from the .idx with pread, a block at a time.
  void document_starts(int64_t first, std::span<int64_t> out) const;
  // Copies tokens [start, start + out.size()) into out.
  void read(int64_t start, std::span<int64_t> out) const;
  const std::string& path() const { return path_; }

 private:
  TokenFile() = default;
  // The file changed since it was opened: a UserError naming --data, the file and what changed.
  [[noreturn]] void fail_changed(const std::string& what) const;
  std::string path_;
  TokenFormat format_ = TokenFormat::trainer;
  int descriptor_ = -1;          // kept open for the run's reads
  size_t payload_offset_ = 0;    // the first id's byte offset
  size_t opened_bytes_ = 0;      // the file's size when opened and checked
  int64_t model_vocab_size_ = 0;
  int64_t num_tokens_ = 0;
  int64_t vocab_size_ = 0;
  int bytes_per_token_ = 0;
  int64_t num_documents_ = -1;
  std::string index_path_;     // Megatron's .idx
  uint64_t sequences_ = 0;     // its sequence count
};

// Writes a token file; picks uint16 when vocab_size <= 65536, else uint32. Writes to path + ".tmp"
// then renames, so a crash never leaves a half-written file under the final name.
void write_token_file(const std::string& path, std::span<const int64_t> tokens, int64_t vocab_size);

// The streaming form of write_token_file, for corpora larger than memory: append ids in pieces,
// then finish() fills in the header's token count and renames path + ".tmp" to path. Destroyed
// without finish() (an exception on the way), it removes the temporary file.
class TokenFileWriter {
 public:
  // format: TokenFormat::trainer (ours), TokenFormat::llmc (llm.c's .bin: magic 20240520 with
  // uint16 ids up to a 65,536 vocabulary, else 20240801 with uint32; at most 2^31 - 1 tokens, its
  // header's int32 count) or TokenFormat::megatron (`path` is PREFIX.bin: uint16 ids up to a 65,536
  // vocabulary, else int32; PREFIX.idx written by finish() with a sequence per document, renamed in
  // after the .bin). Throws UserError.
  TokenFileWriter(const std::string& path, int64_t vocab_size, TokenFormat format = TokenFormat::trainer);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(std::span<const int64_t> tokens);  // throws UserError on an id outside the vocab
  // Megatron: the tokens appended since the last end are a document (one sequence of the .idx); the
  // other formats record no documents (a no-op). finish() ends an open document.
  void end_document();
  int64_t num_tokens() const { return num_tokens_; }
  void finish();

 private:
  std::string path_;
  std::string temporary_path_;
  std::FILE* file_ = nullptr;
  TokenFormat format_ = TokenFormat::trainer;
  size_t header_bytes_ = kTokenFileHeaderBytes;
  int64_t vocab_size_ = 0;
  int bytes_per_token_ = 0;
  int64_t num_tokens_ = 0;
  std::vector<unsigned char> buffer_;  // ids narrowed to the file's width
  std::string index_path_;                // Megatron: PREFIX.idx, written by finish()
  std::vector<int32_t> sequence_lengths_; // Megatron: one per document ended
  int64_t documented_tokens_ = 0;         // tokens in the documents ended
};

}  // namespace llm
