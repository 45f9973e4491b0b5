// Sharded checkpoints (checkpoint/checkpoint.h) through the trainer binary under mpirun: each rank writes
// its own parts, and a checkpoint resumes at its own world size bit for bit and at another (4 -> 2,
// 2 -> 3, 1 -> 4) with the uninterrupted run's results, for every optimizer with and without
// offload; saving gathers nothing (the ledger's checkpoint point stays under the training peak).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/interchange/safetensors.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::ScratchDir;

struct ReshardCase {
  std::string name;
  std::string flags;
};

// llama_micro: q/k/v/o 32x32, gate/up 88x32, down 32x88, embed and lm_head 128x32. At 3 ranks every
// matrix pads a row; -2 subsets of gate/up (s = 22) cross rows and ranks; GaLore's left projection
// keeps its moments in flat chunks, its right one a projector every rank holds.
const ReshardCase kOptimizers[] = {
    {"adamw", "--optimizer adamw --lr 1e-2"},
    {"adamw_sn", "--optimizer adamw_sn --subset_size -2 --subset_norm_params all --lr 2e-2"},
    {"galore_right", "--optimizer galore_adamw --rank 8 --update_proj_gap 4 --lr 5e-3"},
    {"galore_left", "--optimizer galore_adamw --rank 8 --update_proj_gap 4 --proj_type left --lr 5e-3"},
    // bf16 moments (--optimizer_state_dtype): the fused AdamW kernel's and the ATen rules' rounding.
    {"adamw_bf16_state", "--optimizer adamw --lr 1e-2 --optimizer_state_dtype bfloat16"},
    {"adamw_sn_bf16_state",
     "--optimizer adamw_sn --subset_size -2 --subset_norm_params all --lr 2e-2 --optimizer_state_dtype bfloat16"},
};

void PrintTo(const ReshardCase& c, std::ostream* out) { *out << c.name; }

constexpr int kSteps = 6, kSaveAt = 3, kGlobalBatch = 12;

std::string run_flags(const std::string& optimizer, const fs::path& dir, int ranks) {
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --num_training_steps " + std::to_string(kSteps) +
         " --warmup_steps 2 --max_length 32 --eval_every 0 --weight_decay 0.1 --grad_clipping 0.5"
         " --total_batch_size " + std::to_string(kGlobalBatch) + " --batch_size " +
         std::to_string(kGlobalBatch / ranks / (ranks == 4 ? 1 : 2)) + " " + optimizer + " --save_dir " +
         (dir / "ckpt").string() + " --run_dir " + (dir / "run").string();
}

std::vector<double> losses(const fs::path& run_dir) {
  std::vector<double> values;
  for (const auto& step : testing::read_metrics_events(run_dir, "train")) values.push_back(step.at("loss"));
  return values;
}

class Reshard : public ::testing::TestWithParam<std::tuple<ReshardCase, bool>> {};

TEST_P(Reshard, ResumesAtTheSameAndAtOtherWorldSizes) {
  const auto& [optimizer, offload] = GetParam();
  const std::string flags = optimizer.flags + (offload ? " --offload optimizer" : "");
  for (const auto& [saved_at, resumed_at] : {std::pair{4, 2}, std::pair{2, 3}, std::pair{1, 4}}) {
    const std::string transition = std::to_string(saved_at) + " -> " + std::to_string(resumed_at);
    SCOPED_TRACE(transition);
    ScratchDir dir("reshard_" + optimizer.name + (offload ? "_offload" : ""));
    auto full = run_command(testing::trainer_launcher(saved_at) + run_flags(flags, dir / "full", saved_at) +
                            " --save_every " + std::to_string(kSaveAt));
    ASSERT_EQ(full.exit_code, 0) << full.output;
    // Each rank wrote its own parts and its index; the manifest lists them all.
    const nlohmann::json manifest = testing::load_checkpoint((dir / "full/ckpt/step_3").string()).manifest;
    EXPECT_EQ(manifest.at("world_size"), saved_at);
    EXPECT_EQ(manifest.at("files").size(), 2u * saved_at);
    const std::vector<double> expected = losses(dir / "full/run");
    ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));
    const testing::Checkpoint expected_final = testing::load_checkpoint((dir / "full/ckpt/step_6").string());

    for (int ranks : {saved_at, resumed_at}) {
      if (ranks == saved_at && saved_at != 4) continue;  // the same world size once per case (4 ranks)
      const fs::path resumed_dir = dir / ("resumed" + std::to_string(ranks));
      auto resumed = run_command(testing::trainer_launcher(ranks) + run_flags(flags, resumed_dir, ranks) +
                                 " --continue_from " + (dir / "full/ckpt/step_3").string());
      ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
      EXPECT_NE(resumed.output.find("at step 3 (saved by " + std::to_string(saved_at) + " rank(s))"), std::string::npos)
          << resumed.output;
      const std::vector<double> actual = losses(resumed_dir / "run");
      ASSERT_EQ(actual.size(), static_cast<size_t>(kSteps - kSaveAt));
      for (size_t i = 0; i < actual.size(); ++i) {
        const double want = expected[kSaveAt + i];
        if (ranks == saved_at)
          EXPECT_EQ(actual[i], want) << "same world size, step " << kSaveAt + i + 1 << ": bit-identical";
        else
          EXPECT_LE(std::abs(actual[i] - want) / std::abs(want), 1e-5)
              << ranks << " ranks, step " << kSaveAt + i + 1 << ": " << actual[i] << " vs " << want;
      }
      const testing::Checkpoint final_state = testing::load_checkpoint((resumed_dir / "ckpt/step_6").string());
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
            const bool bf16_moment = optimizer.name.ends_with("_bf16_state") && tensors == &expected_final.optimizer;
            const double scale = want.abs().max().item<double>() + 1e-12;
            EXPECT_LE((got - want).abs().max().item<double>() / scale, bf16_moment ? 8e-3 : 1e-3)
                << ranks << " ranks: " << key;
          }
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Reshard, ::testing::Combine(::testing::ValuesIn(kOptimizers), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + (std::get<1>(info.param) ? "_offload" : "");
                         });

// Saving gathers nothing: on every rank the tracked peak while the save runs (the ledger's checkpoint
// point's window) is no more than the training step's own peak (before, each rank held the full model
// and optimizer state while rank 0 wrote them).
TEST(ShardedSave, NoRankHoldsMoreThanItsShardsWhileSaving) {
  ScratchDir dir("save_peak");
  auto result = run_command(testing::trainer_launcher(4) + run_flags("--optimizer adamw --lr 1e-2", dir.path(), 4) +
                            " --save_every 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(dir / "run" / ("memory.rank" + std::to_string(rank) + ".jsonl"));
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
    EXPECT_EQ(checkpoints, kSteps / 2) << "rank " << rank;
  }
}

// --async_save writes the synchronous save's checkpoints, bit for bit: when the write ends before the
// next step boundary, and when it is held back a second (LLM_DEBUG_SAVE_DELAY_SECONDS) so that the
// steps after the save run while it is written (what is written is the host copy taken at the save).
// Each save's "checkpoint" record says when it completed; the last step's save is synchronous.
TEST(AsyncSave, WritesTheSynchronousCheckpointsWhileTrainingGoesOn) {
  ScratchDir dir("async_save");
  const std::string optimizer = "--optimizer adamw_sn --subset_size -2 --subset_norm_params all --lr 2e-2";
  const std::string launcher = testing::trainer_launcher(2);
  struct Variant {
    const char* name;
    std::string prefix, flags;
  };
  const Variant variants[] = {{"sync", "", ""}, {"async", "", " --async_save"},
                              {"late", "LLM_DEBUG_SAVE_DELAY_SECONDS=1 ", " --async_save"}};
  std::map<std::string, std::vector<nlohmann::json>> records;
  for (const Variant& variant : variants) {
    auto result = run_command(variant.prefix + launcher + run_flags(optimizer, dir / variant.name, 2) +
                              " --save_every 2" + variant.flags);
    ASSERT_EQ(result.exit_code, 0) << variant.name << "\n" << result.output;
    records[variant.name] = testing::read_metrics_events(dir / variant.name / "run", "checkpoint");
    ASSERT_EQ(records[variant.name].size(), 3u) << variant.name << "\n" << result.output;
    EXPECT_FALSE(fs::exists(dir / variant.name / "ckpt/step_2.tmp"));
    EXPECT_FALSE(fs::exists(dir / variant.name / "ckpt/step_4.tmp"));
  }
  for (const char* variant : {"async", "late"}) {
    SCOPED_TRACE(variant);
    testing::expect_same_run(dir / "sync", dir / variant, kSteps);
    for (const char* step : {"ckpt/step_2", "ckpt/step_4"}) testing::expect_same_checkpoint(dir / "sync" / step, dir / variant / step);
  }
  for (int i = 0; i < 3; ++i) {
    const int64_t step = 2 * (i + 1);
    EXPECT_EQ(records["sync"][i].at("step"), step);
    EXPECT_EQ(records["sync"][i].at("completed_at_step"), step);
    EXPECT_EQ(records["sync"][i].at("background"), false);
    EXPECT_EQ(records["async"][i].at("step"), step);
    EXPECT_EQ(records["late"][i].at("step"), step);
  }
  // A save completes at the first boundary after its files are written, at the latest the next
  // save's (held back 1 s, that one unless a step takes a second).
  for (const char* variant : {"async", "late"})
    for (int i = 0; i < 2; ++i) {
      const int64_t step = 2 * (i + 1);
      EXPECT_EQ(records[variant][i].at("background"), true);
      EXPECT_GE(records[variant][i].at("completed_at_step").get<int64_t>(), step + 1);
      EXPECT_LE(records[variant][i].at("completed_at_step").get<int64_t>(), step + 2);
    }
  EXPECT_EQ(records["late"][2].at("completed_at_step"), kSteps);  // the last step's save: synchronous
  EXPECT_EQ(records["late"][2].at("background"), false);
  // The manifest keeps the settings that wrote it.
  for (const char* variant : {"sync", "async"}) {
    const nlohmann::json run = testing::load_checkpoint((dir / variant / "ckpt/step_2").string()).manifest.at("run");
    EXPECT_EQ(run.at("save_every"), 2);
    EXPECT_EQ(run.at("async_save"), std::string(variant) == "async");
    EXPECT_EQ(run.at("optimizer"), "adamw_sn");
  }
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
  const auto run = [&](const std::string& name, const std::string& flags) {
    return run_command(testing::trainer_launcher(2) + " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
                       " --device cpu --num_training_steps 4 --warmup_steps 0 --max_length 32 --eval_every 0"
                       " --total_batch_size 8 --batch_size 2 --save_every 2 --save_dir " + (dir / name / "ckpt").string() +
                       " --run_dir " + (dir / name / "run").string() + " " + flags);
  };
  for (const auto& [name, flags] : {std::pair{"fp32", ""}, std::pair{"bf16", "--optimizer_state_dtype bfloat16"},
                                    std::pair{"bf16_async", "--optimizer_state_dtype bfloat16 --async_save"}}) {
    const auto result = run(name, flags);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const fs::path step = dir / name / "ckpt" / "step_2";
    const bool bf16 = std::string(name) != "fp32";
    EXPECT_EQ(testing::load_checkpoint(step.string()).manifest.at("optimizer_state_dtype"), bf16 ? "bfloat16" : "float32");
    for (int rank = 0; rank < 2; ++rank) {
      const SafetensorsFile file((step / ("rank" + std::to_string(rank) + ".safetensors")).string());
      int moments = 0;
      for (const auto& [key, entry] : file.entries()) {
        const bool moment = key.ends_with(".exp_avg") || key.ends_with(".exp_avg_sq");
        moments += moment;
        EXPECT_EQ(entry.dtype, moment && bf16 ? at::kBFloat16 : at::kFloat) << name << " rank " << rank << ": " << key;
      }
      EXPECT_GT(moments, 0) << name << " rank " << rank;
    }
  }
  // The background save writes what the synchronous one writes.
  const testing::Checkpoint sync = testing::load_checkpoint((dir / "bf16/ckpt/step_4").string());
  const testing::Checkpoint async = testing::load_checkpoint((dir / "bf16_async/ckpt/step_4").string());
  for (const auto* part : {&sync.model, &sync.optimizer})
    for (const auto& [key, tensor] : *part)
      EXPECT_TRUE(at::equal(tensor, (part == &sync.model ? async.model : async.optimizer).at(key))) << key;
  // Across dtypes, both ways.
  const auto into_bf16 = run("fp32_to_bf16", "--optimizer_state_dtype bfloat16 --continue_from " +
                                                 (dir / "fp32/ckpt/step_2").string());
  ASSERT_EQ(into_bf16.exit_code, 0) << into_bf16.output;
  EXPECT_NE(into_bf16.output.find("resuming float32 optimizer state as bfloat16 (--optimizer_state_dtype): each moment "
                                  "rounded to the nearest bf16"),
            std::string::npos)
      << into_bf16.output;
  const auto into_fp32 = run("bf16_to_fp32", "--continue_from " + (dir / "bf16/ckpt/step_2").string());
  ASSERT_EQ(into_fp32.exit_code, 0) << into_fp32.output;
  EXPECT_NE(into_fp32.output.find("resuming bfloat16 optimizer state as float32 (--optimizer_state_dtype): exact"),
            std::string::npos)
      << into_fp32.output;
  // bf16 -> fp32 is exact: the resumed fp32 run's state at step 2 is the bf16 run's, widened; its first
  // step from there equals an fp32 run from the widened state, so its losses are finite and close.
  const auto resumed = testing::read_metrics_events(dir / "bf16_to_fp32/run", "train");
  ASSERT_EQ(resumed.size(), 2u);
  const auto original = testing::read_metrics_events(dir / "bf16/run", "train");
  EXPECT_EQ(resumed[0].at("loss"), original[2].at("loss")) << "step 3's loss is computed before its update";
}

}  // namespace
}  // namespace llm
