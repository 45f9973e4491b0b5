// Hybrid sharding with the optimizer split across the groups too (--shard_optimizer_across_groups)
// through the trainer binary under mpirun on CPU: 2 groups of 2 step as full_shard at 4 ranks does
// (the same layout, another order of the sums) for every optimizer; the optimizer state per rank is
// full_shard's, half of plain hybrid's; every rank
// writes its shard of a checkpoint that resumes under the other strategies; the bytes a step follow the
// formulas; the flag outside hybrid sharding is refused.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/micro_runs.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::optimizer_across_groups_test {
namespace {

namespace fs = std::filesystem;

const std::string kAcross = "--sharding hybrid_shard --shard_group_size 2 --shard_optimizer_across_groups";

using testing::with_sharding;

class AcrossGroups : public ::testing::TestWithParam<testing::MicroCase> {};

TEST_P(AcrossGroups, EqualsFullShardAtTheWorldSize) {
  const testing::MicroCase& c = GetParam();
  const testing::RecordedRun& across = testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(c.flags, kAcross)));
  ASSERT_EQ(across.exit_code, 0) << across.output;
  const testing::RecordedRun& full_shard = testing::recorded_run(4, testing::micro_run_flags(4, c.flags));
  ASSERT_EQ(full_shard.exit_code, 0) << full_shard.output;
  testing::expect_same_up_to_sum_order(full_shard.dir, across.dir, testing::kMicroSteps, c.bf16_state);
  // Each rank holds full_shard's optimizer state at 4 ranks (rank k G + g's), less than plain hybrid's.
  const testing::RecordedRun& hybrid =
      testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(c.flags, "--sharding hybrid_shard --shard_group_size 2")));
  ASSERT_EQ(hybrid.exit_code, 0) << hybrid.output;
  const auto state = [](const testing::RecordedRun& run) {
    return testing::read_metrics_events(run.run_dir(), "sharded_state").at(0).at("ranks");
  };
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int world_shard = (r % 2) * 2 + r / 2;  // k G + g: place k in group g, as full_shard's rank
    EXPECT_EQ(state(across).at(r).at("optimizer_state_bytes"), state(full_shard).at(world_shard).at("optimizer_state_bytes"));
    // Half of plain hybrid's where all of it is rows (GaLore's right projector is on every rank whole).
    const double plain = state(hybrid).at(r).at("optimizer_state_bytes");
    const bool rows_only = c.name.rfind("galore", 0) != 0 || c.flags.find("--proj_type left") != std::string::npos;
    if (rows_only)
      EXPECT_NEAR(state(across).at(r).at("optimizer_state_bytes").get<double>(), plain / 2, 0.05 * plain);
    else
      EXPECT_LT(state(across).at(r).at("optimizer_state_bytes").get<double>(), plain);
    EXPECT_EQ(state(across).at(r).at("gradient_shard_bytes"), state(full_shard).at(world_shard).at("gradient_shard_bytes"));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, AcrossGroups, ::testing::ValuesIn(testing::micro_optimizers()),
                         [](const auto& info) { return info.param.name; });

// Composed with activation checkpointing, recompute, grouped projections, padded matmuls, bf16 moments
// (the shard_grad_op form), the fused step and every offload mode, each against full_shard at 4 ranks
// with the same flags.
struct Composition {
  std::string name, sharding, flags;
};

class AcrossGroupsComposes : public ::testing::TestWithParam<Composition> {};

TEST_P(AcrossGroupsComposes, AsFullShardDoes) {
  const auto& [name, sharding, flags] = GetParam();
  const std::string adamw = testing::micro_case("adamw").flags + " " + flags;
  const testing::RecordedRun& across = testing::recorded_run(
      4, testing::micro_run_flags(4, with_sharding(adamw, "--sharding " + sharding +
                                                          " --shard_group_size 2 --shard_optimizer_across_groups")));
  ASSERT_EQ(across.exit_code, 0) << across.output;
  const std::string flat = sharding == "hybrid_shard" ? "full_shard" : "shard_grad_op";
  const testing::RecordedRun& reference =
      testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(adamw, "--sharding " + flat)));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  testing::expect_same_up_to_sum_order(reference.dir, across.dir, testing::kMicroSteps,
                                       flags.find("--optimizer_state_dtype bfloat16") != std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Features, AcrossGroupsComposes,
    ::testing::Values(
        Composition{"hybrid_shard", "hybrid_shard", "--activation_checkpointing --grouped_projections --pad_matmul_dims on"},
        Composition{"hybrid_shard_grad_op", "hybrid_shard_grad_op", "--recompute mlp,attention --optimizer_state_dtype bfloat16"},
        // Each unit stepped in backward as its world shard's gradient lands, its rows all-gathered
        // across the groups there.
        Composition{"hybrid_shard_fused_step", "hybrid_shard", "--fuse_optimizer_with_backward --grad_clipping 0"},
        // Offloaded, the host steps this rank's world shard and the block's other rows come across the
        // groups at the unit's next gather, in every place the offloaded step runs.
        Composition{"offload_host", "hybrid_shard", "--offload optimizer --activation_checkpointing"},
        Composition{"offload_optimizer_parameters", "hybrid_shard", "--offload optimizer,parameters --recompute attention"},
        Composition{"offload_parameters", "hybrid_shard_grad_op", "--offload parameters"},
        Composition{"offload_step_device", "hybrid_shard", "--offload optimizer --offload_step device"},
        Composition{"offload_step_speculative", "hybrid_shard", "--offload optimizer --offload_step speculative"},
        Composition{"offload_delayed_update", "hybrid_shard_grad_op", "--offload optimizer --offload_delayed_update 2"}),
    [](const auto& info) { return info.param.name; });

// The offloaded step of the optimizers whose step sums or gathers across ranks (subset norms, GaLore's
// projectors), over the world layout's host communicator, and bf16 moments.
class AcrossGroupsOffload : public ::testing::TestWithParam<testing::MicroCase> {};

TEST_P(AcrossGroupsOffload, EqualsFullShardOffloaded) {
  const std::string flags = GetParam().flags + " --offload optimizer";
  const testing::RecordedRun& across = testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(flags, kAcross)));
  ASSERT_EQ(across.exit_code, 0) << across.output;
  const testing::RecordedRun& full_shard = testing::recorded_run(4, testing::micro_run_flags(4, flags));
  ASSERT_EQ(full_shard.exit_code, 0) << full_shard.output;
  testing::expect_same_up_to_sum_order(full_shard.dir, across.dir, testing::kMicroSteps, GetParam().bf16_state);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, AcrossGroupsOffload,
                         ::testing::Values(testing::micro_case("adamw_sn_general_all"), testing::micro_case("galore_right"),
                                           testing::micro_case("galore_left"), testing::micro_case("adamw_bf16_state")),
                         [](const auto& info) { return info.param.name; });

// Every rank writes its shard (the world layout's, as full_shard at 4 ranks), and the checkpoint
// resumes under plain hybrid, at 3 ranks under full_shard and offloaded; a full_shard checkpoint
// resumes with the optimizer across the groups. Each resumed run's steps within the sums' order of the uninterrupted.
TEST(AcrossGroupsCheckpoint, EveryRankWritesItsShardAndItResumesAnywhere) {
  const std::string adamw = testing::micro_case("adamw").flags;
  const testing::RecordedRun& across = testing::recorded_run(4, testing::micro_run_flags(4, with_sharding(adamw, kAcross)));
  ASSERT_EQ(across.exit_code, 0) << across.output;
  const fs::path saved = across.save_dir() / ("step_" + std::to_string(testing::kMicroSaveAt));
  const testing::Checkpoint checkpoint = testing::load_checkpoint(saved.string());
  EXPECT_EQ(checkpoint.manifest.at("world_size"), 4);
  EXPECT_EQ(checkpoint.manifest.at("files").size(), 8u);
  const testing::RecordedRun& full_shard = testing::recorded_run(4, testing::micro_run_flags(4, adamw));
  ASSERT_EQ(full_shard.exit_code, 0) << full_shard.output;
  const auto uninterrupted = testing::read_metrics_events(across.run_dir(), "train");
  struct Resume {
    int ranks;
    std::string sharding;
    fs::path from;
  };
  for (const Resume& resume :
       {Resume{4, "--sharding hybrid_shard --shard_group_size 2", saved}, Resume{3, "--sharding full_shard", saved},
        Resume{4, kAcross, full_shard.save_dir() / ("step_" + std::to_string(testing::kMicroSaveAt))},
        // Offloaded: the loaded world shards go to the host, and each block's rows come across the
        // groups at its first gather.
        Resume{4, kAcross + " --offload optimizer", saved}}) {
    SCOPED_TRACE(std::to_string(resume.ranks) + " ranks, " + resume.sharding + " from " + resume.from.string());
    testing::ScratchDir dir("across_resume");
    const testing::CommandResult result = testing::run_command(
        testing::trainer_launcher(resume.ranks) + " " +
        testing::micro_run_flags(resume.ranks, with_sharding(adamw, resume.sharding)) + " --continue_from " +
        resume.from.string() + " --run_dir " + (dir / "run").string() + " --save_dir " + (dir / "ckpt").string());
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto steps = testing::read_metrics_events(dir / "run", "train");
    ASSERT_EQ(steps.size(), static_cast<size_t>(testing::kMicroSteps - testing::kMicroSaveAt));
    for (const nlohmann::json& step : steps) {
      const double want = uninterrupted.at(step.at("step").get<size_t>() - 1).at("loss"), got = step.at("loss");
      EXPECT_LE(std::abs(got - want) / want, 1e-5) << "step " << step.at("step") << ": " << got << " vs " << want;
    }
  }
}

// A step's bytes (docs/sharding.md), B_p the block each rank gathers (G world shards: the record's
// parameter_shard_bytes), B_w its own world shard (gradient_shard_bytes): inside the group
// (S - 1)(2 M + 1) B_p (the gathers, and the reduce-scatter into the block); across the groups a
// reduce-scatter of the block and an all-gather of the updated shards, 2 (G - 1) B_w.
TEST(AcrossGroupsLinks, EachStepSendsWhatTheFormulaSays) {
  constexpr int kMicro = 2, kGroup = 2, kGroups = 2;
  const testing::RecordedRun& run = testing::recorded_run(
      4, "--config " + (testing::source_dir() / "configs/llama_micro.json").string() +
             " --device cpu --num_training_steps 3 --warmup_steps 0 --max_length 32 --batch_size 2"
             " --total_batch_size 16 --eval_every 0 --eval_batches 1 " + kAcross);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json state = testing::read_metrics_events(run.run_dir(), "sharded_state").at(0).at("ranks").at(0);
  const double block = state.at("parameter_shard_bytes"), own = state.at("gradient_shard_bytes");
  EXPECT_EQ(block, kGroups * own);
  const double inside = (kGroup - 1) * (2 * kMicro + 1) * block, across = 2.0 * (kGroups - 1) * own;
  for (const nlohmann::json& step : testing::read_metrics_events(run.run_dir(), "train")) {
    SCOPED_TRACE("step " + step.at("step").dump());
    EXPECT_NEAR(step.at("links").at("group").at("bytes").get<double>(), inside, 0.01 * inside + 256);
    EXPECT_NEAR(step.at("links").at("across").at("bytes").get<double>(), across, 0.01 * across + 256);
  }
}

TEST(AcrossGroupsFlags, OutsideHybridShardingIsRefused) {
  const std::string settings = testing::trainer_binary().string() + " --config " +
                               (testing::source_dir() / "configs/llama_micro.json").string() +
                               " --max_length 32 --device cpu --print_config --shard_optimizer_across_groups";
  struct Refusal {
    std::string flags, message;
  };
  for (const Refusal& refusal :
       {Refusal{"--sharding full_shard", "and --sharding is full_shard"},
        Refusal{"--sharding no_shard", "and --sharding is no_shard"}}) {
    const testing::CommandResult result = testing::run_command(testing::mpirun(4) + settings + " " + refusal.flags);
    EXPECT_EQ(result.exit_code, 2) << refusal.flags << "\n" << result.output;
    EXPECT_NE(result.output.find("--shard_optimizer_across_groups: " ), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(refusal.message), std::string::npos) << refusal.flags << "\n" << result.output;
  }
}

}  // namespace
}  // namespace llm::optimizer_across_groups_test
