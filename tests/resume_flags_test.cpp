// A resume with flags that change training (issue 44, bad case 3): exit 2 before anything is built,
// naming each flag with the checkpoint's value and this run's, unless --allow_changed_flags; the
// flags that do not change the steps (layout, logging, saving, where it stops) may differ freely;
// a new schedule length is said (config/training_settings.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/training_settings.h"
#include "tests/checkpoint_test_util.h"
#include "tests/rounding_bounds.h"
#include "tests/test_util.h"

namespace llm::resume_flags_test {
namespace {

namespace fs = std::filesystem;
using testing::mentions;
using testing::run_command;
using testing::ScratchDir;
using testing::trainer_command;

// Four steps saved at 2 and 4 (llama_micro, --lr 0.001 and --seed 0 by default, cosine).
class ResumeFlags : public ::testing::Test {
 protected:
  void SetUp() override { testing::train_four_steps(dir_ / "ckpt", dir_ / "first"); }
  // Resumes step_2 into run folder `run` with `flags` added.
  testing::CommandResult resume(const std::string& run, const std::string& flags) {
    return run_command(trainer_command("--num_training_steps 4 --save_dir " + (dir_ / "ckpt").string() +
                                       " --continue_from " + (dir_ / "ckpt/step_2").string() + " --run_dir " +
                                       (dir_ / run).string() + " " + flags));
  }
  ScratchDir dir_{"resume_flags"};
};

TEST_F(ResumeFlags, ChangedTrainingFlagsAreRefusedNamingEach) {
  const auto refused = resume("other_lr", "--lr 0.002 --seed 5 --scheduler linear --weight_decay 0.1");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  for (const std::string& part :
       {(dir_ / "ckpt/step_2/manifest.json").string() + ": run: this run's flags change what the checkpoint's run "
                                                          "trained with",
        std::string("--lr (the checkpoint's 0.001, this run's 0.002)"),
        std::string("--seed (the checkpoint's 0, this run's 5)"),
        std::string("--scheduler (the checkpoint's \"cosine\", this run's \"linear\")"),
        std::string("--weight_decay (the checkpoint's 0.0, this run's 0.1)"),
        std::string("pass --allow_changed_flags if the change is meant")})
    EXPECT_TRUE(mentions(refused.output, part)) << part << "\n" << refused.output;
  EXPECT_FALSE(fs::exists(dir_ / "other_lr/metrics.jsonl")) << "refused before the run started";
  EXPECT_EQ(testing::manifest(dir_ / "ckpt/step_4").at("run").at("lr"), 0.001) << "step_4 not written again";
}

TEST_F(ResumeFlags, AllowChangedFlagsGoesOnAndSaysEach) {
  const auto allowed = resume("allowed", "--lr 0.002 --seed 5 --allow_changed_flags");
  ASSERT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_TRUE(mentions(allowed.output, "--allow_changed_flags: resuming " + (dir_ / "ckpt/step_2").string() +
                                           " with changed flags: --lr (the checkpoint's 0.001, this run's 0.002); "
                                           "--seed (the checkpoint's 0, this run's 5)"))
      << allowed.output;
  EXPECT_EQ(testing::read_metrics_events(dir_ / "allowed", "train").size(), 2u);
  EXPECT_EQ(testing::manifest(dir_ / "ckpt/step_4").at("run").at("lr"), 0.002);
  // The lr alone changed (into a save_dir of its own): the learning rate acts only in the update after
  // a step's forward, so step 3 (the checkpoint's weights, batch 3) is the first run's bit for bit, and
  // step 4 is not (the new lr's update); each step's lr is the first run's twice (exactly: 2x commutes
  // with rounding).
  const auto lr_only = run_command(trainer_command("--num_training_steps 4 --lr 0.002 --allow_changed_flags --save_dir " +
                                                   (dir_ / "ckpt_lr").string() + " --continue_from " +
                                                   (dir_ / "ckpt/step_2").string() + " --run_dir " +
                                                   (dir_ / "lr_only").string()));
  ASSERT_EQ(lr_only.exit_code, 0) << lr_only.output;
  const auto first = testing::read_metrics_events(dir_ / "first", "train");
  const auto steps = testing::read_metrics_events(dir_ / "lr_only", "train");
  ASSERT_EQ(first.size(), 4u);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].at("loss").get<double>(), first[2].at("loss").get<double>()) << "step 3: the checkpoint's weights";
  EXPECT_NE(steps[1].at("loss").get<double>(), first[3].at("loss").get<double>()) << "step 4: the new lr's update";
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(steps[i].at("lr").get<double>(), 2 * first[2 + i].at("lr").get<double>()) << "step " << 3 + i;
}

// What lays the work out, logs, evaluates and saves does not change the steps: the same losses as
// the first run's steps 3 and 4, and no word about changed flags.
TEST_F(ResumeFlags, LayoutLoggingAndSavingFlagsMayDiffer) {
  // Two ranks at half the micro-batch: another world size, the same steps (first: --keep_last 1 below
  // removes step_2).
  const auto two_ranks = run_command(testing::mpirun(2) + testing::trainer_binary().string() +
                                     testing::trainer_arguments("--batch_size 1 --num_training_steps 4 --continue_from " +
                                                                (dir_ / "ckpt/step_2").string() + " --run_dir " +
                                                                (dir_ / "two_ranks").string()));
  ASSERT_EQ(two_ranks.exit_code, 0) << two_ranks.output;
  EXPECT_FALSE(mentions(two_ranks.output, "changed flags")) << two_ranks.output;
  // Its steps 3 and 4 are the first run's to fp32's rounding bounds (tests/rounding_bounds.h: step 3
  // is the checkpoint's weights with the mean over the tokens summed in another order, step 4 one
  // update later): the loss to its floor plus its movement's rounding, the gradient norm relatively.
  const auto first = testing::read_metrics_events(dir_ / "first", "train");
  ASSERT_EQ(first.size(), 4u);
  const auto resumed_two = testing::read_metrics_events(dir_ / "two_ranks", "train");
  ASSERT_EQ(resumed_two.size(), 2u);
  const testing::RoundingBounds fp32 = testing::fp32_bounds();
  for (size_t i = 0; i < 2; ++i) {
    const double want = first[2 + i].at("loss"), have = resumed_two[i].at("loss");
    EXPECT_NEAR(have, want, fp32.loss_floor + fp32.loss_k * fp32.u * std::abs(want - first[0].at("loss").get<double>()))
        << "step " << 3 + i;
    const double want_norm = first[2 + i].at("grad_norm"), norm = resumed_two[i].at("grad_norm");
    EXPECT_NEAR(norm, want_norm, fp32.norm_k * fp32.u * want_norm) << "step " << 3 + i;
  }
  const auto resumed = resume("layout", "--batch_size 1 --total_batch_size 2 --offload optimizer "
                                        "--activation_checkpointing --pad_matmul_dims on "
                                        "--no_prefetch --eval_every 1 --log_every 2 --save_every 1 --keep_last 1 "
                                        "--name other --divergence_patience 3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(mentions(resumed.output, "changed flags")) << resumed.output;
  const auto steps = testing::read_metrics_events(dir_ / "layout", "train");
  ASSERT_EQ(steps.size(), 1u) << "--log_every 2: step 4 only";
  EXPECT_EQ(steps[0].at("step"), 4);
  EXPECT_NEAR(steps[0].at("loss").get<double>(), first[3].at("loss").get<double>(),
              fp32.loss_floor + fp32.loss_k * fp32.u * std::abs(first[3].at("loss").get<double>() -
                                                                first[0].at("loss").get<double>()))
      << "gradient accumulation sums the micro-batches in another grouping";
}

TEST_F(ResumeFlags, AnotherScheduleLengthIsSaid) {
  const auto longer = run_command(trainer_command("--num_training_steps 6 --continue_from " + (dir_ / "ckpt").string() +
                                                  " --run_dir " + (dir_ / "longer").string()));
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_TRUE(mentions(longer.output, "--num_training_steps 6 (the checkpoint's run had 4): the cosine learning rate "
                                      "from here on follows the schedule of 6 steps"))
      << longer.output;
}

// --- which settings are compared (no process) ------------------------------------------------------

std::vector<std::string> flags_of(const std::vector<SettingDifference>& differences) {
  std::vector<std::string> flags;
  for (const SettingDifference& difference : differences) flags.push_back(difference.flag);
  return flags;
}

TEST(TrainingSettings, TheHeldOutSplitAndOnlyIt) {
  RunConfig saved;
  saved.data.eval_fraction = 0.05;
  RunConfig now = saved;
  now.data.eval_fraction = 0.1;
  EXPECT_EQ(flags_of(training_setting_differences(saved.to_json(), now)), std::vector<std::string>{"--eval_fraction"});
  now.data.eval_source = "val.bin";  // every window of --data trained on now
  EXPECT_EQ(flags_of(training_setting_differences(saved.to_json(), now)), std::vector<std::string>{"--eval_data"});
  saved.data.eval_source = "old/val.bin";  // both with --eval_data: the path and the fraction are evaluation's
  EXPECT_TRUE(training_setting_differences(saved.to_json(), now).empty());
}

TEST(TrainingSettings, KeysAnOlderCheckpointLacksAreNotCompared) {
  RunConfig saved;
  nlohmann::json old_run = saved.to_json();
  old_run.erase("optimizer_state_dtype");
  RunConfig now = saved;
  now.optimizer.state_dtype = "bfloat16";
  now.optimizer.lr = 0.5;
  EXPECT_EQ(flags_of(training_setting_differences(old_run, now)), std::vector<std::string>{"--lr"});
  EXPECT_TRUE(training_setting_differences(nlohmann::json(), now).empty());
  // Numbers compare by value: an integer written where the checkpoint has a float.
  old_run["lr"] = 0.5;
  old_run["max_length"] = 128.0;
  EXPECT_TRUE(training_setting_differences(old_run, now).empty());
}

}  // namespace
}  // namespace llm::resume_flags_test
