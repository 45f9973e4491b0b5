// Corpora of any size on almost no disk, for the tests and benchmarks that need 10^12 tokens
// (tests/sampler_scale_test.cpp, bench/sampler_bench.cpp): token files in our format
// (data/token_file.h) whose 64-byte header promises the token count and whose ids are a hole made
// by ftruncate(2). The file system stores a block or two per file, and every id in the hole reads
// 0, a valid id. A few ids may be written at chosen corpus positions (marks), so a reader can tell
// which window it read.
//
// Each TokenFile holds its descriptor open for the run, so a corpus of 1,000 shards needs more open
// files than the usual soft limit of 1024 leaves after the test harness's own: open_sparse_corpus
// raises the soft limit towards the hard one first.
//
// Header-only, and free of GoogleTest and test_util.h, so bench/ includes it too. Failures throw
// std::runtime_error naming the file and errno.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "data/token_corpus.h"
#include "data/token_file.h"

namespace llm::testing {

// A corpus position and the id written there; every other id of a sparse corpus reads 0.
struct TokenMark {
  int64_t position = 0;
  int64_t id = 0;
};

namespace sparse_detail {

[[noreturn]] inline void fail(const std::string& what, const std::string& path) {
  throw std::runtime_error("sparse corpus: " + what + " " + path + ": " + std::strerror(errno));
}

inline void write_at(int descriptor, const void* bytes, size_t count, off_t offset,
                     const std::string& path) {
  if (::pwrite(descriptor, bytes, count, offset) != static_cast<ssize_t>(count))
    fail("cannot write", path);
}

}  // namespace sparse_detail

inline int sparse_bytes_per_token(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// Writes `shards` files shard_00000.bin, ... into `folder` (made if missing), each of
// `tokens_per_shard` ids of a `vocab_size` vocabulary (uint16 up to 65536, else uint32, as
// write_token_file picks), all 0 but the marks (positions in the corpus, the shards concatenated in
// order; ids below vocab_size). Returns the paths in corpus order.
inline std::vector<std::string> write_sparse_shards(const std::filesystem::path& folder, int shards,
                                                    int64_t tokens_per_shard, int64_t vocab_size,
                                                    const std::vector<TokenMark>& marks = {}) {
  if (shards <= 0 || tokens_per_shard <= 0 || vocab_size <= 0 || vocab_size > (int64_t{1} << 32))
    throw std::invalid_argument("sparse corpus: shards, tokens per shard and vocab_size (at most "
                                "2^32) must be positive");
  std::filesystem::create_directories(folder);
  const int width = sparse_bytes_per_token(vocab_size);
  std::vector<std::string> paths;
  for (int shard = 0; shard < shards; ++shard) {
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%05d.bin", shard);
    const std::string path = (folder / name).string();
    const int descriptor = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (descriptor < 0) sparse_detail::fail("cannot create", path);
    // The header of data/token_file.h, little endian (the hosts we build for).
    unsigned char header[kTokenFileHeaderBytes] = {};
    const uint32_t version = kTokenFileVersion, bytes_per_token = static_cast<uint32_t>(width);
    const auto count = static_cast<uint64_t>(tokens_per_shard);
    const auto vocab = static_cast<uint64_t>(vocab_size);
    std::memcpy(header, kTokenFileMagic, sizeof(kTokenFileMagic));
    std::memcpy(header + 8, &version, 4);
    std::memcpy(header + 12, &bytes_per_token, 4);
    std::memcpy(header + 16, &count, 8);
    std::memcpy(header + 24, &vocab, 8);
    sparse_detail::write_at(descriptor, header, sizeof(header), 0, path);
    const auto file_bytes = static_cast<off_t>(kTokenFileHeaderBytes) +
                            static_cast<off_t>(tokens_per_shard) * width;
    if (::ftruncate(descriptor, file_bytes) != 0) sparse_detail::fail("cannot extend", path);
    const int64_t first = int64_t{shard} * tokens_per_shard;
    for (const TokenMark& mark : marks) {
      if (mark.position < first || mark.position >= first + tokens_per_shard) continue;
      const auto id = static_cast<uint32_t>(mark.id);
      const auto narrow = static_cast<uint16_t>(mark.id);
      const off_t offset = static_cast<off_t>(kTokenFileHeaderBytes) +
                           static_cast<off_t>(mark.position - first) * width;
      sparse_detail::write_at(descriptor, width == 2 ? static_cast<const void*>(&narrow) : &id,
                              static_cast<size_t>(width), offset, path);
    }
    if (::close(descriptor) != 0) sparse_detail::fail("cannot close", path);
    paths.push_back(path);
  }
  return paths;
}

// Raises this process's soft limit of open files to at least `needed` (up to the hard limit).
inline void raise_open_file_limit(rlim_t needed) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= needed) return;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? needed : std::min(needed, limit.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

// Opens the shards as one corpus (TokenFile::open each: headers only), named `name` in messages.
inline std::shared_ptr<TokenCorpus> open_sparse_corpus(const std::vector<std::string>& paths,
                                                       int64_t vocab_size,
                                                       const std::string& name = "sparse corpus") {
  raise_open_file_limit(static_cast<rlim_t>(paths.size()) + 256);
  std::vector<std::shared_ptr<TokenFile>> shards;
  shards.reserve(paths.size());
  for (const std::string& path : paths) shards.push_back(TokenFile::open(path, vocab_size));
  return std::make_shared<TokenCorpus>(std::move(shards), name);
}

}  // namespace llm::testing
