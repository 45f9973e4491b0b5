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
            const double scale = want.abs().max().item<double>() + 1e-12;
            EXPECT_LE((got - want).abs().max().item<double>() / scale, 1e-3) << ranks << " ranks: " << key;
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

}  // namespace
}  // namespace llm
