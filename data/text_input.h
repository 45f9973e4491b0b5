// What `trainer prepare` reads: text as corpora are published, one document at a time.
//
// A file is read through its compression, told by its first bytes (not its name): gzip (C4's
// .json.gz; zlib) and zstd (Dolma's and the Pile's .jsonl.zst; libzstd), else plain; a Parquet file
// (magic PAR1: FineWeb) is read through pyarrow by data/parquet_text.py, run by the project's Python,
// which streams its `text_key` column as JSON Lines. Its documents are, by its name with any
// .gz/.zst left out:
//   - JSON Lines (*.jsonl, *.json): one JSON object a line, the document its `text_key` string (C4,
//     Dolma, the Pile and FineWeb's JSON exports call it "text"); a record without it, or a line that
//     is not JSON, is a UserError naming the file and line;
//   - text (anything else): one document a line.
// Every byte read is checked to be UTF-8 text as it streams past (Utf8Check: no NUL byte, no invalid
// sequence), so a bad byte anywhere in a file, not only in its first bytes, is a UserError naming the
// file, the byte's offset (in the decompressed text) and its line; a JSON record's text, once its
// escapes are decoded, holds no NUL either.
// Documents come out as pieces of at most `max_piece_bytes`, cut at a space (else at a UTF-8
// character boundary), so that no document, however long, is held whole; `ends_document` marks its
// last piece.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace llm {

enum class TextCompression { none, gzip, zstd, parquet };
enum class TextLayout { lines, json_lines };

// Reads the decompressed bytes of a file. Throws UserError naming the file (and `flag`) for a file
// it cannot open or a stream that is damaged or cut short.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual size_t read(char* out, size_t bytes) = 0;  // 0 at the end
  // text_key: the column a Parquet file is read by.
  static std::unique_ptr<ByteSource> open(const std::string& path, const std::string& flag,
                                          const std::string& text_key = "text");
};

TextCompression compression_of(const std::string& path);  // by the first bytes; none if unreadable
TextLayout layout_of(const std::string& path);            // by the name, .gz/.zst left out; Parquet: JSON Lines
const char* to_string(TextCompression compression);       // "plain", "gzip", "zstd"

// UTF-8 text as it streams past in chunks: no NUL byte, no invalid sequence (a byte that starts no
// character, a missing continuation byte, an overlong form, a surrogate, a code point above U+10FFFF);
// a character may be cut between two chunks. One check for the whole of every input (DocumentReader)
// and for the probe before anything is trained (data/prepare_inputs.cpp).
class Utf8Check {
 public:
  // "" while every byte so far is text; else what is wrong, naming the byte's offset from the start
  // of the stream and its line (from 1).
  std::string feed(const char* bytes, size_t size);
  // At the end of the stream: a character cut short by the end is invalid.
  std::string finish() const;

 private:
  std::string problem(unsigned char byte, int64_t offset) const;
  unsigned char pending_[4] = {};  // a character cut by the end of the last chunk
  size_t pending_size_ = 0;
  int64_t offset_ = 0;             // of the next byte (or of the pending character)
  int64_t line_ = 1;
};

class DocumentReader {
 public:
  DocumentReader(const std::string& path, size_t max_piece_bytes, const std::string& text_key,
                 const std::string& flag = "--input");
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next piece; false at the end of the file. Whitespace-only documents are passed on as they
  // are (the caller skips what encodes to nothing).
  bool next(std::string& piece, bool& ends_document);
  int64_t bytes_read() const;     // decompressed bytes consumed so far (for progress)
  int64_t line() const;           // the current line, from 1 (for messages)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The longest JSON Lines record read whole (its text is then cut into pieces).
inline constexpr size_t kMaxRecordBytes = size_t{256} << 20;

}  // namespace llm
