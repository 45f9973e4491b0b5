// The headers of the four token-file formats (data/token_file.h lists them): where the ids start,
// how wide they are and how many, read and checked from the file's first bytes (and, for Megatron,
// its .idx). Internal to data/: TokenFile::open calls read_token_layout, then reads ids with pread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "data/token_file.h"

namespace llm {

// Byte offsets of our header's fields (data/token_file.h).
inline constexpr size_t kMagicOffset = 0;
inline constexpr size_t kVersionOffset = 8;
inline constexpr size_t kBytesPerTokenOffset = 12;
inline constexpr size_t kNumTokensOffset = 16;
inline constexpr size_t kVocabSizeOffset = 24;

// llm.c (dev/data/data_common.py): 256 int32, [0] magic, [1] version, [2] token count.
inline constexpr int32_t kLlmcGpt2Magic = 20240520;   // version 1, uint16 ids
inline constexpr int32_t kLlmcLlama3Magic = 20240801; // version 7, uint32 ids
inline constexpr size_t kLlmcHeaderBytes = 256 * 4;

struct TokenLayout {
  TokenFormat format = TokenFormat::trainer;
  size_t payload_offset = 0;  // the first id's byte offset in the file read
  int bytes_per_token = 0;    // 2 or 4
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;     // the header's (ours), else 0
  std::string ids_path{};     // the file the ids are in: `path`, or a Megatron .idx's .bin
  // Megatron's document index (the only format here that records documents): the .idx, its sequence
  // count and its document index's entries (documents + 1: [0], then each document's end).
  std::string index_path{};
  uint64_t sequences = 0;
  uint64_t document_entries = 0;
};

// The byte offsets of a Megatron .idx's arrays, for `sequences` sequences.
size_t megatron_pointers_offset(uint64_t sequences);
size_t megatron_documents_offset(uint64_t sequences);

// `path` is open as `descriptor` with `file_bytes` bytes. Throws UserError naming the file for a
// format it does not know or a header, size or index that is wrong.
// memmap_bytes (2, 4 or 0): how a file in none of the formats is read (TokenFile::open).
TokenLayout read_token_layout(const std::string& path, int descriptor, size_t file_bytes, int64_t model_vocab_size,
                              int memmap_bytes = 0);

// The Megatron pair `path` belongs to, as (the .bin, the .idx): for PREFIX.bin with a PREFIX.idx
// beside it, or for PREFIX.idx itself; ("", "") when `path` is neither.
std::pair<std::string, std::string> megatron_pair(const std::string& path);

// Reads exactly `bytes` bytes at `offset` (pread, retried on EINTR). Throws UserError naming `path`
// for a read error or a file that ends first.
void read_exactly(int descriptor, const std::string& path, size_t offset, void* out, size_t bytes);

}  // namespace llm
