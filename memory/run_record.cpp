#include "memory/run_record.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/input_paths.h"
#include "common/output_files.h"
#include "config/config.h"
#include "memory/categories.h"
#include "memory/estimate.h"
#include "memory/svg.h"
#include "common/json_file.h"

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
      record.value = parse_json_text(line, path.string() + " line " + std::to_string(file.lines));
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
      file.fail(record, prefix + key + ": expected a byte count >= 0 (got " + json_excerpt(value) +
                            "): the file is damaged or was not written by this trainer");
  };
  for (const char* key : MemoryCategories::keys())
    if (object.contains(key)) check(key, object.at(key));
  if (object.contains("peak_bytes")) check("peak_bytes", object.at("peak_bytes"));
  for (const char* nested : {"max", "at_peak", "summary"})
    if (object.contains(nested) && object.at(nested).is_object())
      check_byte_counts(file, record, object.at(nested), prefix + nested + ".");
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
        // A resumed run's ledger holds a segment per start: the segment with the largest peak.
        RankMemorySummary segment = RankMemorySummary::from_json(fields.at("summary"));
        if (end == nullptr || segment.peak_bytes > ended.peak_bytes) {
          ended = std::move(segment);
          end = &line;
        }
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

}  // namespace

std::string file_label(const std::string& label) {
  std::string out;
  for (char c : label) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  return out.empty() ? "run" : out;
}

namespace {

// metrics.jsonl: the steps' losses and speed, how the run ended, and its start record (the world,
// the device, the run's settings and its model).
void read_metrics(const std::string& dir, RunRecord& record) {
  const fs::path metrics_path = fs::path(dir) / "metrics.jsonl";
  const std::string not_regular = regular_file_problem(metrics_path);
  LLM_REQUIRE(not_regular != "is missing", dir, "metrics.jsonl",
              "missing: not a training run folder (the trainer writes metrics.jsonl into --run_dir)");
  require_regular_file(metrics_path, dir, "metrics.jsonl", "a run's metrics file");
  std::vector<double> rates, group_bytes, group_seconds, across_bytes, across_seconds, node_bytes, node_seconds;
  const JsonlFile metrics = read_jsonl(metrics_path);
  const JsonlRecord* start = nullptr;
  for (const JsonlRecord& line : metrics.records)
    read_record(metrics, line, [&](const json& fields) {
      const std::string event = fields.value("event", "");
      if (event == "start") {
        start = &line;
        record.ended = "";  // a resumed run: what the last start's segment ended with
      } else if (event == "end" || event == "preempted") {
        record.ended = event;
      }
      if (event == "train") {
        rates.push_back(fields.value("tokens_per_s", 0.0));
        record.final_loss = number_or_nan(fields, "loss", 0.0);
        record.steps = std::max(record.steps, fields.value("step", int64_t{0}));
        const json links = fields.value("links", json());
        if (links.is_object() && links.value("group", json()).is_object() && links.value("across", json()).is_object()) {
          group_bytes.push_back(links["group"].value("bytes", 0.0));
          group_seconds.push_back(links["group"].value("s", 0.0));
          across_bytes.push_back(links["across"].value("bytes", 0.0));
          across_seconds.push_back(links["across"].value("s", 0.0));
          const json node = links.value("node", json::object());
          node_bytes.push_back(node.is_object() ? node.value("bytes", 0.0) : 0.0);
          node_seconds.push_back(node.is_object() ? node.value("s", 0.0) : 0.0);
        }
        if (fields.value("straggler", json()).is_object()) ++record.straggler_steps;
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
  if (!group_bytes.empty()) {
    // As the rate: the first step also gathers what later steps find in place (the optimizer's lazy
    // state, the first prefetch), so it is left out when there are others.
    const auto after_first = [](std::vector<double> values) {
      if (values.size() > 1) values.erase(values.begin());
      return median(values);
    };
    record.has_links = true;
    record.group = {after_first(group_bytes), after_first(group_seconds)};
    record.across = {after_first(across_bytes), after_first(across_seconds)};
    record.node = {after_first(node_bytes), after_first(node_seconds)};
  }
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
  record.planned_steps = record.run.num_training_steps;
  LLM_REQUIRE(record.start.contains("model"), start_line, "model", "missing: the model config of the run");
  try {
    // The model's name is its config file's stem, so the config's path is the source here.
    record.model = parse_model_config(record.start.at("model"),
                                      record.run.config_path.empty() ? std::string("model") : record.run.config_path);
  } catch (const UserError& error) {
    fail_user(start_line, "model", std::string("the run's model config is not valid: ") + error.what());
  }
}

// Every rank's memory ledger, and its summary.
std::vector<JsonlFile> read_ledgers(const std::string& dir, RunRecord& record) {
  std::vector<JsonlFile> ledgers;
  for (int rank = 0; rank < record.world; ++rank) {
    const fs::path path = fs::path(dir) / ("memory.rank" + std::to_string(rank) + ".jsonl");
    const std::string not_regular = regular_file_problem(path);
    LLM_REQUIRE(not_regular != "is missing", dir, path.filename().string(),
                "missing: the run has " + std::to_string(record.world) +
                    " rank(s) but no memory ledger for this one (a run made before the ledger existed, or cut short?)");
    require_regular_file(path, dir, path.filename().string(), "a rank's memory ledger");
    ledgers.push_back(read_jsonl(path));
    record.ranks.push_back(read_rank_summary(rank, ledgers.back()));
  }
  return ledgers;
}

// One rank's bars at record.timeline_step, and its train and eval peaks over the run.
RankTimeline read_timeline(int rank, const std::vector<JsonlFile>& ledgers, RunRecord& record) {
  RankTimeline timeline;
  timeline.rank = rank;
  // A resumed run repeats the steps after its checkpoint in a later segment (a later start record):
  // the timeline is the last segment's that has the step.
  std::vector<std::vector<TimelineBar>> segments(1);
  for (const JsonlRecord& line : ledgers[rank].records)
    read_record(ledgers[rank], line, [&](const json& fields) {
      if (fields.value("event", "") == "start" && !segments.back().empty()) segments.emplace_back();
      if (fields.value("event", "") != "point") return;
      const std::string phase = fields.value("phase", "");
      const int64_t window_peak = fields.value("window_peak_bytes", int64_t{0});
      if (phase == "eval")
        record.eval_peak_per_rank[rank] = std::max(record.eval_peak_per_rank[rank], window_peak);
      else if (phase != "checkpoint")
        record.train_peak_per_rank[rank] = std::max(record.train_peak_per_rank[rank], window_peak);
      if (fields.value("step", int64_t{-1}) != record.timeline_step) return;
      TimelineBar bar;
      const std::string unit = fields.value("unit", "");
      bar.label = fields.value("phase", "") + (unit.empty() ? "" : ":" + unit);
      if (fields.value("micro", int64_t{0}) > 0) bar.label += " (micro " + std::to_string(fields.value("micro", int64_t{0})) + ")";
      bar.categories = MemoryCategories::from_json(fields);
      bar.window_peak_bytes = fields.value("window_peak_bytes", int64_t{0});
      segments.back().push_back(bar);
    });
  for (auto segment = segments.rbegin(); segment != segments.rend() && timeline.bars.empty(); ++segment)
    timeline.bars = *segment;
  return timeline;
}

// The estimate for the run's own settings (a run the estimate refuses keeps the reason).
void estimate_run(RunRecord& record) {
  try {
    EstimateOptions options;
    options.world_size = record.world;
    options.device = record.device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
    record.estimate = estimate_memory(record.model, record.run, options);
    record.has_estimate = true;
  } catch (const UserError& failure) {
    record.estimate_error = failure.what();
  }
}

}  // namespace

RunRecord read_run(const std::string& dir) {
  RunRecord record;
  record.dir = dir;
  std::error_code error;
  LLM_REQUIRE(fs::is_directory(dir, error), dir, "",
              fs::exists(dir, error) ? "is not a folder: pass run folders (the --run_dir of training runs)"
                                     : "no such folder: pass run folders (the --run_dir of training runs)");
  read_metrics(dir, record);

  fs::path label_path = fs::path(dir);
  if (label_path.filename().empty()) label_path = label_path.parent_path();
  record.label = label_path.filename().string();

  // Each rank's ledger; the timeline is taken from the step in which rank 0 peaked.
  const std::vector<JsonlFile> ledgers = read_ledgers(dir, record);
  record.timeline_step = record.ranks.front().peak_step;
  record.train_peak_per_rank.assign(record.world, 0);
  record.eval_peak_per_rank.assign(record.world, 0);
  for (int rank = 0; rank < record.world; ++rank) record.timeline.push_back(read_timeline(rank, ledgers, record));
  estimate_run(record);
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

std::string unfinished_note(const RunRecord& run) {
  const std::string of = "step " + std::to_string(run.steps) + " of " + std::to_string(run.planned_steps);
  if (run.ended == "end") return "";
  if (run.ended == "preempted") return "preempted at " + of;
  return "unfinished (last " + of + "; no end record in metrics.jsonl: still running, or killed)";
}

std::string final_loss_text(const RunRecord& run) {
  const std::string loss = format_number(run.final_loss, "%.4f");
  if (run.ended == "end") return loss;
  return loss + " (" + (run.ended == "preempted" ? "preempted" : "unfinished") + ", last step " +
         std::to_string(run.steps) + " of " + std::to_string(run.planned_steps) + ")";
}

void write_file(const std::string& path, const std::string& content) {
  try {
    write_file_atomically(path, content);
  } catch (const WriteError& error) {
    throw UserError(std::string(error.what()) + "; check --out");
  }
}

}  // namespace llm
