#include "memory/ledger.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <sstream>

#include "common/errors.h"
#include "common/host_memory.h"
#include "common/log.h"
#include "common/memory_stats.h"
#include "sharding/communicator.h"

namespace llm {
namespace fs = std::filesystem;

MemoryCategories owned_categories(const OwnedBytes& owned, int64_t other_bytes) {
  MemoryCategories categories;
  categories.parameters = owned.parameters;
  categories.gradients = owned.gradients;
  categories.optimizer_device = owned.optimizer_device;
  categories.optimizer_host = owned.optimizer_host;
  categories.other = other_bytes;
  return categories;
}

MemoryLedger::MemoryLedger(const std::string& run_dir, int rank, int world_size, c10::Device device,
                           const nlohmann::json& run_info, bool append)
    : run_dir_(run_dir), rank_(rank), world_size_(world_size), device_(device) {
  fs::create_directories(run_dir_);
  const std::string path = (fs::path(run_dir_) / ("memory.rank" + std::to_string(rank_) + ".jsonl")).string();
  out_.open(path, append);
  run_summary_.rank = step_summary_.rank = rank_;
  nlohmann::json start = {{"event", "start"},
                          {"rank", rank_},
                          {"world_size", world_size_},
                          {"device", device_.str()},
                          {"tracked", device_.is_cuda() ? "cuda_caching_allocator" : "cpu_allocator"},
                          {"host_tracking", host_memory_tracking_installed()},
                          {"baseline_bytes", tracked_bytes()},
                          {"run", run_info}};
  out_.write_line(start.dump());
  reset_windows();
}

int64_t MemoryLedger::tracked_bytes() const {
  if (device_.is_cuda()) return device_memory_stats(device_).allocated_bytes;
  return host_memory_counters().current_bytes;
}

int64_t MemoryLedger::tracked_window_peak() const {
  if (device_.is_cuda()) return device_memory_stats(device_).allocated_peak_bytes;
  return host_memory_counters().window_peak_bytes;
}

void MemoryLedger::reset_windows() {
  reset_host_window_peak();
  reset_device_peak_stats(device_);
}

int MemoryLedger::phase_index(const std::string& label) {
  auto found = std::find(phase_labels_.begin(), phase_labels_.end(), label);
  if (found != phase_labels_.end()) return static_cast<int>(found - phase_labels_.begin());
  phase_labels_.push_back(label);
  return static_cast<int>(phase_labels_.size()) - 1;
}

void MemoryLedger::begin_step(int64_t step) {
  if (!startup_recorded_) {
    // Everything from the ledger's construction to the first step: building, initialising and
    // sharding the units, the optimizer state, the corpus.
    startup_peak_bytes_ = tracked_window_peak();
    startup_recorded_ = true;
    out_.write_line(
        nlohmann::json{{"event", "startup"}, {"peak_bytes", startup_peak_bytes_}, {"tracked_bytes", tracked_bytes()}}.dump());
  }
  step_ = step;
  micro_ = 0;
  sequence_ = 0;
  step_points_ = 0;
  step_summary_ = RankMemorySummary();
  step_summary_.rank = rank_;
  step_summary_.peak_step = step;
  reset_windows();
}

void MemoryLedger::point(const std::string& phase, const std::string& unit, const MemoryCategories& owned) {
  const int64_t tracked = tracked_bytes();
  const int64_t window_peak = std::max(tracked_window_peak(), tracked);
  const HostMemoryCounters host = host_memory_counters();
  const DeviceMemoryStats device = device_memory_stats(device_);
  const PinnedMemoryStats pinned = pinned_memory_stats(device_);
  // Page-locked buffers of exact size (offload's landing and staging buffers, --async_save's copy)
  // are cudaHostAlloc'd by us, outside the caching host allocator's figures: added here.
  const int64_t exact_pinned = exact_pinned_bytes();
  const int64_t rss = current_resident_bytes();
  MemoryCategories categories = owned;
  categories.activations = 0;
  // Owned buffers on the host (offloaded optimizer state) are not in a CUDA device's tracked total.
  const int64_t owned_on_device =
      categories.total() - (device_.is_cuda() ? categories.optimizer_host : 0);
  categories.activations = tracked - owned_on_device;

  const std::string label = unit.empty() ? phase : phase + ":" + unit;
  phase_index(label);
  nlohmann::json record = {{"event", "point"}, {"step", step_}, {"micro", micro_}, {"seq", sequence_++},
                           {"phase", phase}, {"unit", unit}};
  for (int i = 0; i < MemoryCategories::kCount; ++i) record[MemoryCategories::keys()[i]] = categories.at(i);
  record["tracked_bytes"] = tracked;
  record["window_peak_bytes"] = window_peak;
  record["transient_bytes"] = window_peak - tracked;
  record["host_bytes"] = host.current_bytes;
  record["host_window_peak_bytes"] = host.window_peak_bytes;
  record["rss_bytes"] = rss;
  record["reserved_bytes"] = device.reserved_bytes;
  record["reserved_window_peak_bytes"] = device.reserved_peak_bytes;
  record["pinned_bytes"] = pinned.reserved_bytes + exact_pinned;
  record["exact_pinned_bytes"] = exact_pinned;
  out_.write_line(record.dump());

  RankMemorySummary& s = step_summary_;
  s.max.raise_to(categories);
  if (step_points_ == 0 || window_peak > s.peak_bytes) {
    s.peak_bytes = window_peak;
    s.at_peak = categories;
    s.transient_at_peak = window_peak - tracked;
    s.peak_phase = label;
  }
  s.host_peak_bytes = std::max(s.host_peak_bytes, host.window_peak_bytes);
  s.reserved_peak_bytes = std::max(s.reserved_peak_bytes, device.reserved_peak_bytes);
  s.pinned_peak_bytes = std::max(s.pinned_peak_bytes, pinned.reserved_peak_bytes + exact_pinned);
  s.alloc_retries = device.alloc_retries;
  s.ooms = device.ooms;
  ++step_points_;
  if (device_.is_cuda()) device_run_peak_ = std::max(device_run_peak_, window_peak);
  reset_windows();
}

void MemoryLedger::end_step() {
  RankMemorySummary& s = step_summary_;
  s.rss_peak_bytes = peak_resident_bytes();
  nlohmann::json record = {{"event", "step"},
                           {"step", step_},
                           {"points", step_points_},
                           {"peak_bytes", s.peak_bytes},
                           {"peak_phase", s.peak_phase},
                           {"at_peak", s.at_peak.to_json()},
                           {"transient_at_peak", s.transient_at_peak},
                           {"max", s.max.to_json()},
                           {"host_peak_bytes", s.host_peak_bytes},
                           {"rss_peak_bytes", s.rss_peak_bytes},
                           {"reserved_peak_bytes", s.reserved_peak_bytes},
                           {"pinned_peak_bytes", s.pinned_peak_bytes},
                           {"alloc_retries", s.alloc_retries},
                           {"ooms", s.ooms}};
  out_.write_line(record.dump());

  RankMemorySummary& run = run_summary_;
  if (steps_recorded_ == 0 || s.peak_bytes > run.peak_bytes) {
    run.peak_bytes = s.peak_bytes;
    run.at_peak = s.at_peak;
    run.transient_at_peak = s.transient_at_peak;
    run.peak_phase = s.peak_phase;
    run.peak_step = s.peak_step;
  }
  run.max.raise_to(s.max);
  run.host_peak_bytes = std::max(run.host_peak_bytes, s.host_peak_bytes);
  run.rss_peak_bytes = std::max(run.rss_peak_bytes, s.rss_peak_bytes);
  run.reserved_peak_bytes = std::max(run.reserved_peak_bytes, s.reserved_peak_bytes);
  run.pinned_peak_bytes = std::max(run.pinned_peak_bytes, s.pinned_peak_bytes);
  run.alloc_retries = s.alloc_retries;
  run.ooms = s.ooms;
  ++steps_recorded_;
}

int64_t MemoryLedger::step_line_peak_bytes() const {
  return device_.is_cuda() ? device_run_peak_ : peak_resident_bytes();
}

RankMemorySummary MemoryLedger::summary() const { return run_summary_; }

std::vector<RankMemorySummary> MemoryLedger::finish(Communicator& communicator, const std::string& title,
                                                    const std::string& description) {
  RankMemorySummary mine = run_summary_;
  mine.rss_peak_bytes = std::max(mine.rss_peak_bytes, peak_resident_bytes());
  out_.write_line(nlohmann::json{{"event", "end"}, {"steps", steps_recorded_}, {"startup_peak_bytes", startup_peak_bytes_},
                                 {"summary", mine.to_json()}}
                      .dump());

  // One row per rank (gather_rows: one all-reduce): every figure as an int64, the peak's phase as its
  // index in phase_labels_ (every rank meets the same labels in the same order).
  // The node travels as a hash of the host's name (ranks with the same name share its RAM).
  const int64_t host_key = static_cast<int64_t>(std::hash<std::string>{}(process_identity().host) >> 1);
  auto row_of = [&](const RankMemorySummary& s) {
    std::vector<int64_t> row = {s.peak_bytes, s.transient_at_peak, s.peak_step,
                                static_cast<int64_t>(phase_index(s.peak_phase)), s.host_peak_bytes,
                                s.rss_peak_bytes, s.reserved_peak_bytes, s.pinned_peak_bytes,
                                s.alloc_retries, s.ooms, host_key};
    for (int i = 0; i < MemoryCategories::kCount; ++i) row.push_back(s.max.at(i));
    for (int i = 0; i < MemoryCategories::kCount; ++i) row.push_back(s.at_peak.at(i));
    return row;
  };
  const at::Tensor table = gather_rows(communicator, row_of(mine));
  std::vector<RankMemorySummary> ranks;
  std::vector<int64_t> host_keys;  // in order of each node's lowest rank
  for (int r = 0; r < world_size_; ++r) {
    const int64_t* v = table[r].data_ptr<int64_t>();
    RankMemorySummary s;
    s.rank = r;
    s.peak_bytes = v[0];
    s.transient_at_peak = v[1];
    s.peak_step = v[2];
    s.peak_phase = v[3] >= 0 && v[3] < static_cast<int64_t>(phase_labels_.size()) ? phase_labels_[v[3]] : "?";
    s.host_peak_bytes = v[4];
    s.rss_peak_bytes = v[5];
    s.reserved_peak_bytes = v[6];
    s.pinned_peak_bytes = v[7];
    s.alloc_retries = v[8];
    s.ooms = v[9];
    const auto known = std::find(host_keys.begin(), host_keys.end(), v[10]);
    s.node = static_cast<int>(known - host_keys.begin());
    if (known == host_keys.end()) host_keys.push_back(v[10]);
    for (int i = 0; i < MemoryCategories::kCount; ++i) s.max.at(i) = v[11 + i];
    for (int i = 0; i < MemoryCategories::kCount; ++i) s.at_peak.at(i) = v[11 + MemoryCategories::kCount + i];
    ranks.push_back(s);
  }

  if (rank_ == 0) {
    const bool cuda = device_.is_cuda();
    const std::string path = (fs::path(run_dir_) / "memory_report.md").string();
    std::ostringstream report;
    report << "# " << title << "\n\n" << description << "\n\n"
           << "## Peak per rank, by category\n\n"
           << "Each category's largest value at any timeline point of the run; *peak (tracked tensors)* is the "
           << (cuda ? "CUDA caching allocator's" : "CPU allocator's")
           << " peak over the training steps, transients inside a phase included, so the categories do "
              "not add up to it (docs/memory.md).\n\n"
           << per_rank_markdown(ranks, cuda) << "\n## Across ranks\n\n"
           << "Imbalance is max / mean; above " << kImbalanceThreshold << " it is flagged.\n\n"
           << across_ranks_markdown(ranks, cuda);
    // Host memory per node: ranks on one node share its RAM (with --offload optimizer, its masters
    // and optimizer state).
    report << "\n## Host memory per node\n\n"
           << "Each figure summed over the node's ranks (their peaks, an upper bound of the node's).\n\n"
           << "| node | ranks | resident (RSS) | LibTorch host | pinned |\n|---:|---|---:|---:|---:|\n";
    for (const NodeMemorySummary& node : by_node(ranks)) {
      std::string listed;
      for (int r : node.ranks) listed += (listed.empty() ? "" : ", ") + std::to_string(r);
      report << "| " << node.node << " | " << listed << " | " << human_bytes(node.rss_peak_bytes) << " | "
             << human_bytes(node.host_peak_bytes) << " | " << human_bytes(node.pinned_peak_bytes) << " |\n";
    }
    try {  // checked (common/output_files.h): a full disk is an error naming the file, or one warning
      write_file_atomically(path, report.str());
    } catch (const WriteError& error) {
      run_file_write_failed(path, error.reason());
    }
    std::vector<int64_t> peaks;
    for (const RankMemorySummary& s : ranks) peaks.push_back(s.peak_bytes);
    const AcrossRanks stats = across_ranks(peaks);
    log::info("memory: peak per rank mean {}, min {}, max {} (max/mean {:.3f}{}); {}", human_bytes(static_cast<int64_t>(stats.mean)),
              human_bytes(static_cast<int64_t>(stats.min)), human_bytes(static_cast<int64_t>(stats.max)), stats.imbalance(),
              stats.imbalance() > kImbalanceThreshold ? ", imbalanced" : "", path);
    std::istringstream table(across_ranks_markdown(ranks, cuda));
    for (std::string line; std::getline(table, line);) log::info("memory: {}", line);
  }
  return ranks;
}

}  // namespace llm
