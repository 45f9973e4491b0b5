// trainer report on recorded run folders (tests/fixtures/memory_runs, made by make_fixtures.sh
// beside them): the Markdown names every run and rank with its figures, and every SVG parses as XML
// (expat) with the panels, bars and markers the data calls for. Bad run folders are exit 2.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <expat.h>

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace llm::memory_report_test {
namespace {

using testing::run_command;
using testing::ScratchDir;

// A parsed XML element: its name, attributes and children.
struct Element {
  std::string name;
  std::map<std::string, std::string> attributes;
  std::vector<std::unique_ptr<Element>> children;

  bool has_class(const std::string& css_class) const {
    auto found = attributes.find("class");
    if (found == attributes.end()) return false;
    std::istringstream words(found->second);
    for (std::string word; words >> word;)
      if (word == css_class) return true;
    return false;
  }
  // Descendants (self included) with this element name and class ("" = any class).
  void find(const std::string& element, const std::string& css_class, std::vector<const Element*>& out) const {
    if (name == element && (css_class.empty() || has_class(css_class))) out.push_back(this);
    for (const auto& child : children) child->find(element, css_class, out);
  }
  std::vector<const Element*> all(const std::string& element, const std::string& css_class = "") const {
    std::vector<const Element*> out;
    find(element, css_class, out);
    return out;
  }
};

struct ParseState {
  std::unique_ptr<Element> root;
  std::vector<Element*> open;
};

// Parses a whole document with expat; fails the test (and returns nullptr) if it is not well formed.
std::unique_ptr<Element> parse_xml(const std::filesystem::path& path) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ParseState state;
  XML_Parser parser = XML_ParserCreate("UTF-8");
  XML_SetUserData(parser, &state);
  XML_SetElementHandler(
      parser,
      [](void* data, const XML_Char* name, const XML_Char** attributes) {
        auto* state = static_cast<ParseState*>(data);
        auto element = std::make_unique<Element>();
        element->name = name;
        for (int i = 0; attributes[i] != nullptr; i += 2) element->attributes[attributes[i]] = attributes[i + 1];
        Element* raw = element.get();
        if (state->open.empty())
          state->root = std::move(element);
        else
          state->open.back()->children.push_back(std::move(element));
        state->open.push_back(raw);
      },
      [](void* data, const XML_Char*) { static_cast<ParseState*>(data)->open.pop_back(); });
  const bool ok = XML_Parse(parser, text.data(), static_cast<int>(text.size()), /*isFinal=*/1) == XML_STATUS_OK;
  if (!ok)
    ADD_FAILURE() << path << " is not well-formed XML: " << XML_ErrorString(XML_GetErrorCode(parser)) << " at line "
                  << XML_GetCurrentLineNumber(parser);
  XML_ParserFree(parser);
  return ok ? std::move(state.root) : nullptr;
}

std::filesystem::path fixtures() { return testing::source_dir() / "tests/fixtures/memory_runs"; }

std::vector<nlohmann::json> ledger(const std::string& run, int rank) {
  std::ifstream in(fixtures() / run / ("memory.rank" + std::to_string(rank) + ".jsonl"));
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

const std::vector<std::pair<std::string, int>> kRuns = {
    {"adamw_fp32_w1", 1}, {"adamw_sn_fp32_w2", 2}, {"galore_bf16_w2", 2}};

class MemoryReport : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string command = testing::trainer_binary().string() + " report";
    for (const auto& [run, ranks] : kRuns) command += " " + (fixtures() / run).string();
    result_ = run_command(command + " --out " + out_.path().string());
    ASSERT_EQ(result_.exit_code, 0) << result_.output;
    std::ifstream in(out_ / "memory_report.md");
    markdown_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ScratchDir out_{"memory_report"};
  testing::CommandResult result_;
  std::string markdown_;
};

TEST_F(MemoryReport, MarkdownComparesTheRunsAndListsEveryRank) {
  for (const char* heading : {"# Memory report", "## Runs side by side", "## Categories side by side",
                              "### Peak per rank, by category", "### Across ranks", "### Estimate beside measured"})
    EXPECT_NE(markdown_.find(heading), std::string::npos) << heading;
  EXPECT_NE(markdown_.find("| tokens/s | final loss |"), std::string::npos);
  for (const auto& [run, ranks] : kRuns) {
    EXPECT_NE(markdown_.find("## Run " + run), std::string::npos) << run;
    // The side-by-side row names the run's optimizer and world size, from its start record.
    const auto start = testing::read_metrics_events(fixtures() / run, "start").at(0);
    const std::string row_start = "| " + run + " | llama_micro | " + start.at("optimizer").get<std::string>() + " |";
    const size_t row = markdown_.find(row_start);
    ASSERT_NE(row, std::string::npos) << row_start;
    const std::string row_text = markdown_.substr(row, markdown_.find('\n', row) - row);
    EXPECT_NE(row_text.find("| " + std::to_string(ranks) + " | cpu |"), std::string::npos) << row_text;
    // Estimate beside measured: one row per rank with both figures and the error.
    const size_t section = markdown_.find("## Run " + run);
    const size_t estimate = markdown_.find("### Estimate beside measured", section);
    ASSERT_NE(estimate, std::string::npos);
    for (int r = 0; r < ranks; ++r)
      EXPECT_NE(markdown_.find("\n| " + std::to_string(r) + " | ", estimate), std::string::npos) << run << " rank " << r;
    EXPECT_NE(markdown_.find("memory/" + run + "_timeline.svg", section), std::string::npos);
  }
  EXPECT_NE(markdown_.find("memory/peak_per_rank.svg"), std::string::npos);
  // Runs recorded before the step record counted its links say so (tests/hybrid_test.cpp reads the
  // bytes of runs that have them).
  EXPECT_NE(markdown_.find("## Communication per step"), std::string::npos);
  EXPECT_NE(markdown_.find("| adamw_fp32_w1 | full_shard | 1 | 1 | n/a |"), std::string::npos) << markdown_;
}

TEST_F(MemoryReport, TimelinePlotsHaveAPanelPerRankAndABarPerPoint) {
  for (const auto& [run, ranks] : kRuns) {
    const auto svg = parse_xml(out_ / "memory" / (run + "_timeline.svg"));
    ASSERT_NE(svg, nullptr) << run;
    EXPECT_EQ(svg->name, "svg");
    for (const char* attribute : {"width", "height", "viewBox", "xmlns"})
      EXPECT_EQ(svg->attributes.count(attribute), 1u) << attribute;
    EXPECT_EQ(svg->all("g", "legend-entry").size(), 6u) << "one legend entry per category";
    const auto panels = svg->all("g", "panel");
    ASSERT_EQ(panels.size(), static_cast<size_t>(ranks)) << run;
    // The plot shows the step in which rank 0 peaked: as many bars (window-peak ticks) as that step
    // has points in each rank's ledger, and one stacked segment per non-zero category of each point.
    const auto rank0 = ledger(run, 0);
    const int64_t step = rank0.back().at("summary").at("peak_step");
    for (int r = 0; r < ranks; ++r) {
      const Element& panel = *panels[r];
      EXPECT_EQ(panel.attributes.at("id"), "rank-" + std::to_string(r));
      size_t expected_points = 0, expected_segments = 0;
      for (const auto& record : ledger(run, r)) {
        if (record.at("event") != "point" || record.at("step") != step) continue;
        ++expected_points;
        for (const char* key : {"parameters", "gradients", "optimizer_device", "optimizer_host", "activations", "other"})
          expected_segments += static_cast<int64_t>(record.at(key)) > 0 ? 1 : 0;
      }
      ASSERT_GT(expected_points, 5u);
      EXPECT_EQ(panel.all("line", "window-peak").size(), expected_points) << run << " rank " << r;
      EXPECT_EQ(panel.all("rect", "bar").size(), expected_segments) << run << " rank " << r;
      EXPECT_EQ(panel.all("rect", "activations").size() > 0, true);
    }
  }
}

TEST_F(MemoryReport, PeakPlotHasABarPerRankAndAnEstimatePerRun) {
  const auto svg = parse_xml(out_ / "memory/peak_per_rank.svg");
  ASSERT_NE(svg, nullptr);
  EXPECT_EQ(svg->name, "svg");
  size_t bars = 0;
  for (const auto& [run, ranks] : kRuns) bars += static_cast<size_t>(ranks);
  EXPECT_EQ(svg->all("rect", "peak").size(), bars);
  EXPECT_EQ(svg->all("line", "estimate").size(), kRuns.size());
  EXPECT_EQ(svg->all("g", "run").size(), kRuns.size());
  EXPECT_EQ(svg->all("text", "run-label").size(), kRuns.size());
}

TEST(MemoryReportErrors, BadRunFoldersAreExitTwo) {
  ScratchDir dir("report_errors");
  const std::string report = testing::trainer_binary().string() + " report ";
  auto missing = run_command(report + (dir / "no_such_run").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("no such folder"), std::string::npos) << missing.output;

  std::filesystem::create_directories(dir / "empty_run");
  auto no_metrics = run_command(report + (dir / "empty_run").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(no_metrics.exit_code, 2) << no_metrics.output;
  EXPECT_NE(no_metrics.output.find("metrics.jsonl"), std::string::npos) << no_metrics.output;

  // A two-rank run folder with only rank 0's ledger.
  std::filesystem::create_directories(dir / "half_run");
  for (const char* file : {"metrics.jsonl", "memory.rank0.jsonl"})
    std::filesystem::copy_file(fixtures() / "adamw_sn_fp32_w2" / file, dir / "half_run" / file);
  auto no_ledger = run_command(report + (dir / "half_run").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(no_ledger.exit_code, 2) << no_ledger.output;
  EXPECT_NE(no_ledger.output.find("memory.rank1.jsonl"), std::string::npos) << no_ledger.output;

  auto nothing = run_command(report);
  EXPECT_EQ(nothing.exit_code, 2) << nothing.output;
  auto training_flag = run_command(report + (fixtures() / "adamw_fp32_w1").string() + " --lr 1");
  EXPECT_EQ(training_flag.exit_code, 2) << training_flag.output;
}

// A copy of the one-rank fixture run with one of its files changed by `damage`, reported.
testing::CommandResult report_damaged(const ScratchDir& dir, const std::string& name, const std::string& file,
                                      const std::function<std::string(const std::string&)>& damage) {
  const std::filesystem::path run = dir / name;
  std::filesystem::create_directories(run);
  for (const char* copied : {"metrics.jsonl", "memory.rank0.jsonl"}) {
    std::ifstream in(fixtures() / "adamw_fp32_w1" / copied);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(run / copied) << (copied == file ? damage(text) : text);
  }
  return run_command(testing::trainer_binary().string() + " report " + run.string() + " --out " +
                     (dir / (name + "_out")).string());
}

// The first `lines` lines of text, each with its newline.
std::string first_lines(const std::string& text, int lines) {
  size_t end = 0;
  for (int i = 0; i < lines; ++i) {
    end = text.find('\n', end);
    if (end == std::string::npos) return text;
    ++end;
  }
  return text.substr(0, end);
}

TEST(MemoryReportErrors, DamagedFilesNameTheFileAndLine) {
  // Each case: exit 2 with a message naming the file and, where one line is at fault, the line;
  // before, these were a segfault (world_size 0), exit 1 with nlohmann's text, or a report with
  // a measured peak of 0 and an estimate error of +77235100 %.
  struct Case {
    const char* name;
    const char* file;
    std::function<std::string(const std::string&)> damage;
    std::vector<std::string> fragments;
  };
  auto replace = [](const std::string& pattern, const std::string& with) {
    return [=](const std::string& text) { return std::regex_replace(text, std::regex(pattern), with); };
  };
  const std::vector<Case> cases = {
      {"metrics_empty", "metrics.jsonl", [](const std::string&) { return std::string(); },
       {"metrics.jsonl: start: the file is empty"}},
      {"metrics_cut", "metrics.jsonl", [](const std::string& text) { return text.substr(0, 300); },
       {"metrics.jsonl: line 1: is not a JSON object", "truncated"}},
      {"metrics_number", "metrics.jsonl", [](const std::string& text) { return "42\n" + text; },
       {"metrics.jsonl: line 1: expected a JSON object (got a number)"}},
      {"world_zero", "metrics.jsonl", replace("\"world_size\":1", "\"world_size\":0"),
       {"metrics.jsonl: line 1: world_size: expected the run's number of ranks", "(got 0)"}},
      {"world_negative", "metrics.jsonl", replace("\"world_size\":1", "\"world_size\":-3"),
       {"metrics.jsonl: line 1: world_size", "(got -3)"}},
      {"world_text", "metrics.jsonl", replace("\"world_size\":1", "\"world_size\":\"one\""),
       {"metrics.jsonl: line 1: a field has the wrong type"}},
      {"loss_text", "metrics.jsonl", replace("\"loss\":[0-9.]+", "\"loss\":\"x\""),
       {"metrics.jsonl: line 3: a field has the wrong type"}},
      {"model_broken", "metrics.jsonl", replace("\"hidden_size\":32", "\"hidden_size\":-32"),
       {"metrics.jsonl: line 1: model: the run's model config is not valid", "hidden_size"}},
      {"ledger_empty", "memory.rank0.jsonl", [](const std::string&) { return std::string(); },
       {"memory.rank0.jsonl: is empty", "rank 0"}},
      {"ledger_start_only", "memory.rank0.jsonl", [](const std::string& text) { return first_lines(text, 1); },
       {"memory.rank0.jsonl: has no step record in its 1 line(s)"}},
      {"ledger_cut", "memory.rank0.jsonl",
       [](const std::string& text) { const std::string head = first_lines(text, 4); return head + head.substr(0, 40); },
       {"memory.rank0.jsonl: line 5: is not a JSON object"}},
      {"ledger_number", "memory.rank0.jsonl", [](const std::string& text) { return first_lines(text, 1) + "7\n"; },
       {"memory.rank0.jsonl: line 2: expected a JSON object (got a number)"}},
      {"ledger_peak_text", "memory.rank0.jsonl", replace("\"peak_bytes\":[0-9]+", "\"peak_bytes\":\"big\""),
       {"memory.rank0.jsonl: line 12: a field has the wrong type"}},
      {"ledger_negative", "memory.rank0.jsonl", replace("\"parameters\":[0-9]+", "\"parameters\":-5"),
       {"memory.rank0.jsonl: line 3: parameters: expected a byte count >= 0 (got -5)"}},
      {"ledger_zero_peak", "memory.rank0.jsonl", replace("\"peak_bytes\":[0-9]+", "\"peak_bytes\":0"),
       {"memory.rank0.jsonl: line 28: peak_bytes: expected a positive byte count (got 0)"}},
  };
  ScratchDir dir("report_damaged");
  for (const Case& damaged : cases) {
    SCOPED_TRACE(damaged.name);
    const auto result = report_damaged(dir, damaged.name, damaged.file, damaged.damage);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    for (const std::string& fragment : damaged.fragments)
      EXPECT_NE(result.output.find(fragment), std::string::npos) << "lacks \"" << fragment << "\": " << result.output;
    EXPECT_FALSE(std::filesystem::exists(dir / (std::string(damaged.name) + "_out") / "memory_report.md"));
  }
}

TEST(MemoryReportErrors, DivergedLossIsReportedNotRefused) {
  // The trainer writes a non-finite loss as null: the report shows it as nan.
  ScratchDir dir("report_null_loss");
  const auto result = report_damaged(dir, "null_loss", "metrics.jsonl", [](const std::string& text) {
    return std::regex_replace(text, std::regex("\"(final_)?loss\":[0-9.]+"), "\"$1loss\":null");
  });
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::ifstream in(dir / "null_loss_out" / "memory_report.md");
  const std::string markdown((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(markdown.find("final loss nan"), std::string::npos) << markdown.substr(0, 2000);
}


// A run still going, or killed, has no end record in metrics.jsonl: its last step's loss is not a
// final loss. The report said "final loss" all the same; now the run is "unfinished (last step N of
// M ...)" in the report's table and section and on stdout. A finished run says nothing of the kind.
TEST(MemoryReportErrors, AnUnfinishedRunIsReportedAsUnfinished) {
  ScratchDir dir("report_ended");
  // The fixture's lines: start, sharded_state, train (step 1), train (step 2), eval, memory, gather_schedule, end.
  const auto killed = report_damaged(dir, "killed", "metrics.jsonl", [](const std::string& text) { return first_lines(text, 3); });
  ASSERT_EQ(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("note: run killed"), std::string::npos) << killed.output;
  EXPECT_NE(killed.output.find("unfinished (last step 1 of 2; no end record in metrics.jsonl"), std::string::npos)
      << killed.output;
  const std::string markdown = testing::read_text(dir / "killed_out" / "memory_report.md");
  EXPECT_NE(markdown.find("(unfinished, last step 1 of 2) |"), std::string::npos) << markdown.substr(0, 3000);
  EXPECT_NE(markdown.find("**unfinished (last step 1 of 2; no end record in metrics.jsonl: still running, or killed)**"),
            std::string::npos)
      << markdown;
  EXPECT_EQ(markdown.find("tokens/s, final loss"), std::string::npos) << "an unfinished run has no final loss";
  // Preempted: it ended, but not at its last step.
  const auto preempted = report_damaged(dir, "preempted", "metrics.jsonl", [](const std::string& text) {
    return first_lines(text, 3) + "{\"event\":\"preempted\",\"step\":1,\"signal\":\"SIGTERM\",\"checkpoint\":null}\n";
  });
  ASSERT_EQ(preempted.exit_code, 0) << preempted.output;
  EXPECT_NE(preempted.output.find("preempted at step 1 of 2"), std::string::npos) << preempted.output;
  const auto finished = report_damaged(dir, "finished", "metrics.jsonl", [](const std::string& text) { return text; });
  ASSERT_EQ(finished.exit_code, 0) << finished.output;
  EXPECT_EQ(finished.output.find("note: run"), std::string::npos) << finished.output;
  const std::string finished_markdown = testing::read_text(dir / "finished_out" / "memory_report.md");
  EXPECT_NE(finished_markdown.find("tokens/s, final loss"), std::string::npos);
  EXPECT_EQ(finished_markdown.find("(unfinished"), std::string::npos);
}

// `trainer report RUN --out RUN` replaced the run's own memory_report.md (written at the end of its
// training) without a word: refused, naming the folder and why. An --out that exists and is not a
// folder (a device, a fifo, a file), or where a file to write is a folder, is refused, never replaced.
TEST(MemoryReportErrors, OutIsNeverARunFolderNorSomethingElse) {
  ScratchDir dir("report_out");
  ASSERT_EQ(report_damaged(dir, "run", "metrics.jsonl", [](const std::string& text) { return text; }).exit_code, 0);
  const std::filesystem::path run = dir / "run";
  std::ofstream(run / "memory_report.md") << "the run's own report\n";
  const std::string report = testing::trainer_binary().string() + " report " + run.string() + " --out ";
  for (const std::string& out : {run.string(), run.string() + "/", (dir / "." / "run").string()}) {
    const auto onto_run = run_command(report + out);
    EXPECT_EQ(onto_run.exit_code, 2) << out << ": " << onto_run.output;
    for (const char* part : {"--out", "is a training run folder", "memory_report.md is the run's own report",
                             "pass another --out"})
      EXPECT_NE(onto_run.output.find(part), std::string::npos) << part << " in: " << onto_run.output;
    EXPECT_NE(onto_run.output.find(out), std::string::npos) << onto_run.output;
  }
  EXPECT_EQ(testing::read_text(run / "memory_report.md"), "the run's own report\n");
  EXPECT_FALSE(std::filesystem::exists(run / "memory"));

  const std::filesystem::path fifo = dir / "fifo", file = dir / "file.md", holder = dir / "holder";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::ofstream(file) << "mine\n";
  std::filesystem::create_directories(holder / "memory_report.md");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"/dev/full", "--out: /dev/full exists and is a character device, not a folder"},
      {fifo.string(), "exists and is a fifo, not a folder"},
      {file.string(), "exists and is a regular file, not a folder"},
      {holder.string(), "memory_report.md exists and is a folder, not a regular file"},
  };
  for (const auto& [out, message] : refused) {
    const auto result = run_command(report + out);
    EXPECT_EQ(result.exit_code, 2) << out << ": " << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << out << ": " << result.output;
  }
  EXPECT_EQ(testing::read_text(file), "mine\n");
  EXPECT_TRUE(std::filesystem::is_directory(holder / "memory_report.md"));
}

// The techniques report (`trainer report --techniques`) over real runs of llama_micro made here:
// three techniques at one rank and a baseline at two, and a context sweep of two lengths.
class TechniquesReport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    runs_ = std::make_unique<ScratchDir>("techniques");
    const std::string common = " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
                               " --device cpu --num_training_steps 3 --warmup_steps 0 --grad_clipping 0 "
                               "--eval_every 0 --eval_batches 1 --batch_size 2 --run_dir ";
    const std::vector<std::tuple<std::string, int, std::string>> runs = {
        {"w1_baseline", 1, "--max_length 64"},
        {"w1_checkpointing", 1, "--max_length 64 --activation_checkpointing"},
        {"w1_bf16_pure_fused", 1, "--max_length 64 --dtype bfloat16 --precision pure --fuse_optimizer_with_backward"},
        {"w2_baseline", 2, "--max_length 64 --batch_size 1"},  // the same global batch
        {"sweep_32", 1, "--max_length 32 --num_training_steps 1"},
        {"sweep_64", 1, "--max_length 64 --num_training_steps 1"},
    };
    const auto tiny = run_command(testing::trainer_binary().string() + common + (*runs_ / "tiny").string() +
                                  " --max_length 64 --num_training_steps 2 --config " +
                                  (testing::source_dir() / "configs/llama_tiny.json").string());
    ASSERT_EQ(tiny.exit_code, 0) << tiny.output;
    for (const auto& [name, ranks, flags] : runs) {
      const auto result = run_command(testing::mpirun(ranks) + testing::trainer_binary().string() + common +
                                      (*runs_ / name).string() + " " + flags);
      ASSERT_EQ(result.exit_code, 0) << name << ": " << result.output;
    }
  }
  static void TearDownTestSuite() { runs_.reset(); }
  static std::string dir(const std::string& name) { return (*runs_ / name).string(); }
  static testing::CommandResult report(const std::string& arguments, const std::string& out) {
    return run_command(testing::trainer_binary().string() + " report " + arguments + " --out " + out);
  }
  static std::string read(const std::filesystem::path& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // The cells of the table row that starts with `first_cell` after `from`.
  static std::vector<std::string> row(const std::string& markdown, const std::string& first_cell, size_t from = 0) {
    const size_t start = markdown.find("\n| " + first_cell + " |", from);
    if (start == std::string::npos) return {};
    const std::string line = markdown.substr(start + 1, markdown.find('\n', start + 1) - start - 1);
    std::vector<std::string> cells;
    std::istringstream in(line.substr(1));
    for (std::string cell; std::getline(in, cell, '|');) {
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      cells.push_back(cell);
    }
    return cells;
  }
  static inline std::unique_ptr<ScratchDir> runs_;
};

TEST_F(TechniquesReport, SharesAreOfTheBaselineOfTheSameWorldSize) {
  ScratchDir out("techniques_out");
  const auto result = report("--techniques " + dir("w1_baseline") + " " + dir("w1_checkpointing") + " " +
                                 dir("w1_bf16_pure_fused") + " " + dir("w2_baseline") + " --context_sweep " +
                                 dir("sweep_64") + " " + dir("sweep_32"),
                             out.path().string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string markdown = read(out / "techniques.md");
  const size_t one_rank = markdown.find("### 1 rank"), two_ranks = markdown.find("### 2 ranks");
  ASSERT_NE(one_rank, std::string::npos) << markdown;
  ASSERT_NE(two_ranks, std::string::npos) << markdown;
  // Cells: run, techniques, peak, share, tokens/s, share, final loss, estimate, error.
  const auto baseline = row(markdown, "w1_baseline", one_rank);
  const auto checkpointing = row(markdown, "w1_checkpointing", one_rank);
  const auto savers = row(markdown, "w1_bf16_pure_fused", one_rank);
  const auto other_world = row(markdown, "w2_baseline", two_ranks);
  ASSERT_EQ(baseline.size(), 9u) << markdown;
  ASSERT_EQ(checkpointing.size(), 9u) << markdown;
  ASSERT_EQ(savers.size(), 9u) << markdown;
  ASSERT_EQ(other_world.size(), 9u) << markdown;
  EXPECT_EQ(baseline[1], "fp32, AdamW");
  EXPECT_EQ(checkpointing[1], "checkpointing");
  EXPECT_EQ(savers[1], "bf16 pure + fused step");
  EXPECT_EQ(baseline[3], "100.0 %");
  EXPECT_EQ(baseline[5], "100.0 %");
  EXPECT_EQ(other_world[3], "100.0 %");  // its own baseline, not the one-rank run
  // Each share is the run's peak over the baseline's, as the table prints them; the savers save.
  for (const auto* cells : {&checkpointing, &savers}) {
    const double share = std::stod((*cells)[3]) / 100, expected = std::stod((*cells)[2]) / std::stod(baseline[2]);
    EXPECT_NEAR(share, expected, 0.006) << (*cells)[0];  // the peaks are printed to 0.01 MiB
    EXPECT_LT(share, 1.0) << (*cells)[0];
    const double speed = std::stod((*cells)[5]) / 100, speed_expected = std::stod((*cells)[4]) / std::stod(baseline[4]);
    EXPECT_NEAR(speed, speed_expected, 0.01) << (*cells)[0];
  }
  // The fp32 estimate is within 10 % of the measured peak.
  EXPECT_LT(std::abs(std::stod(baseline[8])), 10.0) << baseline[8];
  EXPECT_NE(markdown.find("| - | compilation (torch.compile) | not run |"), std::string::npos);
  EXPECT_NE(markdown.find("techniques/peak_share.svg"), std::string::npos);

  // The sweep, sorted by length: the forward-only peak below the training step's at each length, and
  // both growing with the length.
  const size_t sweep = markdown.find("## Context length");
  ASSERT_NE(sweep, std::string::npos) << markdown;
  const auto short_run = row(markdown, "32", sweep), long_run = row(markdown, "64", sweep);
  ASSERT_EQ(short_run.size(), 9u) << markdown;
  ASSERT_EQ(long_run.size(), 9u) << markdown;
  EXPECT_LT(markdown.find("\n| 32 |", sweep), markdown.find("\n| 64 |", sweep));
  for (const auto* cells : {&short_run, &long_run}) {
    EXPECT_EQ((*cells)[1], "fp32");
    EXPECT_LT(std::stod((*cells)[2]), std::stod((*cells)[5])) << (*cells)[0];
    EXPECT_LT(std::abs(std::stod((*cells)[4])), 10.0) << "forward-only estimate error " << (*cells)[4];
    EXPECT_LT(std::abs(std::stod((*cells)[7])), 10.0) << "training-step estimate error " << (*cells)[7];
  }
  EXPECT_LT(std::stod(short_run[5]), std::stod(long_run[5]));

  // The plots: a row per technique run with both bars, and four series (measured and estimated,
  // forward only and training step) of two points each.
  const auto shares = parse_xml(out / "techniques" / "peak_share.svg");
  ASSERT_NE(shares, nullptr);
  EXPECT_EQ(shares->all("g", "section").size(), 2u);
  const auto rows = shares->all("g", "row");
  EXPECT_EQ(rows.size(), 4u);
  for (const Element* bars : rows) {
    EXPECT_EQ(bars->all("rect", "peak-share").size(), 1u);
    EXPECT_EQ(bars->all("rect", "speed-share").size(), 1u);
  }
  const auto lines = parse_xml(out / "techniques" / "context_length.svg");
  ASSERT_NE(lines, nullptr);
  const auto series = lines->all("g", "series");
  ASSERT_EQ(series.size(), 4u);
  for (const Element* line : series) {
    EXPECT_EQ(line->all("rect", "marker").size(), 2u);
    EXPECT_EQ(line->all("line", "segment").size(), 1u);
  }
}

TEST_F(TechniquesReport, RunsOfAnotherWorkloadAreRefused) {
  ScratchDir out("techniques_refused");
  // A context sweep without --techniques.
  const auto no_techniques = report(dir("w1_baseline") + " --context_sweep " + dir("sweep_32"), out.path().string());
  EXPECT_EQ(no_techniques.exit_code, 2) << no_techniques.output;
  EXPECT_NE(no_techniques.output.find("--context_sweep: belongs to the techniques report"), std::string::npos)
      << no_techniques.output;
  // A run of another model.
  const auto other_model = report("--techniques " + dir("w1_baseline") + " " + dir("tiny"), out.path().string());
  EXPECT_EQ(other_model.exit_code, 2) << other_model.output;
  EXPECT_NE(other_model.output.find("runs the model llama_tiny but"), std::string::npos) << other_model.output;
  // A technique run of another context length: its share would compare other work.
  const auto other_length = report("--techniques " + dir("w1_baseline") + " " + dir("sweep_32"), out.path().string());
  EXPECT_EQ(other_length.exit_code, 2) << other_length.output;
  EXPECT_NE(other_length.output.find("runs sequences of 32 but"), std::string::npos) << other_length.output;
  // Two sweep runs of the same dtype and length.
  const auto twice = report("--techniques " + dir("w1_baseline") + " --context_sweep " + dir("sweep_32") + " " +
                                dir("sweep_32"),
                            out.path().string());
  EXPECT_EQ(twice.exit_code, 2) << twice.output;
  EXPECT_NE(twice.output.find("pass one run per dtype and context length"), std::string::npos) << twice.output;
  // A sweep run at another world size (and batch).
  const auto other_world = report("--techniques " + dir("w1_baseline") + " --context_sweep " + dir("sweep_32") + " " +
                                      dir("w2_baseline"),
                                  out.path().string());
  EXPECT_EQ(other_world.exit_code, 2) << other_world.output;
  EXPECT_NE(other_world.output.find("w2_baseline: --context_sweep: runs a micro-batch of 1 but"), std::string::npos)
      << other_world.output;
  EXPECT_FALSE(std::filesystem::exists(out / "techniques.md"));
}

}  // namespace
}  // namespace llm::memory_report_test
