#include "memory/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/folder_lock.h"
#include "common/output_files.h"
#include "config/config.h"
#include "memory/categories.h"
#include "memory/estimate.h"
#include "memory/run_record.h"
#include "memory/svg.h"

namespace llm {
namespace {
namespace fs = std::filesystem;

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
        << format_number(run.tokens_per_second, "%.0f") << " | " << final_loss_text(run) << " | "
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

// The bytes a step sends on each kind of link, the seconds in those collectives, and the steps that
// named a straggler: what explains two runs' tokens/s beside each other (docs/sharding.md has the
// formulas the bytes follow).
std::string communication_side_by_side(const std::vector<RunRecord>& runs) {
  double largest = 0;
  for (const RunRecord& run : runs) largest = std::max({largest, run.group.bytes, run.across.bytes, run.node.bytes});
  const ByteUnit unit = byte_unit_for(static_cast<int64_t>(largest));
  std::ostringstream out;
  out << "Rank 0's bytes sent a step inside its shard group and across groups (hybrid sharding; every other strategy "
         "has one group: all its bytes are inside it), the backward's gathers inside a node under "
         "--backward_gather_size, and the seconds in those collectives; medians over the steps after the first.\n\n"
      << "| run | sharding | ranks | group size | inside the group (" << unit.name << ") | s | across groups ("
      << unit.name << ") | s | backward in the node (" << unit.name
      << ") | s | steps with a straggler |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const RunRecord& run : runs) {
    out << "| " << run.label << " | " << to_string(run.run.sharding.strategy) << " | " << run.world << " | "
        << (is_hybrid(run.run.sharding.strategy) ? run.run.sharding.group_size : run.world) << " | ";
    if (run.has_links)
      out << format_in(static_cast<int64_t>(run.group.bytes), unit) << " | " << format_number(run.group.seconds, "%.4f")
          << " | " << format_in(static_cast<int64_t>(run.across.bytes), unit) << " | "
          << format_number(run.across.seconds, "%.4f") << " | " << format_in(static_cast<int64_t>(run.node.bytes), unit)
          << " | " << format_number(run.node.seconds, "%.4f") << " | " << run.straggler_steps << " |\n";
    else
      out << "n/a | n/a | n/a | n/a | n/a | n/a | n/a (a run from before the step record counted its links) |\n";
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

// --out must not be a run folder: memory_report.md there is the run's own report, written at the
// end of training, and would be replaced.
void refuse_report_over_a_run(const fs::path& out, const std::vector<RunRecord>& runs) {
  std::error_code error;
  const fs::path where = fs::weakly_canonical(out, error);
  bool a_run = fs::exists(out / "metrics.jsonl", error);
  for (const RunRecord& run : runs) a_run |= !where.empty() && fs::weakly_canonical(run.dir, error) == where;
  if (a_run)
    fail_user("command line", "--out",
              out.string() + " is a training run folder (it holds metrics.jsonl): its memory_report.md is the run's own "
              "report, written at the end of training, and the report would replace it; pass another --out, e.g. " +
                  (out.filename().empty() ? out.parent_path() : out).string() + "_report");
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
  refuse_report_over_a_run(out, runs);
  refuse_unless_absent_or(out, OutputKind::folder, "--out");
  refuse_unless_absent_or(plots, OutputKind::folder, "--out (its memory/ folder of plots)");
  // One writer per --out (two reports to one folder left one's markdown beside the other's plots):
  // the second is refused, naming the first, before anything is written.
  const std::unique_ptr<FolderLock> lock = FolderLock::output(out, "--out");
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
  write_file((plots / "peak_per_rank.svg").string(), peak_per_rank_svg("Peak memory per rank, per run", peaks));

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
     << categories_side_by_side(runs) << "\n## Communication per step\n\n" << communication_side_by_side(runs);
  for (const RunRecord& run : runs) {
    const std::string name = file_label(run.label);
    const bool cuda = run.device.rfind("cuda", 0) == 0;
    write_file((plots / (name + "_timeline.svg")).string(),
               stacked_timeline_svg(run.label + ": memory over step " + std::to_string(run.timeline_step) +
                                        " by category, per rank",
                                    run.timeline));
    md << "\n## Run " << run.label << "\n\n`" << run.dir << "`: " << run_settings(run) << "; "
       << run.steps << " step(s), " << format_number(run.tokens_per_second, "%.0f") << " tokens/s, "
       << (unfinished_note(run).empty() ? "final loss " + format_number(run.final_loss, "%.4f")
                                        : "**" + unfinished_note(run) + "**: the loss of its last step " +
                                              format_number(run.final_loss, "%.4f") + " is not a final loss")
       << ".\n\n### Peak per rank, by category\n\n"
       << per_rank_markdown(run.ranks, cuda) << "\n### Across ranks\n\n" << across_ranks_markdown(run.ranks, cuda)
       << "\n### Estimate beside measured\n\n" << estimate_beside_measured(run) << "\n![" << run.label
       << " timeline](memory/" << name << "_timeline.svg)\n";
  }
  write_file((out / "memory_report.md").string(), md.str());
  // The report says which runs have not ended; so does its command, where the user looks first.
  for (const RunRecord& run : runs)
    if (!unfinished_note(run).empty())
      std::cout << "note: run " << run.label << " (" << run.dir << ") is " << unfinished_note(run)
                << ": its loss in the report is its last step's, not a final loss\n";
  std::cout << "wrote " << (out / "memory_report.md").string() << " and " << plots.string() << "/*.svg\n" << std::flush;
}

}  // namespace llm
