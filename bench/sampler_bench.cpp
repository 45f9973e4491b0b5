// The batch sampler's start-up and memory at pre-training scale (issue 27), ours against today's, in
// one process on the same simulated corpora: --shards token files (sparse: tests/sparse_corpus.h,
// a header promising the count, the ids a hole) of 10^9 to 10^12 tokens in all.
//   ours     BatchSampler (data/batches.h) over the keyed window order (data/window_order.h): its
//            constructor and first micro-batch, its resident-memory growth, the order's cost per
//            position, micro-batches drawn at random positions, and (up to --check_max_tokens)
//            that epoch 0 visits every train window once
//   today's  the sampler before issue 27: at each epoch's first sample, a std::vector<int64_t> of
//            every train window shuffled by Fisher-Yates with std::mt19937_64 seeded from
//            (seed, epoch) (the code as it was, reproduced here), run up to
//            --baseline_max_tokens; above that its bytes and seconds are projected from the
//            largest size run (8 bytes per window; the time is a lower bound, as the shuffle's
//            random swaps miss the cache more as the array grows)
// Prints a Markdown table and the bound that matters: the order state ours holds (bytes, whatever
// the corpus) against today's per-rank array at 10^12 tokens.
//
//   build/bench/sampler_bench [--dir /tmp] [--shards 1000] [--max_length 1024] [--batch 8]
//                             [--sizes 1e9,1e10,1e11,1e12] [--baseline_max_tokens 1e10]
//                             [--check_max_tokens 1e10]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include "common/memory_stats.h"
#include "data/batches.h"
#include "data/window_order.h"
#include "tests/sparse_corpus.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSeed = 1234;
constexpr int64_t kVocab = 32000;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
volatile uint64_t order_sink = 0;  // keeps the timed loop of the order's evaluations

// "10^12" for powers of ten, else "%.3g".
std::string tokens_text(double tokens) {
  const double exponent = std::round(std::log10(tokens));
  char text[32];
  if (std::abs(tokens - std::pow(10.0, exponent)) < 0.5)
    std::snprintf(text, sizeof(text), "10^%.0f", exponent);
  else
    std::snprintf(text, sizeof(text), "%.3g", tokens);
  return text;
}

// Today's order, as data/batches.cpp drew it before issue 27.
uint64_t uniform_below(std::mt19937_64& generator, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t draw = generator();
    if (draw >= threshold) return draw % bound;
  }
}
std::vector<int64_t> todays_permutation(int64_t num_windows, uint64_t seed, int64_t epoch) {
  const auto epoch_bits = static_cast<uint64_t>(epoch);
  std::seed_seq seeds{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                      static_cast<uint32_t>(epoch_bits), static_cast<uint32_t>(epoch_bits >> 32)};
  std::mt19937_64 generator(seeds);
  std::vector<int64_t> permutation(static_cast<size_t>(num_windows));
  std::iota(permutation.begin(), permutation.end(), 0);
  for (int64_t i = num_windows - 1; i > 0; --i)
    std::swap(permutation[i], permutation[uniform_below(generator, static_cast<uint64_t>(i) + 1)]);
  return permutation;
}

struct Row {
  double tokens = 0;
  int64_t windows = 0;
  double open_ms = 0;
  double startup_ms = 0, order_ns = 0, draws_per_s = 0;
  int64_t grown = 0;
  std::string bijection = "not run";
  bool baseline_run = false;
  double baseline_s = 0;
  int64_t baseline_grown = 0;
  double baseline_bytes_per_window = 0;
};

// Epoch 0 of ours visits every one of n windows once (a bitmap of n bits).
bool visits_every_window_once(const llm::KeyedPermutation& permutation) {
  const uint64_t n = permutation.size();
  std::vector<uint64_t> seen((n + 63) / 64, 0);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t window = permutation(i);
    if (window >= n || (seen[window / 64] >> (window % 64) & 1) != 0) return false;
    seen[window / 64] |= uint64_t{1} << (window % 64);
  }
  return true;
}

Row measure(const std::filesystem::path& folder, int shards, double tokens, int64_t max_length,
            int64_t batch, double baseline_max_tokens, double check_max_tokens) {
  Row row;
  const auto tokens_per_shard = static_cast<int64_t>(tokens / shards);
  row.tokens = static_cast<double>(tokens_per_shard) * shards;
  std::filesystem::remove_all(folder);
  const std::vector<std::string> paths =
      llm::testing::write_sparse_shards(folder, shards, tokens_per_shard, kVocab);

  auto started = Clock::now();
  const auto corpus = llm::testing::open_sparse_corpus(paths, kVocab, "sampler_bench corpus");
  row.open_ms = 1e3 * seconds_since(started);

  const int64_t before = llm::current_resident_bytes();
  started = Clock::now();
  llm::BatchSampler sampler(corpus, llm::Split::train, max_length, 0.0, kSeed, 0, 1, batch);
  sampler.next();
  row.startup_ms = 1e3 * seconds_since(started);
  row.windows = sampler.num_windows();
  const auto n = static_cast<uint64_t>(row.windows);

  std::mt19937_64 positions(7);
  const int draws = 2000;
  started = Clock::now();
  for (int i = 0; i < draws; ++i) {
    sampler.seek(static_cast<int64_t>(positions() % (16 * n)));  // anywhere in 16 epochs
    sampler.next();
  }
  row.draws_per_s = draws / seconds_since(started);
  row.grown = llm::current_resident_bytes() - before;

  const llm::WindowOrder order(n, kSeed);
  const llm::KeyedPermutation epoch = order.epoch(3);
  const uint64_t evaluations = std::min<uint64_t>(n, 2000000);
  uint64_t checksum = 0;
  started = Clock::now();
  for (uint64_t i = 0; i < evaluations; ++i) checksum += epoch(i);
  row.order_ns = 1e9 * seconds_since(started) / static_cast<double>(evaluations);
  order_sink = checksum;

  if (tokens <= check_max_tokens) {
    started = Clock::now();
    const bool once = visits_every_window_once(order.epoch(0));
    char text[64];
    std::snprintf(text, sizeof(text), "%s (%.1f s)", once ? "yes" : "NO", seconds_since(started));
    row.bijection = text;
  }

  if (tokens <= baseline_max_tokens) {
    row.baseline_run = true;
    const int64_t baseline_before = llm::current_resident_bytes();
    started = Clock::now();
    std::vector<int64_t> permutation = todays_permutation(row.windows, kSeed, 0);
    row.baseline_s = seconds_since(started);
    row.baseline_grown = llm::current_resident_bytes() - baseline_before;
    row.baseline_bytes_per_window =
        static_cast<double>(row.baseline_grown) / static_cast<double>(row.windows);
    // The agreement both must have: a permutation of the same n windows (sum 0 + ... + n - 1).
    uint64_t sum = 0;
    for (int64_t window : permutation) sum += static_cast<uint64_t>(window);
    if (sum != n * (n - 1) / 2) std::printf("warning: today's order does not sum to n(n - 1) / 2\n");
  }
  std::filesystem::remove_all(folder);
  return row;
}

void run(const std::filesystem::path& folder, const std::string& dir, int shards, int64_t max_length,
         int64_t batch, const std::vector<double>& sizes, double baseline_max_tokens,
         double check_max_tokens) {
  std::printf("sampler_bench: %d shards (sparse files under %s), windows of %lld tokens, "
              "micro-batch %lld, seed %llu\n\n", shards, dir.c_str(),
              static_cast<long long>(max_length + 1), static_cast<long long>(batch),
              static_cast<unsigned long long>(kSeed));
  // Warm up what every sampler uses once (ATen's first tensors, the allocator), so the first row's
  // memory is the sampler's.
  measure(folder, shards, std::max(1e6, 1.0 * shards * (max_length + 1) * 2 * batch), max_length,
          batch, 0, 0);

  std::vector<Row> rows;
  for (double tokens : sizes)
    rows.push_back(measure(folder, shards, tokens, max_length, batch, baseline_max_tokens,
                           check_max_tokens));

  const Row* largest_baseline = nullptr;
  for (const Row& row : rows)
    if (row.baseline_run) largest_baseline = &row;
  std::printf("| tokens | train windows | open %d shards (ms) | ours: start-up (ms) | ours: RSS "
              "growth (MiB) | ours: order (ns/position) | ours: micro-batches/s, random seeks | "
              "ours: epoch 0 a permutation | today: permutation (s) | today: RSS growth (MiB) | "
              "today: bytes/window |\n", shards);
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n");
  for (const Row& row : rows) {
    char time[48] = "not run", bytes[48] = "not run", per_window[48] = "not run";
    if (row.baseline_run) {
      std::snprintf(time, sizeof(time), "%.2f", row.baseline_s);
      std::snprintf(bytes, sizeof(bytes), "%.1f", mib(row.baseline_grown));
      std::snprintf(per_window, sizeof(per_window), "%.2f", row.baseline_bytes_per_window);
    } else if (largest_baseline != nullptr) {  // projected from the largest size run
      const double scale =
          static_cast<double>(row.windows) / static_cast<double>(largest_baseline->windows);
      std::snprintf(time, sizeof(time), ">= %.1f (projected)", largest_baseline->baseline_s * scale);
      std::snprintf(bytes, sizeof(bytes), "%.0f (projected)", mib(8 * row.windows));
      std::snprintf(per_window, sizeof(per_window), "8 (projected)");
    }
    std::printf("| %s | %lld | %.1f | %.2f | %.2f | %.0f | %.0f | %s | %s | %s | %s |\n",
                tokens_text(row.tokens).c_str(), static_cast<long long>(row.windows), row.open_ms,
                row.startup_ms, mib(row.grown), row.order_ns, row.draws_per_s,
                row.bijection.c_str(), time, bytes, per_window);
  }
  const Row& last = rows.back();
  std::printf("\nThe order's state per rank: ours %zu bytes (WindowOrder and the epoch's "
              "KeyedPermutation) at every size; today's at %s tokens: 8 bytes x %lld windows = "
              "%.2f GB, drawn anew at each epoch's first sample.\n",
              sizeof(llm::WindowOrder) + sizeof(llm::KeyedPermutation),
              tokens_text(last.tokens).c_str(), static_cast<long long>(last.windows),
              8.0 * static_cast<double>(last.windows) / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::filesystem::temp_directory_path().string();
  int shards = 1000;
  int64_t max_length = 1024, batch = 8;
  std::vector<double> sizes = {1e9, 1e10, 1e11, 1e12};
  double baseline_max_tokens = 1e10, check_max_tokens = 1e10;
  CLI::App app{"the batch sampler's start-up and memory for 10^9 to 10^12 tokens, ours and today's"};
  app.add_option("--dir", dir, "where the sparse shards are written (and removed)")
      ->capture_default_str();
  app.add_option("--shards", shards)->capture_default_str();
  app.add_option("--max_length", max_length)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--sizes", sizes, "corpus sizes in tokens")->delimiter(',')->capture_default_str();
  app.add_option("--baseline_max_tokens", baseline_max_tokens,
                 "largest corpus today's permutation is drawn for (8 bytes per window)")
      ->capture_default_str();
  app.add_option("--check_max_tokens", check_max_tokens,
                 "largest corpus whose epoch 0 is checked to visit every window once")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::filesystem::path folder =
      std::filesystem::path(dir) / ("sampler_bench_" + std::to_string(::getpid()));
  try {
    run(folder, dir, shards, max_length, batch, sizes, baseline_max_tokens, check_max_tokens);
  } catch (const std::exception& error) {
    std::filesystem::remove_all(folder);
    std::fprintf(stderr, "sampler_bench: %s\n", error.what());
    return 2;
  }
  return 0;
}

