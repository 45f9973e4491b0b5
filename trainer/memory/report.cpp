#include "trainer/memory/report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "trainer/config.h"
#include "trainer/memory/categories.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/svg.h"

namespace llm {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// Every record of a JSONL file; a line that is not JSON is a UserError naming the file and line.
std::vector<json> read_jsonl(const fs::path& path) {
  std::ifstream in(path);
  LLM_REQUIRE(in.good(), path.string(), "", "cannot be read");
  std::vector<json> records;
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    try {
      records.push_back(json::parse(line));
    } catch (const json::parse_error&) {
      fail_user(path.string(), "line " + std::to_string(line_number), "is not a JSON object (a truncated file?)");
    }
  }
  return records;
}

struct RunRecord {
  std::string dir, label;
  json start;
  ModelConfig model;
  RunConfig run;
  int world = 1;
  std::string device;
  int64_t steps = 0;
  double tokens_per_second = 0;
  double final_loss = 0, final_eval_loss = 0;
  std::vector<RankMemorySummary> ranks;
  std::vector<RankTimeline> timeline;  // every rank's points of the step with rank 0's peak
  int64_t timeline_step = 0;
  bool has_estimate = false;
  std::string estimate_error;
  MemoryEstimate estimate;
};

std::string file_label(const std::string& label) {
  std::string out;
  for (char c : label) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  return out.empty() ? "run" : out;
}

RankMemorySummary summary_from_steps(int rank, const std::vector<json>& records) {
  RankMemorySummary summary;
  summary.rank = rank;
  bool first = true;
  for (const json& record : records) {
    if (record.value("event", "") != "step") continue;
    const int64_t peak = record.value("peak_bytes", int64_t{0});
    summary.max.raise_to(MemoryCategories::from_json(record.value("max", json::object())));
    if (first || peak > summary.peak_bytes) {
      summary.peak_bytes = peak;
      summary.peak_step = record.value("step", int64_t{0});
      summary.peak_phase = record.value("peak_phase", "");
      summary.at_peak = MemoryCategories::from_json(record.value("at_peak", json::object()));
      summary.transient_at_peak = record.value("transient_at_peak", int64_t{0});
      first = false;
    }
    summary.host_peak_bytes = std::max(summary.host_peak_bytes, record.value("host_peak_bytes", int64_t{0}));
    summary.rss_peak_bytes = std::max(summary.rss_peak_bytes, record.value("rss_peak_bytes", int64_t{0}));
    summary.reserved_peak_bytes = std::max(summary.reserved_peak_bytes, record.value("reserved_peak_bytes", int64_t{0}));
    summary.pinned_peak_bytes = std::max(summary.pinned_peak_bytes, record.value("pinned_peak_bytes", int64_t{0}));
    summary.alloc_retries = record.value("alloc_retries", int64_t{0});
    summary.ooms = record.value("ooms", int64_t{0});
  }
  return summary;
}

RunRecord read_run(const std::string& dir) {
  RunRecord record;
  record.dir = dir;
  std::error_code error;
  LLM_REQUIRE(fs::is_directory(dir, error), dir, "",
              fs::exists(dir, error) ? "is not a folder: pass run folders (the --run_dir of training runs)"
                                     : "no such folder: pass run folders (the --run_dir of training runs)");
  const fs::path metrics_path = fs::path(dir) / "metrics.jsonl";
  LLM_REQUIRE(fs::is_regular_file(metrics_path, error), dir, "metrics.jsonl",
              "missing: not a training run folder (the trainer writes metrics.jsonl into --run_dir)");
  std::vector<double> rates;
  bool have_start = false;
  for (const json& line : read_jsonl(metrics_path)) {
    const std::string event = line.value("event", "");
    if (event == "start") {
      record.start = line;
      have_start = true;
    } else if (event == "train") {
      rates.push_back(line.value("tokens_per_s", 0.0));
      record.final_loss = line.value("loss", 0.0);
      record.steps = std::max(record.steps, line.value("step", int64_t{0}));
    } else if (event == "end") {
      record.final_loss = line.value("final_loss", record.final_loss);
      record.final_eval_loss = line.value("final_eval_loss", 0.0);
      record.steps = std::max(record.steps, line.value("steps", int64_t{0}));
    }
  }
  LLM_REQUIRE(have_start, metrics_path.string(), "start", "no start record: the run did not get past its start-up");
  if (rates.size() > 1) rates.erase(rates.begin());  // the first step includes one-off work
  record.tokens_per_second = median(rates);
  record.world = record.start.value("world_size", 1);
  record.device = record.start.value("device", "cpu");
  const json run_json = record.start.value("run", json::object());
  record.run = run_config_from_json(run_json, metrics_path.string());
  LLM_REQUIRE(record.start.contains("model"), metrics_path.string(), "start.model", "missing: the model config of the run");
  record.model = parse_model_config(record.start.at("model"),
                                    record.run.config_path.empty() ? std::string("model") : record.run.config_path);

  fs::path label_path = fs::path(dir);
  if (label_path.filename().empty()) label_path = label_path.parent_path();
  record.label = label_path.filename().string();

  // Each rank's ledger; the timeline is taken from the step in which rank 0 peaked.
  std::vector<std::vector<json>> ledgers;
  for (int rank = 0; rank < record.world; ++rank) {
    const fs::path path = fs::path(dir) / ("memory.rank" + std::to_string(rank) + ".jsonl");
    LLM_REQUIRE(fs::is_regular_file(path, error), dir, path.filename().string(),
                "missing: the run has " + std::to_string(record.world) +
                    " rank(s) but no memory ledger for this one (a run made before the ledger existed, or cut short?)");
    ledgers.push_back(read_jsonl(path));
    RankMemorySummary summary;
    bool ended = false;
    for (const json& line : ledgers.back())
      if (line.value("event", "") == "end" && line.contains("summary")) {
        summary = RankMemorySummary::from_json(line.at("summary"));
        ended = true;
      }
    if (!ended) summary = summary_from_steps(rank, ledgers.back());
    summary.rank = rank;
    record.ranks.push_back(summary);
  }
  record.timeline_step = record.ranks.front().peak_step;
  for (int rank = 0; rank < record.world; ++rank) {
    RankTimeline timeline;
    timeline.rank = rank;
    for (const json& line : ledgers[rank]) {
      if (line.value("event", "") != "point" || line.value("step", int64_t{-1}) != record.timeline_step) continue;
      TimelineBar bar;
      const std::string unit = line.value("unit", "");
      bar.label = line.value("phase", "") + (unit.empty() ? "" : ":" + unit);
      if (line.value("micro", int64_t{0}) > 0) bar.label += " (micro " + std::to_string(line.value("micro", int64_t{0})) + ")";
      bar.categories = MemoryCategories::from_json(line);
      bar.window_peak_bytes = line.value("window_peak_bytes", int64_t{0});
      timeline.bars.push_back(bar);
    }
    record.timeline.push_back(timeline);
  }

  // The estimate for the run's own settings.
  try {
    EstimateOptions options;
    options.world_size = record.world;
    options.device = record.device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
    record.estimate = estimate_memory(record.model, record.run, options);
    record.has_estimate = true;
  } catch (const UserError& failure) {
    record.estimate_error = failure.what();
  }
  return record;
}

std::string format_ratio(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%+.2f %%", 100.0 * value);
  return text;
}

std::string format_number(double value, const char* format) {
  char text[48];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

int64_t largest_peak(const RunRecord& run) {
  int64_t peak = 0;
  for (const RankMemorySummary& rank : run.ranks) peak = std::max(peak, rank.peak_bytes);
  return peak;
}

int64_t largest_estimate(const RunRecord& run) {
  int64_t peak = 0;
  for (const RankEstimate& rank : run.estimate.ranks) peak = std::max(peak, rank.peak_bytes);
  return peak;
}

std::string run_settings(const RunRecord& run) {
  std::ostringstream out;
  out << run.model.name << ", " << run.run.optimizer.name << ", " << to_string(run.run.precision.dtype);
  if (run.run.precision.dtype == DType::bfloat16) out << " (" << to_string(run.run.precision.mode) << ")";
  out << ", " << to_string(run.run.sharding.strategy) << ", " << run.world << " rank(s) on " << run.device << ", micro-batch "
      << run.run.data.batch_size << " x " << run.run.data.max_length;
  if (run.run.data.gradient_accumulation > 1) out << " x " << run.run.data.gradient_accumulation << " accumulated";
  return out.str();
}

std::string side_by_side(const std::vector<RunRecord>& runs) {
  int64_t largest = 0;
  for (const RunRecord& run : runs) largest = std::max({largest, largest_peak(run), largest_estimate(run)});
  const ByteUnit unit = byte_unit_for(largest);
  std::ostringstream out;
  out << "| run | model | optimizer | dtype | sharding | ranks | device | steps | tokens/s | final loss | peak per rank, max ("
      << unit.name << ") | mean | max / mean | estimate (" << unit.name << ") | estimate error |\n"
      << "|---|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|\n";
  for (const RunRecord& run : runs) {
    std::vector<int64_t> peaks;
    for (const RankMemorySummary& rank : run.ranks) peaks.push_back(rank.peak_bytes);
    const AcrossRanks stats = across_ranks(peaks);
    out << "| " << run.label << " | " << run.model.name << " | " << run.run.optimizer.name
        << " | " << to_string(run.run.precision.dtype)
        << (run.run.precision.dtype == DType::bfloat16 ? std::string(" ") + to_string(run.run.precision.mode) : "") << " | "
        << to_string(run.run.sharding.strategy) << " | " << run.world << " | " << run.device << " | " << run.steps << " | "
        << format_number(run.tokens_per_second, "%.0f") << " | " << format_number(run.final_loss, "%.4f") << " | "
        << format_in(stats.max, unit) << " | " << format_in(stats.mean, unit) << " | "
        << format_number(stats.imbalance(), "%.3f") << (stats.imbalance() > kImbalanceThreshold ? " **imbalanced**" : "")
        << " | ";
    if (run.has_estimate)
      out << format_in(largest_estimate(run), unit) << " | "
          << format_ratio(static_cast<double>(largest_estimate(run)) / static_cast<double>(std::max<int64_t>(1, stats.max)) - 1.0)
          << " |\n";
    else
      out << "n/a | n/a |\n";
  }
  return out.str();
}

std::string categories_side_by_side(const std::vector<RunRecord>& runs) {
  int64_t largest = 0;
  for (const RunRecord& run : runs)
    for (const RankMemorySummary& rank : run.ranks)
      for (int i = 0; i < MemoryCategories::kCount; ++i) largest = std::max(largest, rank.max.at(i));
  const ByteUnit unit = byte_unit_for(largest);
  std::ostringstream out;
  out << "Each category's peak on the rank where it is largest, measured / estimated (" << unit.name << ").\n\n| run |";
  for (int i = 0; i < MemoryCategories::kCount; ++i) out << ' ' << MemoryCategories::titles()[i] << " |";
  out << "\n|---|";
  for (int i = 0; i < MemoryCategories::kCount; ++i) out << "---:|";
  out << '\n';
  for (const RunRecord& run : runs) {
    out << "| " << run.label << " |";
    for (int i = 0; i < MemoryCategories::kCount; ++i) {
      int64_t measured = 0, estimated = 0;
      for (const RankMemorySummary& rank : run.ranks) measured = std::max(measured, rank.max.at(i));
      for (const RankEstimate& rank : run.estimate.ranks) estimated = std::max(estimated, rank.max.at(i));
      out << ' ' << format_in(measured, unit) << " / " << (run.has_estimate ? format_in(estimated, unit) : "n/a") << " |";
    }
    out << '\n';
  }
  return out.str();
}

std::string estimate_beside_measured(const RunRecord& run) {
  if (!run.has_estimate) return "No estimate: " + run.estimate_error + "\n";
  int64_t largest = 0;
  for (size_t r = 0; r < run.ranks.size(); ++r)
    largest = std::max({largest, run.ranks[r].peak_bytes, run.estimate.ranks[r].peak_bytes});
  const ByteUnit unit = byte_unit_for(largest);
  std::ostringstream out;
  out << "| rank | measured peak (" << unit.name << ") | estimated (" << unit.name
      << ") | error | measured in | estimated in |\n|---:|---:|---:|---:|---|---|\n";
  for (size_t r = 0; r < run.ranks.size() && r < run.estimate.ranks.size(); ++r) {
    const RankMemorySummary& measured = run.ranks[r];
    const RankEstimate& estimated = run.estimate.ranks[r];
    out << "| " << r << " | " << format_in(measured.peak_bytes, unit) << " | " << format_in(estimated.peak_bytes, unit)
        << " | "
        << format_ratio(static_cast<double>(estimated.peak_bytes) / static_cast<double>(std::max<int64_t>(1, measured.peak_bytes)) - 1.0)
        << " | " << measured.peak_phase << " | " << estimated.peak_phase << " |\n";
  }
  return out.str();
}

void write_file(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  LLM_REQUIRE(out.good(), path.string(), "", "cannot be written; check --out");
  out << content;
}

}  // namespace

void write_memory_report(const std::vector<std::string>& run_dirs, const std::string& out_dir) {
  LLM_REQUIRE(!run_dirs.empty(), "command line", "RUN_DIR", "pass at least one run folder");
  std::vector<RunRecord> runs;
  std::map<std::string, int> seen;
  for (const std::string& dir : run_dirs) {
    runs.push_back(read_run(dir));
    RunRecord& run = runs.back();
    const int count = ++seen[run.label];
    if (count > 1) run.label += "-" + std::to_string(count);
  }
  const fs::path out(out_dir), plots = out / "memory";
  std::error_code error;
  fs::create_directories(plots, error);
  LLM_REQUIRE(!error, out_dir, "--out", "cannot create the folder (" + error.message() + ")");

  std::vector<RunPeaks> peaks;
  for (const RunRecord& run : runs) {
    RunPeaks entry;
    entry.label = run.label;
    for (const RankMemorySummary& rank : run.ranks) entry.peak_per_rank.push_back(rank.peak_bytes);
    entry.estimate_bytes = run.has_estimate ? largest_estimate(run) : 0;
    peaks.push_back(entry);
  }
  write_file(plots / "peak_per_rank.svg", peak_per_rank_svg("Peak memory per rank, per run", peaks));

  std::ostringstream md;
  md << "# Memory report\n\n"
     << runs.size() << " run(s). Measured: each rank's memory ledger (`memory.rank<R>.jsonl`); estimated: `trainer "
        "estimate` for the run's own settings (its `metrics.jsonl` start record). Peak: the tracked allocator's peak "
        "over the run's steps (CPU: LibTorch's CPU allocator; CUDA: the caching allocator's allocated bytes), "
        "transients inside a phase included. Tokens/s: the median over the steps after the first. "
        "`docs/memory.md` says how each category is counted.\n\n"
     << "## Runs side by side\n\n"
     << side_by_side(runs) << "\n![peak per rank, per run](memory/peak_per_rank.svg)\n\n"
     << "## Categories side by side\n\n"
     << categories_side_by_side(runs);
  for (const RunRecord& run : runs) {
    const std::string name = file_label(run.label);
    const bool cuda = run.device.rfind("cuda", 0) == 0;
    write_file(plots / (name + "_timeline.svg"),
               stacked_timeline_svg(run.label + ": memory over step " + std::to_string(run.timeline_step) +
                                        " by category, per rank",
                                    run.timeline));
    md << "\n## Run " << run.label << "\n\n`" << run.dir << "`: " << run_settings(run) << "; "
       << run.steps << " step(s), " << format_number(run.tokens_per_second, "%.0f") << " tokens/s, final loss "
       << format_number(run.final_loss, "%.4f") << ".\n\n### Peak per rank, by category\n\n"
       << per_rank_markdown(run.ranks, cuda) << "\n### Across ranks\n\n" << across_ranks_markdown(run.ranks, cuda)
       << "\n### Estimate beside measured\n\n" << estimate_beside_measured(run) << "\n![" << run.label
       << " timeline](memory/" << name << "_timeline.svg)\n";
  }
  write_file(out / "memory_report.md", md.str());
}

}  // namespace llm
