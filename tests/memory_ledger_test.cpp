// The memory ledger: the counting CPU allocator in-process, then the trainer under mpirun on CPU at 1,
// 2 and 4 ranks, read back from RUN_DIR/memory.rank<R>.jsonl: the categories add up to the tracked
// total, the owned buffers alone explain it when no activation is alive, nothing grows from step to
// step, and the sharded categories are 1/N of one rank's (row padding aside).
#include <gtest/gtest.h>

#include <fstream>

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "common/host_memory.h"
#include "tests/test_util.h"
#include "memory/categories.h"

namespace llm::memory_ledger_test {
namespace {

using testing::run_command;
using testing::ScratchDir;

TEST(HostMemoryTracking, CountsEveryTensorUntilItIsFreed) {
  install_host_memory_tracking();
  ASSERT_TRUE(host_memory_tracking_installed());
  const HostMemoryCounters before = host_memory_counters();
  reset_host_window_peak();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);           // 4000 bytes
    at::Tensor b = at::empty({7, 3}, at::kDouble);          // 168 bytes
    EXPECT_EQ(host_memory_counters().current_bytes - before.current_bytes, 4000 + 168);
    EXPECT_EQ(host_memory_counters().live_blocks - before.live_blocks, 2);
    a = at::Tensor();
    EXPECT_EQ(host_memory_counters().current_bytes - before.current_bytes, 168);
  }
  const HostMemoryCounters after = host_memory_counters();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_EQ(after.window_peak_bytes - before.current_bytes, 4000 + 168);
  EXPECT_GE(after.peak_bytes, after.window_peak_bytes);
  reset_host_window_peak();
  EXPECT_EQ(host_memory_counters().window_peak_bytes, after.current_bytes);
  // A tensor freed on another thread (as autograd workers do) is uncounted there too.
  at::Tensor moved = at::zeros({256}, at::kFloat);
  std::thread([t = std::move(moved)]() mutable { t = at::Tensor(); }).join();
  EXPECT_EQ(host_memory_counters().current_bytes, after.current_bytes);
}

struct LedgerRun {
  std::vector<std::vector<nlohmann::json>> ranks;  // every record of memory.rank<R>.jsonl
};

LedgerRun train_and_read(const ScratchDir& dir, int ranks, const std::string& flags) {
  const std::string launcher = ranks == 1 ? "OMP_NUM_THREADS=1 " : testing::mpirun(ranks);
  auto result = run_command(launcher + testing::trainer_binary().string() + " --device cpu --warmup_steps 0 " +
                            "--eval_every 0 --eval_batches 1 --run_dir " + dir.path().string() + " " + flags);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  LedgerRun run;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(dir / ("memory.rank" + std::to_string(r) + ".jsonl"));
    EXPECT_TRUE(in.good()) << "rank " << r << " wrote no ledger";
    std::vector<nlohmann::json> records;
    for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    run.ranks.push_back(std::move(records));
  }
  return run;
}

std::vector<nlohmann::json> points(const std::vector<nlohmann::json>& records, const std::string& phase = "") {
  std::vector<nlohmann::json> out;
  for (const auto& record : records)
    if (record.at("event") == "point" && (phase.empty() || record.at("phase") == phase)) out.push_back(record);
  return out;
}

class LedgerAddsUp : public ::testing::TestWithParam<int> {};

TEST_P(LedgerAddsUp, CategoriesExplainTheTrackedTotal) {
  const int ranks = GetParam();
  ScratchDir dir("ledger_adds_up_" + std::to_string(ranks));
  const LedgerRun run = train_and_read(
      dir, ranks, "--config " + (testing::source_dir() / "configs/llama_tiny.json").string() +
                      " --num_training_steps 3 --batch_size 2 --max_length 32 --optimizer adamw_sn");
  for (int r = 0; r < ranks; ++r) {
    const auto all = points(run.ranks[r]);
    ASSERT_FALSE(all.empty());
    for (const auto& point : all) {
      const MemoryCategories categories = MemoryCategories::from_json(point);
      const int64_t tracked = point.at("tracked_bytes");
      // By construction (activations is the remainder) ...
      EXPECT_EQ(categories.total(), tracked) << point.dump();
      // ... so what is checked is that the owned buffers never exceed what the allocator holds:
      // a remainder below zero would mean a buffer counted as owned that LibTorch did not allocate.
      EXPECT_GE(categories.activations, -static_cast<int64_t>(0.01 * tracked)) << point.dump();
      EXPECT_GE(static_cast<int64_t>(point.at("window_peak_bytes")), tracked);
    }
    // After the optimizer no activation is alive: the owned buffers alone must explain the tracked
    // total, within 1 % (the loss scalars and similar). The same at every step: nothing leaks.
    const auto after_optimizer = points(run.ranks[r], "optimizer");
    ASSERT_EQ(after_optimizer.size(), 3u);
    for (const auto& point : after_optimizer) {
      const double tracked = point.at("tracked_bytes");
      EXPECT_LE(std::abs(static_cast<double>(point.at("activations"))), 0.01 * tracked)
          << "rank " << r << " step " << point.at("step") << ": " << point.dump();
      EXPECT_EQ(point.at("activations"), after_optimizer.front().at("activations"))
          << "the remainder after the optimizer changed between steps (a leak?)";
    }
    // During the forward the activations grow unit by unit.
    int64_t previous = -1;
    for (const auto& point : points(run.ranks[r], "forward")) {
      if (point.at("step") != 1) continue;
      EXPECT_GT(static_cast<int64_t>(point.at("activations")), previous) << point.dump();
      previous = point.at("activations");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LedgerAddsUp, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "_ranks"; });

TEST(LedgerSharding, ShardedCategoriesShrinkAsOneOverN) {
  // At the optimizer point of a full_shard run the parameters are the master shard alone (no unit is
  // gathered), the gradients the gradient shard, the optimizer state its shard: each 1/N of one
  // rank's, plus the padding of rows to a multiple of N. no_shard keeps them whole on every rank.
  const std::string flags = "--config " + (testing::source_dir() / "configs/llama_tiny.json").string() +
                            " --num_training_steps 1 --batch_size 1 --max_length 16";
  auto optimizer_point = [&](int ranks, const std::string& strategy) {
    ScratchDir dir("ledger_shrink_" + strategy + std::to_string(ranks));
    const LedgerRun run = train_and_read(dir, ranks, flags + " --sharding " + strategy);
    std::vector<MemoryCategories> per_rank;
    for (const auto& records : run.ranks) per_rank.push_back(MemoryCategories::from_json(points(records, "optimizer").at(0)));
    return per_rank;
  };
  const MemoryCategories single = optimizer_point(1, "full_shard").at(0);
  ASSERT_GT(single.parameters, 0);
  for (int ranks : {2, 4}) {
    for (const MemoryCategories& rank : optimizer_point(ranks, "full_shard")) {
      for (int64_t MemoryCategories::*category :
           {&MemoryCategories::parameters, &MemoryCategories::gradients, &MemoryCategories::optimizer_device}) {
        const double share = static_cast<double>(single.*category) / ranks;
        // Padding: at most one row per parameter; llama_tiny's rows are at least 64 wide, so 3 %.
        EXPECT_GE(static_cast<double>(rank.*category), share) << ranks << " ranks";
        EXPECT_LE(static_cast<double>(rank.*category), 1.03 * share) << ranks << " ranks";
      }
    }
  }
  // The contrast that shows the test can fail: no_shard holds everything on every rank. Its units are
  // resident (sharding/fsdp_unit.h): the parameters are views of the master, not a copy beside it.
  const MemoryCategories replicated = optimizer_point(2, "no_shard").at(1);
  EXPECT_EQ(replicated.gradients, single.gradients);
  EXPECT_EQ(replicated.optimizer_device, single.optimizer_device);
  EXPECT_EQ(replicated.parameters, single.parameters);
}

TEST(LedgerReport, EndOfRunTableIsGatheredToRankZero) {
  ScratchDir dir("ledger_report");
  const LedgerRun run = train_and_read(
      dir, 2, "--config " + (testing::source_dir() / "configs/llama_micro.json").string() +
                  " --num_training_steps 2 --batch_size 2 --max_length 16");
  // metrics.jsonl carries every rank's summary, equal to each rank's own end record.
  const auto memory = testing::read_metrics_events(dir.path(), "memory");
  ASSERT_EQ(memory.size(), 1u);
  ASSERT_EQ(memory[0].at("ranks").size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const auto& end = run.ranks[r].back();
    ASSERT_EQ(end.at("event"), "end");
    EXPECT_EQ(memory[0].at("ranks")[r].at("peak_bytes"), end.at("summary").at("peak_bytes")) << "rank " << r;
    EXPECT_EQ(memory[0].at("ranks")[r].at("max"), end.at("summary").at("max")) << "rank " << r;
  }
  std::ifstream report_file(dir / "memory_report.md");
  ASSERT_TRUE(report_file.good());
  const std::string report((std::istreambuf_iterator<char>(report_file)), std::istreambuf_iterator<char>());
  // Both ranks run on this machine: one node, whose host figures are the ranks' summed.
  ASSERT_EQ(memory[0].at("nodes").size(), 1u) << memory[0].dump();
  const nlohmann::json& node = memory[0].at("nodes")[0];
  EXPECT_EQ(node.at("ranks"), nlohmann::json::array({0, 1}));
  for (const char* figure : {"rss_peak_bytes", "host_peak_bytes", "pinned_peak_bytes"}) {
    const int64_t summed = memory[0].at("ranks")[0].at(figure).get<int64_t>() + memory[0].at("ranks")[1].at(figure).get<int64_t>();
    EXPECT_EQ(node.at(figure).get<int64_t>(), summed) << figure;
  }
  EXPECT_GT(node.at("rss_peak_bytes").get<int64_t>(), 0);
  for (const char* expected : {"## Peak per rank, by category", "## Across ranks", "| peak (tracked tensors) |", "max / mean",
                               "| 0 |", "| 1 |", "## Host memory per node", "| 0 | 0, 1 |"})
    EXPECT_NE(report.find(expected), std::string::npos) << expected << "\n" << report;
}

TEST(LedgerSnapshot, MemorySnapshotOnCpuIsAUserError) {
  ScratchDir dir("ledger_snapshot");
  auto result = run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                            (testing::source_dir() / "configs/llama_micro.json").string() +
                            " --device cpu --num_training_steps 1 --warmup_steps 0 --max_length 16"
                            " --memory_snapshot --run_dir " + (dir / "run").string());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--memory_snapshot"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("CUDA"), std::string::npos) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run/metrics.jsonl")) << "nothing is written before the check";
}

// On a GPU: the ledger reads the caching allocator (allocated, reserved), and --memory_snapshot
// writes the allocator's history as a pickle (pytorch.org/memory_viz reads it). Skips without a GPU.
TEST(LedgerCuda, CachingAllocatorReadingsAndSnapshot) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this host";
  ScratchDir dir("ledger_cuda");
  auto result = run_command(testing::trainer_binary().string() + " --config " +
                            (testing::source_dir() / "configs/llama_tiny.json").string() +
                            " --device cuda --num_training_steps 3 --warmup_steps 0 --max_length 32"
                            " --batch_size 2 --eval_every 0 --eval_batches 1 --memory_snapshot --run_dir " +
                            dir.path().string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto snapshot = dir / "memory_snapshot.rank0.pickle";
  ASSERT_TRUE(std::filesystem::exists(snapshot));
  EXPECT_GT(std::filesystem::file_size(snapshot), 1000u);
  std::ifstream in(dir / "memory.rank0.jsonl");
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.at("event") != "step") continue;
    ++steps;
    const int64_t peak = record.at("peak_bytes"), reserved = record.at("reserved_peak_bytes");
    EXPECT_GT(peak, 0);
    EXPECT_GE(reserved, peak) << "the caching allocator reserves at least what it hands out";
    EXPECT_EQ(record.at("ooms"), 0);
  }
  EXPECT_EQ(steps, 3);
}

}  // namespace
}  // namespace llm::memory_ledger_test
