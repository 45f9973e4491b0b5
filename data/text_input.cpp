#include "data/text_input.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "data/python_helper.h"
#include "common/json_file.h"

namespace llm {
namespace {

class PlainSource final : public ByteSource {
 public:
  PlainSource(const std::string& path, const std::string& flag) : path_(path), flag_(flag) {
    file_ = std::fopen(path.c_str(), "rb");
    if (file_ == nullptr) fail_user(path, flag, "cannot open (" + std::string(std::strerror(errno)) + "); check the path");
  }
  ~PlainSource() override { std::fclose(file_); }
  size_t read(char* out, size_t bytes) override {
    const size_t got = std::fread(out, 1, bytes, file_);
    if (got == 0 && std::ferror(file_)) fail_user(path_, flag_, "read error (" + std::string(std::strerror(errno)) + ")");
    return got;
  }

 private:
  std::string path_, flag_;
  std::FILE* file_ = nullptr;
};

// zlib's gz* reads every gzip member in turn (concatenated .gz files are one stream).
class GzipSource final : public ByteSource {
 public:
  GzipSource(const std::string& path, const std::string& flag) : path_(path), flag_(flag) {
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) fail_user(path, flag, "cannot open (" + std::string(std::strerror(errno)) + "); check the path");
    gzbuffer(file_, 1 << 20);
  }
  ~GzipSource() override { gzclose(file_); }
  size_t read(char* out, size_t bytes) override {
    const int got = gzread(file_, out, static_cast<unsigned>(std::min<size_t>(bytes, 1u << 30)));
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file_, &code);
      fail_user(path_, flag_, "is not a readable gzip stream (" + std::string(message ? message : "zlib error") +
                                  "): the file is damaged or cut short; download it again");
    }
    if (got == 0) {  // the end, or a stream cut short (zlib: Z_BUF_ERROR, "unexpected end of file")
      int code = Z_OK;
      const char* message = gzerror(file_, &code);
      if ((code != Z_OK && code != Z_STREAM_END) || !gzeof(file_))
        fail_user(path_, flag_, "gzip stream stops before its end (" + std::string(message ? message : "zlib error") +
                                    "): the file is cut short; download it again");
    }
    return static_cast<size_t>(got);
  }

 private:
  std::string path_, flag_;
  gzFile file_ = nullptr;
};

class ZstdSource final : public ByteSource {
 public:
  ZstdSource(const std::string& path, const std::string& flag)
      : plain_(path, flag), path_(path), flag_(flag), input_(ZSTD_DStreamInSize()) {
    stream_ = ZSTD_createDStream();
    ZSTD_initDStream(stream_);
  }
  ~ZstdSource() override { ZSTD_freeDStream(stream_); }
  size_t read(char* out, size_t bytes) override {
    ZSTD_outBuffer output{out, bytes, 0};
    while (output.pos == 0) {
      if (in_.pos == in_.size) {
        in_ = {input_.data(), plain_.read(input_.data(), input_.size()), 0};
        if (in_.size == 0) {
          if (!frame_done_) fail_user(path_, flag_, "zstd stream ends inside a frame: the file is cut short; download it again");
          return 0;
        }
      }
      const size_t result = ZSTD_decompressStream(stream_, &output, &in_);
      if (ZSTD_isError(result))
        fail_user(path_, flag_, "is not a readable zstd stream (" + std::string(ZSTD_getErrorName(result)) +
                                    "): the file is damaged; download it again");
      frame_done_ = result == 0;
    }
    return output.pos;
  }

 private:
  PlainSource plain_;
  std::string path_, flag_;
  std::vector<char> input_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  ZSTD_DStream* stream_ = nullptr;
  bool frame_done_ = true;
};

// A Parquet file's text column, as JSON Lines from data/parquet_text.py's stdout; its stderr goes to a
// temporary file, which names what went wrong when it ends with a non-zero status.
class ParquetSource final : public ByteSource {
 public:
  ParquetSource(const std::string& path, const std::string& flag, const std::string& column)
      : path_(path), flag_(flag) {
    const std::string python = project_python(), script = project_script("data/parquet_text.py");
    char errors_path[] = "/tmp/trainer_parquet_XXXXXX";
    const int errors = ::mkstemp(errors_path);
    LLM_REQUIRE(errors >= 0, path, flag, "cannot make a temporary file (" + std::string(std::strerror(errno)) + ")");
    errors_path_ = errors_path;
    int up[2];
    LLM_REQUIRE(::pipe(up) == 0, path, flag, "cannot make a pipe (" + std::string(std::strerror(errno)) + ")");
    std::string why;
    child_ = spawn_helper({python, script, path, column}, -1, up[1], errors, {up[0]}, &why);
    ::close(up[1]);
    ::close(errors);
    from_child_ = up[0];
    if (child_ < 0)
      fail_user(path, flag, "cannot start " + python + " to read Parquet through pyarrow (" + why +
                                "); set TRAINER_PYTHON to the project's Python");
  }
  ~ParquetSource() override {
    if (from_child_ >= 0) ::close(from_child_);
    if (child_ > 0) {
      ::kill(child_, SIGTERM);
      int status = 0;
      ::waitpid(child_, &status, 0);
    }
    ::unlink(errors_path_.c_str());
  }
  size_t read(char* out, size_t bytes) override {
    for (;;) {
      const ssize_t got = ::read(from_child_, out, bytes);
      if (got < 0 && errno == EINTR) continue;
      LLM_REQUIRE(got >= 0, path_, flag_, "reading the Parquet reader's output failed (" + std::string(std::strerror(errno)) + ")");
      if (got > 0) return static_cast<size_t>(got);
      int status = 0;
      ::waitpid(child_, &status, 0);
      child_ = -1;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::ifstream in(errors_path_);
        std::string why((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
        fail_user(path_, flag_, why.empty() ? "the Parquet reader (data/parquet_text.py) failed" : why);
      }
      return 0;
    }
  }

 private:
  std::string path_, flag_, errors_path_;
  pid_t child_ = -1;
  int from_child_ = -1;
};

// Moves the tail of `piece` after its last space (or a split UTF-8 character) into `carry`.
void cut_at_boundary(std::string& piece, std::string& carry) {
  size_t cut = piece.rfind(' ');
  if (cut == std::string::npos || cut == 0) {
    cut = piece.size();
    while (cut > 0 && (static_cast<unsigned char>(piece[cut - 1]) & 0xC0) == 0x80) --cut;
    if (cut > 0 && static_cast<unsigned char>(piece[cut - 1]) >= 0xC0) --cut;  // a lead byte
    if (cut == 0) cut = piece.size();  // not UTF-8 at all: cut anywhere
  }
  carry.assign(piece, cut, std::string::npos);
  piece.resize(cut);
}

// The length of the UTF-8 character starting at s[0] (available bytes of it): its length when valid,
// 0 when not, -1 when cut short by `available` (valid so far).
int utf8_character(const unsigned char* s, size_t available) {
  const unsigned lead = s[0];
  // Lead bytes of 2-, 3- and 4-byte characters; C0, C1 and F5..FF never start one.
  const int length = lead < 0x80 ? 1 : lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3
                   : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
  for (int k = 1; k < length; ++k) {
    if (static_cast<size_t>(k) >= available) return -1;
    const unsigned next = s[k];
    if ((next & 0xC0) != 0x80) return 0;
    if (k == 1 && ((lead == 0xE0 && next < 0xA0) || (lead == 0xED && next > 0x9F) ||  // overlong, surrogate
                   (lead == 0xF0 && next < 0x90) || (lead == 0xF4 && next > 0x8F)))   // overlong, > U+10FFFF
      return 0;
  }
  return length;
}

}  // namespace

std::unique_ptr<ByteSource> ByteSource::open(const std::string& path, const std::string& flag,
                                             const std::string& text_key) {
  switch (compression_of(path)) {
    case TextCompression::parquet: return std::make_unique<ParquetSource>(path, flag, text_key);
    case TextCompression::gzip: return std::make_unique<GzipSource>(path, flag);
    case TextCompression::zstd: return std::make_unique<ZstdSource>(path, flag);
    case TextCompression::none: break;
  }
  return std::make_unique<PlainSource>(path, flag);
}

TextCompression compression_of(const std::string& path) {
  unsigned char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(magic), 4);
  const std::streamsize got = in.gcount();
  if (got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) return TextCompression::gzip;
  if (got >= 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd) return TextCompression::zstd;
  if (got >= 4 && std::memcmp(magic, "PAR1", 4) == 0) return TextCompression::parquet;
  return TextCompression::none;
}

TextLayout layout_of(const std::string& path) {
  if (compression_of(path) == TextCompression::parquet) return TextLayout::json_lines;
  std::string name = path;
  for (const std::string suffix : {".gz", ".zst", ".zstd"})
    if (name.ends_with(suffix)) name = name.substr(0, name.size() - suffix.size());
  return name.ends_with(".jsonl") || name.ends_with(".json") || name.ends_with(".ndjson") ? TextLayout::json_lines
                                                                                              : TextLayout::lines;
}

const char* to_string(TextCompression compression) {
  switch (compression) {
    case TextCompression::gzip: return "gzip";
    case TextCompression::zstd: return "zstd";
    case TextCompression::parquet: return "Parquet";
    case TextCompression::none: break;
  }
  return "plain";
}

std::string Utf8Check::problem(unsigned char byte, int64_t offset) const {
  const std::string where = " at byte " + std::to_string(offset) + " (line " + std::to_string(line_) + ")";
  if (byte == 0) return "a NUL byte" + where + " (a binary file, or UTF-16 text?)";
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02X", byte);
  return "invalid UTF-8" + where + " (" + hex + "; Latin-1 or another encoding? convert it with iconv -t UTF-8)";
}

std::string Utf8Check::feed(const char* data, size_t size) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  size_t i = 0;
  while (pending_size_ > 0 && i < size) {  // the character the last chunk cut
    pending_[pending_size_++] = bytes[i++];
    const int length = utf8_character(pending_, pending_size_);
    if (length == 0) return problem(pending_[0], offset_);
    if (length > 0) {
      offset_ += length;
      pending_size_ = 0;
    }
  }
  while (i < size) {
    const unsigned char byte = bytes[i];
    if (byte != 0 && byte < 0x80) {  // ASCII, most of any corpus
      line_ += byte == '\n';
      ++i;
      ++offset_;
      continue;
    }
    const int length = byte == 0 ? 0 : utf8_character(bytes + i, size - i);
    if (length == 0) return problem(byte, offset_);
    if (length < 0) {
      pending_size_ = size - i;
      std::memcpy(pending_, bytes + i, pending_size_);
      return "";
    }
    i += static_cast<size_t>(length);
    offset_ += length;
  }
  return "";
}

std::string Utf8Check::finish() const { return pending_size_ > 0 ? problem(pending_[0], offset_) : std::string(); }

struct DocumentReader::Impl {
  std::string path, flag, text_key;
  size_t max_piece_bytes;
  TextLayout layout;
  std::unique_ptr<ByteSource> source;
  std::vector<char> buffer = std::vector<char>(1 << 20);
  size_t position = 0, filled = 0;
  int64_t consumed = 0, line = 0;
  bool line_open = false;
  std::string carry;     // lines: the tail of a cut line; json_lines: the rest of the record's text
  bool in_record = false;

  Utf8Check utf8;          // every byte of the file (not of a Parquet file: pyarrow's JSON of its column)
  TextCompression compression = TextCompression::none;
  bool parquet = false;

  bool refill() {
    filled = source->read(buffer.data(), buffer.size());
    position = 0;
    if (!parquet) {
      const std::string why = filled > 0 ? utf8.feed(buffer.data(), filled) : utf8.finish();
      if (!why.empty())
        fail_user(path, flag, std::string("is not UTF-8 text") +
                                  (compression == TextCompression::none ? "" : std::string(" (") + to_string(compression) + "-compressed)") +
                                  ": " + why + "; pass text (one document per line) or JSON Lines files, plain, gzip or zstd");
    }
    return filled > 0;
  }

  // "line 7" of a text or JSON Lines file; "row 7" of a Parquet file (a row a line of its reader's JSON).
  std::string record_name() const { return (parquet ? "row " : "line ") + std::to_string(line); }

  // Reads up to `limit` bytes of the current line into `piece`; ends_line when its newline (or the
  // end of the file) was reached. False at the end of the file with nothing read.
  bool read_line(std::string& piece, size_t limit, bool& ends_line) {
    for (;;) {
      if (position == filled && !refill()) {
        if (piece.empty() && !line_open) return false;
        ends_line = true;
        line_open = false;
        return true;
      }
      const char* start = buffer.data() + position;
      const size_t available = filled - position;
      const auto* newline = static_cast<const char*>(std::memchr(start, '\n', available));
      const size_t take = newline != nullptr ? static_cast<size_t>(newline - start) : available;
      const size_t room = limit - piece.size();
      if (!line_open) ++line;
      line_open = true;
      if (take <= room) {
        piece.append(start, take);
        position += take;
        consumed += static_cast<int64_t>(take);
        if (newline == nullptr) continue;
        ++position;
        ++consumed;
        ends_line = true;
        line_open = false;
        return true;
      }
      piece.append(start, room);
      position += room;
      consumed += static_cast<int64_t>(room);
      ends_line = false;
      return true;
    }
  }

  static void strip_carriage_return(std::string& piece) {
    if (!piece.empty() && piece.back() == '\r') piece.pop_back();
  }

  bool next_line_piece(std::string& piece, bool& ends_document) {
    piece = std::move(carry);
    carry.clear();
    bool ends_line = false;
    if (!read_line(piece, max_piece_bytes, ends_line) && piece.empty()) return false;
    if (ends_line) {
      strip_carriage_return(piece);
    } else {
      cut_at_boundary(piece, carry);
    }
    ends_document = ends_line;
    return true;
  }

  // The next piece of the current record's text, reading the next record when it is done.
  bool next_record_piece(std::string& piece, bool& ends_document) {
    while (!in_record) {
      std::string record;
      bool ends_line = false;
      if (!read_line(record, kMaxRecordBytes, ends_line)) return false;
      if (!ends_line)
        fail_user(path, flag, record_name() + " is a JSON record over " +
                                  std::to_string(kMaxRecordBytes >> 20) + " MiB: is this a JSON Lines file?");
      strip_carriage_return(record);
      if (record.find_first_not_of(" \t") == std::string::npos) continue;  // a blank line
      nlohmann::json parsed = parse_json_text(record, path, /*allow_exceptions=*/false);
      if (parsed.is_discarded())
        fail_user(path, flag, record_name() + " is not JSON (a JSON Lines file holds one JSON object a "
                                  "line; name a text file *.txt to read it as lines)");
      // One rule for JSON Lines and Parquet (whose reader writes each row as such a record, nulls
      // included): a record's text is a string; a record without it, or with a null, a number, an
      // array or an object there, is refused naming its line (row), never skipped or converted.
      if (!parsed.is_object() || !parsed.contains(text_key))
        fail_user(path, flag, record_name() + " has no string \"" + text_key + "\"" +
                                  (parsed.is_object() && !parsed.empty() ? " (its keys: " + keys_of(parsed) + ")" : "") +
                                  "; pass --text_key with the key that holds the document's text");
      const nlohmann::json& text = parsed.at(text_key);
      if (!text.is_string())
        fail_user(path, flag, record_name() + "'s \"" + text_key + "\" is " + (text.is_null() ? "null" : text.type_name()) +
                                  ", not a string: each record's text must be a string; remove or fix the record, or " +
                                  "pass --text_key with the key that holds the document's text");
      carry = text.get<std::string>();
      LLM_REQUIRE(carry.find('\0') == std::string::npos, path, flag,
                  record_name() + "'s \"" + text_key + "\" holds a NUL character (\\u0000) at character " +
                      std::to_string(carry.find('\0')) + ": text holds none; remove it from the record");
      in_record = true;
    }
    piece = std::move(carry);
    carry.clear();
    if (piece.size() > max_piece_bytes) {
      carry.assign(piece, max_piece_bytes, std::string::npos);
      piece.resize(max_piece_bytes);
      std::string tail;
      cut_at_boundary(piece, tail);
      carry.insert(0, tail);
    }
    ends_document = carry.empty();
    if (ends_document) in_record = false;
    return true;
  }

  static std::string keys_of(const nlohmann::json& object) {
    std::string keys;
    int listed = 0;
    for (const auto& [key, value] : object.items()) {
      if (listed++ == 6) return keys + ", ...";
      keys += (keys.empty() ? "" : ", ") + key;
    }
    return keys;
  }
};

DocumentReader::DocumentReader(const std::string& path, size_t max_piece_bytes, const std::string& text_key,
                               const std::string& flag)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->flag = flag;
  impl_->text_key = text_key;
  impl_->max_piece_bytes = max_piece_bytes;
  impl_->layout = layout_of(path);
  impl_->source = ByteSource::open(path, flag, text_key);
  impl_->compression = compression_of(path);
  impl_->parquet = impl_->compression == TextCompression::parquet;
}

DocumentReader::~DocumentReader() = default;

bool DocumentReader::next(std::string& piece, bool& ends_document) {
  return impl_->layout == TextLayout::json_lines ? impl_->next_record_piece(piece, ends_document)
                                                 : impl_->next_line_piece(piece, ends_document);
}

int64_t DocumentReader::bytes_read() const { return impl_->consumed; }
int64_t DocumentReader::line() const { return impl_->line; }

}  // namespace llm
