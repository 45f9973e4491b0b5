#include "trainer/run_records.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "checkpoint/interchange/pretrained.h"
#include "common/log.h"
#include "memory/categories.h"
#include "memory/estimate_fit.h"
#include "memory/step_time.h"
#include "optim/shard_optimizer.h"
#include "sharding/communicator.h"
#include "sharding/sharded_model.h"
#include "trainer/preemption.h"
#include "trainer/train_loop.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

// The end-of-run record of the gather order: tests read the peak from it.
nlohmann::json gather_schedule_record(const ShardedModel& sharded) {
  const GatherSchedule& schedule = sharded.plan().gathers();
  return {{"event", "gather_schedule"},
          {"strategy", to_string(sharded.options().strategy)},
          // One rank or no_shard: every unit is its own shard and is never gathered.
          {"units_resident", sharded.unit_count() > 0 && sharded.unit(0).resident()},
          {"prefetch", schedule.prefetch()},
          {"side_stream", sharded.has_gather_stream()},
          {"units", schedule.unit_count()},
          {"peak_gathered_units", sharded.peak_gathered_units()},
          {"schedule_peak_gathered_units", schedule.peak_gathered_units()},
          {"inline_gathers", schedule.inline_gathers()},
          {"prefetches", schedule.prefetches()}};
}

at::ScalarType compute_dtype(const RunConfig& run) {
  return run.precision.dtype == DType::bfloat16 ? at::kBFloat16 : at::kFloat;
}

}  // namespace

RunRecords::RunRecords(const ModelConfig& model_config, const RunConfig& run, const RuntimeContext& context)
    : model_config_(model_config),
      run_(run),
      context_(context),
      metrics_((fs::path(run.logging.run_dir) / "metrics.jsonl").string(), context.rank == 0, context.world_size == 1,
               !run.checkpoint.continue_from.empty()),
      ledger_(run.logging.run_dir, context.rank, context.world_size, context.device,
              {{"model", model_config.name}, {"optimizer", run.optimizer.name}, {"dtype", to_string(run.precision.dtype)},
               {"precision", to_string(run.precision.mode)}, {"sharding", to_string(run.sharding.strategy)}},
              !run.checkpoint.continue_from.empty()) {}

void RunRecords::start(const RunStart& start) {
  const c10::Device device = context_.device;
  flops_per_token_ = model_flops_per_token(model_config_, run_.data.max_length);
  if (context_.rank == 0) {
    peak_ = device_peak_flops(device, compute_dtype(run_), at::get_num_threads(), run_.logging.peak_tflops);
    log::info("MFU against {}", peak_.flops_per_second > 0 ? peak_.source : "nothing (" + peak_.source + ")");
  }
  metrics_.write({{"event", "start"}, {"model", model_config_.to_json()}, {"run", run_.to_json()},
                  {"model_flops_per_token", flops_per_token_}, {"peak_flops", peak_.flops_per_second},
                  {"peak_flops_source", peak_.source},
                  {"world_size", context_.world_size}, {"device", device.str()},
                  {"host_threads", at::get_num_threads()}, {"communicator", start.communicator}, {"sharding", to_string(run_.sharding.strategy)},
                  {"parameters", model_config_.num_parameters()}, {"shard_parameter_bytes", start.shard_parameter_bytes},
                  {"optimizer", run_.optimizer.name}, {"optimizer_state_bytes", start.optimizer_state_bytes},
                  {"startup_peak_parameter_bytes", start.startup_peak_parameter_bytes},
                  {"largest_unit_parameter_bytes", start.largest_unit_parameter_bytes},
                  {"corpus_unigram_entropy", start.corpus_unigram_entropy},
                  {"corpus_entropy_rate", start.corpus_entropy_rate}, {"start_step", start.start_step}, {"run_id", start.run_id},
                  {"attention_backend", start.attention_backend}, {"mlp_compute_width", model_config_.compute_intermediate()},
                  {"vocab_compute_width", model_config_.compute_vocab()},
                  {"offload_threads", start.offloaded ? nlohmann::json(start.offload_threads) : nlohmann::json()},
                  {"grouped_projections", run_.grouped_projections},
                  {"resumed_from", start.resumed_from.empty() ? nlohmann::json() : nlohmann::json(start.resumed_from)}});
  log::info("model {}: {:.2f}M parameters on {} x {} ({}, {}, {} host threads per rank), {} steps of {} sequences x {} tokens",
            model_config_.name, model_config_.num_parameters() / 1e6, context_.world_size, device.str(),
            start.communicator, to_string(run_.sharding.strategy), at::get_num_threads(),
            run_.num_training_steps, run_.data.total_batch_size,
            run_.data.max_length);
  log::info("optimizer {}: {} of state on this rank{}", run_.optimizer.name, human_bytes(start.optimizer_state_bytes),
            start.offloaded ? ", in host memory with the fp32 masters (--offload optimizer)" : "");
  if (start.offloaded) {
    log::info("offload: the host step on {} thread{}, the rank's compute on {} (--offload_threads)", start.offload_threads,
              start.offload_threads == 1 ? "" : "s", at::get_num_threads());
    const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
    if (device.is_cuda() && (wait_policy == nullptr || std::string(wait_policy) != "PASSIVE"))
      log::warn("offload on a GPU: OMP_WAIT_POLICY=PASSIVE in the environment keeps the host step's idle OpenMP "
                "threads from spinning on the cores the launching thread needs (libgomp reads it at start)");
  }
  if (context_.rank == 0) {
    log::info("attention: scaled_dot_product_attention runs {}", start.attention_backend);
    if (model_config_.matmul_padded())
      log::info("MLP computed {} wide, logits {} wide: intermediate_size {} and vocab_size {} padded with zeros "
                "(--pad_matmul_dims {}); checkpoints stay as the config says",
                model_config_.compute_intermediate(), model_config_.compute_vocab(), model_config_.intermediate_size,
                model_config_.vocab_size, run_.pad_matmul_dims);
  }
  if (context_.rank == 0 && !run_.logging.tensorboard_dir.empty()) {
    metrics_.attach_tensorboard(std::make_unique<TensorBoardWriter>(run_.logging.tensorboard_dir, start.start_step + 1));
    if (TensorBoardWriter* tensorboard = metrics_.tensorboard()) {
      // The resolved settings, as `--print_config` prints them (GaLore's --name and --tags among them).
      const nlohmann::json config = {{"model", model_config_.to_json()}, {"run", run_.to_json()},
                                     {"world_size", context_.world_size}, {"device", device.str()},
                                     {"peak_flops", peak_.flops_per_second}, {"peak_flops_source", peak_.source}};
      tensorboard->text("config", start.start_step, "```json\n" + config.dump(2) + "\n```");
      log::info("TensorBoard events in {}", tensorboard->path().string());
    }
  }
  if (context_.init_from != nullptr)
    log::info("--init_from {}: read this rank's rows, {} bytes ({}) of the folder's {} bytes of weights",
              context_.init_from->folder(), start.init_from_bytes, human_bytes(start.init_from_bytes),
              context_.init_from->weight_bytes());
}

void RunRecords::sharded_state(const ShardedModel& sharded, const ShardOptimizer& optimizer, Communicator& communicator) {
  const int world = communicator.world_size();
  int64_t parameters = 0, gradients = 0, materialized = 0;
  for (size_t u = 0; u < sharded.unit_count(); ++u) {
    const ShardedUnit& unit = sharded.unit(u);
    // The device's persistent rows: the master, or once offloaded the compute-dtype copy (none when
    // the parameters are offloaded too: that copy is in host memory).
    if (!unit.master_offloaded())
      parameters += static_cast<int64_t>(unit.gathered_rows().nbytes());
    else if (!unit.parameters_offloaded())
      parameters += static_cast<int64_t>(unit.compute_shard().nbytes());
    // 0 with offload: the shard is transient, gone to host memory after each backward.
    gradients += unit.gradient_shard().defined() ? static_cast<int64_t>(unit.gradient_shard().nbytes()) : 0;
    materialized += unit.compute_parameter_bytes();
  }
  const at::Tensor table = gather_rows(communicator, {parameters, gradients, optimizer.state_bytes(), materialized});
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r)
    ranks.push_back({{"rank", r}, {"parameter_shard_bytes", table[r][0].item<int64_t>()},
                     {"gradient_shard_bytes", table[r][1].item<int64_t>()},
                     {"optimizer_state_bytes", table[r][2].item<int64_t>()},
                     {"materialized_parameter_bytes", table[r][3].item<int64_t>()}});
  metrics_.write({{"event", "sharded_state"}, {"ranks", ranks}});
}

double RunRecords::model_flops_utilisation(int64_t step, double tokens_per_second) {
  const double achieved = flops_per_token_ * tokens_per_second / context_.world_size;  // per rank
  if (peak_.flops_per_second > 0 && achieved > peak_.flops_per_second && !peak_.capped) {
    const PeakFlops stale = peak_;
    peak_ = outpaced_peak(stale, achieved, compute_dtype(run_), at::get_num_threads());
    // The start record's peak no longer holds: what a program reads the MFU against from this step.
    const nlohmann::json record = {{"event", "peak_flops"}, {"step", step}, {"peak_flops", peak_.flops_per_second},
                                   {"peak_flops_source", peak_.source}, {"capped", peak_.capped},
                                   {"stale_peak_flops", stale.flops_per_second},
                                   {"stale_peak_flops_source", stale.source}};
    metrics_.write(record);
    if (TensorBoardWriter* tensorboard = metrics_.tensorboard())
      tensorboard->text("peak_flops", step, "```json\n" + record.dump(2) + "\n```");
  }
  // At most 1: the peak now covers the run's rate, or is a given one that the warning said is capped
  // (and peak x ranks may round a hair below the rate it was raised to).
  return std::min(1.0, llm::model_flops_utilisation(flops_per_token_, tokens_per_second, peak_, context_.world_size));
}

void RunRecords::step_memory(int64_t step, Communicator& communicator) {
  if (run_.logging.tensorboard_dir.empty()) return;
  // Every rank's row: the tracked peak, then the categories at it.
  const RankMemorySummary& mine = ledger_.last_step_summary();
  std::vector<int64_t> row = {mine.peak_bytes};
  for (int i = 0; i < MemoryCategories::kCount; ++i) row.push_back(mine.at_peak.at(i));
  const at::Tensor table = gather_rows(communicator, row);
  TensorBoardWriter* tensorboard = metrics_.tensorboard();
  if (tensorboard == nullptr) return;
  const at::Tensor largest = std::get<0>(table.max(0));
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [scope, values] : {std::pair<std::string, at::Tensor>{"rank0", table[0]}, {"max_over_ranks", largest}}) {
    scalars.emplace_back("memory/" + scope + "/peak_tracked_bytes", static_cast<double>(values[0].item<int64_t>()));
    for (int i = 0; i < MemoryCategories::kCount; ++i)
      scalars.emplace_back("memory/" + scope + "/" + MemoryCategories::keys()[static_cast<size_t>(i)] + "_bytes",
                           static_cast<double>(values[i + 1].item<int64_t>()));
  }
  tensorboard->scalars(step, scalars);
}

void RunRecords::preempted_before_first_step(int64_t start_step, int signal) {
  metrics_.write({{"event", "preempted"}, {"step", start_step}, {"signal", signal_name(signal)},
                  {"checkpoint", nlohmann::json()}, {"before_first_step", true}});
}

void RunRecords::finish(int64_t steps, int64_t steps_run, const ShardedModel& model, Communicator& communicator,
                        double final_loss, double final_eval_loss, int preempted_by,
                        const std::string& preemption_checkpoint, const std::string& stopped_by) {
  finish_memory_ledger(steps_run, communicator);
  metrics_.write(gather_schedule_record(model));
  if (preempted_by != 0)
    metrics_.write({{"event", "preempted"}, {"step", steps}, {"signal", signal_name(preempted_by)},
                    {"checkpoint", preemption_checkpoint.empty() ? nlohmann::json() : nlohmann::json(preemption_checkpoint)}});
  else {
    nlohmann::json end = {{"event", "end"}, {"steps", steps}, {"final_loss", final_loss},
                          {"final_eval_loss", final_eval_loss}, {"peak_memory_bytes", ledger_.step_line_peak_bytes()},
                          {"step_time", step_time_}};
    if (!stopped_by.empty()) {  // --stop_at_step or --max_runtime: an end before the last step, saved
      end["stopped_by"] = stopped_by;
      end["checkpoint"] = preemption_checkpoint.empty() ? nlohmann::json() : nlohmann::json(preemption_checkpoint);
    }
    metrics_.write(end);
  }
}

void RunRecords::observe_step(const StepRecord& record) {
  if (context_.rank != 0 || !record.phase_seconds) return;
  // The first logged step pays the allocator's and the libraries' first calls: the medians leave it out.
  if (!first_step_observed_) {
    first_step_observed_ = true;
    return;
  }
  step_phases_.emplace_back(record.step_seconds, *record.phase_seconds);
  if (step_phases_.size() > kStepTimeWindow) step_phases_.pop_front();
}

EstimateOptions RunRecords::estimate_options(int ranks_per_node) const {
  EstimateOptions options;
  options.world_size = context_.world_size;
  options.device = context_.device.is_cuda() ? "cuda" : "cpu";
  options.ranks_per_node = ranks_per_node < context_.world_size ? ranks_per_node : 0;
  if (peak_.flops_per_second > 0) options.device_tflops = peak_.flops_per_second / 1e12;
  return options;
}

nlohmann::json RunRecords::step_time_comparison(const EstimateOptions& options) const {
  if (step_phases_.empty()) return nullptr;
  std::vector<double> steps;
  std::vector<std::vector<double>> phases(kStepPhases);
  for (const auto& [seconds, by_phase] : step_phases_) {
    steps.push_back(seconds);
    for (int p = 0; p < kStepPhases; ++p) phases[static_cast<size_t>(p)].push_back(by_phase[static_cast<size_t>(p)]);
  }
  nlohmann::json measured_phases = nlohmann::json::object();
  for (int p = 0; p < kStepPhases; ++p)
    measured_phases[to_string(static_cast<StepPhase>(p))] = median(phases[static_cast<size_t>(p)]);
  const double measured = median(steps);
  try {
    const StepTimeEstimate predicted = predict_step_time(model_config_, run_, options, options.device);
    return {{"steps", steps.size()}, {"measured", {{"step_seconds", measured}, {"phase_s", measured_phases}}},
            {"predicted", predicted.to_json()},
            {"predicted_over_measured", predicted.step_seconds / std::max(1e-12, measured)}};
  } catch (const std::exception& error) {
    log::warn("no predicted step time to compare: {}", error.what());
    return nullptr;
  }
}

// The step time beside its prediction: a section of RUN_DIR/memory_report.md and a log line (rank 0).
void RunRecords::append_step_time_report(const nlohmann::json& comparison) const {
  const nlohmann::json& measured = comparison.at("measured");
  const nlohmann::json& predicted = comparison.at("predicted");
  std::ostringstream section;
  char line[256];
  std::snprintf(line, sizeof(line),
                "\n## Step time: measured and predicted\n\nMeasured: the median over the %zu logged steps after the first "
                "(metrics.jsonl phase_s). Predicted: `trainer estimate`'s step time (memory/step_time.h) for this run, ",
                comparison.at("steps").get<size_t>());
  section << line << "the compute " << predicted.at("compute_source").get<std::string>() << "; the links "
          << predicted.at("link_source").get<std::string>() << " (`trainer estimate --profile` measures the compute instead).\n\n"
          << "| phase | measured (s) | predicted (s) | predicted / measured |\n|---|---:|---:|---:|\n";
  const auto row = [&](const std::string& name, double have, double want) {
    std::snprintf(line, sizeof(line), "| %s | %.4g | %.4g | %s |\n", name.c_str(), have, want,
                  have > 0 ? (std::to_string(std::lround(100 * want / have)) + " %").c_str() : "n/a");
    section << line;
  };
  for (int p = 0; p < kStepPhases; ++p) {
    const std::string name = to_string(static_cast<StepPhase>(p));
    row(name, measured.at("phase_s").at(name).get<double>(), predicted.at("phase_s").at(name).get<double>());
  }
  row("step", measured.at("step_seconds").get<double>(), predicted.at("step_seconds").get<double>());
  std::ofstream((fs::path(run_.logging.run_dir) / "memory_report.md").string(), std::ios::app) << section.str();
  log::info("step time: {:.4g} s measured (the median after the first step), {:.4g} s predicted by trainer estimate's "
            "model at the run's peak ({:.0f} %; memory_report.md has the phases)",
            measured.at("step_seconds").get<double>(), predicted.at("step_seconds").get<double>(),
            100.0 * comparison.at("predicted_over_measured").get<double>());
}

// Per rank, the lever that lowers the estimated peak most (memory/estimate_fit.h); none when the
// estimate cannot be made (its reason logged).
std::vector<LeverAdvice> RunRecords::lever_advice(const EstimateOptions& options) const {
  try {
    return lowest_peak_levers(model_config_, run_, options);
  } catch (const std::exception& error) {
    log::warn("no estimate of what would lower the peak: {}", error.what());
    return {};
  }
}

// One line per rank: where its peak was and what would lower it most.
std::string RunRecords::peak_line(const RankMemorySummary& rank, const LeverAdvice* lever) const {
  // What held most of it: the largest category at the peak, or the temporaries of the phase.
  int largest = 0;
  for (int i = 1; i < MemoryCategories::kCount; ++i)
    if (rank.at_peak.at(i) > rank.at_peak.at(largest)) largest = i;
  const bool transient = rank.transient_at_peak > rank.at_peak.at(largest);
  const std::string most = transient ? "temporaries inside the phase " + human_bytes(rank.transient_at_peak)
                                     : std::string(MemoryCategories::titles()[static_cast<size_t>(largest)]) + " " +
                                           human_bytes(rank.at_peak.at(largest));
  std::string line = "rank " + std::to_string(rank.rank) + ": peak " + human_bytes(rank.peak_bytes) +
                     " of tracked tensors at step " + std::to_string(rank.peak_step) + ", " + rank.peak_phase + " (" +
                     most + " of it); ";
  if (lever == nullptr) return line + "no estimate of what would lower it";
  if (lever->flags.empty()) return line + "no single lever lowers its estimated peak";
  char cost[64];
  std::snprintf(cost, sizeof(cost), "%+.4g s a step predicted", lever->added_seconds);
  // At a declared rate a smaller micro-batch computes the same FLOPs: only its extra gathers cost.
  const std::string measure = lever->flags.find("--batch_size") != std::string::npos
                                  ? "; at the peak a smaller micro-batch computes the same FLOPs: `trainer estimate --profile` times it"
                                  : "";
  return line + "lowers it most: " + lever->flags + " (estimate " + human_bytes(lever->peak_bytes) + " -> " +
         human_bytes(lever->lowered_bytes) + ", " + cost + measure + ")";
}

// The end of the run's ledger (collective): rank 0 writes RUN_DIR/memory_report.md, and every rank's
// summary and every node's host figures go into metrics.jsonl as one "memory" record.
void RunRecords::finish_memory_ledger(int64_t steps_run, Communicator& communicator) {
  std::ostringstream description;
  description << "Run `" << run_.logging.run_dir << "`: " << model_config_.name << ", " << run_.optimizer.name << ", "
              << to_string(run_.precision.dtype)
              << (run_.precision.dtype == DType::bfloat16 ? std::string(" (") + to_string(run_.precision.mode) + ")" : "") << ", "
              << to_string(run_.sharding.strategy) << ", " << context_.world_size << " rank(s) on " << context_.device.str()
              << ", batch " << run_.data.batch_size << " x " << run_.data.max_length << " tokens, " << steps_run << " step(s).";
  const std::vector<RankMemorySummary> summaries = ledger_.finish(communicator, "Memory report", description.str());
  const std::vector<NodeMemorySummary> node_summaries = by_node(summaries);
  std::vector<LeverAdvice> advice;
  if (context_.rank == 0) {
    // This run as `trainer estimate` takes it, for the step time beside the measured one and the
    // pricing of the lever that lowers the peak (one model, one set of rates).
    size_t ranks_per_node = 0;
    for (const NodeMemorySummary& node : node_summaries) ranks_per_node = std::max(ranks_per_node, node.ranks.size());
    const EstimateOptions options = estimate_options(static_cast<int>(ranks_per_node));
    step_time_ = step_time_comparison(options);
    if (!step_time_.is_null()) append_step_time_report(step_time_);
    advice = lever_advice(options);
  }
  nlohmann::json ranks = nlohmann::json::array(), nodes = nlohmann::json::array();
  for (const RankMemorySummary& rank : summaries) {
    ranks.push_back(rank.to_json());
    const LeverAdvice* lever = static_cast<size_t>(rank.rank) < advice.size() ? &advice[static_cast<size_t>(rank.rank)] : nullptr;
    if (lever != nullptr)
      ranks.back()["lowers_peak_most"] = {{"flags", lever->flags}, {"estimated_peak_bytes", lever->peak_bytes},
                                          {"estimated_lowered_bytes", lever->lowered_bytes},
                                          {"added_seconds", lever->added_seconds}};
    if (context_.rank == 0) log::info("{}", peak_line(rank, lever));
  }
  for (const NodeMemorySummary& node : node_summaries) nodes.push_back(node.to_json());
  metrics_.write({{"event", "memory"}, {"ranks", ranks}, {"nodes", nodes}});
}

}  // namespace llm
