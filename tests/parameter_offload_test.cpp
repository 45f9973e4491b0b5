// --offload parameters and --offload optimizer,parameters through the trainer binary on CPU
// (sharding/fsdp_unit.h): each unit's compute-dtype rows live in host memory and are copied in at
// every gather, so no unit is resident and no_shard's units are copied in and freed like
// full_shard's. On CPU the arithmetic is unchanged: every step's loss, gradient norm and evaluation,
// and the final parameters and optimizer state, equal the run without offload bit for bit, for each
// strategy, precision and optimizer, at 1 to 4 ranks, with accumulation, clipping, the fused step
// and recomputation. The ledger shows where the rows went: between steps the device holds the
// master alone (parameters) or nothing (both), and the host the compute rows.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/micro_runs.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::parameter_offload_test {
namespace {

using testing::run_command;
using testing::ScratchDir;

struct ParameterOffloadCase {
  std::string name;
  int ranks;
  std::string flags;
  bool pure_bf16 = false;    // the compute rows are 2 bytes, else 4
  bool fused = false;        // --fuse_optimizer_with_backward: the optimizer stays on the device
};

// The family of tests/micro_runs.h: llama_micro, 6 steps, accumulation, clipping, evaluation and a
// checkpoint at 3 and 6; recorded (the fp32 AdamW runs without offload are also Reshard's).
const testing::RecordedRun& micro_run(const ParameterOffloadCase& c, const std::string& more = "") {
  return testing::recorded_run(c.ranks, testing::micro_run_flags(c.ranks, c.flags + more));
}

class ParameterOffloadEquivalence : public ::testing::TestWithParam<ParameterOffloadCase> {};

TEST_P(ParameterOffloadEquivalence, EqualsNoOffloadBitwise) {
  const ParameterOffloadCase& c = GetParam();
  const testing::RecordedRun& plain = micro_run(c);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto plain_state = testing::read_metrics_events(plain.run_dir(), "sharded_state").at(0).at("ranks");

  std::vector<std::string> sets = {"parameters"};
  if (!c.fused) sets.push_back("optimizer,parameters");
  for (const std::string& set : sets) {
    SCOPED_TRACE("--offload " + set);
    const bool with_optimizer = set != "parameters";
    const testing::RecordedRun& offloaded = micro_run(c, " --offload " + set);
    ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
    testing::expect_same_run(plain.dir, offloaded.dir, testing::kMicroSteps);

    const auto state = testing::read_metrics_events(offloaded.run_dir(), "sharded_state").at(0).at("ranks");
    for (int r = 0; r < c.ranks; ++r) {
      // The fp32 master's bytes, 4 a row; the compute rows are c of them.
      const int64_t master = plain_state[r].at("parameter_shard_bytes").get<int64_t>();
      ASSERT_GT(master, 0);
      const int64_t rows = master / 4 * (c.pure_bf16 ? 2 : 4);
      // The device's persistent rows: the master while the optimizer is on the device, else none.
      EXPECT_EQ(state[r].at("parameter_shard_bytes").get<int64_t>(), with_optimizer ? 0 : master) << "rank " << r;
      const auto points = testing::read_ledger_events(offloaded.run_dir(), r, "point");
      ASSERT_FALSE(points.empty());
      int optimizer_points = 0;
      for (const nlohmann::json& point : points) {
        if (point.at("phase") != "optimizer") continue;
        ++optimizer_points;
        // Between steps nothing is gathered: the device holds the master or nothing.
        EXPECT_EQ(point.at("parameters").get<int64_t>(), with_optimizer ? 0 : master) << "rank " << r;
        if (!with_optimizer) {
          EXPECT_EQ(point.at("optimizer_host").get<int64_t>(), rows) << "rank " << r << ": the host holds the rows alone";
        } else {
          EXPECT_GT(point.at("optimizer_host").get<int64_t>(), rows + master) << "rank " << r << ": rows, masters, state";
          // GaLore projects on the device: its projectors' copies are there.
          if (c.flags.find("galore") != std::string::npos)
            EXPECT_GT(point.at("optimizer_device").get<int64_t>(), 0) << "rank " << r;
          else
            EXPECT_EQ(point.at("optimizer_device").get<int64_t>(), 0) << "rank " << r;
        }
      }
      EXPECT_EQ(optimizer_points, testing::kMicroSteps) << "rank " << r;
    }
  }
}

const ParameterOffloadCase kCases[] = {
    {"fp32_adamw_1rank", 1, testing::micro_case("adamw").flags},
    {"fp32_adamw_4ranks", 4, testing::micro_case("adamw").flags},
    {"pure_bf16_adamw_sn_2ranks_shard_grad_op", 2,
     "--optimizer adamw_sn --lr 2e-2 --dtype bfloat16 --precision pure --sharding shard_grad_op", true},
    {"mixed_bf16_galore_2ranks", 2,
     "--optimizer galore_adamw --rank 8 --update_proj_gap 2 --lr 5e-3 --dtype bfloat16 --precision mixed"},
    {"fp32_adamw_sn_3ranks_no_shard", 3, "--optimizer adamw_sn --lr 2e-2 --sharding no_shard"},
    {"pure_bf16_galore_1rank_bf16_state", 1,
     "--optimizer galore_adamw --rank 8 --update_proj_gap 2 --lr 5e-3 --dtype bfloat16 --precision pure "
     "--optimizer_state_dtype bfloat16",
     true},
    {"pure_bf16_adamw_4ranks_no_shard_checkpointing", 4,
     "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision pure --sharding no_shard --activation_checkpointing", true},
    {"mixed_bf16_adamw_2ranks_recompute", 2,
     "--optimizer adamw --lr 1e-2 --dtype bfloat16 --precision mixed --recompute norm,swiglu --no_prefetch"},
    {"fp32_adamw_2ranks_fused_step", 2, "--optimizer adamw --lr 1e-2 --grad_clipping 0 --fuse_optimizer_with_backward",
     false, true},
};

INSTANTIATE_TEST_SUITE_P(Cases, ParameterOffloadEquivalence, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// A checkpoint saved with both offloaded resumes with the parameters alone offloaded (the masters are
// what a checkpoint holds, whoever kept them), and the resumed steps equal the uninterrupted run.
TEST(ParameterOffload, ResumesExactlyAcrossOffloadSets) {
  const ParameterOffloadCase c{"resume", 2, testing::micro_case("adamw").flags};
  const testing::RecordedRun& whole = micro_run(c, " --offload optimizer,parameters");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ScratchDir resumed_dir("param_offload_resumed");
  auto resumed = run_command(testing::trainer_launcher(2) + " " + testing::micro_run_flags(2, c.flags) +
                             " --offload parameters --continue_from " + (whole.save_dir() / "step_3").string() +
                             " --run_dir " + (resumed_dir / "run").string() + " --save_dir " + (resumed_dir / "ckpt").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto whole_steps = testing::read_metrics_events(whole.run_dir(), "train");
  const auto resumed_steps = testing::read_metrics_events(resumed_dir / "run", "train");
  ASSERT_EQ(resumed_steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed_steps[i].at("loss").get<double>(), whole_steps[i + 3].at("loss").get<double>()) << "step " << i + 4;
    EXPECT_EQ(resumed_steps[i].at("grad_norm").get<double>(), whole_steps[i + 3].at("grad_norm").get<double>());
  }
  testing::expect_same_checkpoint(whole.save_dir() / "step_6", resumed_dir / "ckpt/step_6");
}

// The set reads in either order and is recorded as one spelling; what it cannot be is exit 2.
TEST(ParameterOffload, TheFlagIsASet) {
  ScratchDir dir("param_offload_flag");
  const std::string base = testing::trainer_binary().string() + " --config " +
                           (testing::source_dir() / "configs/llama_micro.json").string() +
                           " --device cpu --num_training_steps 1 --max_length 32 --batch_size 2 --eval_every 0 --run_dir " +
                           (dir / "run").string();
  auto reversed = run_command("OMP_NUM_THREADS=1 " + base + " --offload parameters,optimizer");
  ASSERT_EQ(reversed.exit_code, 0) << reversed.output;
  const auto start = testing::read_metrics_events(dir / "run", "start").at(0);
  EXPECT_EQ(start.at("run").at("offload"), "optimizer,parameters") << start.at("run").dump();
  // The record reads back (trainer report parses the run's settings from it).
  auto report = run_command(testing::trainer_binary().string() + " report " + (dir / "run").string() + " --out " +
                            (dir / "report").string());
  EXPECT_EQ(report.exit_code, 0) << report.output;

  for (const char* bad : {"parameters,none", "params", "optimizer,", "optimizer,optimizer"}) {
    auto refused = run_command(base + " --offload " + bad);
    EXPECT_EQ(refused.exit_code, 2) << bad << "\n" << refused.output;
    EXPECT_NE(refused.output.find("--offload"), std::string::npos) << refused.output;
  }
  auto fused = run_command(base + " --offload optimizer,parameters --grad_clipping 0 --fuse_optimizer_with_backward");
  EXPECT_EQ(fused.exit_code, 2) << fused.output;
  EXPECT_NE(fused.output.find("--offload parameters alone combines with it"), std::string::npos) << fused.output;
}

}  // namespace
}  // namespace llm::parameter_offload_test
