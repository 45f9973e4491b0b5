// End-to-end runs of the trainer binary on a tiny config: the loss falls below the corpus's unigram
// entropy, a resumed run equals the uninterrupted one, divergence stops the run with a clear message,
// and the command line's exit codes. These read metrics.jsonl, never stdout columns.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace llm::train_test {
namespace {

using testing::run_command;
using testing::ScratchDir;

std::string trainer_command(const std::string& flags) {
  return "OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
         (testing::source_dir() / "configs/llama_micro.json").string() + " --device cpu " + flags;
}


TEST(Train, LossFallsWellBelowTheUnigramEntropy) {
  ScratchDir dir("loss_falls");
  auto result = run_command(trainer_command(
      "--num_training_steps 150 --warmup_steps 10 --lr 3e-3 --batch_size 16 --max_length 64 "
      "--eval_every 50 --run_dir " + dir.path().string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto start = testing::read_metrics_events(dir.path(), "start").at(0);
  const double unigram = start.at("corpus_unigram_entropy");
  const double floor = start.at("corpus_entropy_rate");
  ASSERT_GT(unigram, floor + 2.0) << "the corpus must separate the two figures";
  const auto evals = testing::read_metrics_events(dir.path(), "eval");
  ASSERT_EQ(evals.size(), 3u);
  const double final_eval = evals.back().at("eval_loss");
  const auto steps = testing::read_metrics_events(dir.path(), "train");
  ASSERT_EQ(steps.size(), 150u);
  EXPECT_GT(static_cast<double>(steps.front().at("loss")), unigram - 0.2) << "starts near log(V)";
  // "Well below": at least 70 % of the way from the unigram entropy down to the floor.
  EXPECT_LT(final_eval, unigram - 0.7 * (unigram - floor)) << result.output;
  EXPECT_GT(final_eval, floor - 0.05) << "no model beats the entropy rate";
}

// metrics.jsonl's train records split each step's time into phases (common/step_timer.h) that add up
// to the step: a reader can see where the time went. At one rank the units are resident and nothing is
// gathered; at two ranks under full_shard the gathers and reduce-scatters show as collectives.
// Structure, not speed: no time is compared with a threshold.
TEST(Train, StepTimeSplitsIntoPhases) {
  for (const int ranks : {1, 2}) {
    ScratchDir dir("phases" + std::to_string(ranks));
    const std::string flags = " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
                              " --device cpu --num_training_steps 3 --warmup_steps 0 --batch_size 2 --max_length 32"
                              " --total_batch_size " + std::to_string(4 * ranks) + " --run_dir " + dir.path().string();
    const std::string launcher = ranks == 1 ? "OMP_NUM_THREADS=1 " : testing::mpirun(ranks);
    auto result = run_command(launcher + testing::trainer_binary().string() + flags);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto steps = testing::read_metrics_events(dir.path(), "train");
    ASSERT_EQ(steps.size(), 3u);
    for (const auto& step : steps) {
      EXPECT_EQ(step.at("phase_s_step"), step.at("step")) << "a CPU rank reads each step's phases at its end";
      const nlohmann::json& phases = step.at("phase_s");
      double sum = 0;
      for (const char* phase : {"forward", "backward", "collectives", "optimizer", "other"}) {
        ASSERT_TRUE(phases.contains(phase)) << step.dump();
        EXPECT_GE(static_cast<double>(phases.at(phase)), 0.0) << phase;
        sum += static_cast<double>(phases.at(phase));
      }
      const double step_time = step.at("step_time_s");
      // The phases partition the step's span; the rest is the few calls outside it (metrics line).
      EXPECT_LE(sum, step_time) << step.dump();
      EXPECT_GE(sum, 0.9 * step_time - 1e-3) << step.dump();
      for (const char* phase : {"forward", "backward", "optimizer"})
        EXPECT_GT(static_cast<double>(phases.at(phase)), 0.0) << phase << ": " << step.dump();
      // The host clock's phases: on a CPU rank they are the phases (on CUDA the stream's differ).
      EXPECT_EQ(step.at("host_phase_s"), phases) << step.dump();
      EXPECT_FALSE(step.contains("offload")) << step.dump();
      if (ranks == 2) {
        EXPECT_GT(static_cast<double>(phases.at("collectives")), 0.0) << step.dump();
      }
    }
    const auto schedule = testing::read_metrics_events(dir.path(), "gather_schedule").at(0);
    EXPECT_EQ(schedule.at("units_resident"), ranks == 1) << schedule.dump();
    const int64_t gathers = schedule.at("inline_gathers").get<int64_t>() + schedule.at("prefetches").get<int64_t>();
    if (ranks == 1)
      EXPECT_EQ(gathers, 0) << "one rank: every unit is its own shard, nothing is gathered";
    else
      EXPECT_GT(gathers, 0) << schedule.dump();
  }
}

// A read of a device value on the host drains a GPU's queue (common/device.h): a step makes a fixed
// number of them, whatever its micro-batches and units. Two per step (the loss averaged over ranks,
// the gradient norm); the fused step one more (the loss checked before the backward that updates).
// Before the loss stayed on the device, each micro-batch's loss was read, and the fused step read
// every unit's gradient norm: 4 + 2 reads at accumulation 4, 2 + 1 + units fused.
TEST(Train, HostReadsPerStepDoNotGrowWithMicroBatchesOrUnits) {
  for (const auto& [accumulation, extra, expected] :
       std::vector<std::tuple<int, std::string, int64_t>>{{1, "", 1}, {4, "", 1},
                                                          {4, " --fuse_optimizer_with_backward --grad_clipping 0", 2}}) {
    SCOPED_TRACE("accumulation " + std::to_string(accumulation) + extra);
    ScratchDir dir("host_reads");
    auto result = run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                              (testing::source_dir() / "configs/llama_micro.json").string() +
                              " --device cpu --num_training_steps 2 --warmup_steps 0 --batch_size 2 --max_length 16"
                              " --total_batch_size " + std::to_string(2 * accumulation) +
                              " --eval_every 0 --run_dir " + dir.path().string() + extra);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto steps = testing::read_metrics_events(dir.path(), "train");
    ASSERT_EQ(steps.size(), 2u);
    for (const auto& step : steps) EXPECT_EQ(step.at("host_reads").get<int64_t>(), expected) << step.dump();
  }
}

// With --offload optimizer the host step runs beside the step (a worker thread, and on CUDA off the
// compute stream): the train record says how long it took and how long the compute thread waited
// for it, since the last record. Here 3 steps of llama_micro on one CPU rank.
TEST(Train, OffloadReportsItsHostStepAndWaits) {
  ScratchDir dir("offload_times");
  auto result = run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                            (testing::source_dir() / "configs/llama_micro.json").string() +
                            " --device cpu --num_training_steps 3 --warmup_steps 0 --batch_size 2 --max_length 16"
                            " --eval_every 0 --offload optimizer --run_dir " + dir.path().string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto steps = testing::read_metrics_events(dir.path(), "train");
  ASSERT_EQ(steps.size(), 3u);
  double host_step = 0;
  for (const auto& step : steps) {
    ASSERT_TRUE(step.contains("offload")) << step.dump();
    const double step_s = step.at("offload").at("host_step_s"), wait_s = step.at("offload").at("wait_s");
    EXPECT_GE(wait_s, 0.0) << step.dump();
    EXPECT_GE(step_s, 0.0) << step.dump();
    host_step += step_s;
  }
  // Every unit of every step was stepped on the host (the last step's before the run's end).
  EXPECT_GT(host_step, 0.0);
}

// NCCL carries GPU tensors only: --communicator nccl on a CPU rank is exit 2 before anything is built.
TEST(Train, NcclCommunicatorOnCpuIsRefused) {
  ScratchDir dir("nccl_on_cpu");
  const auto result = run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                                  (testing::source_dir() / "configs/llama_micro.json").string() +
                                  " --device cpu --communicator nccl --num_training_steps 1 --batch_size 2"
                                  " --max_length 16 --run_dir " +
                                  dir.path().string());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--communicator nccl: NCCL carries GPU tensors, and this rank runs on cpu"),
            std::string::npos)
      << result.output;
  EXPECT_TRUE(testing::read_metrics_events(dir.path(), "train").empty());
}

TEST(Train, ResumedRunEqualsTheUninterruptedOne) {
  ScratchDir dir("resume");
  const std::string common =
      "--num_training_steps 12 --warmup_steps 3 --lr 2e-3 --batch_size 4 --max_length 32 "
      "--total_batch_size 8 --eval_every 0 ";
  auto full = run_command(trainer_command(common + "--save_every 6 --save_dir " +
                                          (dir / "ckpt").string() + " --run_dir " +
                                          (dir / "full").string()));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  auto resumed = run_command(trainer_command(common + "--continue_from " +
                                             (dir / "ckpt/step_6").string() + " --run_dir " +
                                             (dir / "resumed").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto full_steps = testing::read_metrics_events(dir / "full", "train");
  const auto resumed_steps = testing::read_metrics_events(dir / "resumed", "train");
  ASSERT_EQ(full_steps.size(), 12u);
  ASSERT_EQ(resumed_steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed_steps[i].at("step"), full_steps[i + 6].at("step"));
    // Same process, same thread count, same operations: bit-identical on CPU.
    EXPECT_EQ(static_cast<double>(resumed_steps[i].at("loss")),
              static_cast<double>(full_steps[i + 6].at("loss"))) << "step " << i + 7;
    EXPECT_EQ(static_cast<double>(resumed_steps[i].at("grad_norm")),
              static_cast<double>(full_steps[i + 6].at("grad_norm")));
  }
  EXPECT_EQ(testing::read_metrics_events(dir / "full", "end").at(0).at("final_eval_loss"),
            testing::read_metrics_events(dir / "resumed", "end").at(0).at("final_eval_loss"));
}

TEST(Train, ResumeFromASaveDirPicksTheNewestCheckpoint) {
  ScratchDir dir("resume_dir");
  const std::string common = "--num_training_steps 4 --warmup_steps 1 --batch_size 2 --max_length 16 "
                             "--eval_every 0 --save_every 2 --save_dir " + (dir / "ckpt").string();
  ASSERT_EQ(run_command(trainer_command(common + " --run_dir " + (dir / "a").string())).exit_code, 0);
  auto resumed = run_command(trainer_command("--num_training_steps 6 --warmup_steps 1 --batch_size 2 "
                                             "--max_length 16 --eval_every 0 --continue_from " +
                                             (dir / "ckpt").string() + " --run_dir " + (dir / "b").string()));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto steps = testing::read_metrics_events(dir / "b", "train");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps.front().at("step"), 5);
}

// A folder of the earlier full-tensor format (trainer_state.json, model.pt) is named as such.
TEST(Train, CheckpointOfTheEarlierFormatIsAClearError) {
  ScratchDir dir("bad_ckpt");
  std::filesystem::create_directories(dir / "step_3");
  std::ofstream(dir / "step_3/trainer_state.json") << "{\"step\": 3}";
  std::ofstream(dir / "step_3/model.pt") << "not a zip";
  auto result = run_command(trainer_command("--num_training_steps 4 --warmup_steps 1 --max_length 32 --continue_from " +
                                            (dir / "step_3").string() + " --run_dir " +
                                            (dir / "run").string()));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("step_3/manifest.json: missing: the folder holds a checkpoint of the earlier full-tensor "
                               "format"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("frame #"), std::string::npos) << "no C++ stack trace:\n" << result.output;
}

TEST(Train, SaveDirThatIsAFileIsRefusedBeforeTraining) {
  ScratchDir dir("save_dir_file");
  std::ofstream(dir / "afile") << "x";
  for (const std::string& save_dir : {(dir / "afile").string(), (dir / "afile/below").string()}) {
    auto result = run_command(trainer_command("--num_training_steps 2 --batch_size 2 --max_length 16 --save_dir " +
                                              save_dir + " --run_dir " + (dir / "run").string()));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("--save_dir: expected a folder for the checkpoints"), std::string::npos)
        << result.output;
    EXPECT_TRUE(testing::read_metrics_events(dir / "run", "train").empty()) << "refused before the first step";
  }
}


TEST(Train, DivergenceStopsWithAClearMessage) {
  ScratchDir dir("diverge");
  auto result = run_command(trainer_command(
      "--num_training_steps 30 --warmup_steps 0 --lr 1e30 --grad_clipping 0 --batch_size 2 "
      "--max_length 16 --eval_every 0 --run_dir " + dir.path().string()));
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("training stopped: step"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("Lower --lr"), std::string::npos) << result.output;
  // An fp32 run is not told to use fp32 (issue 51); a bf16 run is.
  EXPECT_EQ(result.output.find("--dtype float32"), std::string::npos) << result.output;
  ScratchDir bf16("diverge_bf16");
  auto in_bf16 = run_command(trainer_command(
      "--num_training_steps 30 --warmup_steps 0 --lr 1e30 --grad_clipping 0 --batch_size 2 --dtype bfloat16 "
      "--max_length 16 --eval_every 0 --run_dir " + bf16.path().string()));
  EXPECT_EQ(in_bf16.exit_code, 3) << in_bf16.output;
  EXPECT_NE(in_bf16.output.find("or use --dtype float32"), std::string::npos) << in_bf16.output;
}

// Divergence without a NaN (trainer/divergence.h): a huge lr and no clipping drive llama_micro either
// to a collapsed model (uniform loss, a gradient norm of exactly 0) or to a loss far above uniform.
// Both ran all their steps, exited 0 and checkpointed the dead model before the rule existed.
TEST(Train, CollapsedModelStopsWithExitThree) {
  ScratchDir dir("collapsed");
  auto result = run_command(trainer_command(
      "--num_training_steps 40 --lr 1000 --grad_clipping 0 --batch_size 4 --max_length 32 --eval_every 0 "
      "--save_every 10 --run_dir " + (dir / "run").string() + " --save_dir " + (dir / "ckpt").string()));
  EXPECT_EQ(result.exit_code, 3) << result.output;
  for (const char* part : {"training has diverged", "gradient norm has been exactly 0 for the last 10 steps",
                           "Lower --lr (now 1000)", "--grad_clipping (now 0, e.g. 1.0)", "--divergence_patience 0"})
    EXPECT_NE(result.output.find(part), std::string::npos) << part << " in:\n" << result.output;
  const auto steps = testing::read_metrics_events(dir / "run", "train");
  ASSERT_FALSE(steps.empty());
  EXPECT_LT(steps.size(), 40u) << "stopped before the last step";
  for (size_t i = steps.size() - 9; i < steps.size(); ++i) EXPECT_EQ(steps[i].at("grad_norm").get<double>(), 0.0);
  EXPECT_FALSE(std::filesystem::exists(dir / "ckpt" / "step_40")) << "no checkpoint of the end of a dead run";
  // With the check off the same run goes to its end, as before.
  ScratchDir off("collapsed_off");
  auto unchecked = run_command(trainer_command(
      "--num_training_steps 40 --lr 1000 --grad_clipping 0 --batch_size 4 --max_length 32 --eval_every 0 "
      "--divergence_patience 0 --run_dir " + off.path().string()));
  EXPECT_EQ(unchecked.exit_code, 0) << unchecked.output;
}

TEST(Train, RunawayLossStopsWithExitThree) {
  ScratchDir dir("runaway");
  auto result = run_command(trainer_command(
      "--num_training_steps 40 --lr 100 --grad_clipping 0 --batch_size 4 --max_length 32 --eval_every 0 "
      "--divergence_patience 5 --run_dir " + dir.path().string()));
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("at or above ln(128) + 1"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("last 5 steps after warmup"), std::string::npos) << result.output;
  const auto steps = testing::read_metrics_events(dir.path(), "train");
  // Warmup is 4 steps (a tenth of 40): steps 5 to 9 are the five over the ceiling, and step 10 stops
  // before its update.
  EXPECT_LE(steps.size(), 10u);
}

TEST(Train, PrintConfigHelpAndBadInputExitCodes) {
  auto printed = run_command(trainer_command("--print_config --batch_size 3 --max_length 32"));
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  const auto json_start = printed.output.find('{');
  ASSERT_NE(json_start, std::string::npos) << printed.output;
  const auto resolved = nlohmann::json::parse(printed.output.substr(json_start));
  EXPECT_EQ(resolved.at("run").at("batch_size"), 3);

  auto help = run_command(testing::trainer_binary().string() + " --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--total_batch_size"), std::string::npos);

  auto missing = run_command(testing::trainer_binary().string() + " --config /no/such.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("/no/such.json"), std::string::npos) << missing.output;

  auto bad_flag = run_command(trainer_command("--scheduler sometimes"));
  EXPECT_EQ(bad_flag.exit_code, 2);
  EXPECT_NE(bad_flag.output.find("--scheduler"), std::string::npos) << bad_flag.output;

  auto bad_data = run_command(trainer_command("--data /no/such.tok --max_length 32"));
  EXPECT_EQ(bad_data.exit_code, 2);
  EXPECT_NE(bad_data.output.find("/no/such.tok"), std::string::npos) << bad_data.output;
}

TEST(Train, PrepareThenTrainOnTheTokenFile) {
  // The whole user path through the binary: text -> `trainer prepare` (training a tokenizer) ->
  // token file -> training on it.
  ScratchDir dir("prepare_train");
  {
    std::ofstream text(dir / "corpus.txt");
    const char* words[] = {"the", "model", "learns", "tokens", "from", "text", "and", "memory",
                           "shards", "ranks", "gather", "scatter", "every", "step", "again"};
    for (int line = 0; line < 3000; ++line) {
      for (int word = 0; word < 12; ++word) text << words[(line * 7 + word * word + word) % 15] << ' ';
      text << '\n';
    }
  }
  auto prepared = run_command(testing::trainer_binary().string() + " prepare --input " +
                              (dir / "corpus.txt").string() + " --vocab_size 64 --output " +
                              (dir / "corpus.tok").string());
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  ASSERT_TRUE(std::filesystem::exists(dir / "corpus.tok.model")) << prepared.output;
  auto trained = run_command(trainer_command("--data " + (dir / "corpus.tok").string() +
                                             " --num_training_steps 5 --warmup_steps 1 --batch_size 4"
                                             " --max_length 32 --eval_every 0 --run_dir " +
                                             (dir / "run").string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const auto steps = testing::read_metrics_events(dir / "run", "train");
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_LT(static_cast<double>(steps.back().at("loss")), static_cast<double>(steps.front().at("loss")));
}

}  // namespace
}  // namespace llm::train_test
