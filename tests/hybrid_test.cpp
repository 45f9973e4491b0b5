// Hybrid sharding (--sharding hybrid_shard / hybrid_shard_grad_op, --shard_group_size S) through the
// trainer binary under mpirun on CPU: 2 groups of 2 equal full_shard at 4 ranks and one rank up to the
// order of the cross-rank sums, for every optimizer and composed with the other features; a group of
// the whole world is full_shard bit for bit; each step sends the bytes docs/sharding.md's formulas say
// on each link, the cross-group all-reduce once a step whatever the accumulation; a checkpoint holds one
// copy of each shard and moves between hybrid, full_shard and one rank at other world sizes; a rank
// held back is named as a straggler, and past --collective_timeout with its collective.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/micro_runs.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::hybrid_test {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::ScratchDir;

using testing::with_sharding;
const std::string kHybrid = "--sharding hybrid_shard --shard_group_size 2";

// Each optimizer: hybrid 2x2 against full_shard at 4 ranks (another order of the same sums: within
// each group, then across) and against one rank. The full_shard and one-rank runs are the ones
// sharding_test records (tests/micro_runs.h), shared when both run in one suite.
class HybridOptimizers : public ::testing::TestWithParam<testing::MicroCase> {};

TEST_P(HybridOptimizers, TwoGroupsOfTwoEqualFullShardAndOneRank) {
  const testing::MicroCase& c = GetParam();
  const testing::RecordedRun& hybrid = testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(c.flags, kHybrid)));
  ASSERT_EQ(hybrid.exit_code, 0) << hybrid.output;
  const testing::RecordedRun& full_shard = testing::recorded_run(4, testing::micro_run_flags(4, c.flags));
  ASSERT_EQ(full_shard.exit_code, 0) << full_shard.output;
  {
    SCOPED_TRACE("against full_shard at 4 ranks");
    testing::expect_same_up_to_sum_order(full_shard.dir, hybrid.dir, testing::kMicroSteps, c.bf16_state);
  }
  if (!c.bf16_state) {  // bf16 moments: across world sizes through a resume only (sharding_test)
    SCOPED_TRACE("against one rank");
    const testing::RecordedRun& one = testing::recorded_run(1, testing::micro_run_flags(1, c.flags));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    testing::expect_same_up_to_sum_order(one.dir, hybrid.dir, testing::kMicroSteps);
  }
}

const auto case_name = [](const auto& info) { return info.param.name; };
INSTANTIATE_TEST_SUITE_P(Optimizers, HybridOptimizers, ::testing::ValuesIn(testing::micro_optimizers()), case_name);

// Hybrid composed with the other features, each against full_shard at 4 ranks with the same flags:
// the optimizer's offload (every mode), parameter offload, activation checkpointing and recompute,
// grouped projections and padded matmuls, the fused step, bf16 compute, the shard_grad_op form.
struct Composition {
  std::string name, flags;
  bool bf16 = false;          // bf16 compute: the order of the sums moves a bf16 rounding
  bool bf16_moments = false;  // bf16 optimizer state (tests/run_comparison.h)
};

class HybridComposes : public ::testing::TestWithParam<Composition> {};

TEST_P(HybridComposes, WithEachFeatureAsFullShardDoes) {
  const Composition& c = GetParam();
  const std::string adamw = testing::micro_case("adamw").flags;
  const testing::RecordedRun& hybrid =
      testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(adamw, kHybrid) + " " + c.flags));
  ASSERT_EQ(hybrid.exit_code, 0) << hybrid.output;
  const std::string reference_sharding =
      c.flags.find("hybrid_shard_grad_op") != std::string::npos ? "--sharding shard_grad_op" : "--sharding full_shard";
  std::string flags = c.flags;
  const std::string grad_op = "--sharding hybrid_shard_grad_op";
  if (flags.find(grad_op) != std::string::npos) flags.erase(flags.find(grad_op), grad_op.size());
  const testing::RecordedRun& full_shard =
      testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(adamw, reference_sharding) + " " + flags));
  ASSERT_EQ(full_shard.exit_code, 0) << full_shard.output;
  if (!c.bf16) {
    testing::expect_same_up_to_sum_order(full_shard.dir, hybrid.dir, testing::kMicroSteps, c.bf16_moments);
    return;
  }
  // bf16 compute: the losses within one bf16 rounding's worth of the fp32 sums' reordering.
  const auto want = testing::read_metrics_events(full_shard.run_dir(), "train");
  const auto got = testing::read_metrics_events(hybrid.run_dir(), "train");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(got[i].at("loss").get<double>() - want[i].at("loss").get<double>()),
              std::abs(want[i].at("loss").get<double>()) * 0x1p-8)
        << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(
    Features, HybridComposes,
    ::testing::Values(
        Composition{"offload_checkpointing_grouped_padded",
                    "--offload optimizer --activation_checkpointing --grouped_projections --pad_matmul_dims on"},
        Composition{"parameter_offload_recompute", "--offload optimizer,parameters --recompute attention"},
        // The other places the offloaded step runs: on the device over streamed windows, speculatively in
        // backward (clipping at 0.5 fires, so some units are stepped again), one step late.
        Composition{"offload_step_device", "--offload optimizer --offload_step device"},
        Composition{"offload_step_speculative", "--offload optimizer --offload_step speculative"},
        Composition{"offload_delayed_update", "--offload optimizer --offload_delayed_update 2"},
        Composition{"fused_step", "--fuse_optimizer_with_backward --grad_clipping 0"},
        Composition{"grad_op_bf16_state", "--sharding hybrid_shard_grad_op --optimizer_state_dtype bfloat16", false, true},
        Composition{"bf16_mixed", "--dtype bfloat16 --precision mixed", true}),
    case_name);

// A group of the whole world is one group and no replica: full_shard's run, bit for bit.
TEST(HybridWholeWorld, AGroupOfEveryRankIsFullShardBitForBit) {
  const std::string adamw = testing::micro_case("adamw").flags;
  const testing::RecordedRun& one_group =
      testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(adamw, "--sharding hybrid_shard --shard_group_size 4")));
  ASSERT_EQ(one_group.exit_code, 0) << one_group.output;
  const testing::RecordedRun& full_shard = testing::recorded_run(4, testing::micro_run_flags(4, adamw));
  ASSERT_EQ(full_shard.exit_code, 0) << full_shard.output;
  testing::expect_same_run(full_shard.dir, one_group.dir, testing::kMicroSteps);
}

// Without --shard_group_size a group is the ranks of one node (all 4 here, from the launcher); a size
// that does not divide the world is exit 2 on every rank, naming the divisors.
TEST(HybridFlags, TheDefaultGroupIsANodeAndASizeThatDoesNotDivideIsRefused) {
  const std::string settings = testing::trainer_binary().string() + " --config " +
                               (testing::source_dir() / "configs/llama_micro.json").string() +
                               " --max_length 32 --device cpu --sharding hybrid_shard --print_config";
  const testing::CommandResult resolved = run_command(testing::mpirun(4) + settings);
  ASSERT_EQ(resolved.exit_code, 0) << resolved.output;
  EXPECT_NE(resolved.output.find("\"shard_group_size\": 4"), std::string::npos) << resolved.output;
  const testing::CommandResult refused = run_command(testing::mpirun(4) + settings + " --shard_group_size 3");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--shard_group_size: 3 does not divide the 4 ranks into groups of equal size: give a "
                                "divisor of 4 (1, 2, 4)"),
            std::string::npos)
      << refused.output;
}

// The bytes a step sends on each link (docs/sharding.md), from the run's own sharded_state record: a
// rank's parameter and gradient shards (fp32 here, padding rows included), B_p and B_g, in a group of S
// ranks, G groups, M micro-batches:
//   full_shard / hybrid_shard:   inside the group (S - 1) (2 M B_p + B_g)   (forward and backward gathers, one reduce-scatter)
//   shard_grad_op / its hybrid:  inside the group (S - 1) (M B_p + B_g)     (no gather in the backward)
//   across groups:               2 (G - 1) / G x B_g                        (one all-reduce of the shard a step)
// plus a few scalars (the norm's partial sums). Accumulation 2 here: a per-micro-batch all-reduce
// across groups doubles the across bytes.
struct LinkCase {
  std::string sharding;
  int group_size;  // S
  int gathers;     // per micro-batch
};

class HybridLinks : public ::testing::TestWithParam<LinkCase> {};

TEST_P(HybridLinks, EachStepSendsWhatTheFormulaSays) {
  const LinkCase& c = GetParam();
  constexpr int kRanks = 4, kMicro = 2;
  const testing::RecordedRun& run = testing::recorded_run(
      kRanks, "--config " + (testing::source_dir() / "configs/llama_micro.json").string() +
                  " --device cpu --num_training_steps 3 --warmup_steps 0 --max_length 32 --batch_size 2"
                  " --total_batch_size 16 --eval_every 0 --eval_batches 1 --sharding " + c.sharding +
                  (c.sharding.rfind("hybrid", 0) == 0 ? " --shard_group_size " + std::to_string(c.group_size) : ""));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json state = testing::read_metrics_events(run.run_dir(), "sharded_state").at(0).at("ranks").at(0);
  const double parameters = state.at("parameter_shard_bytes"), gradients = state.at("gradient_shard_bytes");
  const int groups = kRanks / c.group_size;
  const double inside = (c.group_size - 1) * (c.gathers * kMicro * parameters + gradients);
  const double across = 2.0 * (groups - 1) / groups * gradients;
  const auto steps = testing::read_metrics_events(run.run_dir(), "train");
  ASSERT_EQ(steps.size(), 3u);
  for (const nlohmann::json& step : steps) {
    SCOPED_TRACE("step " + step.at("step").dump());
    const double group_bytes = step.at("links").at("group").at("bytes"), across_bytes = step.at("links").at("across").at("bytes");
    EXPECT_NEAR(group_bytes, inside, 0.01 * inside + 256);
    EXPECT_NEAR(across_bytes, across, 0.01 * across + 256);
    EXPECT_GE(step.at("links").at("across").at("s").get<double>(), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, HybridLinks,
                         ::testing::Values(LinkCase{"full_shard", 4, 2}, LinkCase{"hybrid_shard", 2, 2},
                                           LinkCase{"hybrid_shard_grad_op", 2, 1}),
                         [](const auto& info) { return info.param.sharding; });

// `trainer report` puts the runs' bytes a step side by side: each column the median of the step
// records after the first, in the table's unit.
TEST(HybridReport, ShowsEachRunsBytesPerLink) {
  ScratchDir out("hybrid_report");
  std::vector<fs::path> runs;
  std::string command = testing::trainer_binary().string() + " report";
  for (const char* strategy : {"full_shard", "hybrid_shard"}) {
    // The runs EachStepSendsWhatTheFormulaSays records (the same flags).
    const testing::RecordedRun& run = testing::recorded_run(
        4, "--config " + (testing::source_dir() / "configs/llama_micro.json").string() +
               " --device cpu --num_training_steps 3 --warmup_steps 0 --max_length 32 --batch_size 2"
               " --total_batch_size 16 --eval_every 0 --eval_batches 1 --sharding " + strategy +
               (std::string(strategy) == "hybrid_shard" ? " --shard_group_size 2" : ""));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    runs.push_back(run.run_dir());
    command += " " + run.run_dir().string();
  }
  const testing::CommandResult result = run_command(command + " --out " + (out / "report").string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string markdown = testing::read_text(out / "report" / "memory_report.md");
  const size_t section = markdown.find("## Communication per step");
  ASSERT_NE(section, std::string::npos) << markdown;
  const size_t header = markdown.find("| run | sharding |", section);
  ASSERT_NE(header, std::string::npos);
  const std::string unit = markdown.substr(markdown.find("inside the group (", header) + 18, 3);
  const double scale = unit == "MiB" ? 1 << 20 : unit == "KiB" ? 1 << 10 : unit.rfind("B)", 0) == 0 ? 1 : 0;
  ASSERT_GT(scale, 0) << unit;
  const auto cells_of = [&](size_t at) {
    std::vector<std::string> cells;
    const std::string row = markdown.substr(at, markdown.find('\n', at) - at);
    for (size_t from = 1, bar; (bar = row.find('|', from)) != std::string::npos; from = bar + 1) {
      std::string cell = row.substr(from, bar - from);
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      cells.push_back(cell);
    }
    return cells;
  };
  // Both run folders are named run: the report labels the second run-2.
  for (size_t r = 0; r < runs.size(); ++r) {
    const fs::path& run_dir = runs[r];
    const auto steps = testing::read_metrics_events(run_dir, "train");
    ASSERT_EQ(steps.size(), 3u);
    // Steps 2 and 3: the median of two is their mean.
    const auto median = [&](const char* link) {
      return 0.5 * (steps[1].at("links").at(link).at("bytes").get<double>() + steps[2].at("links").at(link).at("bytes").get<double>());
    };
    const std::string label = r == 0 ? "run" : "run-2";
    const size_t at = markdown.find("\n| " + label + " | " + (r == 0 ? "full_shard" : "hybrid_shard") + " |", section);
    ASSERT_NE(at, std::string::npos) << label << " has no row:\n" << markdown.substr(section);
    const std::vector<std::string> cells = cells_of(at + 1);
    ASSERT_EQ(cells.size(), 11u) << markdown.substr(at);
    EXPECT_NEAR(std::stod(cells[4]) * scale, median("group"), 0.01 * scale) << cells[4];
    EXPECT_NEAR(std::stod(cells[6]) * scale, median("across"), 0.01 * scale) << cells[6];
  }
}

// One copy of each shard: group 0 writes (2 ranks' files and the manifest of a world of 2, the
// topology beside it), and the checkpoint goes anywhere: hybrid 2x2 (saved in the background) ->
// full_shard at 3 -> one rank -> hybrid 3x2 -> hybrid 2x2, each resuming from the step the previous
// one saved, every step within the sums' order of the uninterrupted hybrid run.
TEST(HybridCheckpoint, OneCopyOfEachShardAndItMovesAcrossTopologies) {
  const std::string adamw = testing::micro_case("adamw").flags;
  ScratchDir dir("hybrid_checkpoint");
  struct Leg {
    int ranks;
    std::string sharding;
  };
  const std::vector<Leg> legs = {{4, kHybrid + " --async_save"},
                                 {3, "--sharding full_shard"},
                                 {1, "--sharding full_shard"},
                                 {6, "--sharding hybrid_shard --shard_group_size 3"},
                                 {4, kHybrid}};
  const auto leg_flags = [&](const Leg& leg) {
    // 12 sequences a step: at 6 ranks 1 each and 2 micro-batches.
    std::string flags = testing::micro_run_flags(leg.ranks == 6 ? 3 : leg.ranks, with_sharding(adamw, leg.sharding));
    if (leg.ranks == 6) flags += " --batch_size 1";
    return flags + " --save_every 1";
  };
  std::vector<fs::path> saves;
  for (size_t i = 0; i < legs.size(); ++i) {
    const Leg& leg = legs[i];
    SCOPED_TRACE("leg " + std::to_string(i) + ": " + std::to_string(leg.ranks) + " ranks, " + leg.sharding);
    const fs::path run_dir = dir / ("run" + std::to_string(i)), save_dir = dir / ("ckpt" + std::to_string(i));
    const std::string resume = i == 0 ? "" : " --continue_from " + (saves.back() / ("step_" + std::to_string(i + 1))).string();
    const testing::CommandResult result =
        run_command(testing::trainer_launcher(leg.ranks) + " " + leg_flags(leg) + resume + " --run_dir " +
                    run_dir.string() + " --save_dir " + save_dir.string());
    ASSERT_EQ(result.exit_code, 0) << result.output;
    saves.push_back(save_dir);
  }
  // The first leg's checkpoint: what group 0 wrote, once.
  const testing::Checkpoint first = testing::load_checkpoint((saves[0] / "step_1").string());
  EXPECT_EQ(first.manifest.at("world_size"), 2) << "one copy: the writers of one group";
  EXPECT_EQ(first.manifest.at("files").size(), 4u) << "each writer's shard file and its index";
  EXPECT_EQ(first.manifest.at("sharding").at("strategy"), "hybrid_shard");
  EXPECT_EQ(first.manifest.at("sharding").at("group_size"), 2);
  EXPECT_EQ(first.manifest.at("sharding").at("ranks"), 4);
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(saves[0] / "step_1")) files += entry.is_regular_file();
  EXPECT_EQ(files, 5u) << "2 shard files, 2 indexes and the manifest";
  // The chain's every step against the uninterrupted hybrid run's (the first leg).
  const auto uninterrupted = testing::read_metrics_events(dir / "run0", "train");
  ASSERT_EQ(uninterrupted.size(), static_cast<size_t>(testing::kMicroSteps));
  for (size_t i = 1; i < legs.size(); ++i) {
    const auto steps = testing::read_metrics_events(dir / ("run" + std::to_string(i)), "train");
    ASSERT_FALSE(steps.empty());
    const int64_t resumed_at = steps.front().at("step");
    EXPECT_EQ(resumed_at, static_cast<int64_t>(i + 2)) << "leg " << i << " resumed after the step it was given";
    for (const nlohmann::json& step : steps) {
      const double want = uninterrupted.at(step.at("step").get<size_t>() - 1).at("loss"), got = step.at("loss");
      EXPECT_LE(std::abs(got - want) / want, 1e-5) << "leg " << i << ", step " << step.at("step") << ": " << got << " vs " << want;
    }
  }
  const std::string last = "step_" + std::to_string(testing::kMicroSteps);
  const testing::Checkpoint want = testing::load_checkpoint((saves[0] / last).string());
  const testing::Checkpoint got = testing::load_checkpoint((saves.back() / last).string());
  EXPECT_EQ(got.manifest.at("samples_consumed"), want.manifest.at("samples_consumed")) << "the data position moved with it";
  for (const auto& [name, tensor] : want.model)
    EXPECT_LE((got.model.at(name) - tensor).abs().max().item<double>() / (tensor.abs().max().item<double>() + 1e-12), 1e-4)
        << name;
}

// A rank held back before each of its cross-group collectives (LLM_DEBUG_DELAY_COLLECTIVE: 20 ms, a
// slow GPU or a busy host) is named as the straggler in the log and in the step records; the same
// run without it names none.
TEST(HybridStraggler, ARankHeldBackIsNamed) {
  const std::string flags = testing::micro_run_flags(4, with_sharding(testing::micro_case("adamw").flags, kHybrid));
  const testing::RecordedRun& held =
      testing::recorded_run(4, flags, "LLM_DEBUG_DELAY_COLLECTIVE=1:across:0:0.02");
  ASSERT_EQ(held.exit_code, 0) << held.output;
  const auto steps = testing::read_metrics_events(held.run_dir(), "train");
  ASSERT_EQ(steps.size(), static_cast<size_t>(testing::kMicroSteps));
  for (size_t i = 2; i < steps.size(); ++i) {  // named from the third logged step (trainer/step_ranks.h)
    ASSERT_TRUE(steps[i].at("straggler").is_object()) << "step " << i + 1 << ": " << steps[i].dump();
    EXPECT_EQ(steps[i].at("straggler").at("rank"), 1) << "step " << i + 1;
    EXPECT_GT(steps[i].at("straggler").at("compute_s").get<double>(),
              steps[i].at("straggler").at("others_median_s").get<double>());
  }
  EXPECT_NE(held.output.find("rank 1 is a straggler"), std::string::npos) << held.output;
}

// Past --collective_timeout, the rank held back (rank 2 sleeps before its 6th cross-group collective)
// is named in every rank's message, with the collective the others wait in and the one it did last.
TEST(HybridStall, EveryRankNamesTheCollectiveAndTheRankThatNeverReachedIt) {
  ScratchDir dir("hybrid_stall");
  const testing::CommandResult result = run_command(
      "LLM_DEBUG_DELAY_COLLECTIVE=2:across:6:60 timeout -s KILL 60 env " + testing::mpirun(4) +
      testing::trainer_binary().string() + " " +
      testing::micro_run_flags(4, with_sharding(testing::micro_case("adamw").flags, kHybrid)) +
      " --num_training_steps 50 --save_every 0 --collective_timeout 5 --run_dir " + (dir / "run").string());
  EXPECT_NE(result.exit_code, 0) << result.output;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] error stalled";
    const size_t at = result.output.find(prefix);
    ASSERT_NE(at, std::string::npos) << "rank " << rank << " said nothing:\n" << result.output;
    const std::string message = result.output.substr(at, result.output.find('\n', at) - at);
    EXPECT_NE(message.find("rank 0 is in all_reduce #6 on across (ranks 0, 2)"), std::string::npos) << message;
    EXPECT_NE(message.find("which rank 2 (its last there #5) never reached"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 2 is in none (its last: "), std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace llm::hybrid_test
