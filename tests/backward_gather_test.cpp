// full_shard's node-local copy for the backward (--backward_gather_size R, ZeRO++ hpZ) through the
// trainer binary under mpirun on CPU: the backward's gathers read the same parameter bits from the
// node's copy, so a run is full_shard's bit for bit (fp32, pure bf16 with padded matmuls and activation
// checkpointing, GaLore); the step's gathers move from the world to the node as the formulas say; the
// flag's bad values are refused.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/micro_runs.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::backward_gather_test {
namespace {

struct Case {
  std::string name, flags;
};

class BackwardGather : public ::testing::TestWithParam<Case> {};

// The run with the node's copy against the same run without it: every loss, norm and lr, every
// evaluation, and the last checkpoint, bit for bit.
TEST_P(BackwardGather, IsFullShardBitForBit) {
  const Case& c = GetParam();
  const std::string flags = testing::micro_run_flags(4, c.flags);
  const testing::RecordedRun& plain = testing::recorded_run(4, flags);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const testing::RecordedRun& copied = testing::recorded_run(4, flags + " --backward_gather_size 2");
  ASSERT_EQ(copied.exit_code, 0) << copied.output;
  testing::expect_same_run(plain.dir, copied.dir, testing::kMicroSteps);
  // The node's gathers happened (and nothing else changed but where the backward gathers).
  const auto steps = testing::read_metrics_events(copied.run_dir(), "train");
  ASSERT_FALSE(steps.empty());
  EXPECT_GT(steps.back().at("links").at("node").at("bytes").get<double>(), 0.0);
  EXPECT_EQ(testing::read_metrics_events(plain.run_dir(), "train").back().at("links").at("node").at("bytes"), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BackwardGather,
    ::testing::Values(Case{"adamw", testing::micro_case("adamw").flags},
                      Case{"pure_bf16_padded_checkpointed",
                           testing::micro_case("adamw").flags +
                               " --dtype bfloat16 --precision pure --pad_matmul_dims on --activation_checkpointing"},
                      Case{"galore_no_prefetch", testing::micro_case("galore_left").flags + " --no_prefetch"},
                      Case{"offload_recompute", testing::micro_case("adamw").flags + " --offload optimizer --recompute mlp"}),
    [](const auto& info) { return info.param.name; });

// A step's bytes (docs/sharding.md), from the run's own records: the forward gathers over every rank
// as before, (N - 1) M B_p; the backward's over the node, (R - 1) M B_n with B_n the node's copy, about
// N / R shards; the reduce-scatter unchanged. Accumulation 2.
TEST(BackwardGatherLinks, TheBackwardGathersMoveInsideTheNode) {
  constexpr int kRanks = 4, kMicro = 2, kNode = 2;
  const std::string flags = "--config " + (testing::source_dir() / "configs/llama_micro.json").string() +
                            " --device cpu --num_training_steps 3 --warmup_steps 0 --max_length 32 --batch_size 2"
                            " --total_batch_size 16 --eval_every 0 --eval_batches 1 --sharding full_shard";
  const testing::RecordedRun& run = testing::recorded_run(kRanks, flags + " --backward_gather_size 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json state = testing::read_metrics_events(run.run_dir(), "sharded_state").at(0).at("ranks").at(0);
  const double parameters = state.at("parameter_shard_bytes"), gradients = state.at("gradient_shard_bytes");
  const double world = (kRanks - 1) * (kMicro * parameters + gradients);
  const double node = (kNode - 1) * kMicro * (kRanks / kNode) * parameters;  // the copy: N / R shards (padding aside)
  for (const nlohmann::json& step : testing::read_metrics_events(run.run_dir(), "train")) {
    SCOPED_TRACE("step " + step.at("step").dump());
    EXPECT_NEAR(step.at("links").at("group").at("bytes").get<double>(), world, 0.01 * world + 256);
    EXPECT_NEAR(step.at("links").at("node").at("bytes").get<double>(), node, 0.02 * node);
    EXPECT_EQ(step.at("links").at("across").at("bytes"), 0);
  }
}

// The flag is full_shard's, below and dividing the world size, and not with parameter offload.
TEST(BackwardGatherFlags, BadSizesAndCombinationsAreRefused) {
  const std::string settings = testing::trainer_binary().string() + " --config " +
                               (testing::source_dir() / "configs/llama_micro.json").string() +
                               " --max_length 32 --device cpu --print_config";
  struct Refusal {
    std::string flags, message;
  };
  for (const Refusal& refusal :
       {Refusal{"--backward_gather_size 3", "--backward_gather_size: 3 does not divide the 4 ranks: give a divisor below "
                                            "the world size (1, 2)"},
        Refusal{"--backward_gather_size 4", "--backward_gather_size: 4 is not below the 4 ranks"},
        Refusal{"--backward_gather_size 2 --sharding shard_grad_op", "and --sharding is shard_grad_op"},
        Refusal{"--backward_gather_size 2 --offload parameters", "with --offload parameters"}}) {
    const testing::CommandResult result = testing::run_command(testing::mpirun(4) + settings + " " + refusal.flags);
    EXPECT_EQ(result.exit_code, 2) << refusal.flags << "\n" << result.output;
    EXPECT_NE(result.output.find(refusal.message), std::string::npos) << refusal.flags << "\n" << result.output;
  }
}

}  // namespace
}  // namespace llm::backward_gather_test
