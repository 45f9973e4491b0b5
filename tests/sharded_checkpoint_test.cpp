// Sharded checkpoints (checkpoint/checkpoint.h) through the trainer binary under mpirun: each rank writes
// its own parts, and a checkpoint resumes at its own world size bit for bit and at another (2 -> 3 for
// each optimizer's state, with and without offload; 4 -> 2 and 1 -> 4 too for AdamW) with the uninterrupted
// run's results; saving gathers nothing (the ledger's checkpoint point stays under the training peak);
// the background save writes the synchronous one's bits; bf16 moments are saved as bf16.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/interchange/safetensors.h"
#include "tests/micro_runs.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::sharded_checkpoint_test {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::ScratchDir;

std::vector<double> losses(const fs::path& run_dir) {
  std::vector<double> values;
  for (const auto& step : testing::read_metrics_events(run_dir, "train")) values.push_back(step.at("loss"));
  return values;
}

// Each optimizer's run (tests/micro_runs.h, recorded once and shared with sharding_test's WorldSizes),
// saved at step 3 by 4 ranks and resumed by 4 (the same world size: bit for bit), and saved by 2 and
// resumed by 3 (every matrix pads a row there, and a rank reads its rows from both files): the rest
// of the run equals the uninterrupted run's. AdamW also goes 4 -> 2 and 1 -> 4 (fewer ranks, and from
// one). With offload, the saving and the resumed runs hold the optimizer in host memory, which writes
// and reads its parts of the same files.
class Reshard : public ::testing::TestWithParam<std::tuple<testing::MicroCase, bool>> {};

TEST_P(Reshard, ResumesAtTheSameAndAtOtherWorldSizes) {
  const auto& [optimizer, offload] = GetParam();
  const std::string flags = optimizer.flags + (offload ? " --offload optimizer" : "");
  const std::string saved_step = "step_" + std::to_string(testing::kMicroSaveAt);
  const std::string last_step = "step_" + std::to_string(testing::kMicroSteps);
  std::vector<std::pair<int, int>> transitions = {{4, 4}, {2, 3}};
  if (optimizer.name == "adamw") transitions.insert(transitions.end(), {{4, 2}, {1, 4}});
  for (const auto& [saved_at, resumed_at] : transitions) {
    const std::string transition = std::to_string(saved_at) + " -> " + std::to_string(resumed_at);
    SCOPED_TRACE(transition);
    const testing::RecordedRun& full = testing::recorded_run(saved_at, testing::micro_run_flags(saved_at, flags));
    ASSERT_EQ(full.exit_code, 0) << full.output;
    const fs::path checkpoint = full.save_dir() / saved_step;
    // Each rank wrote its own parts and its index; the manifest lists them all.
    const nlohmann::json manifest = testing::load_checkpoint(checkpoint.string()).manifest;
    EXPECT_EQ(manifest.at("world_size"), saved_at);
    EXPECT_EQ(manifest.at("files").size(), 2u * saved_at);
    const std::vector<double> expected = losses(full.run_dir());
    ASSERT_EQ(expected.size(), static_cast<size_t>(testing::kMicroSteps));
    const testing::Checkpoint expected_final = testing::load_checkpoint((full.save_dir() / last_step).string());

    {
      const int ranks = resumed_at;
      ScratchDir resumed_dir("reshard_" + optimizer.name + (offload ? "_offload" : ""));
      auto resumed = run_command(testing::trainer_launcher(ranks) + " " + testing::micro_run_flags(ranks, flags) +
                                 " --continue_from " + checkpoint.string() + " --run_dir " + (resumed_dir / "run").string() +
                                 " --save_dir " + (resumed_dir / "ckpt").string());
      ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
      EXPECT_NE(resumed.output.find("at step 3 (saved by " + std::to_string(saved_at) + " rank(s))"), std::string::npos)
          << resumed.output;
      const std::vector<double> actual = losses(resumed_dir / "run");
      ASSERT_EQ(actual.size(), static_cast<size_t>(testing::kMicroSteps - testing::kMicroSaveAt));
      for (size_t i = 0; i < actual.size(); ++i) {
        const double want = expected[testing::kMicroSaveAt + i];
        if (ranks == saved_at)
          EXPECT_EQ(actual[i], want) << "same world size, step " << testing::kMicroSaveAt + i + 1 << ": bit-identical";
        else
          EXPECT_LE(std::abs(actual[i] - want) / std::abs(want), 1e-5)
              << ranks << " ranks, step " << testing::kMicroSaveAt + i + 1 << ": " << actual[i] << " vs " << want;
      }
      const testing::Checkpoint final_state = testing::load_checkpoint((resumed_dir / "ckpt" / last_step).string());
      ASSERT_EQ(final_state.model.size(), expected_final.model.size());
      ASSERT_EQ(final_state.optimizer.size(), expected_final.optimizer.size());
      for (const auto* tensors : {&expected_final.model, &expected_final.optimizer})
        for (const auto& [key, want] : *tensors) {
          const at::Tensor& got = (tensors == &expected_final.model ? final_state.model : final_state.optimizer).at(key);
          if (ranks == saved_at) {
            EXPECT_TRUE(at::equal(got, want)) << key;
          } else if (key != "step") {
            // A bf16 moment's stochastic rounding takes the other neighbour where its fp32 value moved
            // by an ulp (sums over ranks add in another order): one bf16 step, 2^-8 of the value.
            const bool bf16_moment = optimizer.bf16_state && tensors == &expected_final.optimizer;
            const double scale = want.abs().max().item<double>() + 1e-12;
            EXPECT_LE((got - want).abs().max().item<double>() / scale, bf16_moment ? 8e-3 : 1e-3)
                << ranks << " ranks: " << key;
          }
        }
    }
  }
}

// AdamW, the general subset norm, GaLore both ways and the bf16 moments (each a state of another
// shape, with its own parts to read back), with and without offload. The other forms of the same rules
// (per-matrix subset norms, RMSprop-SN, the subspace projector) are compared across world sizes by
// sharding_test's WorldSizes.
std::vector<std::tuple<testing::MicroCase, bool>> reshard_cases() {
  std::vector<std::tuple<testing::MicroCase, bool>> cases;
  for (const char* name : {"adamw", "adamw_sn_general_all", "galore_right", "galore_left", "adamw_bf16_state",
                           "adamw_sn_bf16_state"})
    for (const bool offload : {false, true}) cases.emplace_back(testing::micro_case(name), offload);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Reshard, ::testing::ValuesIn(reshard_cases()), [](const auto& info) {
  return std::get<0>(info.param).name + (std::get<1>(info.param) ? "_offload" : "");
});

// Resuming with another optimizer is refused, naming the one that wrote the checkpoint: at start-up
// with the other changed flags (config/training_settings.h), and with --allow_changed_flags when its
// state is read (it does not fit).
TEST(ReshardRefusal, AnotherOptimizersCheckpointIsRefused) {
  const testing::MicroCase& galore = testing::micro_case("galore_right");
  const testing::RecordedRun& saved = testing::recorded_run(2, testing::micro_run_flags(2, galore.flags));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  ScratchDir dir("reshard_other_optimizer");
  const auto resume = [&](const std::string& more) {
    return run_command(testing::trainer_launcher(1) + " " + testing::micro_run_flags(1, "--optimizer adamw" + more) +
                       " --continue_from " + (saved.save_dir() / "step_3").string() + " --run_dir " +
                       (dir / "run").string() + " --save_dir " + (dir / "ckpt").string());
  };
  auto other = resume("");
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("--optimizer (the checkpoint's \"galore_adamw\", this run's \"adamw\")"), std::string::npos)
      << other.output;
  auto allowed = resume(" --allow_changed_flags");
  EXPECT_EQ(allowed.exit_code, 2) << allowed.output;
  EXPECT_NE(allowed.output.find("written by --optimizer"), std::string::npos) << allowed.output;
}

// Saving gathers nothing: on every rank the tracked peak while the save runs (the ledger's checkpoint
// point's window) is no more than the training step's own peak (before, each rank held the full model
// and optimizer state while rank 0 wrote them).
TEST(ShardedSave, NoRankHoldsMoreThanItsShardsWhileSaving) {
  const testing::RecordedRun& run = testing::recorded_run(4, testing::micro_run_flags(4, testing::micro_case("adamw").flags));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(run.run_dir() / ("memory.rank" + std::to_string(rank) + ".jsonl"));
    int64_t checkpoints = 0, step_peak = 0, step = -1;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (record.value("event", "") != "point") continue;
      if (record.at("step") != step) step_peak = 0, step = record.at("step");
      const int64_t peak = record.at("window_peak_bytes");
      if (record.at("phase") != "checkpoint") {
        step_peak = std::max(step_peak, peak);
        continue;
      }
      ++checkpoints;
      EXPECT_GT(step_peak, 0);
      EXPECT_LE(peak, step_peak) << "rank " << rank << ", step " << step << ": the save held more than the step";
    }
    EXPECT_EQ(checkpoints, testing::kMicroSteps / testing::kMicroSaveAt) << "rank " << rank;
  }
}

// --async_save writes the synchronous save's checkpoints, bit for bit: when the write ends before the
// next step boundary, and when it is held back a second (LLM_DEBUG_SAVE_DELAY_SECONDS) so that the
// steps after the save run while it is written (what is written is the host copy taken at the save).
// Each save's "checkpoint" record says when it completed; the last step's save is synchronous.
TEST(AsyncSave, WritesTheSynchronousCheckpointsWhileTrainingGoesOn) {
  ScratchDir dir("async_save");
  const std::string flags = testing::micro_run_flags(2, testing::micro_case("adamw_sn_general_all").flags);
  const testing::RecordedRun& sync = testing::recorded_run(2, flags);
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  struct Variant {
    const char* name;
    std::string prefix;
  };
  const Variant variants[] = {{"async", ""}, {"late", "LLM_DEBUG_SAVE_DELAY_SECONDS=1 "}};
  std::map<std::string, std::vector<nlohmann::json>> records;
  records["sync"] = testing::read_metrics_events(sync.run_dir(), "checkpoint");
  ASSERT_EQ(records["sync"].size(), 2u) << sync.output;
  for (const Variant& variant : variants) {
    auto result = run_command(variant.prefix + testing::trainer_launcher(2) + " " + flags + " --async_save --run_dir " +
                              (dir / variant.name / "run").string() + " --save_dir " + (dir / variant.name / "ckpt").string());
    ASSERT_EQ(result.exit_code, 0) << variant.name << "\n" << result.output;
    records[variant.name] = testing::read_metrics_events(dir / variant.name / "run", "checkpoint");
    ASSERT_EQ(records[variant.name].size(), 2u) << variant.name << "\n" << result.output;
    EXPECT_FALSE(fs::exists(dir / variant.name / "ckpt/step_3.tmp"));
    SCOPED_TRACE(variant.name);
    testing::expect_same_run(sync.dir, dir / variant.name, testing::kMicroSteps);
    testing::expect_same_checkpoint(sync.save_dir() / "step_3", dir / variant.name / "ckpt/step_3");
  }
  EXPECT_EQ(records["sync"][0].at("step"), 3);
  EXPECT_EQ(records["sync"][0].at("completed_at_step"), 3);
  EXPECT_EQ(records["sync"][0].at("background"), false);
  // A save completes at the first boundary after its files are written, at the latest the next
  // save's (held back 1 s, that one unless a step takes a second).
  for (const char* variant : {"async", "late"}) {
    EXPECT_EQ(records[variant][0].at("step"), 3);
    EXPECT_EQ(records[variant][0].at("background"), true);
    EXPECT_GE(records[variant][0].at("completed_at_step").get<int64_t>(), 4);
    EXPECT_LE(records[variant][0].at("completed_at_step").get<int64_t>(), 6);
    EXPECT_EQ(records[variant][1].at("step"), 6);
  }
  EXPECT_EQ(records["late"][1].at("completed_at_step"), testing::kMicroSteps);  // the last step's save: synchronous
  EXPECT_EQ(records["late"][1].at("background"), false);
  // The manifest keeps the settings that wrote it.
  const nlohmann::json sync_run = testing::load_checkpoint((sync.save_dir() / "step_3").string()).manifest.at("run");
  const nlohmann::json async_run = testing::load_checkpoint((dir / "async/ckpt/step_3").string()).manifest.at("run");
  for (const nlohmann::json* run : {&sync_run, &async_run}) {
    EXPECT_EQ(run->at("save_every"), 3);
    EXPECT_EQ(run->at("optimizer"), "adamw_sn");
  }
  EXPECT_EQ(sync_run.at("async_save"), false);
  EXPECT_EQ(async_run.at("async_save"), true);
}

// A run that stops with an error while a background save is being written (held back 30 s here)
// gives that save up between tensors instead of waiting for it: the error comes at once, and the
// save never becomes a checkpoint.
TEST(AsyncSave, AnErrorIsNotHeldUpByTheSaveInFlight) {
  ScratchDir dir("async_save_error");
  const auto started = std::chrono::steady_clock::now();
  auto result = run_command("LLM_DEBUG_SAVE_DELAY_SECONDS=30 " + testing::trainer_launcher(1) + " --config " +
                            (testing::source_dir() / "configs/llama_micro.json").string() +
                            " --device cpu --num_training_steps 30 --warmup_steps 0 --lr 1e30 --grad_clipping 0"
                            " --batch_size 2 --total_batch_size 2 --max_length 16 --eval_every 0 --save_every 1"
                            " --async_save --save_dir " + (dir / "ckpt").string() + " --run_dir " + (dir / "run").string());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("saving checkpoint"), std::string::npos) << "no save was in flight:\n" << result.output;
  EXPECT_LT(seconds, 20) << "the error waited for the held-back save";
  EXPECT_FALSE(fs::exists(dir / "ckpt/step_1/manifest.json"));
}

// bf16 moments are saved as bf16 (masters as fp32), by the synchronous and the background save
// alike; the manifest names the dtype; a float32 checkpoint resumes into bf16 state (rounded to
// nearest, logged) and a bf16 one into float32 (exact, logged).
TEST(Bf16StateCheckpoint, SavedInItsDtypeAndResumableIntoTheOther) {
  ScratchDir dir("bf16_state_ckpt");
  const testing::MicroCase& fp32_case = testing::micro_case("adamw");
  const testing::MicroCase& bf16_case = testing::micro_case("adamw_bf16_state");
  ASSERT_FALSE(fp32_case.bf16_state);
  ASSERT_TRUE(bf16_case.bf16_state);
  // The recorded runs (shared with Reshard), and the bf16 one again with the background save.
  const auto run = [&](const std::string& name, const std::string& flags) {
    return run_command(testing::trainer_launcher(2) + " " + testing::micro_run_flags(2, flags) + " --save_dir " +
                       (dir / name / "ckpt").string() + " --run_dir " + (dir / name / "run").string());
  };
  const testing::RecordedRun& fp32 = testing::recorded_run(2, testing::micro_run_flags(2, fp32_case.flags));
  const testing::RecordedRun& bf16 = testing::recorded_run(2, testing::micro_run_flags(2, bf16_case.flags));
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const auto async = run("bf16_async", bf16_case.flags + " --async_save");
  ASSERT_EQ(async.exit_code, 0) << async.output;
  for (const auto& [name, saves, bf16_moments] : {std::tuple{"fp32", fp32.save_dir(), false},
                                                  std::tuple{"bf16", bf16.save_dir(), true},
                                                  std::tuple{"bf16_async", dir / "bf16_async/ckpt", true}}) {
    const fs::path step = saves / "step_3";
    EXPECT_EQ(testing::load_checkpoint(step.string()).manifest.at("optimizer_state_dtype"),
              bf16_moments ? "bfloat16" : "float32");
    for (int rank = 0; rank < 2; ++rank) {
      const SafetensorsFile file((step / ("rank" + std::to_string(rank) + ".safetensors")).string());
      int moments = 0;
      for (const auto& [key, entry] : file.entries()) {
        const bool moment = key.ends_with(".exp_avg") || key.ends_with(".exp_avg_sq");
        moments += moment;
        EXPECT_EQ(entry.dtype, moment && bf16_moments ? at::kBFloat16 : at::kFloat) << name << " rank " << rank << ": " << key;
      }
      EXPECT_GT(moments, 0) << name << " rank " << rank;
    }
  }
  // The background save writes what the synchronous one writes.
  const testing::Checkpoint sync_state = testing::load_checkpoint((bf16.save_dir() / "step_6").string());
  const testing::Checkpoint async_state = testing::load_checkpoint((dir / "bf16_async/ckpt/step_6").string());
  for (const auto* part : {&sync_state.model, &sync_state.optimizer})
    for (const auto& [key, tensor] : *part)
      EXPECT_TRUE(at::equal(tensor, (part == &sync_state.model ? async_state.model : async_state.optimizer).at(key))) << key;
  // Across dtypes, both ways: a change of training flags, so said with --allow_changed_flags.
  const auto into_bf16 = run("fp32_to_bf16", fp32_case.flags + " --optimizer_state_dtype bfloat16 --allow_changed_flags --continue_from " +
                                                 (fp32.save_dir() / "step_3").string());
  ASSERT_EQ(into_bf16.exit_code, 0) << into_bf16.output;
  EXPECT_NE(into_bf16.output.find("resuming float32 optimizer state as bfloat16 (--optimizer_state_dtype): each moment "
                                  "rounded to the nearest bf16"),
            std::string::npos)
      << into_bf16.output;
  const auto into_fp32 = run("bf16_to_fp32", "--optimizer adamw --lr 1e-2 --allow_changed_flags --continue_from " +
                                                 (bf16.save_dir() / "step_3").string());
  ASSERT_EQ(into_fp32.exit_code, 0) << into_fp32.output;
  EXPECT_NE(into_fp32.output.find("resuming bfloat16 optimizer state as float32 (--optimizer_state_dtype): exact"),
            std::string::npos)
      << into_fp32.output;
  // bf16 -> fp32 is exact: the resumed fp32 run's state at step 3 is the bf16 run's, widened; its first
  // step from there equals an fp32 run from the widened state, so its losses are finite and close.
  const auto resumed = testing::read_metrics_events(dir / "bf16_to_fp32/run", "train");
  ASSERT_EQ(resumed.size(), 3u);
  const auto original = testing::read_metrics_events(bf16.run_dir(), "train");
  EXPECT_EQ(resumed[0].at("loss"), original[3].at("loss")) << "step 4's loss is computed before its update";
}

}  // namespace
}  // namespace llm::sharded_checkpoint_test
