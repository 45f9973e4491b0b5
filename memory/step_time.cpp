// The step-time model (memory/step_time.h states it): the arithmetic over the units, the collectives
// and the optimizer, and what `trainer estimate` prints of it. profile_compute is in step_profile.cpp.
#include "memory/step_time.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "common/device.h"
#include "common/errors.h"
#include "common/log.h"
#include "memory/collective_table.h"
#include "memory/estimate.h"
#include "memory/estimate_fit.h"
#include "memory/estimate_shapes.h"
#include "optim/host_threads.h"
#include "model/recompute.h"
#include "model/units.h"

namespace llm {
namespace {

// Matmul parameters of a unit kind (the embedding's lookup has none), from the config alone.
struct UnitSizes {
  double embed = 0, layer = 0, head = 0;  // parameters of each unit (the shards split these)
  double layer_matmul = 0, head_matmul = 0;
};

UnitSizes unit_sizes(const ModelConfig& model) {
  UnitSizes sizes;
  for (const UnitSpec& unit : describe_units(model)) {
    double numel = 0, matmul = 0;
    for (const ParameterSpec& parameter : unit.parameters) {
      numel += static_cast<double>(parameter.numel());
      if (parameter.linear) matmul += static_cast<double>(parameter.numel());
    }
    if (unit.kind == UnitKind::embedding) sizes.embed = numel;
    else if (unit.kind == UnitKind::decoder_layer) sizes.layer = numel, sizes.layer_matmul = matmul;
    else sizes.head = numel, sizes.head_matmul = matmul;
  }
  return sizes;
}

}  // namespace

int64_t largest_unit_parameters(const ModelConfig& model) {
  const UnitSizes sizes = unit_sizes(model);
  return static_cast<int64_t>(std::max({sizes.embed, sizes.layer, sizes.head}));
}

namespace {

// A ring collective of `steps` steps each moving `chunk` bytes.
double ring_seconds(double steps, double chunk, double gbs, double latency) {
  return steps <= 0 ? 0.0 : steps * (latency + chunk / (gbs * 1e9));
}

// The share of a layer's forward FLOPs (its attention's and its MLP's) that --recompute runs again.
double recomputed_share(const ModelConfig& model, const RunConfig& run) {
  const double h = static_cast<double>(model.hidden_size), I = static_cast<double>(model.intermediate_size);
  const double kv = static_cast<double>(model.num_key_value_heads * model.head_dim());
  const double S = static_cast<double>(run.data.max_length);
  return recomputed_flops_per_layer_token(model, run) / (4 * h * h + 4 * h * kv + 4 * h * S + 6 * h * I);
}

}  // namespace

double recomputed_flops_per_layer_token(const ModelConfig& model, const RunConfig& run) {
  const RecomputeSet set = recompute_set(run.recompute);
  const double h = static_cast<double>(model.hidden_size), I = static_cast<double>(model.intermediate_size);
  const double kv = static_cast<double>(model.num_key_value_heads * model.head_dim());
  const double S = static_cast<double>(run.data.max_length);
  double flops = 0;
  if (set.norm) flops += 2 * 4 * h;
  if (set.mlp) flops += 6 * h * I;
  else if (set.swiglu) flops += 4 * I;
  if (set.attention) flops += 4 * h * h + 4 * h * kv + 4 * h * S;
  return flops;
}

const char* predicted_phase_name(int phase) {
  static const char* const names[kPredictedPhases] = {"forward", "backward", "collectives", "optimizer", "other"};
  return names[phase];
}

ComputeRates declared_compute(const ModelConfig& model, const RunConfig& run, double tflops, double memory_gbs) {
  const UnitSizes sizes = unit_sizes(model);
  const double tokens = static_cast<double>(run.data.batch_size * run.data.max_length);
  const double attention = 4.0 * model.hidden_size * run.data.max_length;  // scores and weighted sum, a token
  const double rate = tflops * 1e12;
  ComputeRates rates;
  rates.layer.forward = (2 * sizes.layer_matmul + attention) * tokens / rate;
  rates.head.forward = 2 * sizes.head_matmul * tokens / rate;
  rates.layer.backward = 2 * rates.layer.forward;
  rates.head.backward = 2 * rates.head.forward;
  rates.optimizer_seconds_per_element = 28.0 / (memory_gbs * 1e9);
  rates.copy_seconds_per_byte = 1.0 / (memory_gbs * 1e9);
  char text[160];
  std::snprintf(text, sizeof(text), "declared: %g TFLOP/s for the matmuls (--device_tflops), the optimizer at %g GB/s",
                tflops, memory_gbs);
  rates.source = text;
  return rates;
}

StepTimeEstimate estimate_step_time(const ModelConfig& model, const RunConfig& run, int world,
                                    const std::string& device, const ComputeRates& compute, const LinkRates& links,
                                    int cores, double host_gbs, double pcie_gbs) {
  StepTimeEstimate estimate;
  estimate.compute_source = compute.source;
  estimate.link_source = links.source;
  const UnitSizes sizes = unit_sizes(model);
  const double layers = static_cast<double>(model.num_hidden_layers);
  const double micro = static_cast<double>(std::max<int64_t>(1, run.data.gradient_accumulation));
  const bool cuda = device == "cuda";
  const int per_node = links.ranks_per_node > 0 ? std::min(links.ranks_per_node, world) : world;
  // CPU ranks sharing the cores: each rank's compute stretched by the oversubscription.
  const double stretch =
      !cuda && cores > 0 ? std::max(1.0, static_cast<double>(per_node) * compute.threads / cores) : 1.0;

  // Compute, a micro-batch.
  const std::vector<bool> recomputed = recomputed_units(describe_units(model), run.activation_checkpointing_every);
  const double checkpointed = static_cast<double>(std::count(recomputed.begin(), recomputed.end(), true));
  const double share = run.activation_checkpointing_every > 0 ? 0.0 : recomputed_share(model, run);
  const double forward = compute.embed.forward + layers * compute.layer.forward + compute.head.forward;
  const double backward = compute.embed.backward + layers * compute.layer.backward + compute.head.backward +
                          (checkpointed + share * layers) * compute.layer.forward;

  // Collectives: a ring over n ranks spans nodes when n exceeds a node's ranks (or, across the
  // groups, whenever there is more than one node).
  const int S = shard_world(run, world), G = world / std::max(1, S);
  const double c = static_cast<double>(ModelShape(model, run).compute_bytes());
  const auto rate = [&](bool spans) { return spans ? links.inter_gbs : links.intra_gbs; };
  // One collective of `bytes` (nccl-tests' size) over `ranks`: the measured table's time (inside a
  // node or across nodes, as the ranks span) where it has the collective, `sharing` times over when
  // that many such collectives share the link at once; else a ring of `steps` steps of `chunk` bytes
  // at `gbs` (the sharing already in it).
  const auto collective = [&](const char* kind, double ranks, double bytes, bool spans, double steps, double chunk,
                              double gbs, double sharing = 1.0) {
    if (const CollectiveTable* table = spans ? links.inter_table : links.intra_table)
      if (const std::optional<double> measured = table->seconds(kind, bytes, static_cast<int>(ranks)))
        return sharing * *measured;
    return ring_seconds(steps, chunk, gbs, links.latency_seconds);
  };
  const bool group_spans = S > per_node, world_spans = world > per_node;
  const bool grad_op = within_group(run.sharding.strategy) == ShardingStrategy::shard_grad_op;
  const int node_copy = run.sharding.backward_gather_size;
  // Parameter offload: a unit is gathered even where it is whole (one rank; no_shard, then planned as
  // full_shard: copied in and freed around each use, sharding/sharded_model.cpp), its rows copied into
  // the parameters at each gather.
  const bool offload_rows = offloads_parameters(run.sharding.offload);
  struct UnitComm {
    double gather_forward = 0, gather_backward = 0, reduce = 0;  // one of each
  };
  // One unit's collectives; its bytes counted `count` times (the decoder layers: L of them).
  const auto unit_comm = [&](double numel, double count) {
    UnitComm comm;
    if (run.sharding.strategy == ShardingStrategy::no_shard) {
      comm.reduce = collective("all_reduce", world, 4.0 * numel, world_spans, 2.0 * (world - 1), 4.0 * numel / world,
                               rate(world_spans));
      (world_spans ? estimate.inter_node_bytes : estimate.intra_node_bytes) += count * 2.0 * (world - 1) * 4.0 * numel / world;
      if (offload_rows) comm.gather_forward = comm.gather_backward = 2.0 * c * numel * compute.copy_seconds_per_byte * stretch;
      return comm;
    }
    const double shard = numel / S;
    // The staging copies: the gathered rows into the parameters, the gradients into the flat buffer
    // (none at S = 1, where the unit is whole on its rank, unless its parameters are offloaded).
    const double copy_rate = S > 1 || offload_rows ? compute.copy_seconds_per_byte * stretch : 0.0;
    const double copy_out = 2.0 * c * numel * copy_rate, copy_in = (c + 4.0) * numel * copy_rate;
    const auto gather = [&](double ranks, double rows, bool spans, double times) {
      (spans ? estimate.inter_node_bytes : estimate.intra_node_bytes) += count * times * (ranks - 1) * rows * c;
      return collective("all_gather", ranks, ranks * rows * c, spans, ranks - 1, rows * c, rate(spans)) + copy_out;
    };
    comm.gather_forward = gather(S, shard, group_spans, micro);
    if (!grad_op)
      comm.gather_backward = node_copy > 0 ? gather(node_copy, numel / node_copy, false, micro)
                                           : gather(S, shard, group_spans, micro);
    comm.reduce = collective("reduce_scatter", S, 4.0 * numel, group_spans, S - 1, 4.0 * shard, rate(group_spans)) + copy_in;
    (group_spans ? estimate.inter_node_bytes : estimate.intra_node_bytes) += count * (S - 1) * 4.0 * shard;
    if (is_hybrid(run.sharding.strategy) && G > 1) {  // the shard across the groups: 2 (G - 1) chunks of 1/G
      // Every rank of a node runs a ring of its own across the groups: between nodes they share the
      // node's link. Measured so (--collective_table_across: all the node's rings at once), the table's
      // time as it is: an all-reduce, or with the optimizer across the groups the reduce-scatter into
      // the world shard and the all-gather of the stepped shards. Else the table between nodes' or the
      // link's time, once for each of the node's ranks.
      std::optional<double> measured;
      if (world_spans && links.across_table != nullptr) {
        if (!run.sharding.optimizer_across_groups) {
          measured = links.across_table->seconds("all_reduce", 4.0 * shard, G);
        } else {
          const std::optional<double> scatter = links.across_table->seconds("reduce_scatter", 4.0 * shard, G);
          const std::optional<double> publish = links.across_table->seconds("all_gather", 4.0 * shard, G);
          if (scatter && publish) measured = *scatter + *publish;
        }
      }
      const double across_gbs = world_spans ? links.inter_gbs / per_node : links.intra_gbs;
      comm.reduce += measured ? *measured
                              : collective("all_reduce", G, 4.0 * shard, world_spans, 2.0 * (G - 1), 4.0 * shard / G,
                                           across_gbs, world_spans ? per_node : 1.0);
      (world_spans ? estimate.inter_node_bytes : estimate.intra_node_bytes) += count * 2.0 * (G - 1) * 4.0 * shard / G;
    }
    return comm;
  };
  const UnitComm embed = unit_comm(sizes.embed, 1), layer = unit_comm(sizes.layer, layers), head = unit_comm(sizes.head, 1);
  // A unit's collectives a step: its gathers and its reduction (hybrid's across the groups besides).
  if (S > 1 || run.sharding.strategy == ShardingStrategy::no_shard) {
    const double per_unit = run.sharding.strategy == ShardingStrategy::no_shard
                                ? 1.0
                                : micro * (grad_op ? 1.0 : 2.0) + 1.0 + (is_hybrid(run.sharding.strategy) && G > 1 ? 1.0 : 0.0);
    estimate.collectives = per_unit * (layers + 2);
  }
  const double gathers = micro * (embed.gather_forward + embed.gather_backward + layers * (layer.gather_forward + layer.gather_backward) +
                                  head.gather_forward + head.gather_backward);
  const double reduces = embed.reduce + layers * layer.reduce + head.reduce;
  estimate.collective_seconds = gathers + reduces;
  double exposed = estimate.collective_seconds;
  // Parameter offload: every gather's rows come in over PCIe first, and the optimizer on the device
  // sends the updated rows out once.
  double parameter_copies = 0;
  if (cuda && offload_rows) {  // on a CPU rank the host shard is the gather's own send buffer: no copy
    const double rows = c * static_cast<double>(model.num_parameters()) / S;
    parameter_copies = (micro * (grad_op ? 1.0 : 2.0) + (offloads_optimizer(run.sharding.offload) ? 0.0 : 1.0)) * rows /
                       (pcie_gbs * 1e9);
  }
  if (cuda && run.sharding.prefetch) {
    // The first gather of each pass is waited for; each later one hides behind the unit before it,
    // each reduction behind the unit after it (the last unit's is waited for at the step's end).
    const auto hidden = [](double comm, double behind) { return std::max(0.0, comm - behind); };
    exposed = micro * (embed.gather_forward + hidden(layer.gather_forward, compute.embed.forward) +
                       (layers - 1) * hidden(layer.gather_forward, compute.layer.forward) +
                       hidden(head.gather_forward, compute.layer.forward) + head.gather_backward +
                       hidden(layer.gather_backward, compute.head.backward) +
                       (layers - 1) * hidden(layer.gather_backward, compute.layer.backward) +
                       hidden(embed.gather_backward, compute.layer.backward)) +
              hidden(head.reduce, compute.layer.backward) + layers * hidden(layer.reduce, compute.layer.backward) + embed.reduce;
  }
  exposed += parameter_copies + estimate.collectives * links.wait_seconds;

  // The optimizer over this rank's rows.
  const int optimizer_ranks = run.sharding.optimizer_across_groups ? world : S;
  const double rows = static_cast<double>(model.num_parameters()) / optimizer_ranks;
  double optimizer = rows * compute.optimizer_seconds_per_element;
  if (offloads_optimizer(run.sharding.offload)) {
    const bool bf16_state = run.optimizer.state_dtype == "bfloat16";
    // A byte between device and host memory: over PCIe on CUDA; on a CPU rank both are the same
    // memory, and the byte is read and written by a copy at the measured copy rate.
    const double host_byte = cuda ? 1.0 / (pcie_gbs * 1e9) : 2.0 * compute.copy_seconds_per_byte;
    if (run.sharding.offload_step == OffloadStep::device)  // master and moments in and out, the kernel between
      optimizer += rows * 2.0 * (4.0 + (bf16_state ? 4.0 : 8.0)) * host_byte;
    else if (cuda)  // the gradient shard in, the updated rows out, the step at the host's rate
      optimizer = rows * ((4.0 + c) * host_byte + (bf16_state ? 20.0 : 28.0) / (host_gbs * 1e9));
    else  // the same copies, and the same kernel as without offload (on a worker thread)
      optimizer += rows * (4.0 + c) * host_byte;
  }
  // The loss's average and the gradient norm's sum over the ranks: a one-element all-reduce each.
  const double other =
      world > 1 ? 2.0 * collective("all_reduce", world, 4.0, world_spans, 2.0 * (world - 1), 4.0, rate(world_spans)) : 0.0;

  estimate.phases = {micro * forward * stretch, micro * backward * stretch, exposed, optimizer * stretch, other};
  for (double seconds : estimate.phases) estimate.step_seconds += seconds;
  estimate.tokens_per_second =
      static_cast<double>(run.data.total_batch_size * run.data.max_length) / std::max(1e-12, estimate.step_seconds);
  return estimate;
}

StepTimeEstimate predict_step_time(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options,
                                   const std::string& device, ComputeRatesCache* cache) {
  const bool cuda = device == "cuda";
  const int world = options.world_size;
  const int per_node = options.ranks_per_node > 0 ? std::min(options.ranks_per_node, world) : world;
  const int cores = options.host_cores > 0 ? options.host_cores : cores_available();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int threads = omp != nullptr && std::atoi(omp) > 0 ? std::atoi(omp)
                      : cuda                                ? 1
                                                            : std::max(1, cores / per_node);
  ComputeRates compute;
  // --profile times this machine's device: a CUDA estimate profiled on a machine without a GPU is the
  // user's mistake, said as one (ATen's "no CUDA backend" and its stack were what came before).
  LLM_REQUIRE(options.profile_seconds <= 0 || !cuda || visible_gpu_count() > 0, "command line", "--profile",
              "times the units on this machine's device, and this machine has no CUDA device for a --device cuda "
              "estimate: run the estimate where the GPU is, or give the device's rate instead (--device_tflops T)");
  if (options.profile_seconds > 0) {
    const std::string key = std::to_string(run.data.batch_size) + "x" + std::to_string(run.data.max_length) + " " +
                            to_string(run.precision.dtype) + " " + to_string(run.precision.mode);
    // The file only where this process has not profiled those units yet (--fit asks once a candidate).
    const std::string kept_key = profile_cache_key(model, run, device, threads, options.profile_seconds);
    const bool in_process = cache != nullptr && cache->count(key) > 0;
    std::optional<ComputeRates> kept;
    if (!in_process && !options.profile_cache.empty()) kept = read_profile_cache(options.profile_cache, kept_key);
    if (in_process) {
      compute = cache->at(key);
    } else if (kept) {
      compute = *kept;
      compute.source += " (kept in " + options.profile_cache + ")";
      log::info("step time: the units at a micro-batch of {} x {} as profiled before ({})", run.data.batch_size,
                run.data.max_length, options.profile_cache);
      if (cache != nullptr) cache->emplace(key, compute);
    } else {
      log::info("step time: timing the units at a micro-batch of {} x {} for {} s (--profile)", run.data.batch_size,
                run.data.max_length, options.profile_seconds);
      compute = profile_compute(model, run, cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU),
                                options.profile_seconds, threads);
      if (!options.profile_cache.empty()) write_profile_cache(options.profile_cache, kept_key, compute);
      if (cache != nullptr) cache->emplace(key, compute);
    }
  } else
    compute = declared_compute(model, run, options.device_tflops > 0 ? options.device_tflops : cuda ? 200.0 : 0.07,
                               cuda ? 3000.0 : 5.0);
  compute.threads = threads;
  LinkRates links;
  links.intra_gbs = options.intra_node_gbs > 0 ? options.intra_node_gbs : cuda ? 150.0 : 2.0;
  links.inter_gbs = options.inter_node_gbs;
  links.latency_seconds = (options.link_latency_us > 0 ? options.link_latency_us : cuda ? 10.0 : 20.0) * 1e-6;
  links.ranks_per_node = options.ranks_per_node;
  links.wait_seconds = world > 1 ? options.collective_wait_us * 1e-6 : 0.0;
  if (!options.collective_table.empty()) links.intra_table = &load_collective_table(options.collective_table);
  if (!options.collective_table_between.empty())
    links.inter_table = &load_collective_table(options.collective_table_between, "--collective_table_between");
  if (!options.collective_table_across.empty())
    links.across_table = &load_collective_table(options.collective_table_across, "--collective_table_across");
  char text[256];
  std::snprintf(text, sizeof(text), "%g GB/s inside a node (%s), %g GB/s between nodes (--inter_node_gbs), %g us a ring step (%s)",
                links.intra_gbs, options.intra_node_gbs > 0 ? "--intra_node_gbs" : "the default", links.inter_gbs,
                links.latency_seconds * 1e6, options.link_latency_us > 0 ? "--link_latency_us" : "the default");
  links.source = text;
  if (links.wait_seconds > 0) {
    std::snprintf(text, sizeof(text), "; %g us a collective waiting for the last rank (--collective_wait_us)",
                  options.collective_wait_us);
    links.source += text;
  }
  if (links.intra_table != nullptr)
    links.source += "; inside a node the collectives measured in " + links.intra_table->source + " (--collective_table)";
  if (links.inter_table != nullptr)
    links.source += "; across nodes the collectives measured in " + links.inter_table->source + " (--collective_table_between)";
  if (links.across_table != nullptr)
    links.source += "; hybrid's rings across the groups measured in " + links.across_table->source + " (--collective_table_across)";
  if (cuda) {
    std::snprintf(text, sizeof(text), "; offload: PCIe at %g GB/s (--pcie_gbs), the host step at %g GB/s (%s)", options.pcie_gbs,
                  fit_host_gbs(options, world),
                  options.host_gbs > 0 ? "--host_gbs" : "8 GB/s per core of the rank's share of the node, --host_cores");
    links.source += text;
  }
  return estimate_step_time(model, run, world, device, compute, links, cuda ? 0 : cores, fit_host_gbs(options, world),
                            options.pcie_gbs);
}

nlohmann::json StepTimeEstimate::to_json() const {
  nlohmann::json by_phase;
  for (int p = 0; p < kPredictedPhases; ++p) by_phase[predicted_phase_name(p)] = phases[static_cast<size_t>(p)];
  return {{"step_seconds", step_seconds},          {"tokens_per_second", tokens_per_second},
          {"phase_s", by_phase},                   {"collective_seconds", collective_seconds},
          {"collectives", collectives},
          {"inter_node_bytes", inter_node_bytes},  {"intra_node_bytes", intra_node_bytes},
          {"compute_source", compute_source},      {"link_source", link_source}};
}

std::string step_time_section(const StepTimeEstimate& estimate, const RunConfig& run, int world) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "\nStep time (predicted, memory/step_time.h): %.4g s a step, %.4g tokens/s over %d rank(s).\n",
                estimate.step_seconds, estimate.tokens_per_second, world);
  out << line << "Compute: " << estimate.compute_source << ". Links: " << estimate.link_source << ".\n\n"
      << "| phase | seconds | share |\n|---|---:|---:|\n";
  for (int p = 0; p < kPredictedPhases; ++p) {
    const double seconds = estimate.phases[static_cast<size_t>(p)];
    std::snprintf(line, sizeof(line), "| %s | %.4g | %.1f %% |\n", predicted_phase_name(p), seconds,
                  100.0 * seconds / std::max(1e-12, estimate.step_seconds));
    out << line;
  }
  std::snprintf(line, sizeof(line),
                "\nCollectives: %.4g s in all, %.4g s of it exposed; %.4g MB a step inside the node, %.4g MB between nodes "
                "(this rank's; --sharding %s).\n",
                estimate.collective_seconds, estimate.phases[2], estimate.intra_node_bytes / 1e6,
                estimate.inter_node_bytes / 1e6, to_string(run.sharding.strategy));
  out << line;
  return out.str();
}

}  // namespace llm
