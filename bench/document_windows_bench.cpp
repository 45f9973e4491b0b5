// Windows that start at documents (--window_start document, data/document_windows.h) at scale: a
// Megatron dataset per size, its .bin a hole (sparse: no disk) and its .idx written out with
// documents of 1 to 2 * --mean_document tokens (uniform, a fixed seed), the way Megatron's writer
// lays it out. Per size, one process, --repeats times each:
//   open     TokenCorpus::open: the header, the sequences' and the document index's checks (one pass
//            over the .idx, a block at a time)
//   windows  DocumentWindows' construction: one walk over every document start, keeping a mark every
//            1,024 windows
//   lookup   DocumentWindows::start at random windows: the walk from the mark below (microseconds)
//   batch    a micro-batch of --batch windows of --max_length + 1 tokens through BatchSampler at
//            random positions (the lookups and the reads of the hole)
// and the memory the sampler holds for it: the marks' bytes, and the resident growth over the
// construction (the .idx is read through the page cache, which is not the process's).
//
//   build/bench/document_windows_bench [--dir /tmp] [--sizes 1e8,1e9,1e10] [--mean_document 1000]
//                                      [--max_length 1024] [--batch 8] [--repeats 3]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include "common/memory_stats.h"
#include "data/batches.h"
#include "data/document_windows.h"
#include "data/token_corpus.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* at = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, at, bytes);
    if (n <= 0) throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
    at += n;
    bytes -= static_cast<size_t>(n);
  }
}

// PREFIX.bin (a hole of `tokens` uint16 ids) and PREFIX.idx: Megatron's _IndexWriter layout, a
// sequence per document. Returns the document count.
int64_t write_sparse_megatron(const std::string& prefix, int64_t tokens, int64_t mean_document, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<int32_t> lengths;
  for (int64_t left = tokens; left > 0;) {
    const int64_t length = std::min<int64_t>(left, 1 + static_cast<int64_t>(random() % static_cast<uint64_t>(2 * mean_document)));
    lengths.push_back(static_cast<int32_t>(length));
    left -= length;
  }
  const std::string bin = prefix + ".bin", idx = prefix + ".idx";
  const int bin_fd = ::open(bin.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (bin_fd < 0 || ::ftruncate(bin_fd, tokens * 2) != 0) throw std::runtime_error(bin + ": cannot make the hole");
  ::close(bin_fd);
  const int fd = ::open(idx.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(idx + ": cannot create");
  unsigned char header[34] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  const uint64_t version = 1, sequences = lengths.size(), documents = lengths.size() + 1;
  std::memcpy(header + 9, &version, 8);
  header[17] = 8;  // uint16
  std::memcpy(header + 18, &sequences, 8);
  std::memcpy(header + 26, &documents, 8);
  write_all(fd, header, sizeof(header), idx);
  write_all(fd, lengths.data(), lengths.size() * 4, idx);
  constexpr size_t kBlock = 1 << 20;
  std::vector<int64_t> block;
  int64_t pointer = 0;
  for (size_t first = 0; first < lengths.size(); first += kBlock) {
    block.clear();
    for (size_t i = first; i < std::min(lengths.size(), first + kBlock); ++i) {
      block.push_back(pointer);
      pointer += 2 * static_cast<int64_t>(lengths[i]);
    }
    write_all(fd, block.data(), block.size() * 8, idx);
  }
  for (size_t first = 0; first < documents; first += kBlock) {
    block.clear();
    for (size_t i = first; i < std::min<size_t>(documents, first + kBlock); ++i) block.push_back(static_cast<int64_t>(i));
    write_all(fd, block.data(), block.size() * 8, idx);
  }
  ::close(fd);
  return static_cast<int64_t>(lengths.size());
}

template <typename T>
T median(std::vector<T> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("windows that start at documents, at scale");
  std::string dir = "/tmp";
  std::vector<double> sizes = {1e8, 1e9, 1e10};
  int64_t mean_document = 1000, max_length = 1024, batch = 8;
  int repeats = 3;
  app.add_option("--dir", dir);
  app.add_option("--sizes", sizes)->delimiter(',');
  app.add_option("--mean_document", mean_document);
  app.add_option("--max_length", max_length);
  app.add_option("--batch", batch);
  app.add_option("--repeats", repeats);
  CLI11_PARSE(app, argc, argv);

  const std::filesystem::path folder = std::filesystem::path(dir) / ("document_windows_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(folder);
  std::printf("| tokens | documents | .idx MB | open s | windows s | windows | marks KiB | RSS growth MiB | lookup us (median; max) | micro-batch of %lld ms (median) |\n",
              static_cast<long long>(batch));
  std::printf("|---:|---:|---:|---|---|---:|---:|---:|---|---:|\n");
  for (double size : sizes) {
    const auto tokens = static_cast<int64_t>(size);
    const std::string prefix = (folder / ("d" + std::to_string(tokens))).string();
    const int64_t documents = write_sparse_megatron(prefix, tokens, mean_document, 7);
    std::vector<double> open_s, windows_s, lookup_us, lookup_max_us, batch_ms, rss_mib;
    int64_t windows = 0;
    for (int repeat = 0; repeat < repeats; ++repeat) {
      auto started = Clock::now();
      const auto corpus = llm::TokenCorpus::open(prefix + ".bin", 32000);
      open_s.push_back(seconds_since(started));
      const int64_t rss_before = llm::current_resident_bytes();
      started = Clock::now();
      auto document_windows = std::make_shared<const llm::DocumentWindows>(corpus, max_length + 1);
      llm::DocumentWindows::Reader reader(document_windows);
      windows_s.push_back(seconds_since(started));
      rss_mib.push_back(static_cast<double>(llm::current_resident_bytes() - rss_before) / (1 << 20));
      windows = document_windows->size();
      std::mt19937_64 random(11 + repeat);
      std::vector<double> each;
      for (int i = 0; i < 2000; ++i) {
        const auto window = static_cast<int64_t>(random() % static_cast<uint64_t>(windows));
        started = Clock::now();
        volatile int64_t start = reader.start(window);
        (void)start;
        each.push_back(seconds_since(started) * 1e6);
      }
      lookup_us.push_back(median(each));
      lookup_max_us.push_back(*std::max_element(each.begin(), each.end()));
      llm::BatchSampler sampler(corpus, llm::Split::train, max_length, 0.01, 1234, 0, 1, batch, false,
                                llm::WindowStart::document);
      std::vector<double> batches;
      for (int i = 0; i < 50; ++i) {
        sampler.seek(static_cast<int64_t>(random() % static_cast<uint64_t>(std::max<int64_t>(1, sampler.num_windows() * 3))));
        started = Clock::now();
        sampler.next();
        batches.push_back(seconds_since(started) * 1e3);
      }
      batch_ms.push_back(median(batches));
    }
    const double idx_mb = static_cast<double>(std::filesystem::file_size(prefix + ".idx")) / 1e6;
    const double marks_kib = static_cast<double>((windows + llm::DocumentWindows::kStride - 1) / llm::DocumentWindows::kStride * 16) / 1024;
    auto range = [](const std::vector<double>& v, const char* format) {
      char text[96];
      const auto [low, high] = std::minmax_element(v.begin(), v.end());
      std::snprintf(text, sizeof(text), format, median(v), *low, *high);
      return std::string(text);
    };
    std::printf("| %.0e | %lld | %.1f | %s | %s | %lld | %.1f | %s | %s | %s |\n", size, static_cast<long long>(documents),
                idx_mb, range(open_s, "%.3f (%.3f-%.3f)").c_str(), range(windows_s, "%.3f (%.3f-%.3f)").c_str(),
                static_cast<long long>(windows), marks_kib, range(rss_mib, "%.1f (%.1f-%.1f)").c_str(),
                (range(lookup_us, "%.1f (%.1f-%.1f)") + "; " +
                 std::to_string(static_cast<int64_t>(*std::max_element(lookup_max_us.begin(), lookup_max_us.end())))).c_str(),
                range(batch_ms, "%.2f (%.2f-%.2f)").c_str());
    std::fflush(stdout);
    std::filesystem::remove(prefix + ".bin");
    std::filesystem::remove(prefix + ".idx");
  }
  std::filesystem::remove_all(folder);
  return 0;
}
