// The memory ledger's vocabulary, shared by the ledger (measured), the estimator (predicted) and the
// report: the six categories, one rank's peaks, and the statistics across ranks with their Markdown.
//
// Categories (docs/memory.md says how each is counted):
//   parameters        fp32 master shard + gathered compute copies
//   gradients         fp32 gradient shard + full gradients not yet reduced
//   optimizer_device  optimizer state on the training device (the CPU for a CPU run)
//   optimizer_host    what --offload keeps in host memory: the optimizer's masters, buffers and state,
//                     parameter offload's rows ("offloaded (host)" in the tables)
//   activations       the tracked total minus every owned buffer: saved tensors, unit boundaries,
//                     autocast weight copies, temporaries alive at the point
//   other             owned buffers of no other category: the batch and the rotary tables
//
// No LibTorch here: the report verb and its tests read and write these without tensors.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llm {

struct MemoryCategories {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_device = 0;
  int64_t optimizer_host = 0;
  int64_t activations = 0;
  int64_t other = 0;

  static constexpr int kCount = 6;
  // JSON keys, in the order of the plots' stacks and the tables' columns.
  static const std::array<const char*, kCount>& keys();
  // Column headings: "parameters", ..., "optimizer (device)", ...
  static const std::array<const char*, kCount>& titles();
  int64_t& at(int index);
  int64_t at(int index) const;
  int64_t total() const;
  // Each category the larger of the two.
  void raise_to(const MemoryCategories& other);

  nlohmann::json to_json() const;
  bool operator==(const MemoryCategories&) const = default;
  // Missing keys read as 0 (a record from a run without offload has optimizer_host 0 anyway).
  static MemoryCategories from_json(const nlohmann::json& object);
};

// One rank's figures for a run: what memory.rank<R>.jsonl's "end" record holds and what the
// end-of-run table gathers over the communicator.
struct RankMemorySummary {
  int rank = 0;
  int64_t peak_bytes = 0;        // the tracked allocator's peak over the run (transients included)
  MemoryCategories max;          // each category's largest value at any timeline point
  MemoryCategories at_peak;      // the categories at the point that closed the peak's window
  int64_t transient_at_peak = 0; // peak_bytes minus the tracked total at that point
  std::string peak_phase;        // "backward:head", "optimizer", ...
  int64_t peak_step = 0;
  int64_t host_peak_bytes = 0;   // LibTorch's CPU allocator (the same as peak_bytes on a CPU run)
  int64_t rss_peak_bytes = 0;    // the process's peak resident set
  int64_t reserved_peak_bytes = 0;  // CUDA caching allocator's reserved (0 on CPU)
  int64_t pinned_peak_bytes = 0;    // CUDA's pinned host allocator (0 on CPU)
  int64_t alloc_retries = 0;
  int64_t ooms = 0;
  int node = 0;                  // the rank's node, numbered by its lowest rank's order (0 = rank 0's)

  nlohmann::json to_json() const;
  static RankMemorySummary from_json(const nlohmann::json& object);
};

// The ranks of one node (sharing its RAM) and their host figures summed: the ranks' peaks, which
// need not fall at the same moment, so an upper bound of the node's peak (the ranks step in
// lockstep, so their peaks meet within a step).
struct NodeMemorySummary {
  int node = 0;
  std::vector<int> ranks;
  int64_t host_peak_bytes = 0;    // LibTorch's CPU allocations
  int64_t rss_peak_bytes = 0;     // resident sets: what the node's RAM holds
  int64_t pinned_peak_bytes = 0;  // page-locked (CUDA's pinned host allocator)
  nlohmann::json to_json() const;
};
std::vector<NodeMemorySummary> by_node(const std::vector<RankMemorySummary>& ranks);

// mean, min, median, max of one figure across ranks; imbalance = max / mean (1 when mean is 0).
struct AcrossRanks {
  double mean = 0, min = 0, median = 0, max = 0;
  double imbalance() const { return mean > 0 ? max / mean : 1.0; }
};
AcrossRanks across_ranks(const std::vector<int64_t>& values);
double median(std::vector<double> values);  // 0 for none; the mean of the middle two for an even count

// Ranks whose figure is above this fraction of the mean are flagged as imbalanced.
constexpr double kImbalanceThreshold = 1.05;

// Byte counts in one unit chosen for a column of numbers: the largest power of 1024 (B, KiB, MiB,
// GiB, TiB) at which the largest value is at least 1.
struct ByteUnit {
  const char* name;
  double divisor;
};
ByteUnit byte_unit_for(int64_t largest);
std::string format_in(int64_t bytes, const ByteUnit& unit);   // "12.34" (no unit name)
std::string format_in(double bytes, const ByteUnit& unit);
std::string human_bytes(int64_t bytes);                         // "12.34 MiB" (step lines, logs, plots)

// The per-rank table (peak, at which phase, each category's peak, host peak, peak RSS, and on CUDA
// reserved / pinned / retries / OOMs) and the across-ranks table with imbalance flags, in Markdown.
std::string per_rank_markdown(const std::vector<RankMemorySummary>& ranks, bool cuda);
std::string across_ranks_markdown(const std::vector<RankMemorySummary>& ranks, bool cuda);

}  // namespace llm
