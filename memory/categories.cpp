#include "memory/categories.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

namespace llm {

const std::array<const char*, MemoryCategories::kCount>& MemoryCategories::keys() {
  static const std::array<const char*, kCount> names = {
      "parameters", "gradients", "optimizer_device", "optimizer_host", "activations", "other"};
  return names;
}

const std::array<const char*, MemoryCategories::kCount>& MemoryCategories::titles() {
  static const std::array<const char*, kCount> names = {
      "parameters", "gradients", "optimizer (device)", "offloaded (host)", "activations", "other"};
  return names;
}

int64_t& MemoryCategories::at(int index) {
  switch (index) {
    case 0: return parameters;
    case 1: return gradients;
    case 2: return optimizer_device;
    case 3: return optimizer_host;
    case 4: return activations;
    default: return other;
  }
}

int64_t MemoryCategories::at(int index) const { return const_cast<MemoryCategories*>(this)->at(index); }

int64_t MemoryCategories::total() const {
  int64_t sum = 0;
  for (int i = 0; i < kCount; ++i) sum += at(i);
  return sum;
}

void MemoryCategories::raise_to(const MemoryCategories& other) {
  for (int i = 0; i < kCount; ++i) at(i) = std::max(at(i), other.at(i));
}

nlohmann::json MemoryCategories::to_json() const {
  nlohmann::json object = nlohmann::json::object();
  for (int i = 0; i < kCount; ++i) object[keys()[i]] = at(i);
  return object;
}

MemoryCategories MemoryCategories::from_json(const nlohmann::json& object) {
  MemoryCategories categories;
  for (int i = 0; i < kCount; ++i) categories.at(i) = object.value(keys()[i], int64_t{0});
  return categories;
}

nlohmann::json RankMemorySummary::to_json() const {
  return {{"rank", rank},
          {"peak_bytes", peak_bytes},
          {"max", max.to_json()},
          {"at_peak", at_peak.to_json()},
          {"transient_at_peak", transient_at_peak},
          {"peak_phase", peak_phase},
          {"peak_step", peak_step},
          {"host_peak_bytes", host_peak_bytes},
          {"rss_peak_bytes", rss_peak_bytes},
          {"reserved_peak_bytes", reserved_peak_bytes},
          {"pinned_peak_bytes", pinned_peak_bytes},
          {"alloc_retries", alloc_retries},
          {"ooms", ooms},
          {"node", node}};
}

RankMemorySummary RankMemorySummary::from_json(const nlohmann::json& object) {
  RankMemorySummary summary;
  summary.rank = object.value("rank", 0);
  summary.peak_bytes = object.value("peak_bytes", int64_t{0});
  if (object.contains("max")) summary.max = MemoryCategories::from_json(object.at("max"));
  if (object.contains("at_peak")) summary.at_peak = MemoryCategories::from_json(object.at("at_peak"));
  summary.transient_at_peak = object.value("transient_at_peak", int64_t{0});
  summary.peak_phase = object.value("peak_phase", std::string());
  summary.peak_step = object.value("peak_step", int64_t{0});
  summary.host_peak_bytes = object.value("host_peak_bytes", int64_t{0});
  summary.rss_peak_bytes = object.value("rss_peak_bytes", int64_t{0});
  summary.reserved_peak_bytes = object.value("reserved_peak_bytes", int64_t{0});
  summary.pinned_peak_bytes = object.value("pinned_peak_bytes", int64_t{0});
  summary.alloc_retries = object.value("alloc_retries", int64_t{0});
  summary.ooms = object.value("ooms", int64_t{0});
  summary.node = object.value("node", 0);
  return summary;
}

nlohmann::json NodeMemorySummary::to_json() const {
  return {{"node", node}, {"ranks", ranks}, {"host_peak_bytes", host_peak_bytes},
          {"rss_peak_bytes", rss_peak_bytes}, {"pinned_peak_bytes", pinned_peak_bytes}};
}

std::vector<NodeMemorySummary> by_node(const std::vector<RankMemorySummary>& ranks) {
  std::vector<NodeMemorySummary> nodes;
  for (const RankMemorySummary& rank : ranks) {
    if (rank.node < 0) continue;
    if (static_cast<size_t>(rank.node) >= nodes.size()) nodes.resize(static_cast<size_t>(rank.node) + 1);
    NodeMemorySummary& node = nodes[static_cast<size_t>(rank.node)];
    node.node = rank.node;
    node.ranks.push_back(rank.rank);
    node.host_peak_bytes += rank.host_peak_bytes;
    node.rss_peak_bytes += rank.rss_peak_bytes;
    node.pinned_peak_bytes += rank.pinned_peak_bytes;
  }
  return nodes;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

AcrossRanks across_ranks(const std::vector<int64_t>& values) {
  AcrossRanks result;
  if (values.empty()) return result;
  std::vector<double> as_double(values.begin(), values.end());
  double sum = 0;
  for (double value : as_double) sum += value;
  result.mean = sum / static_cast<double>(as_double.size());
  result.min = *std::min_element(as_double.begin(), as_double.end());
  result.max = *std::max_element(as_double.begin(), as_double.end());
  result.median = median(std::move(as_double));
  return result;
}

ByteUnit byte_unit_for(int64_t largest) {
  static const ByteUnit units[] = {
      {"B", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  int index = 0;
  while (index < 4 && static_cast<double>(largest) >= units[index + 1].divisor) ++index;
  return units[index];
}

std::string format_in(double bytes, const ByteUnit& unit) {
  char text[48];
  if (unit.divisor == 1.0)
    std::snprintf(text, sizeof(text), "%.0f", bytes);
  else
    std::snprintf(text, sizeof(text), "%.2f", bytes / unit.divisor);
  return text;
}

std::string format_in(int64_t bytes, const ByteUnit& unit) { return format_in(static_cast<double>(bytes), unit); }

std::string human_bytes(int64_t bytes) {
  const ByteUnit unit = byte_unit_for(bytes < 0 ? -bytes : bytes);
  return format_in(bytes, unit) + " " + unit.name;
}

namespace {

struct Figure {
  std::string title;
  int64_t (*read)(const RankMemorySummary&);
  bool cuda_only;
};

const std::vector<Figure>& figures() {
  static const std::vector<Figure> list = {
      {"peak (tracked tensors)", [](const RankMemorySummary& r) { return r.peak_bytes; }, false},
      {"parameters", [](const RankMemorySummary& r) { return r.max.parameters; }, false},
      {"gradients", [](const RankMemorySummary& r) { return r.max.gradients; }, false},
      {"optimizer (device)", [](const RankMemorySummary& r) { return r.max.optimizer_device; }, false},
      {"offloaded (host)", [](const RankMemorySummary& r) { return r.max.optimizer_host; }, false},
      {"activations", [](const RankMemorySummary& r) { return r.max.activations; }, false},
      {"other", [](const RankMemorySummary& r) { return r.max.other; }, false},
      {"peak (host allocator)", [](const RankMemorySummary& r) { return r.host_peak_bytes; }, false},
      {"peak (RSS)", [](const RankMemorySummary& r) { return r.rss_peak_bytes; }, false},
      {"peak (CUDA reserved)", [](const RankMemorySummary& r) { return r.reserved_peak_bytes; }, true},
      {"peak (pinned host)", [](const RankMemorySummary& r) { return r.pinned_peak_bytes; }, true},
  };
  return list;
}

int64_t largest_of(const std::vector<RankMemorySummary>& ranks, const Figure& figure) {
  int64_t largest = 0;
  for (const RankMemorySummary& rank : ranks) largest = std::max(largest, figure.read(rank));
  return largest;
}

}  // namespace

// Each column (per rank) or row (across ranks) in its own unit: the RSS of a LibTorch process is
// hundreds of MiB while a small model's categories are KiB.
std::string per_rank_markdown(const std::vector<RankMemorySummary>& ranks, bool cuda) {
  std::vector<const Figure*> shown;
  std::vector<ByteUnit> units;
  for (const Figure& figure : figures())
    if (cuda || !figure.cuda_only) {
      shown.push_back(&figure);
      units.push_back(byte_unit_for(largest_of(ranks, figure)));
    }
  std::ostringstream out;
  out << "| rank |";
  for (size_t i = 0; i < shown.size(); ++i) out << ' ' << shown[i]->title << " (" << units[i].name << ") |";
  out << " peak at |";
  if (cuda) out << " alloc retries | OOMs |";
  out << "\n|---:|";
  for (size_t i = 0; i < shown.size(); ++i) out << "---:|";
  out << "---|";
  if (cuda) out << "---:|---:|";
  out << '\n';
  for (const RankMemorySummary& rank : ranks) {
    out << "| " << rank.rank << " |";
    for (size_t i = 0; i < shown.size(); ++i) out << ' ' << format_in(shown[i]->read(rank), units[i]) << " |";
    out << " step " << rank.peak_step << ", " << rank.peak_phase << " |";
    if (cuda) out << ' ' << rank.alloc_retries << " | " << rank.ooms << " |";
    out << '\n';
  }
  return out.str();
}

std::string across_ranks_markdown(const std::vector<RankMemorySummary>& ranks, bool cuda) {
  std::ostringstream out;
  out << "| figure | unit | mean | min | median | max | max / mean |\n"
      << "|---|---|---:|---:|---:|---:|---|\n";
  for (const Figure& figure : figures()) {
    if (figure.cuda_only && !cuda) continue;
    std::vector<int64_t> values;
    for (const RankMemorySummary& rank : ranks) values.push_back(figure.read(rank));
    const AcrossRanks stats = across_ranks(values);
    const ByteUnit unit = byte_unit_for(static_cast<int64_t>(stats.max));
    char ratio[64];
    std::snprintf(ratio, sizeof(ratio), "%.3f", stats.imbalance());
    out << "| " << figure.title << " | " << unit.name << " | " << format_in(stats.mean, unit) << " | "
        << format_in(stats.min, unit) << " | " << format_in(stats.median, unit) << " | " << format_in(stats.max, unit)
        << " | " << ratio << (stats.imbalance() > kImbalanceThreshold ? " **imbalanced**" : "") << " |\n";
  }
  return out.str();
}

}  // namespace llm
