#include "trainer/memory/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
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

// A run's world_size beyond this is a damaged metrics file (and would be looked for ledger by ledger).
constexpr int64_t kMaxRunRanks = int64_t{1} << 20;

// A JSONL file's records, each with its line number, so that every complaint about a record can
// name the file and the line.
struct JsonlRecord {
  int line = 0;
  json value;
};

struct JsonlFile {
  std::string path;
  int lines = 0;
  std::vector<JsonlRecord> records;

  [[noreturn]] void fail(const JsonlRecord& record, const std::string& message) const {
    fail_user(path, "line " + std::to_string(record.line), message);
  }
};

std::string json_type_name(const json& value) {
  return value.is_number() ? "a number" : value.is_array() ? "an array" : value.is_string() ? "a string"
         : value.is_boolean() ? "a boolean" : value.is_null() ? "null" : "an object";
}

// Every record of a JSONL file; a line that is not a JSON object is a UserError naming the file and line.
JsonlFile read_jsonl(const fs::path& path) {
  std::ifstream in(path);
  LLM_REQUIRE(in.good(), path.string(), "", "cannot be read");
  JsonlFile file;
  file.path = path.string();
  for (std::string line; std::getline(in, line);) {
    ++file.lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    JsonlRecord record;
    record.line = file.lines;
    try {
      record.value = json::parse(line);
    } catch (const json::parse_error&) {
      file.fail(record, "is not a JSON object (a truncated file, or not one the trainer wrote?)");
    }
    if (!record.value.is_object())
      file.fail(record, "expected a JSON object (got " + json_type_name(record.value) +
                            "): not a file the trainer wrote");
    file.records.push_back(std::move(record));
  }
  return file;
}

// Runs read(record), turning a field of the wrong type (nlohmann's type_error) into a UserError
// naming the file and line.
template <typename Read>
void read_record(const JsonlFile& file, const JsonlRecord& record, Read&& read) {
  try {
    read(record.value);
  } catch (const json::exception& error) {
    std::string detail = error.what();
    if (const size_t tag_end = detail.find("] "); tag_end != std::string::npos) detail = detail.substr(tag_end + 2);
    file.fail(record, "a field has the wrong type (" + detail + "): the file is damaged or was not written by "
                      "this trainer");
  }
}

// A number that the trainer writes as null when it is not finite (a diverged loss): NaN then.
double number_or_nan(const json& record, const char* key, double fallback) {
  const auto found = record.find(key);
  if (found == record.end()) return fallback;
  return found->is_null() ? std::nan("") : found->get<double>();
}

// Byte counts of a ledger record (its own categories, those of "max" / "at_peak", and of its
// "summary") are never negative; a negative one is a damaged file, not a figure to plot.
void check_byte_counts(const JsonlFile& file, const JsonlRecord& record, const json& object, const std::string& prefix) {
  auto check = [&](const std::string& key, const json& value) {
    if (value.is_number() && value.get<double>() < 0)
      file.fail(record, prefix + key + ": expected a byte count >= 0 (got " + value.dump() +
                            "): the file is damaged or was not written by this trainer");
  };
  for (const char* key : MemoryCategories::keys())
    if (object.contains(key)) check(key, object.at(key));
  if (object.contains("peak_bytes")) check("peak_bytes", object.at("peak_bytes"));
  for (const char* nested : {"max", "at_peak", "summary"})
    if (object.contains(nested) && object.at(nested).is_object())
      check_byte_counts(file, record, object.at(nested), prefix + nested + ".");
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

// Folds one step record into a summary of the steps (for a run cut short before its end record).
void add_step(RankMemorySummary& summary, const json& step, bool first) {
  const int64_t peak = step.value("peak_bytes", int64_t{0});
  summary.max.raise_to(MemoryCategories::from_json(step.value("max", json::object())));
  if (first || peak > summary.peak_bytes) {
    summary.peak_bytes = peak;
    summary.peak_step = step.value("step", int64_t{0});
    summary.peak_phase = step.value("peak_phase", "");
    summary.at_peak = MemoryCategories::from_json(step.value("at_peak", json::object()));
    summary.transient_at_peak = step.value("transient_at_peak", int64_t{0});
  }
  summary.host_peak_bytes = std::max(summary.host_peak_bytes, step.value("host_peak_bytes", int64_t{0}));
  summary.rss_peak_bytes = std::max(summary.rss_peak_bytes, step.value("rss_peak_bytes", int64_t{0}));
  summary.reserved_peak_bytes = std::max(summary.reserved_peak_bytes, step.value("reserved_peak_bytes", int64_t{0}));
  summary.pinned_peak_bytes = std::max(summary.pinned_peak_bytes, step.value("pinned_peak_bytes", int64_t{0}));
  summary.alloc_retries = step.value("alloc_retries", int64_t{0});
  summary.ooms = step.value("ooms", int64_t{0});
}

// One rank's summary from its ledger: the end record's, else one folded from the step records. A
// ledger that is empty, has no step, or holds a figure no run can have is a UserError naming the
// file (and the line).
RankMemorySummary read_rank_summary(int rank, const JsonlFile& ledger) {
  const std::string cut_short = "leave this run out of the report, or run it again";
  LLM_REQUIRE(!ledger.records.empty(), ledger.path, "",
              "is empty: the run wrote no memory record for rank " + std::to_string(rank) +
                  " (it stopped at start-up?); " + cut_short);
  RankMemorySummary ended, from_steps;
  const JsonlRecord* end = nullptr;
  const JsonlRecord* peak_record = nullptr;
  for (const JsonlRecord& line : ledger.records)
    read_record(ledger, line, [&](const json& fields) {
      check_byte_counts(ledger, line, fields, "");
      const std::string event = fields.value("event", "");
      if (event == "end" && fields.contains("summary")) {
        ended = RankMemorySummary::from_json(fields.at("summary"));
        end = &line;
      } else if (event == "step") {
        const int64_t peak_before = from_steps.peak_bytes;
        add_step(from_steps, fields, peak_record == nullptr);
        if (peak_record == nullptr || from_steps.peak_bytes > peak_before) peak_record = &line;
      }
    });
  LLM_REQUIRE(end != nullptr || peak_record != nullptr, ledger.path, "",
              "has no step record in its " + std::to_string(ledger.lines) +
                  " line(s): the run stopped before its first step ended, so there is no peak to report; " +
                  cut_short);
  RankMemorySummary summary = end != nullptr ? ended : from_steps;
  if (summary.peak_bytes <= 0)
    ledger.fail(end != nullptr ? *end : *peak_record,
                "peak_bytes: expected a positive byte count (got " + std::to_string(summary.peak_bytes) +
                    "): every step allocates; the file is damaged or was not written by this trainer");
  summary.rank = rank;
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
  const JsonlFile metrics = read_jsonl(metrics_path);
  const JsonlRecord* start = nullptr;
  for (const JsonlRecord& line : metrics.records)
    read_record(metrics, line, [&](const json& fields) {
      const std::string event = fields.value("event", "");
      if (event == "start") {
        start = &line;
      } else if (event == "train") {
        rates.push_back(fields.value("tokens_per_s", 0.0));
        record.final_loss = number_or_nan(fields, "loss", 0.0);
        record.steps = std::max(record.steps, fields.value("step", int64_t{0}));
      } else if (event == "end") {
        record.final_loss = number_or_nan(fields, "final_loss", record.final_loss);
        record.final_eval_loss = number_or_nan(fields, "final_eval_loss", 0.0);
        record.steps = std::max(record.steps, fields.value("steps", int64_t{0}));
      }
    });
  LLM_REQUIRE(start != nullptr, metrics_path.string(), "start",
              metrics.records.empty() ? "the file is empty: the run did not get past its start-up"
                                      : "no start record: the run did not get past its start-up");
  if (rates.size() > 1) rates.erase(rates.begin());  // the first step includes one-off work
  record.tokens_per_second = median(rates);
  record.start = start->value;
  read_record(metrics, *start, [&](const json& fields) {
    const int64_t world = fields.value("world_size", int64_t{1});
    if (world < 1 || world > kMaxRunRanks)
      metrics.fail(*start, "world_size: expected the run's number of ranks, an integer from 1 to " +
                               std::to_string(kMaxRunRanks) + " (got " +
                               std::to_string(world) + "): the file is damaged or was not written by this trainer");
    record.world = static_cast<int>(world);
    record.device = fields.value("device", "cpu");
  });
  const std::string start_line = metrics_path.string() + ": line " + std::to_string(start->line);
  record.run = run_config_from_json(record.start.value("run", json::object()), start_line);
  LLM_REQUIRE(record.start.contains("model"), start_line, "model", "missing: the model config of the run");
  try {
    // The model's name is its config file's stem, so the config's path is the source here.
    record.model = parse_model_config(record.start.at("model"),
                                      record.run.config_path.empty() ? std::string("model") : record.run.config_path);
  } catch (const UserError& error) {
    fail_user(start_line, "model", std::string("the run's model config is not valid: ") + error.what());
  }

  fs::path label_path = fs::path(dir);
  if (label_path.filename().empty()) label_path = label_path.parent_path();
  record.label = label_path.filename().string();

  // Each rank's ledger; the timeline is taken from the step in which rank 0 peaked.
  std::vector<JsonlFile> ledgers;
  for (int rank = 0; rank < record.world; ++rank) {
    const fs::path path = fs::path(dir) / ("memory.rank" + std::to_string(rank) + ".jsonl");
    LLM_REQUIRE(fs::is_regular_file(path, error), dir, path.filename().string(),
                "missing: the run has " + std::to_string(record.world) +
                    " rank(s) but no memory ledger for this one (a run made before the ledger existed, or cut short?)");
    ledgers.push_back(read_jsonl(path));
    record.ranks.push_back(read_rank_summary(rank, ledgers.back()));
  }
  record.timeline_step = record.ranks.front().peak_step;
  for (int rank = 0; rank < record.world; ++rank) {
    RankTimeline timeline;
    timeline.rank = rank;
    for (const JsonlRecord& line : ledgers[rank].records)
      read_record(ledgers[rank], line, [&](const json& fields) {
        if (fields.value("event", "") != "point" || fields.value("step", int64_t{-1}) != record.timeline_step) return;
        TimelineBar bar;
        const std::string unit = fields.value("unit", "");
        bar.label = fields.value("phase", "") + (unit.empty() ? "" : ":" + unit);
        if (fields.value("micro", int64_t{0}) > 0) bar.label += " (micro " + std::to_string(fields.value("micro", int64_t{0})) + ")";
        bar.categories = MemoryCategories::from_json(fields);
        bar.window_peak_bytes = fields.value("window_peak_bytes", int64_t{0});
        timeline.bars.push_back(bar);
      });
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
