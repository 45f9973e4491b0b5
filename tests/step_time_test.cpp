// The step-time model (memory/step_time.h) on given rates: its phases add up to the step, its bytes
// are the sharding's (the formulas of docs/sharding.md), hybrid sends about 1/S of full_shard's between
// nodes, a faster link shortens exactly the collectives, CUDA's overlap hides only what compute
// covers; and `trainer estimate` prints it when asked, measured (--profile) or declared, in
// seconds at 65536 ranks. No assertion on this machine's speed: the validation is a script
// (launch/step_time_table.sh, docs/step_time.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/device.h"
#include "config/config.h"
#include "memory/collective_table.h"
#include "memory/step_time.h"
#include "model/model_config.h"
#include "tests/test_util.h"

namespace llm::step_time_test {
namespace {

ModelConfig micro() { return load_model_config((testing::source_dir() / "configs/llama_micro.json").string()); }

RunConfig run_with(ShardingStrategy sharding, int group = 0, int micro_batches = 2) {
  RunConfig run;
  run.data.batch_size = 2;
  run.data.max_length = 32;
  run.data.gradient_accumulation = micro_batches;
  run.data.total_batch_size = 2 * micro_batches * 8;
  run.sharding.strategy = sharding;
  run.sharding.group_size = group;
  return run;
}

ComputeRates rates() {
  ComputeRates compute;
  compute.embed = {0.001, 0.002};
  compute.layer = {0.010, 0.020};
  compute.head = {0.004, 0.008};
  compute.optimizer_seconds_per_element = 1e-9;
  compute.source = "given";
  return compute;
}

LinkRates links(double intra, double inter, double latency, int per_node) {
  LinkRates rates;
  rates.intra_gbs = intra;
  rates.inter_gbs = inter;
  rates.latency_seconds = latency;
  rates.ranks_per_node = per_node;
  return rates;
}

TEST(StepTime, PhasesAddUpToTheStepAndTheComputeIsEveryUnitsAMicroBatch) {
  const ModelConfig model = micro();
  const RunConfig run = run_with(ShardingStrategy::full_shard);
  const StepTimeEstimate estimate = estimate_step_time(model, run, 8, "cpu", rates(), links(1, 1, 0, 8), 0, 1, 1);
  double sum = 0;
  for (double seconds : estimate.phases) sum += seconds;
  EXPECT_DOUBLE_EQ(sum, estimate.step_seconds);
  const double layers = static_cast<double>(model.num_hidden_layers);
  EXPECT_NEAR(estimate.phases[0], 2 * (0.001 + layers * 0.010 + 0.004), 1e-12);  // two micro-batches
  EXPECT_NEAR(estimate.phases[1], 2 * (0.002 + layers * 0.020 + 0.008), 1e-12);
  EXPECT_NEAR(estimate.tokens_per_second, 32.0 * 32 / estimate.step_seconds, 1e-6);
  // On a CPU every collective is in line: all of it exposed.
  EXPECT_DOUBLE_EQ(estimate.phases[2], estimate.collective_seconds);
}

TEST(StepTime, BytesAreTheShardingsAndHybridSendsAboutOneSthBetweenNodes) {
  const ModelConfig model = micro();
  const double P = static_cast<double>(model.num_parameters());
  // full_shard over 4 ranks on one node: each unit gathered 2 M times in fp32 and reduce-scattered once,
  // (S - 1)(2 M + 1) shards of 4 P / S bytes.
  const StepTimeEstimate flat = estimate_step_time(model, run_with(ShardingStrategy::full_shard), 4, "cpu", rates(), links(1, 1, 0, 4), 0, 1, 1);
  EXPECT_NEAR(flat.intra_node_bytes, 3.0 * 5 * 4 * P / 4, 1e-6 * P);
  EXPECT_EQ(flat.inter_node_bytes, 0);
  // 2 nodes of 4, a node's link out 10 times slower than inside it: full_shard's ring crosses the
  // nodes, hybrid's groups of a node send only the shard's all-reduce across: 2 (G - 1) / G x 4 P / S
  // (the node's 4 rings sharing its link).
  const StepTimeEstimate spans = estimate_step_time(model, run_with(ShardingStrategy::full_shard), 8, "cpu", rates(), links(10, 1, 0, 4), 0, 1, 1);
  const StepTimeEstimate hybrid =
      estimate_step_time(model, run_with(ShardingStrategy::hybrid_shard, 4), 8, "cpu", rates(), links(10, 1, 0, 4), 0, 1, 1);
  EXPECT_NEAR(spans.inter_node_bytes, 7.0 * 5 * 4 * P / 8, 1e-6 * P);
  EXPECT_NEAR(hybrid.inter_node_bytes, 2.0 * 1 * 4 * P / 4 / 2, 1e-6 * P);
  EXPECT_LT(hybrid.inter_node_bytes, spans.inter_node_bytes / 4);
  EXPECT_LT(hybrid.step_seconds, spans.step_seconds);
}

TEST(StepTime, AFasterLinkShortensOnlyTheCollectives) {
  const ModelConfig model = micro();
  const RunConfig run = run_with(ShardingStrategy::shard_grad_op);
  const StepTimeEstimate slow = estimate_step_time(model, run, 4, "cpu", rates(), links(1, 1, 0, 4), 0, 1, 1);
  const StepTimeEstimate fast = estimate_step_time(model, run, 4, "cpu", rates(), links(2, 2, 0, 4), 0, 1, 1);
  EXPECT_NEAR(fast.collective_seconds, slow.collective_seconds / 2, 1e-12);  // no latency: bandwidth alone
  for (int phase : {0, 1, 3}) EXPECT_DOUBLE_EQ(fast.phases[phase], slow.phases[phase]) << predicted_phase_name(phase);
}

TEST(StepTime, OnCudaPrefetchHidesWhatComputeCoversAndNoMore) {
  const ModelConfig model = micro();
  RunConfig run = run_with(ShardingStrategy::full_shard);
  const StepTimeEstimate cpu = estimate_step_time(model, run, 4, "cpu", rates(), links(0.001, 0.001, 0, 4), 0, 1, 1);
  const StepTimeEstimate hidden = estimate_step_time(model, run, 4, "cuda", rates(), links(100, 100, 0, 4), 0, 1, 1);
  const StepTimeEstimate exposed = estimate_step_time(model, run, 4, "cuda", rates(), links(0.001, 0.001, 0, 4), 0, 1, 1);
  EXPECT_LT(hidden.phases[2], hidden.collective_seconds / 2);     // a fast link: mostly behind compute
  EXPECT_LT(exposed.phases[2], exposed.collective_seconds);       // a slow one: some hidden ...
  EXPECT_GT(exposed.phases[2], exposed.collective_seconds * 0.5);  // ... most of it not
  EXPECT_DOUBLE_EQ(cpu.collective_seconds, exposed.collective_seconds);
  run.sharding.prefetch = false;
  const StepTimeEstimate in_line = estimate_step_time(model, run, 4, "cuda", rates(), links(100, 100, 0, 4), 0, 1, 1);
  EXPECT_DOUBLE_EQ(in_line.phases[2], in_line.collective_seconds);
}

TEST(StepTime, OversubscribedCpuRanksShareTheCores) {
  const ModelConfig model = micro();
  ComputeRates compute = rates();
  compute.threads = 1;
  const RunConfig run = run_with(ShardingStrategy::full_shard);
  const StepTimeEstimate alone = estimate_step_time(model, run, 2, "cpu", compute, links(1, 1, 0, 2), 2, 1, 1);
  const StepTimeEstimate shared = estimate_step_time(model, run, 4, "cpu", compute, links(1, 1, 0, 4), 2, 1, 1);
  EXPECT_NEAR(shared.phases[0], 2 * alone.phases[0], 1e-12);
}

// The measured table (memory/collective_table.h): exact at its rows, a power law between them, the
// smallest's time below, the largest's bandwidth above, and another rank count at the same bus
// bandwidth; a collective it lacks is none (the ring model takes it).
TEST(CollectiveTable, InterpolatesLogLogAndKeepsTheBusBandwidthAcrossRankCounts) {
  const CollectiveTable table = parse_collective_table(
      "{\"collective\": \"all_gather\", \"bytes\": 4096, \"ranks\": 4, \"seconds\": 4e-5}\n"
      "\n"
      "{\"collective\": \"all_gather\", \"bytes\": 1024, \"ranks\": 4, \"seconds\": 1e-5, \"wrong\": 0}\n"
      "{\"collective\": \"all_gather\", \"bytes\": 16384, \"ranks\": 4, \"seconds\": 6.4e-4}\n",
      "table.jsonl");
  EXPECT_EQ(table.ranks, 4);
  EXPECT_DOUBLE_EQ(*table.seconds("all_gather", 1024, 4), 1e-5);
  EXPECT_DOUBLE_EQ(*table.seconds("all_gather", 4096, 4), 4e-5);
  EXPECT_NEAR(*table.seconds("all_gather", 2048, 4), 2e-5, 1e-15);          // linear between 1 and 4 KiB
  EXPECT_NEAR(*table.seconds("all_gather", 8192, 4), 1.6e-4, 1e-15);        // t ~ b^2 between 4 and 16 KiB
  EXPECT_DOUBLE_EQ(*table.seconds("all_gather", 16, 4), 1e-5);              // below: the latency floor
  EXPECT_NEAR(*table.seconds("all_gather", 65536, 4), 4 * 6.4e-4, 1e-15);   // above: the last bandwidth
  EXPECT_NEAR(*table.seconds("all_gather", 4096, 2), 4e-5 * 0.5 / 0.75, 1e-15);
  EXPECT_DOUBLE_EQ(*table.seconds("all_gather", 4096, 1), 0.0);
  EXPECT_FALSE(table.seconds("reduce_scatter", 4096, 4).has_value());
  EXPECT_NE(table.source.find("table.jsonl (4 ranks: all_gather 1024-16384 B)"), std::string::npos) << table.source;
}

// A table of `ranks` ranks at one bus bandwidth, every size from 4 bytes to 10 GB.
std::string flat_rows(double gbs_bytes, int ranks = 4) {
  const double N = ranks;
  std::string rows;
  for (double bytes = 4; bytes <= 1e10; bytes *= 4)
    for (const char* kind : {"all_gather", "reduce_scatter", "all_reduce"}) {
      const double factor = std::string(kind) == "all_reduce" ? 2 * (N - 1) / N : (N - 1) / N;
      char line[200];
      std::snprintf(line, sizeof(line), "{\"collective\": \"%s\", \"bytes\": %.0f, \"ranks\": %d, \"seconds\": %.17g}\n",
                    kind, bytes, ranks, bytes * factor / gbs_bytes);
      rows += line;
    }
  return rows;
}

// A table of one bus bandwidth B at every size is the ring at B with no latency: the same collectives to
// the rounding, for each strategy on one node. The table inside a node takes no ring that spans nodes;
// the table between nodes takes those, hybrid's rings across the groups once for each rank of a node
// sharing its link, as the ring model's per-rank share of the link. A slower table is exactly slower.
TEST(StepTime, MeasuredCollectivesReplaceTheRingsInsideAndBetweenNodes) {
  const ModelConfig model = micro();
  const double B = 2e9;
  const std::string rows = flat_rows(B);
  const CollectiveTable table = parse_collective_table(rows, "flat.jsonl");
  for (const RunConfig& run : {run_with(ShardingStrategy::full_shard), run_with(ShardingStrategy::shard_grad_op),
                               run_with(ShardingStrategy::no_shard), run_with(ShardingStrategy::hybrid_shard, 2)}) {
    LinkRates measured = links(0.001, 0.001, 1.0, 4);  // the ring's own rates would be far slower
    measured.intra_table = &table;
    const StepTimeEstimate ring = estimate_step_time(model, run, 4, "cpu", rates(), links(B / 1e9, 1, 0, 4), 0, 1, 1);
    const StepTimeEstimate from_table = estimate_step_time(model, run, 4, "cpu", rates(), measured, 0, 1, 1);
    EXPECT_NEAR(from_table.collective_seconds, ring.collective_seconds, 1e-9 * ring.collective_seconds)
        << to_string(run.sharding.strategy);
    EXPECT_GT(from_table.collective_seconds, 0) << to_string(run.sharding.strategy);
    EXPECT_EQ(from_table.intra_node_bytes, ring.intra_node_bytes);
  }
  // 2 nodes of 4: full_shard's rings span the nodes, so the table inside a node takes none of them.
  LinkRates spanning = links(3, 0.5, 1e-5, 4);
  const StepTimeEstimate ring = estimate_step_time(model, run_with(ShardingStrategy::full_shard), 8, "cpu", rates(), spanning, 0, 1, 1);
  spanning.intra_table = &table;
  const StepTimeEstimate with_table = estimate_step_time(model, run_with(ShardingStrategy::full_shard), 8, "cpu", rates(), spanning, 0, 1, 1);
  EXPECT_DOUBLE_EQ(with_table.collective_seconds, ring.collective_seconds);
  // The table between nodes takes them: at B between and 10 B inside, the same as the rings at those
  // rates, hybrid's rings across the groups included (4 of them sharing a node's link).
  for (const RunConfig& run : {run_with(ShardingStrategy::full_shard), run_with(ShardingStrategy::hybrid_shard, 4),
                               run_with(ShardingStrategy::hybrid_shard, 2), run_with(ShardingStrategy::no_shard)}) {
    const StepTimeEstimate rings = estimate_step_time(model, run, 8, "cpu", rates(), links(10 * B / 1e9, B / 1e9, 0, 4), 0, 1, 1);
    LinkRates both = links(0.001, 0.001, 1.0, 4);
    both.inter_table = &table;
    const CollectiveTable inside = parse_collective_table(flat_rows(10 * B), "inside.jsonl");
    both.intra_table = &inside;
    const StepTimeEstimate tables = estimate_step_time(model, run, 8, "cpu", rates(), both, 0, 1, 1);
    EXPECT_NEAR(tables.collective_seconds, rings.collective_seconds, 1e-9 * rings.collective_seconds)
        << to_string(run.sharding.strategy) << " " << run.sharding.group_size;
    EXPECT_GT(tables.inter_node_bytes, 0);
  }
  // Every row twice as slow: the collectives inside the node take twice as long.
  const CollectiveTable slow = parse_collective_table(
      [&] {
        std::string doubled;
        std::istringstream in(rows);
        for (std::string line; std::getline(in, line);) {
          nlohmann::json row = nlohmann::json::parse(line);
          row["seconds"] = 2 * row["seconds"].get<double>();
          doubled += row.dump() + "\n";
        }
        return doubled;
      }(),
      "slow.jsonl");
  LinkRates fast_rates = links(1, 1, 0, 4), slow_rates = links(1, 1, 0, 4);
  fast_rates.intra_table = &table;
  slow_rates.intra_table = &slow;
  const RunConfig run = run_with(ShardingStrategy::full_shard);
  EXPECT_NEAR(estimate_step_time(model, run, 4, "cpu", rates(), slow_rates, 0, 1, 1).collective_seconds,
              2 * estimate_step_time(model, run, 4, "cpu", rates(), fast_rates, 0, 1, 1).collective_seconds, 1e-12);
}

// `rows` with the seconds of `kind`'s rows times `factor`.
std::string scaled(const std::string& rows, const std::string& kind, double factor) {
  std::string out;
  std::istringstream in(rows);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (row["collective"] == kind) row["seconds"] = factor * row["seconds"].get<double>();
    out += row.dump() + "\n";
  }
  return out;
}

// Hybrid's rings across the groups, 2 nodes of 2 (groups of 2, one per node, 2 groups): measured with
// both of a node's rings at once (--collective_table_across), they take that table's times as they are.
// At the bus bandwidth the table between nodes shares among a node's ranks (B / 2), the same step; each
// row's time counted once per unit and step (doubling the all-reduce's rows adds exactly what they
// held); with the optimizer across the groups the reduce-scatter's and the all-gather's rows instead;
// no other strategy and no run on one node reads it.
TEST(StepTime, HybridsRingsAcrossTheGroupsTakeTheTableMeasuredWithTheNodesRingsAtOnce) {
  const ModelConfig model = micro();
  const double B = 2e9;
  const CollectiveTable between = parse_collective_table(flat_rows(B), "between.jsonl");
  const std::string across_rows = flat_rows(B / 2, 2);
  const CollectiveTable across = parse_collective_table(across_rows, "across.jsonl");
  const auto step = [&](const RunConfig& run, const CollectiveTable* table, int per_node = 2) {
    LinkRates rates_given = links(100, 0.001, 0, per_node);  // the ring's own rate between nodes far slower
    rates_given.inter_table = &between;
    rates_given.across_table = table;
    return estimate_step_time(model, run, 4, "cpu", rates(), rates_given, 0, 1, 1);
  };
  RunConfig across_optimizer = run_with(ShardingStrategy::hybrid_shard, 2);
  across_optimizer.sharding.optimizer_across_groups = true;
  for (const RunConfig& run : {run_with(ShardingStrategy::hybrid_shard, 2), run_with(ShardingStrategy::hybrid_shard_grad_op, 2),
                               across_optimizer}) {
    const std::string name = std::string(to_string(run.sharding.strategy)) +
                             (run.sharding.optimizer_across_groups ? " across" : "");
    const StepTimeEstimate shared = step(run, nullptr), measured = step(run, &across);
    EXPECT_NEAR(measured.collective_seconds, shared.collective_seconds, 1e-9 * shared.collective_seconds) << name;
    EXPECT_EQ(measured.inter_node_bytes, shared.inter_node_bytes) << name;
    // What the units' across collectives took from the table, by doubling their rows.
    const std::vector<const char*> kinds = run.sharding.optimizer_across_groups
                                               ? std::vector<const char*>{"reduce_scatter", "all_gather"}
                                               : std::vector<const char*>{"all_reduce"};
    double taken = 0;
    for (const char* kind : kinds) {
      const CollectiveTable doubled = parse_collective_table(scaled(across_rows, kind, 2.0), "doubled.jsonl");
      const double grown = step(run, &doubled).collective_seconds - measured.collective_seconds;
      EXPECT_GT(grown, 0) << name << " " << kind;
      taken += grown;
    }
    // Each unit's shard (numel / 2, fp32) at the table's bus bandwidth B / 2: an all-reduce of b bytes
    // over 2 ranks 2 b / B, a reduce-scatter and an all-gather b / B each; all units, 4 P / B.
    EXPECT_NEAR(taken, 4.0 * static_cast<double>(model.num_parameters()) / B, 1e-9 * taken) << name;
    // The kinds it does not make leave it unchanged: every row but theirs doubled.
    std::string others = across_rows;
    for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"})
      if (std::find_if(kinds.begin(), kinds.end(), [&](const char* k) { return std::string(k) == kind; }) == kinds.end())
        others = scaled(others, kind, 2.0);
    const CollectiveTable other_rows = parse_collective_table(others, "others.jsonl");
    EXPECT_DOUBLE_EQ(step(run, &other_rows).collective_seconds, measured.collective_seconds) << name;
  }
  // full_shard and no_shard make no collective across groups; hybrid on one node runs them inside it.
  const CollectiveTable slow = parse_collective_table(scaled(scaled(scaled(across_rows, "all_reduce", 50), "all_gather", 50),
                                                             "reduce_scatter", 50), "slow.jsonl");
  for (const RunConfig& run : {run_with(ShardingStrategy::full_shard), run_with(ShardingStrategy::no_shard)})
    EXPECT_DOUBLE_EQ(step(run, &slow).collective_seconds, step(run, nullptr).collective_seconds) << to_string(run.sharding.strategy);
  EXPECT_DOUBLE_EQ(step(run_with(ShardingStrategy::hybrid_shard, 2), &slow, 4).collective_seconds,
                   step(run_with(ShardingStrategy::hybrid_shard, 2), nullptr, 4).collective_seconds);
  EXPECT_GT(step(run_with(ShardingStrategy::hybrid_shard, 2), &slow).collective_seconds,
            2 * step(run_with(ShardingStrategy::hybrid_shard, 2), nullptr).collective_seconds);
}

// Each collective waits for the last rank (--collective_wait_us): the exposed collectives grow by the
// step's collectives times the wait, nothing else does.
TEST(StepTime, EachCollectiveWaitsForTheLastRank) {
  const ModelConfig model = micro();
  for (const RunConfig& run : {run_with(ShardingStrategy::full_shard), run_with(ShardingStrategy::no_shard)}) {
    LinkRates waiting = links(1, 1, 0, 4);
    waiting.wait_seconds = 1e-3;
    const StepTimeEstimate plain = estimate_step_time(model, run, 4, "cpu", rates(), links(1, 1, 0, 4), 0, 1, 1);
    const StepTimeEstimate waited = estimate_step_time(model, run, 4, "cpu", rates(), waiting, 0, 1, 1);
    EXPECT_GT(plain.collectives, 0);
    EXPECT_NEAR(waited.phases[2] - plain.phases[2], plain.collectives * 1e-3, 1e-12) << to_string(run.sharding.strategy);
    EXPECT_NEAR(waited.step_seconds - plain.step_seconds, plain.collectives * 1e-3, 1e-12);
  }
}

// A sharded unit's gather copies the gathered rows into the parameters (2 c bytes a parameter) and its
// reduction copies the gradients into the flat buffer it sends ((c + 4) bytes), at the measured copy
// rate, stretched as compute on an oversubscribed CPU; no_shard's fp32 gradients are the shard (none).
TEST(StepTime, GathersAndReductionsCostTheirStagingCopies) {
  const ModelConfig model = micro();
  const double P = static_cast<double>(model.num_parameters());
  ComputeRates copying = rates();
  copying.copy_seconds_per_byte = 1e-10;
  copying.threads = 1;
  const auto extra = [&](const RunConfig& run, int cores) {
    return estimate_step_time(model, run, 4, "cpu", copying, links(1, 1, 0, 4), cores, 1, 1).collective_seconds -
           estimate_step_time(model, run, 4, "cpu", rates(), links(1, 1, 0, 4), cores, 1, 1).collective_seconds;
  };
  // fp32 (c = 4), two micro-batches: full_shard gathers each unit 2 x 2 times, shard_grad_op 2 times.
  EXPECT_NEAR(extra(run_with(ShardingStrategy::full_shard), 0), (2 * 2 * 8 + 8) * P * 1e-10, 1e-9 * P * 1e-10);
  EXPECT_NEAR(extra(run_with(ShardingStrategy::shard_grad_op), 0), (2 * 8 + 8) * P * 1e-10, 1e-9 * P * 1e-10);
  EXPECT_NEAR(extra(run_with(ShardingStrategy::hybrid_shard, 2), 0), (2 * 2 * 8 + 8) * P * 1e-10, 1e-9 * P * 1e-10);
  EXPECT_DOUBLE_EQ(extra(run_with(ShardingStrategy::no_shard), 0), 0.0);
  // 4 ranks of one thread on 2 cores: twice as long.
  EXPECT_NEAR(extra(run_with(ShardingStrategy::full_shard), 2), 2 * (2 * 2 * 8 + 8) * P * 1e-10, 1e-9 * P * 1e-10);
}

// On CUDA the offload modes cost their copies: the parameters' rows in over PCIe at every gather (and
// out once with the optimizer on the device), counted with the collectives; the optimizer stepped on
// the host or, with --offload_step device, master and moments both ways over PCIe beside the kernel.
TEST(StepTime, OffloadCostsItsCopiesOverPcieOnCuda) {
  const ModelConfig model = micro();
  const double P = static_cast<double>(model.num_parameters()), pcie = 10, host = 5;
  RunConfig run = run_with(ShardingStrategy::full_shard);  // 2 micro-batches, fp32 compute (c = 4)
  const auto step = [&](const RunConfig& r) { return estimate_step_time(model, r, 4, "cuda", rates(), links(100, 100, 0, 4), 0, host, pcie); };
  const StepTimeEstimate resident = step(run);
  run.sharding.offload = Offload::parameters;
  const StepTimeEstimate parameters = step(run);
  EXPECT_NEAR(parameters.phases[2] - resident.phases[2], (2 * 2 + 1) * 4 * P / 4 / (pcie * 1e9), 1e-12);
  run.sharding.offload = Offload::optimizer;
  const StepTimeEstimate host_step = step(run);
  EXPECT_NEAR(host_step.phases[3], P / 4 * ((4 + 4) / (pcie * 1e9) + 28 / (host * 1e9)), 1e-12);
  run.sharding.offload_step = OffloadStep::device;
  const StepTimeEstimate device_step = step(run);
  EXPECT_NEAR(device_step.phases[3] - resident.phases[3], P / 4 * 2 * (4 + 8) / (pcie * 1e9), 1e-12);
  for (int phase : {0, 1}) EXPECT_DOUBLE_EQ(device_step.phases[phase], resident.phases[phase]);
}

// On a CPU rank host and device memory are one: offload's copies are copies in memory, each byte read
// and written at the measured copy rate (no PCIe), and a whole unit with its parameters offloaded is
// gathered (its rows copied into the parameters) at each use.
TEST(StepTime, OffloadCostsItsCopiesAtTheCopyRateOnACpu) {
  const ModelConfig model = micro();
  const double P = static_cast<double>(model.num_parameters()), copy = 1e-10;
  ComputeRates compute = rates();
  compute.copy_seconds_per_byte = copy;
  const auto step = [&](const RunConfig& r, int world) { return estimate_step_time(model, r, world, "cpu", compute, links(100, 100, 0, world), 0, 5, 10); };
  const auto near = [](double got, double want) { EXPECT_NEAR(got, want, 1e-9 * want) << got << " against " << want; };
  RunConfig run = run_with(ShardingStrategy::full_shard);  // 2 micro-batches, fp32 compute (c = 4)
  const StepTimeEstimate whole = step(run, 1);
  EXPECT_EQ(whole.phases[2], 0);  // one rank, resident units: nothing gathered, nothing copied
  run.sharding.offload = Offload::parameters;
  // 2 micro-batches x 2 gathers (4 B a parameter read and written), the reduction's copy of the gradients (4 B in, 4 out)
  near(step(run, 1).phases[2], (2 * 2 * (2 * 4 * P) + (4 + 4) * P) * copy);
  run.sharding.offload = Offload::optimizer;
  near(step(run, 1).phases[3] - whole.phases[3], P * (4 + 4) * 2 * copy);  // the gradient in, the rows out
  run.sharding.offload_step = OffloadStep::device;
  near(step(run, 1).phases[3] - whole.phases[3], P * 2 * (4 + 8) * 2 * copy);  // master and moments in and out
  // no_shard with its parameters offloaded is planned as full_shard: each use's rows copied in.
  RunConfig replicated = run_with(ShardingStrategy::no_shard);
  const StepTimeEstimate kept = step(replicated, 4);
  replicated.sharding.offload = Offload::parameters;
  near(step(replicated, 4).phases[2] - kept.phases[2], 2 * 2 * (2 * 4 * P) * copy);
}

std::string estimate_command(const std::string& flags) {
  return testing::trainer_binary().string() + " estimate --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --max_length 32 --batch_size 2 " + flags;
}

TEST(StepTimeCommand, MeasuredOrDeclaredAndInSecondsAt65536Ranks) {
  const testing::CommandResult profiled = testing::run_command(estimate_command("--world_size 2 --profile 0.5 --json"));
  ASSERT_EQ(profiled.exit_code, 0) << profiled.output;
  const nlohmann::json step = nlohmann::json::parse(profiled.output.substr(profiled.output.find('{'))).at("step_time");
  EXPECT_NE(step.at("compute_source").get<std::string>().find("measured by --profile"), std::string::npos);
  EXPECT_GT(step.at("phase_s").at("forward").get<double>(), 0);
  EXPECT_GT(step.at("phase_s").at("backward").get<double>(), 0);
  EXPECT_GT(step.at("step_seconds").get<double>(), 0);
  const testing::CommandResult plain = testing::run_command(estimate_command("--world_size 2"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("pass --profile SECONDS"), std::string::npos) << plain.output;
  const testing::CommandResult wide = testing::run_command(estimate_command(
      "--world_size 65536 --ranks_per_node 8 --sharding hybrid_shard --shard_group_size 8 --device_tflops 100"));
  ASSERT_EQ(wide.exit_code, 0) << wide.output;
  EXPECT_NE(wide.output.find("Step time (predicted"), std::string::npos) << wide.output;
  EXPECT_NE(wide.output.find("declared: 100 TFLOP/s"), std::string::npos) << wide.output;
}

// --profile times this machine's device: a CUDA estimate profiled where there is no GPU is exit 2
// naming --profile and what to give instead, not ATen's stack (skipped where a GPU is visible).
TEST(StepTimeCommand, ProfilingACudaEstimateWithoutAGpuSaysWhatToGiveInstead) {
  if (visible_gpu_count() > 0) GTEST_SKIP() << "a GPU is visible: the profile runs on it";
  for (const char* fit : {"", " --fit --memory_budget_gib 1"}) {
    const testing::CommandResult profiled =
        testing::run_command(estimate_command(std::string("--world_size 1 --device cuda --profile 1") + fit));
    EXPECT_EQ(profiled.exit_code, 2) << profiled.output;
    EXPECT_NE(profiled.output.find("--profile"), std::string::npos) << profiled.output;
    EXPECT_NE(profiled.output.find("--device_tflops"), std::string::npos) << profiled.output;
    EXPECT_EQ(profiled.output.find("empty_strided"), std::string::npos) << profiled.output;
  }
}

// --collective_table: a good table is named in the links' source and moves the collectives; each bad
// one is exit 2 naming the file, the line and the field (docs/errors.md); without the step time the
// flag is refused, as the other rates are.
TEST(StepTimeCommand, ACollectiveTableIsUsedAndEveryBadOneIsExitTwo) {
  const testing::ScratchDir dir("collective_table");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const std::string slow = write("slow.jsonl",
                                 "{\"collective\": \"all_gather\", \"bytes\": 4096, \"ranks\": 2, \"seconds\": 0.5}\n"
                                 "{\"collective\": \"reduce_scatter\", \"bytes\": 4096, \"ranks\": 2, \"seconds\": 0.5}\n");
  const auto step = [&](const std::string& flags) {
    const testing::CommandResult result = testing::run_command(estimate_command("--world_size 2 --device_tflops 0.07 --json " + flags));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return nlohmann::json::parse(result.output.substr(result.output.find('{'))).at("step_time");
  };
  const nlohmann::json ring = step(""), measured = step("--collective_table " + slow);
  EXPECT_NE(measured.at("link_source").get<std::string>().find(slow + " (2 ranks: all_gather 4096-4096 B reduce_scatter 4096-4096 B)"),
            std::string::npos) << measured.dump();
  // Half a second a collective, at least (the micro model's units are under 4 KiB or scaled above it).
  EXPECT_GE(measured.at("collective_seconds").get<double>(), 0.5 * measured.at("collectives").get<double>() - 1e-9);
  EXPECT_LT(ring.at("collective_seconds").get<double>(), 0.1);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {(dir / "absent.jsonl").string(), "--collective_table: cannot read"},
      {dir.path().string(), "--collective_table: cannot read"},
      {write("empty.jsonl", "\n"), "empty.jsonl: rows: has none"},
      {write("text.jsonl", "collective,bytes\n"), "text.jsonl line 1: json: is not a JSON object"},
      {write("array.jsonl", "[1, 2]\n"), "array.jsonl line 1: json: is not a JSON object"},
      {write("kind.jsonl", "{\"collective\": \"broadcast\", \"bytes\": 4, \"ranks\": 2, \"seconds\": 1}\n"),
       "kind.jsonl line 1: collective: must be"},
      {write("bytes.jsonl", "{\"collective\": \"all_gather\", \"bytes\": 0, \"ranks\": 2, \"seconds\": 1}\n"),
       "bytes.jsonl line 1: bytes: must be a whole number of bytes above 0"},
      {write("ranks.jsonl", "{\"collective\": \"all_gather\", \"bytes\": 4, \"ranks\": 1, \"seconds\": 1}\n"),
       "ranks.jsonl line 1: ranks: must be a rank count in [2, 1048576]"},
      {write("seconds.jsonl", "{\"collective\": \"all_gather\", \"bytes\": 4, \"ranks\": 2, \"seconds\": -1}\n"),
       "seconds.jsonl line 1: seconds: must be a time above 0"},
      {write("missing.jsonl", "{\"collective\": \"all_gather\", \"bytes\": 4, \"ranks\": 2}\n"),
       "missing.jsonl line 1: seconds: missing"},
      {write("wrong.jsonl", "{\"collective\": \"all_gather\", \"bytes\": 4, \"ranks\": 2, \"seconds\": 1, \"wrong\": 3}\n"),
       "wrong.jsonl line 1: wrong: the probe counted wrong elements"},
      {write("mixed.jsonl", "{\"collective\": \"all_gather\", \"bytes\": 4, \"ranks\": 2, \"seconds\": 1}\n"
                            "{\"collective\": \"all_gather\", \"bytes\": 8, \"ranks\": 4, \"seconds\": 1}\n"),
       "mixed.jsonl line 2: ranks: is 4 where the rows above are 2"},
      {write("twice.jsonl", "{\"collective\": \"all_gather\", \"bytes\": 4, \"ranks\": 2, \"seconds\": 1}\n"
                            "{\"collective\": \"all_gather\", \"bytes\": 4, \"ranks\": 2, \"seconds\": 2}\n"),
       "twice.jsonl line 2: bytes: all_gather of 4 bytes is in the table twice"},
  };
  for (const auto& [path, message] : bad)
    for (const char* fit : {"", " --fit --memory_budget_gib 1"}) {
      const testing::CommandResult result = testing::run_command(
          estimate_command("--world_size 2 --device_tflops 0.07 --collective_table " + path + fit));
      EXPECT_EQ(result.exit_code, 2) << path << fit << ": " << result.output;
      EXPECT_NE(result.output.find(message), std::string::npos) << path << fit << ": " << result.output;
    }
  // Between nodes (2 nodes of one rank): the same rows, named as the table between nodes.
  const nlohmann::json between = step("--ranks_per_node 1 --collective_table_between " + slow);
  EXPECT_NE(between.at("link_source").get<std::string>().find("across nodes the collectives measured in " + slow),
            std::string::npos) << between.dump();
  EXPECT_GE(between.at("collective_seconds").get<double>(), 0.5 * between.at("collectives").get<double>() - 1e-9);
  const testing::CommandResult absent = testing::run_command(estimate_command(
      "--world_size 2 --device_tflops 0.07 --collective_table_between " + (dir / "absent.jsonl").string()));
  EXPECT_EQ(absent.exit_code, 2) << absent.output;
  EXPECT_NE(absent.output.find("--collective_table_between: cannot read"), std::string::npos) << absent.output;
  // Hybrid's rings across the groups (2 nodes of 2, the optimizer across the groups: the table's
  // reduce-scatter and all-gather, half a second each, for every unit): named, and read as the others.
  const auto hybrid = [&](const std::string& flags) {
    const testing::CommandResult result = testing::run_command(estimate_command(
        "--world_size 4 --ranks_per_node 2 --device_tflops 0.07 --json --sharding hybrid_shard --shard_group_size 2 "
        "--shard_optimizer_across_groups" + flags));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return nlohmann::json::parse(result.output.substr(result.output.find('{'))).at("step_time");
  };
  const nlohmann::json across = hybrid(" --collective_table_across " + slow), shared = hybrid("");
  EXPECT_NE(across.at("link_source").get<std::string>().find("hybrid's rings across the groups measured in " + slow),
            std::string::npos) << across.dump();
  EXPECT_GE(across.at("collective_seconds").get<double>(), 3 * 1.0) << across.dump();  // embed, a layer, the head
  EXPECT_LT(shared.at("collective_seconds").get<double>(), 1.0) << shared.dump();
  for (const std::string& path : {(dir / "absent.jsonl").string(), write("kind_across.jsonl", "{\"collective\": \"broadcast\"}\n")}) {
    const testing::CommandResult refused = testing::run_command(
        estimate_command("--world_size 2 --device_tflops 0.07 --collective_table_across " + path));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find(path.find("absent") != std::string::npos ? "--collective_table_across: cannot read"
                                                                             : "kind_across.jsonl line 1: collective: must be"),
              std::string::npos) << refused.output;
  }
  // The wait: named in the links, at least the collectives times it; a negative one refused.
  const nlohmann::json waited = step("--collective_wait_us 200000");
  EXPECT_NE(waited.at("link_source").get<std::string>().find("200000 us a collective waiting for the last rank"), std::string::npos)
      << waited.dump();
  EXPECT_GE(waited.at("phase_s").at("collectives").get<double>(), 0.2 * waited.at("collectives").get<double>() - 1e-9);
  const testing::CommandResult negative =
      testing::run_command(estimate_command("--world_size 2 --device_tflops 0.07 --collective_wait_us -1"));
  EXPECT_EQ(negative.exit_code, 2) << negative.output;
  EXPECT_NE(negative.output.find("--collective_wait_us"), std::string::npos) << negative.output;
  const testing::CommandResult unused = testing::run_command(estimate_command("--world_size 2 --collective_table " + slow));
  EXPECT_EQ(unused.exit_code, 2) << unused.output;
  EXPECT_NE(unused.output.find("--collective_table: only shapes --fit's costs"), std::string::npos) << unused.output;
}

// --fit ranks what fits by the predicted step: on 2 nodes of 2 CPU ranks over a slow link between them,
// full_shard's command fits, but hybrid groups of a node send a quarter of its bytes across and come
// first. Each row's step time is the estimate's own for the command with those flags (the same model,
// not a second one), and the rows are in order of it.
TEST(StepTimeCommand, FitRanksByThePredictedStepAndEachRowIsTheEstimatesOwn) {
  const std::string flags = "--world_size 4 --ranks_per_node 2 --total_batch_size 8 --inter_node_gbs 0.025 --device_tflops 0.07";
  const testing::CommandResult fit = testing::run_command(estimate_command(flags + " --fit --memory_budget_gib 4"));
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  std::vector<std::pair<std::string, double>> rows;  // each row's flags and predicted step seconds
  std::istringstream lines(fit.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| ", 0) != 0 || line.find(" | ") == std::string::npos || line.find("| # |") == 0) continue;
    std::vector<std::string> cells;
    for (size_t at = 1, next; (next = line.find(" |", at)) != std::string::npos; at = next + 2)
      cells.push_back(line.substr(at + 1, next - at - 1));
    ASSERT_EQ(cells.size(), 7u) << line;
    rows.emplace_back(cells[1], std::stod(cells[4]));
  }
  ASSERT_GE(rows.size(), 3u) << fit.output;
  EXPECT_NE(rows.front().first.find("--sharding hybrid_shard --shard_group_size 2"), std::string::npos) << fit.output;
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_LE(rows[i - 1].second, rows[i].second * (1 + 1e-3)) << fit.output;
  const std::string marker = "The command as it is: predicted ";
  ASSERT_NE(fit.output.find(marker), std::string::npos) << fit.output;
  const double command = std::stod(fit.output.substr(fit.output.find(marker) + marker.size()));
  EXPECT_GT(command, rows.front().second * 1.5) << fit.output;
  for (const auto& [added, seconds] : {rows.front(), std::pair<std::string, double>("", command)}) {
    const testing::CommandResult estimate = testing::run_command(estimate_command(flags + " --json " + added));
    ASSERT_EQ(estimate.exit_code, 0) << estimate.output;
    const double predicted =
        nlohmann::json::parse(estimate.output.substr(estimate.output.find('{'))).at("step_time").at("step_seconds").get<double>();
    EXPECT_NEAR(seconds, predicted, predicted * 1e-3) << added;
  }
}

// Every run checks the prediction: its end record and memory_report.md put the measured step (the
// medians after the first step) beside the step time `trainer estimate` predicts for the same flags at
// the run's peak (its start record's peak_flops as --device_tflops), phase by phase.
TEST(StepTimeRun, TheEndRecordAndTheReportPutTheMeasuredStepBesideTheEstimates) {
  testing::ScratchDir dir("step_time_run");
  const std::string flags = "--device cpu --max_length 32 --batch_size 2 --total_batch_size 4";
  const testing::CommandResult run = testing::run_command(
      "OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
      (testing::source_dir() / "configs/llama_micro.json").string() + " " + flags +
      " --eval_every 0 --num_training_steps 4 --run_dir " + (dir / "run").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json end = testing::read_metrics_events(dir / "run", "end").at(0);
  const nlohmann::json start = testing::read_metrics_events(dir / "run", "start").at(0);
  const nlohmann::json& step_time = end.at("step_time");
  ASSERT_TRUE(step_time.is_object()) << end.dump();
  EXPECT_EQ(step_time.at("steps").get<int>(), 3);  // the logged steps after the first
  std::vector<double> steps;
  for (const nlohmann::json& step : testing::read_metrics_events(dir / "run", "train"))
    if (step.at("step").get<int>() > 1) steps.push_back(step.at("step_time_s").get<double>());
  std::sort(steps.begin(), steps.end());
  EXPECT_DOUBLE_EQ(step_time.at("measured").at("step_seconds").get<double>(), steps[1]);
  const double peak_tflops = start.at("peak_flops").get<double>() / 1e12;
  ASSERT_GT(peak_tflops, 0) << start.dump();
  char tflops[64];
  std::snprintf(tflops, sizeof(tflops), "%.17g", peak_tflops);
  const testing::CommandResult estimate = testing::run_command(
      "OMP_NUM_THREADS=1 " + estimate_command("--world_size 1 --total_batch_size 4 --json --device_tflops " + std::string(tflops)));
  ASSERT_EQ(estimate.exit_code, 0) << estimate.output;
  const nlohmann::json predicted = nlohmann::json::parse(estimate.output.substr(estimate.output.find('{'))).at("step_time");
  for (const char* phase : {"forward", "backward", "collectives", "optimizer", "other"}) {
    EXPECT_NEAR(step_time.at("predicted").at("phase_s").at(phase).get<double>(), predicted.at("phase_s").at(phase).get<double>(),
                1e-6 * predicted.at("step_seconds").get<double>() + 1e-12)
        << phase;
    EXPECT_TRUE(step_time.at("measured").at("phase_s").contains(phase)) << phase;
  }
  std::ifstream report(dir / "run" / "memory_report.md");
  const std::string text((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("## Step time: measured and predicted"), std::string::npos) << text;
  EXPECT_NE(text.find("| forward | "), std::string::npos) << text;
}

}  // namespace
}  // namespace llm::step_time_test
