// FSDP-style sharding end to end: mpirun -np N trainer on CPU (MPI backend) against one rank on the
// same global batch, for world sizes 2, 3 (row padding) and 4, each strategy and each optimizer
// (AdamwSN in both forms, RMSprop-SN, GaLore in both orientations and the subspace projector); and
// the per-rank persistent memory (parameters, gradients, optimizer state) shrinking to a quarter at
// 4 ranks.
#include <gtest/gtest.h>

#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "tests/micro_runs.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"
#include "checkpoint/checkpoint.h"

namespace llm::sharding_test {
namespace {

// One case's run at `ranks` against its run at one rank: the same losses (fp32, the same arithmetic
// per sample; only the order of the cross-rank sums differs), the same final parameters and the same
// optimizer state written in full (GaLore's moments and projectors, the subset norms: what resuming at
// another world size relies on).
class WorldSizes : public ::testing::TestWithParam<testing::MicroCase> {};

TEST_P(WorldSizes, NRanksEqualOneRank) {
  const testing::MicroCase& c = GetParam();
  const testing::RecordedRun& reference = testing::recorded_run(1, testing::micro_run_flags(1, c.flags));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const testing::RecordedRun& run = testing::recorded_run(ranks, testing::micro_run_flags(ranks, c.flags));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    testing::expect_same_up_to_sum_order(reference.dir, run.dir, testing::kMicroSteps);
  }
}

std::vector<testing::MicroCase> optimizers_but_adamw() {  // AdamW is the full_shard strategy's case
  std::vector<testing::MicroCase> cases;
  for (const testing::MicroCase& c : testing::micro_optimizers())
    if (c.name != "adamw" && !c.bf16_state) cases.push_back(c);
  return cases;
}

const auto case_name = [](const auto& info) { return info.param.name; };
INSTANTIATE_TEST_SUITE_P(Strategies, WorldSizes, ::testing::ValuesIn(testing::micro_strategies()), case_name);
INSTANTIATE_TEST_SUITE_P(Optimizers, WorldSizes, ::testing::ValuesIn(optimizers_but_adamw()), case_name);

// llama_tiny, one step, at `ranks` with `strategy`: recorded, read by both tests below.
const testing::RecordedRun& tiny_step(int ranks, const std::string& strategy) {
  return testing::recorded_run(ranks, "--config " + (testing::source_dir() / "configs/llama_tiny.json").string() +
                                          " --device cpu --num_training_steps 1 --warmup_steps 0 --max_length 16"
                                          " --batch_size 1 --eval_every 0 --eval_batches 1 --sharding " + strategy);
}

TEST(ShardingMemory, FourRanksHoldAQuarterOfTheTrainingState) {
  auto bytes_per_rank = [](int ranks, const std::string& strategy) {
    const testing::RecordedRun& run = tiny_step(ranks, strategy);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return testing::read_metrics_events(run.run_dir(), "sharded_state").at(0).at("ranks");
  };
  const auto single = bytes_per_rank(1, "full_shard").at(0);
  const auto sharded = bytes_per_rank(4, "full_shard");
  ASSERT_EQ(sharded.size(), 4u);
  for (const char* key : {"parameter_shard_bytes", "gradient_shard_bytes", "optimizer_state_bytes"}) {
    const double quarter = static_cast<double>(single.at(key)) / 4.0;
    ASSERT_GT(quarter, 0) << key;
    for (const auto& rank : sharded) {
      // Within 5 % of a quarter (row padding to a multiple of 4 is the only excess).
      EXPECT_NEAR(static_cast<double>(rank.at(key)), quarter, 0.05 * quarter)
          << key << " on rank " << rank.at("rank");
    }
  }
  for (const auto& rank : sharded)  // full_shard frees every gathered unit after its backward
    EXPECT_EQ(rank.at("materialized_parameter_bytes"), 0) << "rank " << rank.at("rank");
  // no_shard keeps everything on every rank: the contrast that shows the test can fail.
  const auto replicated = bytes_per_rank(4, "no_shard");
  EXPECT_EQ(replicated.at(3).at("parameter_shard_bytes"), single.at("parameter_shard_bytes"));
}

TEST(ShardingMemory, StartUpNeverHoldsMoreThanOneUnsharedUnit) {
  // Units are initialised and sharded as they are built: while unit k is built, units 0..k-1 hold
  // only their shards. The start record counts the parameter storage that exists at each build.
  const testing::RecordedRun& run = tiny_step(4, "full_shard");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto start = testing::read_metrics_events(run.run_dir(), "start").at(0);
  const int64_t peak = start.at("startup_peak_parameter_bytes");
  const int64_t largest_unit = start.at("largest_unit_parameter_bytes");
  const int64_t whole_model = static_cast<int64_t>(start.at("parameters")) * 4;
  EXPECT_GT(largest_unit, 0);
  EXPECT_EQ(peak, largest_unit) << "more than one unit was materialised at start-up";
  EXPECT_LT(2 * peak, whole_model) << "the largest unit must be well under the whole model";
}

// Pure bf16 AdamW at one rank: each resident unit's gradient shard is bf16 (config.h's
// bf16_gradient_shards), half the fp32 one's bytes, with no fp32 copy of the bf16 gradient; the same
// run with AdamW-SN (whose rules read an fp32 shard) or two ranks keeps fp32. Its bits are the fp32
// shard's: launch/record_runs.sh's adamw_bfloat16_pure_w1_* runs are compared bit for bit.
TEST(ShardingMemory, PureBf16AdamwAtOneRankKeepsABf16GradientShard) {
  auto gradient_bytes = [](int ranks, const std::string& optimizer) {
    const testing::RecordedRun& run = testing::recorded_run(
        ranks, "--config " + (testing::source_dir() / "configs/llama_tiny.json").string() +
                   " --device cpu --num_training_steps 2 --warmup_steps 0 --max_length 16 --batch_size 1"
                   " --total_batch_size " + std::to_string(2 * ranks) +
                   " --eval_every 0 --eval_batches 1 --dtype bfloat16 --precision pure --optimizer " + optimizer);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    const auto state = testing::read_metrics_events(run.run_dir(), "sharded_state").at(0).at("ranks").at(0);
    return std::pair<int64_t, int64_t>{state.at("gradient_shard_bytes"), state.at("parameter_shard_bytes")};
  };
  const auto [adamw_gradients, adamw_parameters] = gradient_bytes(1, "adamw");
  const auto [sn_gradients, sn_parameters] = gradient_bytes(1, "adamw_sn");
  EXPECT_EQ(2 * adamw_gradients, sn_gradients) << "bf16 against fp32, the same elements";
  const auto [two_rank_gradients, two_rank_parameters] = gradient_bytes(2, "adamw");
  EXPECT_NEAR(static_cast<double>(two_rank_gradients), static_cast<double>(sn_gradients) / 2, 0.05 * sn_gradients)
      << "two ranks: fp32 shards of half the rows";
}

}  // namespace
}  // namespace llm::sharding_test
