// The four token-file headers: ours, llm.c's, NumPy's .npy and Megatron's .idx (data/token_file.h
// gives each layout). Each parser checks what its format promises against the file's size, so a
// truncated or padded file is refused at open, naming it.
#include "data/token_formats.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/errors.h"
#include "common/input_paths.h"
#include "data/npy_header.h"

namespace llm {
namespace {

constexpr char kFormatsWeRead[] =
    "ours (\"LLMTOKv1\", from `trainer prepare`), llm.c's .bin (magic 20240520 or 20240801), a Megatron "
    ".bin with its .idx, or a NumPy .npy";

template <typename T>
T little_endian(const unsigned char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

// The promised payload (`count` ids of `width` bytes after `offset`) against the file's size.
void check_size(const std::string& path, const char* what, size_t offset, uint64_t count, int width, size_t file_bytes,
                const std::string& remedy) {
  const uint64_t payload = file_bytes >= offset ? file_bytes - offset : 0;
  if (file_bytes >= offset && count <= payload / static_cast<uint64_t>(width) &&
      count * static_cast<uint64_t>(width) == payload)
    return;
  const bool truncated = file_bytes < offset || count > payload / static_cast<uint64_t>(width);
  fail_user(path, "size",
            std::string(what) + " promises " + std::to_string(count) + " tokens of " + std::to_string(width) +
                " bytes (" + std::to_string(offset) + " + tokens * width bytes) but the file has " +
                std::to_string(file_bytes) + " bytes: " +
                (truncated ? "it is truncated (an interrupted copy or write?)" : "it has trailing bytes after the last token") +
                "; " + remedy);
}

// Ours: the 64-byte header of data/token_file.h.
TokenLayout ours(const std::string& path, const unsigned char* head, size_t file_bytes, int64_t model_vocab_size) {
  const std::string remedy = "regenerate it with `trainer prepare`";
  LLM_REQUIRE(file_bytes >= kTokenFileHeaderBytes, path, "header",
              "the file has " + std::to_string(file_bytes) + " bytes, fewer than the " +
                  std::to_string(kTokenFileHeaderBytes) + "-byte header: it is truncated or not a token file; " + remedy);
  const uint32_t version = little_endian<uint32_t>(head + kVersionOffset);
  LLM_REQUIRE(version == kTokenFileVersion, path, "header",
              "version " + std::to_string(version) + " is not supported (this trainer reads " +
                  std::to_string(kTokenFileVersion) + "); " + remedy);
  const uint32_t width = little_endian<uint32_t>(head + kBytesPerTokenOffset);
  LLM_REQUIRE(width == 2 || width == 4, path, "header",
              "bytes per token is " + std::to_string(width) + " (must be 2 or 4): the header is corrupt; " + remedy);
  const uint64_t count = little_endian<uint64_t>(head + kNumTokensOffset);
  const uint64_t header_vocab = little_endian<uint64_t>(head + kVocabSizeOffset);
  check_size(path, "the header", kTokenFileHeaderBytes, count, static_cast<int>(width), file_bytes, remedy);
  LLM_REQUIRE(header_vocab <= static_cast<uint64_t>(model_vocab_size), path, "vocab",
              "the file was tokenized with a vocabulary of " + std::to_string(header_vocab) +
                  " ids but the model has vocab_size " + std::to_string(model_vocab_size) +
                  "; use a model config whose vocab_size is at least " + std::to_string(header_vocab) +
                  ", or re-tokenize with a matching tokenizer");
  return {.format = TokenFormat::trainer, .payload_offset = kTokenFileHeaderBytes, .bytes_per_token = static_cast<int>(width),
          .num_tokens = static_cast<int64_t>(count), .vocab_size = static_cast<int64_t>(header_vocab), .ids_path = path};
}


TokenLayout llmc(const std::string& path, const unsigned char* head, size_t file_bytes) {
  const std::string remedy = "rewrite it with llm.c's dev/data scripts, or tokenize with `trainer prepare`";
  LLM_REQUIRE(file_bytes >= kLlmcHeaderBytes, path, "header",
              "an llm.c .bin (magic " + std::to_string(little_endian<int32_t>(head)) + ") needs a " +
                  std::to_string(kLlmcHeaderBytes) + "-byte header, and the file has " + std::to_string(file_bytes) +
                  " bytes: it is truncated; " + remedy);
  const int32_t magic = little_endian<int32_t>(head);
  const int32_t version = little_endian<int32_t>(head + 4);
  const int32_t count = little_endian<int32_t>(head + 8);
  const int32_t expected_version = magic == kLlmcGpt2Magic ? 1 : 7;
  LLM_REQUIRE(version == expected_version, path, "header",
              "version " + std::to_string(version) + ": an llm.c .bin with magic " + std::to_string(magic) +
                  " is version " + std::to_string(expected_version) + " (" +
                  (magic == kLlmcGpt2Magic ? "uint16" : "uint32") + " ids); " + remedy);
  LLM_REQUIRE(count >= 0, path, "header", "the token count is " + std::to_string(count) + ": the header is corrupt; " + remedy);
  const int width = magic == kLlmcGpt2Magic ? 2 : 4;
  check_size(path, "the llm.c header", kLlmcHeaderBytes, static_cast<uint64_t>(count), width, file_bytes, remedy);
  return {.format = TokenFormat::llmc, .payload_offset = kLlmcHeaderBytes, .bytes_per_token = width, .num_tokens = count,
          .ids_path = path};
}

// NumPy's .npy (format 1.0, 2.0, 3.0): "\x93NUMPY", major, minor, the header's length (u16 for 1.0,
// u32 after), then a Python dict literal: descr, fortran_order, shape (data/npy_header.h).
TokenLayout npy(const std::string& path, int descriptor, size_t file_bytes) {
  const std::string remedy = "save a 1-D uint16 or uint32 array with numpy.save";
  unsigned char prefix[12] = {};
  LLM_REQUIRE(file_bytes >= 10, path, "header", "the .npy header is cut short (" + std::to_string(file_bytes) + " bytes)");
  read_exactly(descriptor, path, 0, prefix, std::min<size_t>(file_bytes, sizeof(prefix)));
  const int major = prefix[6];
  LLM_REQUIRE(major >= 1 && major <= 3, path, "header",
              ".npy format version " + std::to_string(major) + "." + std::to_string(prefix[7]) + " is not one we read (1, 2 or 3)");
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t header_start = 8 + length_bytes;
  LLM_REQUIRE(file_bytes >= header_start, path, "header", "the .npy header is cut short");
  const size_t header_length = major == 1 ? little_endian<uint16_t>(prefix + 8) : little_endian<uint32_t>(prefix + 8);
  // NumPy itself refuses headers over 10,000 bytes; a longer one is damage.
  LLM_REQUIRE(header_length <= 65536 && header_start + header_length <= file_bytes, path, "header",
              "the .npy header claims " + std::to_string(header_length) + " bytes, past the file's end or past "
              "any header NumPy writes; " + remedy);
  std::string header(header_length, '\0');
  read_exactly(descriptor, path, header_start, header.data(), header_length);
  const NpyHeader parsed = parse_npy_header(header, path);
  const std::string& descr = parsed.descr;
  LLM_REQUIRE(descr == "<u2" || descr == "<u4", path, "dtype",
              "the array's dtype is '" + descr + "'; token arrays are little-endian uint16 ('<u2') or uint32 ('<u4'): " + remedy);
  LLM_REQUIRE(!parsed.fortran_order || parsed.shape.size() <= 1, path, "fortran_order", "the array is in Fortran order; " + remedy);
  LLM_REQUIRE(parsed.shape.size() == 1, path, "shape",
              "the array's shape is " + shape_text(parsed.shape) + "; token arrays are 1-D: " + remedy);
  const uint64_t count = parsed.shape[0];
  const int width = descr == "<u2" ? 2 : 4;
  check_size(path, "the .npy header", header_start + header_length, count, width, file_bytes, remedy);
  return {.format = TokenFormat::numpy, .payload_offset = header_start + header_length, .bytes_per_token = width,
          .num_tokens = static_cast<int64_t>(count), .ids_path = path};
}

// Megatron-LM's index (megatron/core/datasets/indexed_dataset.py, _IndexWriter).
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;

TokenLayout megatron(const std::string& bin_path, const std::string& idx_path) {
  const std::string remedy = "rebuild the dataset with Megatron's tools/preprocess_data.py";
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } idx{::open(idx_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};  // a fifo: refused below, not waited on
  if (idx.fd < 0) fail_user(idx_path, "index", std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat info {};
  LLM_REQUIRE(::fstat(idx.fd, &info) == 0 && S_ISREG(info.st_mode), idx_path, "index",
              regular_file_problem(idx_path) + " (the index of " + bin_path + ")");
  const size_t idx_bytes = static_cast<size_t>(info.st_size);
  LLM_REQUIRE(idx_bytes >= kMegatronHeaderBytes, idx_path, "header",
              "the index has " + std::to_string(idx_bytes) + " bytes, fewer than its " +
                  std::to_string(kMegatronHeaderBytes) + "-byte header; " + remedy);
  unsigned char head[kMegatronHeaderBytes];
  read_exactly(idx.fd, idx_path, 0, head, sizeof(head));
  LLM_REQUIRE(std::memcmp(head, kMegatronMagic, sizeof(kMegatronMagic)) == 0, idx_path, "header",
              "wrong magic (expected \"MMIDIDX\\0\\0\"): not a Megatron index; " + remedy);
  const uint64_t version = little_endian<uint64_t>(head + 9);
  LLM_REQUIRE(version == 1, idx_path, "header", "index version " + std::to_string(version) + " (we read 1); " + remedy);
  const int code = head[17];
  LLM_REQUIRE(code == 8 || code == 4, idx_path, "dtype",
              "dtype code " + std::to_string(code) + "; token datasets are uint16 (8) or int32 (4); " + remedy);
  const int width = code == 8 ? 2 : 4;
  const uint64_t sequences = little_endian<uint64_t>(head + 18);
  const uint64_t documents = little_endian<uint64_t>(head + 26);
  const uint64_t expected_idx = kMegatronHeaderBytes + sequences * 12 + documents * 8;
  LLM_REQUIRE(sequences < (uint64_t{1} << 40) && documents < (uint64_t{1} << 40) && expected_idx == idx_bytes, idx_path,
              "size",
              "the index promises " + std::to_string(sequences) + " sequences and " + std::to_string(documents) +
                  " documents (" + std::to_string(expected_idx) + " bytes) but has " + std::to_string(idx_bytes) +
                  " bytes: it is truncated or damaged; " + remedy);
  // The sequences must lie end to end, in order: pointer[i] = the bytes of the sequences before i.
  // Read in blocks, so an index of 10^9 sequences needs no more than a block of memory.
  constexpr uint64_t kBlock = 1 << 16;
  std::vector<int32_t> lengths(kBlock);
  std::vector<int64_t> pointers(kBlock);
  uint64_t tokens = 0;
  for (uint64_t first = 0; first < sequences; first += kBlock) {
    const uint64_t n = std::min(kBlock, sequences - first);
    read_exactly(idx.fd, idx_path, kMegatronHeaderBytes + first * 4, lengths.data(), n * 4);
    read_exactly(idx.fd, idx_path, megatron_pointers_offset(sequences) + first * 8, pointers.data(), n * 8);
    for (uint64_t i = 0; i < n; ++i) {
      LLM_REQUIRE(lengths[i] >= 0 && static_cast<uint64_t>(pointers[i]) == tokens * static_cast<uint64_t>(width),
                  idx_path, "sequence " + std::to_string(first + i),
                  "its length " + std::to_string(lengths[i]) + " or byte pointer " + std::to_string(pointers[i]) +
                      " disagrees with the sequences before it (expected pointer " +
                      std::to_string(tokens * static_cast<uint64_t>(width)) + "): the index and " + bin_path +
                      " do not belong together, or the index is damaged; " + remedy);
      tokens += static_cast<uint64_t>(lengths[i]);
    }
  }
  // The document index: [0], then each document's end as a sequence index, never falling, ending at
  // the sequence count (IndexedDatasetBuilder's). Read in blocks too.
  std::vector<int64_t> ends(kBlock);
  int64_t previous = 0;
  for (uint64_t first = 0; first < documents; first += kBlock) {
    const uint64_t n = std::min(kBlock, documents - first);
    read_exactly(idx.fd, idx_path, megatron_documents_offset(sequences) + first * 8, ends.data(), n * 8);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t entry = first + i;
      const bool ok = entry == 0 ? ends[i] == 0
                                 : ends[i] >= previous && static_cast<uint64_t>(ends[i]) <= sequences &&
                                       (entry + 1 < documents || static_cast<uint64_t>(ends[i]) == sequences);
      LLM_REQUIRE(ok, idx_path, "document index " + std::to_string(entry),
                  "is " + std::to_string(ends[i]) + "; a document index starts at 0, never falls and ends at the sequence "
                  "count " + std::to_string(sequences) + ": the index is damaged; " + remedy);
      previous = ends[i];
    }
  }
  struct stat bin_info {};
  LLM_REQUIRE(::stat(bin_path.c_str(), &bin_info) == 0, bin_path, "data", "missing beside its index " + idx_path);
  const size_t bin_bytes = static_cast<size_t>(bin_info.st_size);
  LLM_REQUIRE(tokens * static_cast<uint64_t>(width) == bin_bytes, bin_path, "size",
              "its index " + idx_path + " promises " + std::to_string(tokens) + " tokens of " + std::to_string(width) +
                  " bytes (" + std::to_string(tokens * static_cast<uint64_t>(width)) + " bytes) but the file has " +
                  std::to_string(bin_bytes) + " bytes: " +
                  (tokens * static_cast<uint64_t>(width) > bin_bytes ? "it is truncated" : "it has trailing bytes") +
                  ", or the two files do not belong together; " + remedy);
  return {TokenFormat::megatron, 0, width, static_cast<int64_t>(tokens), 0, bin_path, idx_path, sequences, documents};
}

}  // namespace

size_t megatron_pointers_offset(uint64_t sequences) { return kMegatronHeaderBytes + sequences * 4; }
size_t megatron_documents_offset(uint64_t sequences) { return kMegatronHeaderBytes + sequences * 12; }

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void read_exactly(int descriptor, const std::string& path, size_t offset, void* out, size_t bytes) {
  auto* at = static_cast<unsigned char*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(descriptor, at + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_user(path, "read", std::string("cannot read (") + std::strerror(errno) + ")");
    if (n == 0)
      fail_user(path, "read", "the file ends at byte " + std::to_string(offset + done) + ", before the " +
                                  std::to_string(bytes) + " bytes read at " + std::to_string(offset));
    done += static_cast<size_t>(n);
  }
}

std::pair<std::string, std::string> megatron_pair(const std::string& path) {
  std::string prefix;
  if (ends_with(path, ".idx"))
    prefix = path.substr(0, path.size() - 4);
  else if (ends_with(path, ".bin"))
    prefix = path.substr(0, path.size() - 4);
  else
    return {};
  struct stat info {};
  if (ends_with(path, ".bin") && ::stat((prefix + ".idx").c_str(), &info) != 0) return {};
  return {prefix + ".bin", prefix + ".idx"};
}

TokenLayout read_token_layout(const std::string& path, int descriptor, size_t file_bytes, int64_t model_vocab_size,
                              int memmap_bytes) {
  if (const auto [bin, idx] = megatron_pair(path); !bin.empty()) return megatron(bin, idx);
  unsigned char head[kTokenFileHeaderBytes] = {};
  read_exactly(descriptor, path, 0, head, std::min(file_bytes, sizeof(head)));
  if (file_bytes >= sizeof(kTokenFileMagic) && std::memcmp(head, kTokenFileMagic, sizeof(kTokenFileMagic)) == 0)
    return ours(path, head, file_bytes, model_vocab_size);
  if (file_bytes >= 4 && (little_endian<int32_t>(head) == kLlmcGpt2Magic || little_endian<int32_t>(head) == kLlmcLlama3Magic))
    return llmc(path, head, file_bytes);
  if (file_bytes >= 6 && std::memcmp(head, "\x93NUMPY", 6) == 0) return npy(path, descriptor, file_bytes);
  if (memmap_bytes > 0) {  // OLMo's headerless ids, --memmap_dtype
    LLM_REQUIRE(file_bytes > 0 && file_bytes % static_cast<size_t>(memmap_bytes) == 0, path, "size",
                "the file has " + std::to_string(file_bytes) + " bytes, " +
                    (file_bytes == 0 ? std::string("no ids") : "not a whole number of " + std::to_string(memmap_bytes) + "-byte ids") +
                    " (--memmap_dtype uint" + std::to_string(8 * memmap_bytes) + "): it is truncated, or its ids are of "
                    "another width");
    return {.format = TokenFormat::raw, .bytes_per_token = memmap_bytes,
            .num_tokens = static_cast<int64_t>(file_bytes / static_cast<size_t>(memmap_bytes)), .ids_path = path};
  }
  const bool bin = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  const bool npy_name = path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0;
  fail_user(path, "header",
            "wrong magic: its first bytes are no token-file format we read (" + std::string(kFormatsWeRead) +
                "; the file has " + std::to_string(file_bytes) + " bytes)" +
                (bin ? "; if it is a Megatron dataset's .bin, its .idx is missing beside it (" +
                           path.substr(0, path.size() - 4) + ".idx)"
                     : std::string()) +
                (npy_name ? "; if it is OLMo's headerless token array (numpy.memmap), pass --memmap_dtype uint16 or uint32"
                          : std::string()) +
                "; regenerate it with `trainer prepare`");
}

}  // namespace llm
