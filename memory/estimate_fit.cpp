#include "memory/estimate_fit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <thread>
#include <cstdio>
#include <sstream>
#include <vector>

#include "common/errors.h"
#include "common/log.h"
#include "common/memory_stats.h"
#include "memory/estimate_simulation.h"
#include "memory/step_time.h"

namespace llm {
namespace {

constexpr double kGiB = 1073741824.0;

struct Candidate {
  RunConfig run;
  std::vector<std::string> flags;  // what to add to the command
  int64_t device_bytes = 0;        // the largest rank's peak (+ the CUDA runtime's memory)
  int64_t host_bytes = 0;          // the largest node's host memory
  StepTimeEstimate step{};         // predicted (memory/step_time.h); for the fitting ones
  double added_seconds = 0;        // its step's seconds less the command's
  bool fits = false;
};

std::string joined(const std::vector<std::string>& flags) {
  std::string text;
  for (const std::string& flag : flags) text += (text.empty() ? "" : " ") + flag;
  return text.empty() ? "(nothing: the command as it is)" : text;
}

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / kGiB);
  return text;
}

}  // namespace

double fit_host_gbs(const EstimateOptions& options, int world_size) {
  if (options.host_gbs > 0) return options.host_gbs;
  const int cores = options.host_cores > 0 ? options.host_cores : std::max(1u, std::thread::hardware_concurrency());
  const int ranks_on_node = options.ranks_per_node > 0 ? std::min(options.ranks_per_node, world_size) : world_size;
  return std::min(kHostStepGbsCap, kHostStepGbsPerCore * cores / std::max(1, ranks_on_node));
}

namespace {

// Every combination of the levers the command leaves off.
// The sharding choices across nodes, the command's first: with full_shard or shard_grad_op on more
// than one node, hybrid groups of whole nodes (1, 2, 4, ... nodes, fewer than all), each also with the
// optimizer across the groups; full_shard's copy for the backward over a node.
struct ShardingChoice {
  std::string flags;  // empty: the command's own
  ShardingConfig sharding;
};
std::vector<ShardingChoice> sharding_choices(const RunConfig& run, int world, int per_node) {
  std::vector<ShardingChoice> choices = {{"", run.sharding}};
  const ShardingStrategy strategy = run.sharding.strategy;
  if (per_node <= 0 || per_node >= world || world % per_node != 0 ||
      (strategy != ShardingStrategy::full_shard && strategy != ShardingStrategy::shard_grad_op) ||
      run.sharding.backward_gather_size > 0)
    return choices;
  // The command's sharding with these fields changed.
  const auto choice = [&](std::string flags, ShardingStrategy as, int group, int backward_gather, bool across) {
    ShardingConfig sharding = run.sharding;
    sharding.strategy = as;
    sharding.group_size = group;
    sharding.backward_gather_size = backward_gather;
    sharding.optimizer_across_groups = across;
    choices.push_back({std::move(flags), sharding});
  };
  const ShardingStrategy hybrid =
      strategy == ShardingStrategy::full_shard ? ShardingStrategy::hybrid_shard : ShardingStrategy::hybrid_shard_grad_op;
  for (int group = per_node; group < world; group *= 2) {
    if (world % group != 0) continue;
    const std::string flags = std::string("--sharding ") + to_string(hybrid) + " --shard_group_size " + std::to_string(group);
    choice(flags, hybrid, group, 0, false);
    choice(flags + " --shard_optimizer_across_groups", hybrid, group, 0, true);
  }
  if (strategy == ShardingStrategy::full_shard)
    choice("--backward_gather_size " + std::to_string(per_node), strategy, 0, per_node, false);
  return choices;
}

std::vector<Candidate> candidates(const RunConfig& run, int world, int per_node, bool cuda, bool precision_lever) {
  std::vector<Candidate> out;
  // The precisions, the command's first: with --fit_precision an fp32 command may become bf16.
  std::vector<std::string> precisions = {""};
  if (precision_lever && run.precision.dtype == DType::float32) {
    precisions.push_back("mixed");
    precisions.push_back("pure");
  }
  const int64_t per_rank = run.data.total_batch_size / world;  // sequences a rank takes a step
  // The micro-batches that divide a rank's share and are at most --batch_size, largest first, found
  // in sqrt(per_rank) steps (--batch_size 2^40 once counted down 2^40 candidates and never answered);
  // where there are more than 32, the largest at most --batch_size, at most half of it, a quarter, ...
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= per_rank / d; ++d)
    if (per_rank % d == 0)
      for (const int64_t divisor : {d, per_rank / d})
        if (divisor <= run.data.batch_size && (divisors.empty() || divisors.back() != divisor)) divisors.push_back(divisor);
  std::sort(divisors.begin(), divisors.end(), std::greater<>());
  std::vector<int64_t> micro_batches = divisors;
  if (divisors.size() > 32) {
    micro_batches.clear();
    for (int64_t most = run.data.batch_size; most >= 1; most /= 2) {
      const int64_t fitting = *std::find_if(divisors.begin(), divisors.end(), [&](int64_t d) { return d <= most; });
      if (micro_batches.empty() || micro_batches.back() != fitting) micro_batches.push_back(fitting);
    }
  }
  const bool state_lever = run.optimizer.state_dtype != "bfloat16";
  const bool checkpointing_lever = run.activation_checkpointing_every == 0 && run.recompute.empty();
  // The recompute choices, least first: none, the memory-bound operations, the matmul-heavy ones too,
  // whole blocks.
  const std::vector<std::string> recompute_choices = {"", "norm,swiglu", "norm,mlp,attention", "block"};
  // Offload adds to what the command offloads already, never takes it away; on a GPU only (on a CPU
  // rank host memory is the device's).
  std::vector<Offload> offload_choices = {run.sharding.offload};
  if (cuda)
    for (const Offload choice : {Offload::optimizer, Offload::parameters, Offload::optimizer_and_parameters})
      if (choice != run.sharding.offload &&
          (offloads_optimizer(choice) || !offloads_optimizer(run.sharding.offload)) &&
          (offloads_parameters(choice) || !offloads_parameters(run.sharding.offload)))
        offload_choices.push_back(choice);
  for (const ShardingChoice& sharding : sharding_choices(run, world, per_node))
  for (const std::string& precision : precisions)
  for (const bool state : {false, true}) {
    if (state && !state_lever) continue;
    for (const std::string& recompute : recompute_choices) {
      if (!recompute.empty() && !checkpointing_lever) continue;
      for (const Offload offload : offload_choices)
      for (const bool device_step : {false, true}) {
        // The device step where the trainer allows it (validation refuses the rest below), added
        // only to a command that leaves the step where it is by default.
        if (device_step && (!cuda || !offloads_optimizer(offload) || offloads_parameters(offload) ||
                            run.sharding.offload_step != OffloadStep::host))
          continue;
        for (const bool fused : {false, true}) {
          // The fused step cannot clip, and the optimizer's offload already steps each unit as its
          // gradient lands.
          if (fused && (run.fuse_optimizer_with_backward || run.optimizer.grad_clipping != 0 || offloads_optimizer(offload)))
            continue;
          for (const int64_t micro : micro_batches) {
            Candidate c{run, {}};
            c.run.sharding = sharding.sharding;  // the offload levers below change it further
            if (!sharding.flags.empty()) c.flags.push_back(sharding.flags);
            if (!precision.empty()) {
              c.run.precision.dtype = DType::bfloat16;
              c.run.precision.mode = precision == "pure" ? Precision::pure : Precision::mixed;
              c.flags.push_back("--dtype bfloat16 --precision " + precision);
            }
            if (state) {
              c.run.optimizer.state_dtype = "bfloat16";
              c.flags.push_back("--optimizer_state_dtype bfloat16");
            }
            if (recompute == "block") {
              c.run.activation_checkpointing_every = 1;
              c.flags.push_back("--activation_checkpointing");
            } else if (!recompute.empty()) {
              c.run.recompute = recompute;
              c.flags.push_back("--recompute " + recompute);
            }
            if (offload != run.sharding.offload) {
              c.run.sharding.offload = offload;
              c.flags.push_back(std::string("--offload ") + to_string(offload));
            }
            if (device_step) {
              c.run.sharding.offload_step = OffloadStep::device;
              c.flags.push_back("--offload_step device");
            }
            if (fused) {
              c.run.fuse_optimizer_with_backward = true;
              c.flags.push_back("--fuse_optimizer_with_backward");
            }
            if (micro != run.data.batch_size) {
              c.run.data.batch_size = micro;
              c.run.data.gradient_accumulation_given = 0;  // the global batch stays --total_batch_size
              c.flags.push_back("--batch_size " + std::to_string(micro) + " --total_batch_size " +
                                std::to_string(run.data.total_batch_size));
            }
            out.push_back(std::move(c));
          }
        }
      }
    }
  }
  return out;
}

// How far along --fit is, over all its candidates (each an estimate), logged every 5 s.
class FitProgress {
 public:
  explicit FitProgress(size_t total) : total_(total) {}
  void next() {
    const auto now = std::chrono::steady_clock::now();
    if (done_++ > 0 && now - last_ > std::chrono::seconds(5)) {
      last_ = now;
      log::info("estimate --fit: {} of {} configurations estimated ({:.0f} s)", done_ - 1, total_,
                std::chrono::duration<double>(now - started_).count());
    }
  }

 private:
  size_t total_, done_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now(), last_ = started_;
};

}  // namespace

std::string run_fit_command(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options) {
  LLM_REQUIRE(options.memory_budget_gib > 0, "command line", "--fit", "needs --memory_budget_gib (one rank's device memory)");
  const int world = options.world_size;
  const int64_t budget = static_cast<int64_t>(options.memory_budget_gib * kGiB);
  const double node_gib = options.host_budget_gib > 0   ? options.host_budget_gib
                          : options.node_memory_gib > 0 ? options.node_memory_gib
                                                        : static_cast<double>(host_total_bytes()) / kGiB;
  const int64_t host_budget = static_cast<int64_t>(node_gib * kGiB);
  EstimateOptions quiet = options;
  quiet.memory_budget_gib = 0;
  quiet.json = false;
  quiet.progress = false;
  quiet.progress = false;

  const std::string device = estimate_device(run, options);
  std::vector<Candidate> all = candidates(run, world, options.ranks_per_node, /*cuda=*/device == "cuda", options.fit_precision);
  FitProgress progress(all.size());
  for (Candidate& c : all) {
    progress.next();
    try {
      validate_run_config(c.run, model, world);
    } catch (const UserError&) {
      continue;  // a combination the trainer would refuse is no answer
    }
    const MemoryEstimate estimate = estimate_memory(model, c.run, quiet);
    for (const RankEstimate& rank : estimate.ranks)
      c.device_bytes = std::max(c.device_bytes, rank.peak_bytes + rank.runtime.total());
    for (const NodeEstimate& node : estimate.nodes) c.host_bytes = std::max(c.host_bytes, node.host_bytes);
    c.fits = c.device_bytes > 0 && c.device_bytes <= budget && c.host_bytes <= host_budget;
  }
  // The fitting ones' step times (memory/step_time.h), against the command's: with --profile each
  // micro-batch's units are measured once.
  ComputeRatesCache rates;
  const StepTimeEstimate command_step = predict_step_time(model, run, options, device, &rates);
  for (Candidate& c : all)
    if (c.fits) {
      c.step = predict_step_time(model, c.run, options, device, &rates);
      c.added_seconds = c.step.step_seconds - command_step.step_seconds;
    }
  std::vector<const Candidate*> fitting, estimated;
  for (const Candidate& c : all) {
    if (c.device_bytes == 0) continue;
    estimated.push_back(&c);
    if (c.fits) fitting.push_back(&c);
  }
  LLM_REQUIRE(!estimated.empty(), "command line", "--fit", "no combination of the levers passes validation");
  if (fitting.empty()) {
    const Candidate* smallest = *std::min_element(estimated.begin(), estimated.end(), [](const Candidate* a, const Candidate* b) {
      return a->device_bytes < b->device_bytes;
    });
    throw UserError("command line: --fit: nothing fits " + gib(budget) + " GiB per rank" +
                    (smallest->device_bytes <= budget ? " with " + gib(host_budget) + " GiB of host memory per node" : "") +
                    ": the smallest peak the levers reach is " + gib(smallest->device_bytes) + " GiB per rank (host " +
                    gib(smallest->host_bytes) + " GiB per node), adding " + joined(smallest->flags) +
                    "; more ranks, " + std::string(options.fit_precision ? "" : "bf16 (--fit_precision tries it), ") +
                    "or a shorter --max_length lower it further");
  }
  // Fastest first (to the microsecond: what the model cannot tell apart is a tie); among equals the
  // command's precision, the larger micro-batch, then fewer levers.
  const auto microseconds = [](const Candidate* c) { return std::llround(c->step.step_seconds * 1e6); };
  std::stable_sort(fitting.begin(), fitting.end(), [&run, &microseconds](const Candidate* a, const Candidate* b) {
    if (microseconds(a) != microseconds(b)) return microseconds(a) < microseconds(b);
    const bool a_keeps = a->run.precision.dtype == run.precision.dtype, b_keeps = b->run.precision.dtype == run.precision.dtype;
    if (a_keeps != b_keeps) return a_keeps;  // the command's arithmetic first
    if (a->run.data.batch_size != b->run.data.batch_size) return a->run.data.batch_size > b->run.data.batch_size;
    return a->flags.size() < b->flags.size();
  });
  std::ostringstream out;
  char line[2048];
  std::snprintf(line, sizeof(line),
                "Fit for %s on %d rank(s) (%s): budget %.2f GiB per rank, host %.2f GiB per node; %zu of %zu "
                "combinations of the levers fit.\n",
                model.name.c_str(), world, device.c_str(), options.memory_budget_gib, node_gib, fitting.size(),
                estimated.size());
  out << line;
  out << "Ranked by the predicted step time (memory/step_time.h; docs/memory.md \"Step time\"). Compute: "
      << command_step.compute_source << ". Links: " << command_step.link_source << ".\n";
  std::snprintf(line, sizeof(line), "The command as it is: predicted %.4g s a step, %.4g tokens/s.\n", command_step.step_seconds,
                command_step.tokens_per_second);
  out << line;
  const Candidate& best = *fitting.front();
  out << "\nAdd to the command: " << joined(best.flags) << "\n";
  std::snprintf(line, sizeof(line),
                "  peak %s GiB per rank, host %s GiB per node, %+.4g s a step against the command as it is; "
                "predicted %.4g s a step, %.4g tokens/s\n",
                gib(best.device_bytes).c_str(), gib(best.host_bytes).c_str(), best.added_seconds, best.step.step_seconds,
                best.step.tokens_per_second);
  out << line;
  out << "\n| # | add | peak per rank (GiB) | host per node (GiB) | step (s) | tokens/s | against the command (s) |\n"
         "|---:|---|---:|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < fitting.size() && i < 10; ++i) {
    std::snprintf(line, sizeof(line), "| %zu | %s | %s | %s | %.4g | %.4g | %+.4g |\n", i + 1, joined(fitting[i]->flags).c_str(),
                  gib(fitting[i]->device_bytes).c_str(), gib(fitting[i]->host_bytes).c_str(), fitting[i]->step.step_seconds,
                  fitting[i]->step.tokens_per_second, fitting[i]->added_seconds);
    out << line;
  }
  if (fitting.size() > 10) out << "(" << fitting.size() - 10 << " more fit)\n";
  return out.str();
}

std::vector<LeverAdvice> lowest_peak_levers(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options) {
  EstimateOptions quiet = options;
  quiet.memory_budget_gib = 0;
  quiet.json = false;
  quiet.progress = false;
  const int world = options.world_size;
  const std::string device = estimate_device(run, options);
  const MemoryEstimate as_is = estimate_memory(model, run, quiet);
  std::vector<LeverAdvice> advice(as_is.ranks.size());
  for (size_t r = 0; r < as_is.ranks.size(); ++r) advice[r].peak_bytes = advice[r].lowered_bytes = as_is.ranks[r].peak_bytes;
  const double command_seconds = predict_step_time(model, run, options, device).step_seconds;
  for (Candidate& c : candidates(run, world, /*per_node=*/0, /*cuda=*/device == "cuda", /*precision_lever=*/false)) {
    if (c.flags.size() != 1) continue;  // one lever at a time
    try {
      validate_run_config(c.run, model, world);
    } catch (const UserError&) {
      continue;
    }
    const MemoryEstimate estimate = estimate_memory(model, c.run, quiet);
    const double seconds = predict_step_time(model, c.run, options, device).step_seconds - command_seconds;
    for (size_t r = 0; r < advice.size() && r < estimate.ranks.size(); ++r) {
      LeverAdvice& best = advice[r];
      const int64_t peak = estimate.ranks[r].peak_bytes;
      if (peak < best.lowered_bytes || (peak == best.lowered_bytes && !best.flags.empty() && seconds < best.added_seconds)) {
        best.flags = c.flags.front();
        best.lowered_bytes = peak;
        best.added_seconds = seconds;
      }
    }
  }
  return advice;
}

}  // namespace llm
