#include "memory/techniques.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include "common/errors.h"
#include "common/folder_lock.h"
#include "common/output_files.h"
#include "memory/run_record.h"
#include "memory/svg.h"

namespace llm {
namespace {
namespace fs = std::filesystem;

// What a run changes against the fp32 AdamW baseline, from its settings: "bf16 pure + checkpointing +
// fused step + GaLore r=32".
std::string techniques_of(const RunConfig& run) {
  std::vector<std::string> parts;
  if (run.precision.dtype == DType::bfloat16) parts.push_back(std::string("bf16 ") + to_string(run.precision.mode));
  if (run.optimizer.name == "adamw_sn") parts.push_back("AdamW-SN");
  if (run.optimizer.name == "galore_adamw") parts.push_back("GaLore r=" + std::to_string(run.optimizer.galore_rank));
  if (run.optimizer.state_dtype == "bfloat16") parts.push_back("bf16 optimizer state");
  if (run.activation_checkpointing_every == 1) parts.push_back("checkpointing");
  if (run.activation_checkpointing_every > 1)
    parts.push_back("checkpointing every " + std::to_string(run.activation_checkpointing_every));
  if (!run.recompute.empty() && run.recompute != "block") parts.push_back("recompute " + run.recompute);
  if (run.fuse_optimizer_with_backward) parts.push_back("fused step");
  if (run.sharding.offload != Offload::none) parts.push_back(std::string("offload ") + to_string(run.sharding.offload));
  if (parts.empty()) return "fp32, AdamW";
  std::string joined;
  for (const std::string& part : parts) joined += (joined.empty() ? "" : " + ") + part;
  return joined;
}

std::string dtype_of(const RunConfig& run) {
  return run.precision.dtype == DType::bfloat16 ? std::string("bf16 ") + to_string(run.precision.mode) : "fp32";
}

std::string percent(double share) { return format_number(100.0 * share, "%.1f %%"); }

// A run's measured and estimated peaks of its training phases and of its evaluation forward, the
// largest over ranks.
struct PhasePeaks {
  int64_t train = 0, eval = 0;
};
PhasePeaks measured_phase_peaks(const RunRecord& run) {
  PhasePeaks peaks;
  for (int64_t bytes : run.train_peak_per_rank) peaks.train = std::max(peaks.train, bytes);
  for (int64_t bytes : run.eval_peak_per_rank) peaks.eval = std::max(peaks.eval, bytes);
  return peaks;
}
PhasePeaks estimated_phase_peaks(const RunRecord& run) {
  PhasePeaks peaks;
  for (const RankEstimate& rank : run.estimate.ranks)
    for (const PhaseEstimate& phase : rank.phases) {
      int64_t& into = phase.label.rfind("eval", 0) == 0 ? peaks.eval : peaks.train;
      into = std::max(into, phase.peak_bytes);
    }
  return peaks;
}

// The same workload: a share of another model's or batch's peak would mean nothing. Every run trains
// the model on the device of the first run; technique runs the batch of their world size's baseline,
// sweep runs the batch and world size of the first sweep run (`baseline` is that run then).
void require_same_workload(const RunRecord& first, const RunRecord& baseline, const RunRecord& run,
                           const std::string& option, bool sweep) {
  auto require = [&](bool same, const RunRecord& other, const std::string& what, const std::string& theirs,
                     const std::string& ours) {
    if (!same)
      fail_user(run.dir, option,
                "runs " + what + " " + ours + " but " + other.dir + " runs " + theirs + ": every run of " + option +
                    " must train the same " +
                    (sweep ? "model, batch and world size" : "model and batch as its world size's baseline") +
                    " for the comparison to mean anything");
  };
  require(run.model.name == first.model.name, first, "the model", first.model.name, run.model.name);
  require(run.device == first.device, first, "on", first.device, run.device);
  require(run.run.data.batch_size == baseline.run.data.batch_size, baseline, "a micro-batch of",
          std::to_string(baseline.run.data.batch_size), std::to_string(run.run.data.batch_size));
  if (sweep) {
    require(run.world == baseline.world, baseline, "on ranks:", std::to_string(baseline.world),
            std::to_string(run.world));
  } else {
    require(run.run.data.max_length == baseline.run.data.max_length, baseline, "sequences of",
            std::to_string(baseline.run.data.max_length), std::to_string(run.run.data.max_length));
    require(run.run.data.gradient_accumulation == baseline.run.data.gradient_accumulation, baseline,
            "gradient accumulation", std::to_string(baseline.run.data.gradient_accumulation),
            std::to_string(run.run.data.gradient_accumulation));
  }
}

std::string techniques_tables(const std::vector<RunRecord>& runs, std::vector<ShareSection>& sections) {
  std::map<int, std::vector<const RunRecord*>> by_world;
  for (const RunRecord& run : runs) by_world[run.world].push_back(&run);
  int64_t largest = 0;
  for (const RunRecord& run : runs) largest = std::max({largest, largest_peak(run), largest_estimate(run)});
  const ByteUnit unit = byte_unit_for(largest);
  std::ostringstream out;
  for (const auto& [world, group] : by_world) {
    const RunRecord& baseline = *group.front();
    const double baseline_peak = static_cast<double>(std::max<int64_t>(1, largest_peak(baseline)));
    const double baseline_speed = baseline.tokens_per_second > 0 ? baseline.tokens_per_second : 1;
    ShareSection section;
    section.title = std::to_string(world) + (world == 1 ? " rank" : " ranks");
    out << "### " << section.title << "\n\nBaseline: " << baseline.label << " (" << techniques_of(baseline.run)
        << "), a micro-batch of " << baseline.run.data.batch_size << " x " << baseline.run.data.max_length
        << " tokens per rank.\n\n| run | techniques | peak per rank (" << unit.name
        << ") | share of baseline | tokens/s | share of baseline | final loss | estimate (" << unit.name
        << ") | estimate error |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
    const RunRecord* best = nullptr;
    for (const RunRecord* run : group) {
      const int64_t peak = largest_peak(*run);
      const double peak_share = static_cast<double>(peak) / baseline_peak;
      const double speed_share = run->tokens_per_second / baseline_speed;
      section.rows.push_back({run->label + ": " + techniques_of(run->run), peak_share, speed_share, peak});
      if (best == nullptr || peak < largest_peak(*best)) best = run;
      out << "| " << run->label << " | " << techniques_of(run->run) << " | " << format_in(peak, unit) << " | "
          << percent(peak_share) << " | " << format_number(run->tokens_per_second, "%.0f") << " | "
          << percent(speed_share) << " | " << final_loss_text(*run) << " | ";
      if (run->has_estimate)
        out << format_in(largest_estimate(*run), unit) << " | "
            << format_ratio(static_cast<double>(largest_estimate(*run)) / static_cast<double>(std::max<int64_t>(1, peak)) - 1.0)
            << " |\n";
      else
        out << "n/a | n/a |\n";
    }
    out << "| - | compilation (torch.compile) | not run | | | | | | |\n\n";
    out << "Smallest peak at " << section.title << ": " << best->label << " (" << techniques_of(best->run) << "), "
        << percent(static_cast<double>(largest_peak(*best)) / baseline_peak) << " of the baseline's peak at "
        << percent(best->tokens_per_second / baseline_speed) << " of its tokens/s.\n\n";
    sections.push_back(std::move(section));
  }
  return out.str();
}

std::string context_sweep(const std::vector<RunRecord>& runs, std::vector<PlotSeries>& series) {
  // Per dtype, the runs by context length.
  std::map<std::string, std::map<int64_t, const RunRecord*>> by_dtype;
  for (const RunRecord& run : runs) {
    const RunRecord*& slot = by_dtype[dtype_of(run.run)][run.run.data.max_length];
    if (slot != nullptr)
      fail_user(run.dir, "--context_sweep",
                "runs " + dtype_of(run.run) + " at context length " + std::to_string(run.run.data.max_length) +
                    " as " + slot->dir + " does: pass one run per dtype and context length");
    slot = &run;
  }
  int64_t largest = 0;
  for (const RunRecord& run : runs) {
    largest = std::max({largest, measured_phase_peaks(run).train, estimated_phase_peaks(run).train});
  }
  const ByteUnit unit = byte_unit_for(largest);
  std::ostringstream out;
  out << "| context length | dtype | forward only, measured (" << unit.name << ") | estimated | error | training step, measured ("
      << unit.name << ") | estimated | error | step / forward |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n";
  static const char* kColors[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#76b7b2", "#b07aa1"};
  size_t color = 0;
  auto error_of = [](int64_t estimated, int64_t measured) {
    return measured > 0 ? format_ratio(static_cast<double>(estimated) / static_cast<double>(measured) - 1.0)
                        : std::string("n/a");
  };
  for (const auto& [dtype, by_length] : by_dtype) {
    PlotSeries forward_measured{dtype + ", forward only, measured", kColors[color % 6], false, {}};
    PlotSeries forward_estimated{dtype + ", forward only, estimated", kColors[color % 6], true, {}};
    PlotSeries step_measured{dtype + ", training step, measured", kColors[(color + 1) % 6], false, {}};
    PlotSeries step_estimated{dtype + ", training step, estimated", kColors[(color + 1) % 6], true, {}};
    color += 2;
    for (const auto& [length, run] : by_length) {
      const PhasePeaks measured = measured_phase_peaks(*run);
      const PhasePeaks estimated = estimated_phase_peaks(*run);
      LLM_REQUIRE(measured.eval > 0, run->dir, "--context_sweep",
                  "has no evaluation in its memory ledger: sweep runs must evaluate (every run does, at its end) "
                  "for the forward-only peak");
      out << "| " << length << " | " << dtype << " | " << format_in(measured.eval, unit) << " | "
          << (run->has_estimate ? format_in(estimated.eval, unit) : "n/a") << " | "
          << (run->has_estimate ? error_of(estimated.eval, measured.eval) : "n/a") << " | "
          << format_in(measured.train, unit) << " | " << (run->has_estimate ? format_in(estimated.train, unit) : "n/a")
          << " | " << (run->has_estimate ? error_of(estimated.train, measured.train) : "n/a") << " | "
          << format_number(static_cast<double>(measured.train) / static_cast<double>(measured.eval), "%.2f") << " |\n";
      const double x = static_cast<double>(length);
      forward_measured.points.emplace_back(x, measured.eval);
      step_measured.points.emplace_back(x, measured.train);
      if (run->has_estimate) {
        forward_estimated.points.emplace_back(x, estimated.eval);
        step_estimated.points.emplace_back(x, estimated.train);
      }
    }
    for (PlotSeries* line : {&step_measured, &step_estimated, &forward_measured, &forward_estimated})
      if (!line->points.empty()) series.push_back(std::move(*line));
  }
  return out.str();
}

// The workload of a set of runs; `with_length` false for the sweep, whose runs differ in it.
std::string settings_line(const RunRecord& run, bool with_length) {
  std::ostringstream out;
  out << run.model.name << " on " << run.device << ", a micro-batch of " << run.run.data.batch_size;
  if (with_length)
    out << " x " << run.run.data.max_length << " tokens";
  else
    out << " sequences";
  out << " per rank, " << to_string(run.run.sharding.strategy) << ", " << run.steps << " step(s)";
  return out.str();
}

// What a CPU run's figures measure that a GPU run's would not.
std::string cpu_caveats(const std::vector<RunRecord>& runs) {
  const bool cpu = std::any_of(runs.begin(), runs.end(), [](const RunRecord& run) { return run.device == "cpu"; });
  if (!cpu) return "";
  return "On a CPU run the device is the host: `--offload optimizer` moves the fp32 masters and optimizer state "
         "into the same memory, beside the compute copy of the parameters the device keeps, and `--offload parameters` "
         "moves that copy there too and makes every unit gather (none stays resident), so neither can lower the "
         "peak there (on a GPU they take them off the device). bf16 tokens/s on a CPU measure LibTorch's CPU bf16 kernels, which on a CPU without "
         "AVX-512 BF16 are far slower than fp32 ones: `bench/cpu_bf16_gemm.py` times the LM head's GEMMs on the "
         "machine.\n\n";
}

}  // namespace

void write_techniques_report(const std::vector<std::string>& technique_dirs, const std::vector<std::string>& sweep_dirs,
                             const std::string& out_dir) {
  LLM_REQUIRE(!technique_dirs.empty(), "command line", "--techniques", "pass at least one run folder");
  auto read_all = [](const std::vector<std::string>& dirs, const std::string& option, bool sweep) {
    std::vector<RunRecord> runs;
    std::map<std::pair<int, std::string>, int> seen;  // labels are unique within a world size's table
    for (const std::string& dir : dirs) {
      runs.push_back(read_run(dir));
      RunRecord& run = runs.back();
      if (const int count = ++seen[{run.world, run.label}]; count > 1) run.label += "-" + std::to_string(count);
      // A technique run's baseline: the first run of its world size; a sweep run's: the first sweep run.
      const RunRecord* baseline = &runs.front();
      if (!sweep)
        baseline = &*std::find_if(runs.begin(), runs.end(),
                                  [&](const RunRecord& earlier) { return earlier.world == run.world; });
      require_same_workload(runs.front(), *baseline, run, option, sweep);
    }
    return runs;
  };
  const std::vector<RunRecord> techniques = read_all(technique_dirs, "--techniques", /*sweep=*/false);
  const std::vector<RunRecord> sweep = read_all(sweep_dirs, "--context_sweep", /*sweep=*/true);
  const fs::path out(out_dir), plots = out / "techniques";
  refuse_unless_absent_or(out, OutputKind::folder, "--out");
  refuse_unless_absent_or(plots, OutputKind::folder, "--out (its techniques/ folder of plots)");
  // One writer per --out (two reports to one folder left one's markdown beside the other's plots):
  // the second is refused, naming the first, before anything is written.
  const std::unique_ptr<FolderLock> lock = FolderLock::output(out, "--out");
  std::error_code error;
  fs::create_directories(plots, error);
  LLM_REQUIRE(!error, out_dir, "--out", "cannot create the folder (" + error.message() + ")");

  std::vector<ShareSection> sections;
  std::ostringstream md;
  md << "# Memory techniques, alone and combined\n\n"
     << "Made by `launch/techniques.sh`, which trains each run below and then calls `trainer report --techniques`. "
        "Technique runs: "
     << settings_line(techniques.front(), true)
     << " (at other world sizes, each section's baseline says its micro-batch). Peak: the tracked allocator's peak per rank over the run's steps (CPU: LibTorch's CPU allocator; CUDA: "
        "the caching allocator's allocated bytes), the largest rank's; share: of the first run of the same world "
        "size, the baseline. Tokens/s: the median over the steps after the first, all ranks together. Estimate: "
        "`trainer estimate` for the run's own settings. `docs/memory.md` says how each category is counted.\n\n"
     << "Compilation (`torch.compile`) has no LibTorch counterpart: TorchInductor and Dynamo are Python, and "
        "the C++ API runs eager kernels only, so it is listed and not run.\n\n"
     << cpu_caveats(techniques)
     << "## Techniques\n\n"
     << techniques_tables(techniques, sections) << "![peak and tokens/s, shares of the baseline](techniques/peak_share.svg)\n";
  write_file((plots / "peak_share.svg").string(),
             share_bars_svg("Memory techniques: peak per rank and tokens/s, shares of the baseline", sections));
  if (!sweep.empty()) {
    std::vector<PlotSeries> series;
    md << "\n## Context length\n\n" << settings_line(sweep.front(), false) << ", " << sweep.front().world
       << (sweep.front().world == 1 ? " rank" : " ranks")
       << "; each context length is its own run. Forward only: the largest window of the run's evaluation forward "
          "(no autograd graph; the training state, weights, persistent gradient shards and optimizer state, stays resident). Training "
          "step: the largest window of forward, backward and the optimizer step. Both the largest rank's.\n\n"
       << context_sweep(sweep, series) << "\n![peak memory over the context length](techniques/context_length.svg)\n";
    write_file((plots / "context_length.svg").string(),
               line_plot_svg("Peak memory per rank over the context length", "context length (tokens)", series));
  }
  write_file((out / "techniques.md").string(), md.str());
}

}  // namespace llm
