// The safetensors file format (huggingface/safetensors), written and read by hand: it is an 8-byte
// little-endian header length N, N bytes of JSON, then the tensors' raw bytes back to back. The JSON
// maps each tensor name to {"dtype": "F32" | "BF16" | ..., "shape": [...], "data_offsets": [begin,
// end)} (offsets into the bytes after the header) and may hold "__metadata__", a string -> string map
// ({"format": "pt"} is what transformers writes and expects). The header is padded with spaces to a
// multiple of 8 bytes, so every tensor starts 8-byte aligned in the file.
//
// Neither side ever holds more than one tensor beyond what the caller holds: the writer is given every
// tensor's name, dtype and shape first (the header comes first in the file) and then the tensors one
// at a time, each converted to its dtype as it is written; the reader parses the header and reads one
// tensor's byte range at a time. No dependency: the format is a page long, and the safetensors crate
// and Python package are what the tests check these files against.
//
// Every failure is a UserError naming the file: a writer that cannot write (disk full, read-only), a
// reader given a file that is truncated, not safetensors, or whose header lies about sizes or offsets.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace llm {

// "F32" <-> at::kFloat, "BF16" <-> at::kBFloat16, "F16" <-> at::kHalf (F64 and the integer types are
// read too, so a folder holding one is named rather than refused as unreadable).
std::string safetensors_dtype_name(at::ScalarType dtype);
// The scalar type of a safetensors dtype name; false when this reader does not know it.
bool safetensors_scalar_type(const std::string& name, at::ScalarType* dtype);

// "[2, 3]": a shape as the messages about tensors write it.
std::string shape_text(at::IntArrayRef shape);
// The elements of a shape read from a file, or -1 when a size is negative or the product passes
// kMostElements (no file or memory holds that many; checked before anything of that shape is
// allocated).
inline constexpr int64_t kMostElements = int64_t{1} << 53;
int64_t checked_element_count(const std::vector<int64_t>& shape);

struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range after the header

  uint64_t nbytes() const { return end - begin; }
};

// Writes PATH.tmp, then renames it to PATH when every declared tensor was written and the bytes are on
// disk (fsynced); destroyed unfinished (an exception on the way), it removes PATH.tmp. It keeps the
// CRC-32C (common/crc32c.h) of the whole file and of each tensor's bytes as they are written.
class SafetensorsWriter {
 public:
  // `entries`: name, dtype and shape of every tensor, in file order (offsets are computed here).
  SafetensorsWriter(std::string path, std::vector<SafetensorsEntry> entries,
                    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next declared tensor: its name and shape must match; it is converted to the declared dtype
  // (one tensor at a time) and its bytes appended. Returns the CRC-32C of those bytes.
  uint32_t write(const std::string& name, const at::Tensor& tensor);
  // Checks that every declared tensor was written, closes, fsyncs and renames. Returns the file's size.
  uint64_t finish();
  uint32_t crc32c() const { return file_crc_; }  // of every byte written so far

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail_write(int error_number) const;
  std::string path_, temporary_path_;
  std::vector<SafetensorsEntry> entries_;
  size_t next_ = 0;
  uint64_t file_bytes_ = 0;
  uint32_t file_crc_ = 0;
  int descriptor_ = -1;  // the staging file (open_output_file: never through a link)
  bool finished_ = false;
};

// One safetensors file's header, and its tensors read one at a time by byte range.
class SafetensorsFile {
 public:
  // Reads and checks the header: JSON, known dtypes, shapes whose byte count is the offsets' span,
  // offsets that tile the data section without gaps or overlaps and end at the end of the file.
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  // The tensor's bytes (only its range is read), as a CPU tensor of its own dtype and shape.
  at::Tensor read(const std::string& name) const;
  // Rows [first_row, first_row + rows) along dim 0: only their byte range is read.
  at::Tensor read_rows(const std::string& name, int64_t first_row, int64_t rows) const;

 private:
  const SafetensorsEntry& entry(const std::string& name) const;  // UserError when absent
  // destination.nbytes() bytes from `offset` into the entry's range.
  void read_into(const SafetensorsEntry& entry, uint64_t offset, const at::Tensor& destination) const;
  std::string path_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace llm
