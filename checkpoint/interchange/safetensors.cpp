#include "checkpoint/interchange/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/crc32c.h"
#include "common/errors.h"
#include "common/output_files.h"
#include "common/json_file.h"

namespace llm {
namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; this writer and reader copy them as they are in memory");

namespace {

struct DTypeName {
  const char* name;
  at::ScalarType dtype;
};
constexpr DTypeName kDTypes[] = {
    {"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}, {"F64", at::kDouble},
    {"I64", at::kLong},  {"I32", at::kInt},       {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},   {"BOOL", at::kBool},
};

// Safetensors files above this header size are refused as not safetensors (the reference reader's
// own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

uint64_t element_count(const std::vector<int64_t>& shape) {
  uint64_t count = 1;
  for (int64_t size : shape) count *= static_cast<uint64_t>(size);
  return count;
}

}  // namespace

int64_t checked_element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t size : shape) {
    if (size < 0) return -1;
    if (size != 0 && count > kMostElements / size) return -1;
    count *= size;
  }
  return count;
}

std::string shape_text(at::IntArrayRef shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const DTypeName& entry : kDTypes)
    if (entry.dtype == dtype) return entry.name;
  fail_user("safetensors", "dtype", std::string("no safetensors name for ") + c10::toString(dtype));
}

bool safetensors_scalar_type(const std::string& name, at::ScalarType* dtype) {
  for (const DTypeName& entry : kDTypes)
    if (name == entry.name) {
      *dtype = entry.dtype;
      return true;
    }
  return false;
}

// --- writer ---------------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsEntry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), temporary_path_(path_ + ".tmp"), entries_(std::move(entries)) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (SafetensorsEntry& entry : entries_) {
    entry.begin = offset;
    entry.end = offset + element_count(entry.shape) * c10::elementSize(entry.dtype);
    offset = entry.end;
    header[entry.name] = {{"dtype", safetensors_dtype_name(entry.dtype)},
                          {"shape", entry.shape},
                          {"data_offsets", {entry.begin, entry.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // every tensor 8-byte aligned in the file
  const uint64_t length = text.size();
  file_bytes_ = 8 + length + offset;
  descriptor_ = open_output_file(temporary_path_, O_WRONLY | O_TRUNC, "safetensors file");
  if (descriptor_ < 0) fail_write(errno);
  int error_number = write_fully(descriptor_, &length, 8);
  if (error_number == 0) error_number = write_fully(descriptor_, text.data(), text.size());
  if (error_number != 0) {  // no destructor runs for a constructor that throws
    ::close(descriptor_);
    std::error_code ignored;
    fs::remove(temporary_path_, ignored);
    fail_write(error_number);
  }
  file_crc_ = llm::crc32c(text.data(), text.size(), llm::crc32c(&length, 8));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (finished_) return;
  if (descriptor_ >= 0) ::close(descriptor_);
  std::error_code ignored;
  fs::remove(temporary_path_, ignored);
}

void SafetensorsWriter::fail_write(int error_number) const {
  fail_user(temporary_path_, "",
            std::string("could not be written (") + std::strerror(error_number) +
                "): disk full, over quota or not writable? Nothing was put under the final name " + path_);
}

uint32_t SafetensorsWriter::write(const std::string& name, const at::Tensor& tensor) {
  LLM_REQUIRE(next_ < entries_.size(), path_, name, "more tensors written than were declared (a bug)");
  const SafetensorsEntry& entry = entries_[next_];
  LLM_REQUIRE(entry.name == name, path_, name, "written out of order: expected " + entry.name + " (a bug)");
  LLM_REQUIRE(tensor.sizes() == at::IntArrayRef(entry.shape), path_, name,
              "shape " + shape_text(tensor.sizes().vec()) + " differs from the declared " + shape_text(entry.shape));
  // The one converted copy that exists at a time: this tensor in the file's dtype, on the host.
  const at::Tensor bytes = tensor.detach().to(at::kCPU).to(entry.dtype).contiguous();
  if (const int error_number = write_fully(descriptor_, bytes.data_ptr(), entry.nbytes()); error_number != 0)
    fail_write(error_number);
  ++next_;
  const uint32_t crc = llm::crc32c(bytes.data_ptr(), entry.nbytes());
  file_crc_ = llm::crc32c(bytes.data_ptr(), entry.nbytes(), file_crc_);
  return crc;
}

uint64_t SafetensorsWriter::finish() {
  LLM_REQUIRE(next_ == entries_.size(), path_, "",
              "closed after " + std::to_string(next_) + " of " + std::to_string(entries_.size()) +
                  " tensors (a bug)");
  // On disk before the rename: a power loss then leaves no file under PATH that is short or empty.
  const int synced = ::fsync(descriptor_) == 0 ? 0 : errno;
  const int closed = ::close(descriptor_) == 0 ? 0 : errno;
  descriptor_ = -1;
  if (synced != 0 || closed != 0) fail_write(synced != 0 ? synced : closed);
  std::error_code error;
  fs::rename(temporary_path_, path_, error);
  LLM_REQUIRE(!error, path_, "", "cannot rename " + temporary_path_ + " to it (" + error.message() + ")");
  finished_ = true;
  return file_bytes_;
}

// --- reader ---------------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  std::error_code error;
  const uint64_t file_size = fs::file_size(path_, error);
  LLM_REQUIRE(!error, path_, "", "cannot be read (" + error.message() + ")");
  const std::string damaged = "; the file is damaged or incomplete: copy or save it again";
  LLM_REQUIRE(file_size >= 8, path_, "",
              "is " + std::to_string(file_size) + " bytes, shorter than a safetensors header" + damaged);
  std::ifstream in(path_, std::ios::binary);
  LLM_REQUIRE(in.good(), path_, "", "cannot be opened for reading: check its permissions");
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  LLM_REQUIRE(length <= kMaxHeaderBytes && length <= file_size - 8, path_, "",
              "not a safetensors file: its first 8 bytes give a header of " + std::to_string(length) +
                  " bytes in a file of " + std::to_string(file_size) + damaged);
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  LLM_REQUIRE(in.good(), path_, "", "cannot read its header" + damaged);
  data_start_ = 8 + length;
  nlohmann::json header;
  try {
    header = parse_json_text(text, path_ + " (its header)");
  } catch (const nlohmann::json::exception& parse_error) {
    fail_user(path_, "header", std::string("not safetensors: the header is not JSON (") + parse_error.what() + ")");
  }
  LLM_REQUIRE(header.is_object(), path_, "header", "not safetensors: the header is not a JSON object");
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      LLM_REQUIRE(value.is_object() || value.is_null(), path_, name, "expected an object of strings");
      if (value.is_object())
        for (const auto& [key, text_value] : value.items())
          if (text_value.is_string()) metadata_[key] = text_value.get<std::string>();
      continue;
    }
    const std::string tensor_name = name;
    const auto bad = [&](const std::string& what) { fail_user(path_, tensor_name, what + damaged); };
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets"))
      bad("expected {\"dtype\", \"shape\", \"data_offsets\"}");
    SafetensorsEntry entry;
    entry.name = name;
    const nlohmann::json& dtype = value.at("dtype");
    if (!dtype.is_string()) bad("dtype is not a string");
    if (!safetensors_scalar_type(dtype.get<std::string>(), &entry.dtype))
      fail_user(path_, name,
                "dtype " + dtype.get<std::string>() +
                    " cannot be read here (F32, BF16, F16, F64 and integer tensors can); quantized weights "
                    "need to be saved unquantized");
    const nlohmann::json& shape = value.at("shape");
    if (!shape.is_array()) bad("shape is not an array");
    for (const nlohmann::json& size : shape) {
      if (!size.is_number_unsigned() || size.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
        bad("shape holds " + json_excerpt(size) + ", not a size");
      entry.shape.push_back(size.get<int64_t>());
    }
    const nlohmann::json& offsets = value.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      bad("data_offsets is not [begin, end]");
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    if (checked_element_count(entry.shape) < 0)
      bad("shape " + shape_text(entry.shape) + " holds more elements than any file does: the header is damaged");
    if (entry.end < entry.begin || entry.nbytes() != element_count(entry.shape) * c10::elementSize(entry.dtype))
      bad("data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + ") do not hold a " +
          dtype.get<std::string>() + " tensor of shape " + shape_text(entry.shape));
    entries_.emplace(name, std::move(entry));
  }
  for (const auto& [name, entry] : entries_) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  // The reference reader's rule: the tensors tile the data section exactly, in some order.
  uint64_t expected = 0;
  for (const SafetensorsEntry* entry : by_offset) {
    LLM_REQUIRE(entry->begin == expected, path_, entry->name,
                "data_offsets start at " + std::to_string(entry->begin) + ", expected " + std::to_string(expected) +
                    " (tensors overlap or leave a gap)" + damaged);
    expected = entry->end;
  }
  LLM_REQUIRE(data_start_ + expected == file_size, path_, "",
              "the header describes " + std::to_string(data_start_ + expected) + " bytes but the file has " +
                  std::to_string(file_size) + (data_start_ + expected > file_size ? " (truncated)" : "") + damaged);
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto found = entries_.find(name);
  LLM_REQUIRE(found != entries_.end(), path_, name, "no such tensor in the file");
  return found->second;
}

void SafetensorsFile::read_into(const SafetensorsEntry& entry, uint64_t offset, const at::Tensor& destination) const {
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + entry.begin + offset));
  in.read(static_cast<char*>(destination.data_ptr()), static_cast<std::streamsize>(destination.nbytes()));
  LLM_REQUIRE(in.good() || destination.nbytes() == 0, path_, entry.name,
              std::string("cannot read the tensor's bytes (") + std::strerror(errno) + ")");
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& found = entry(name);
  at::Tensor tensor = at::empty(found.shape, at::TensorOptions().dtype(found.dtype));
  read_into(found, 0, tensor);
  return tensor;
}

at::Tensor SafetensorsFile::read_rows(const std::string& name, int64_t first_row, int64_t rows) const {
  const SafetensorsEntry& found = entry(name);
  LLM_REQUIRE(!found.shape.empty() && first_row >= 0 && rows >= 0 && first_row + rows <= found.shape[0], path_, name,
              "rows [" + std::to_string(first_row) + ", " + std::to_string(first_row + rows) + ") asked of a tensor of shape " +
                  shape_text(found.shape));
  std::vector<int64_t> shape = found.shape;
  shape[0] = rows;
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(found.dtype));
  // Row-major: the rows are one byte range, a row being the product of the other dims.
  read_into(found, static_cast<uint64_t>(first_row) * (tensor.numel() == 0 ? 0 : tensor.nbytes() / rows), tensor);
  return tensor;
}

}  // namespace llm
