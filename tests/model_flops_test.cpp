// The MFU figure (trainer/model_flops.h) against hand computations, and where its peak comes from.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "test_util.h"
#include "trainer/model_flops.h"

namespace llm::model_flops_test {
namespace {

ModelConfig config(const std::string& name) {
  return load_model_config((testing::source_dir() / "configs" / (name + ".json")).string());
}

TEST(ModelFlops, PerTokenIsSixTimesTheMatmulParametersPlusTheAttentionTermByHand) {
  // llama_20m: h 256, i 688, 4 layers, vocab 32000. Per layer q, k, v, o: 4 x 256^2 = 262,144; the MLP
  // 3 x 256 x 688 = 528,384; 4 layers 3,162,112; the head 32,000 x 256 = 8,192,000: 11,354,112 matmul
  // parameters. At length 128: 6 x 11,354,112 + 12 x 4 x 256 x 128 = 68,124,672 + 1,572,864.
  EXPECT_DOUBLE_EQ(model_flops_per_token(config("llama_20m"), 128), 69'697'536.0);
  // llama_7b: per layer 4 x 4096^2 + 3 x 4096 x 11008 = 202,375,168; 32 layers 6,476,005,376; the head
  // 131,072,000: 6,607,077,376 (6,738,415,616 parameters less the embedding and 65 norms of 4,096). At
  // length 2048: 6 x 6,607,077,376 + 12 x 32 x 4096 x 2048 = 39,642,464,256 + 3,221,225,472.
  const ModelConfig seven_b = config("llama_7b");
  ASSERT_EQ(seven_b.num_parameters(), 6'738'415'616);
  EXPECT_DOUBLE_EQ(model_flops_per_token(seven_b, 2048), 42'863'689'728.0);
}

TEST(ModelFlops, UtilisationIsTheModelsRateOverThePeakOfEveryRank) {
  // llama_7b on 8 H100 SXM in bf16 at 3,000 tokens/s in all: 42,863,689,728 x 3,000 / (989.4e12 x 8).
  const PeakFlops h100 = cuda_table_peak("NVIDIA H100 80GB HBM3", at::kBFloat16);
  ASSERT_DOUBLE_EQ(h100.flops_per_second, 989.4e12);
  EXPECT_NEAR(model_flops_utilisation(42'863'689'728.0, 3000, h100, 8), 0.016246, 1e-6);
  // llama_20m on one CPU rank with a measured 100 GFLOP/s at 1,000 tokens/s: 69,697,536 x 1,000 / 1e11.
  EXPECT_NEAR(model_flops_utilisation(69'697'536.0, 1000, PeakFlops{100e9, "test"}, 1), 0.69697536, 1e-12);
  EXPECT_EQ(model_flops_utilisation(69'697'536.0, 1000, PeakFlops{0, "unknown"}, 1), 0.0);
}

TEST(ModelFlops, TheTableKnowsDevicesByNameAndSaysWhenItDoesNot) {
  EXPECT_DOUBLE_EQ(cuda_table_peak("NVIDIA H100 PCIe", at::kBFloat16).flops_per_second, 756.5e12);
  EXPECT_DOUBLE_EQ(cuda_table_peak("NVIDIA H100 80GB HBM3", at::kFloat).flops_per_second, 66.9e12);
  EXPECT_DOUBLE_EQ(cuda_table_peak("NVIDIA H200", at::kBFloat16).flops_per_second, 989.4e12);
  EXPECT_DOUBLE_EQ(cuda_table_peak("NVIDIA A100-SXM4-80GB", at::kBFloat16).flops_per_second, 312e12);
  EXPECT_DOUBLE_EQ(cuda_table_peak("NVIDIA L40S", at::kBFloat16).flops_per_second, 362.05e12);
  EXPECT_DOUBLE_EQ(cuda_table_peak("NVIDIA L4", at::kBFloat16).flops_per_second, 121e12);  // not L40S's
  EXPECT_DOUBLE_EQ(cuda_table_peak("NVIDIA GeForce RTX 4090", at::kBFloat16).flops_per_second, 165.2e12);
  const PeakFlops unknown = cuda_table_peak("NVIDIA Quadro K620", at::kBFloat16);
  EXPECT_EQ(unknown.flops_per_second, 0);
  EXPECT_NE(unknown.source.find("not in the table"), std::string::npos) << unknown.source;
}

TEST(ModelFlops, TheFlagOverridesAndTheCpuPeakIsMeasuredOnceThenCached) {
  EXPECT_DOUBLE_EQ(device_peak_flops(c10::Device("cpu"), at::kFloat, 1, 2.5).flops_per_second, 2.5e12);
  testing::ScratchDir cache("peak_cache");
  const char* before = std::getenv("TRAINER_CACHE");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("TRAINER_CACHE", cache.path().c_str(), 1);
  const PeakFlops measured = device_peak_flops(c10::Device("cpu"), at::kFloat, 1, 0);
  const PeakFlops cached = device_peak_flops(c10::Device("cpu"), at::kFloat, 1, 0);
  if (before != nullptr) ::setenv("TRAINER_CACHE", saved.c_str(), 1); else ::unsetenv("TRAINER_CACHE");
  EXPECT_GT(measured.flops_per_second, 1e8);  // any CPU of this decade: 100 MFLOP/s and more
  EXPECT_NE(measured.source.find("measured now"), std::string::npos) << measured.source;
  EXPECT_EQ(cached.flops_per_second, measured.flops_per_second);
  EXPECT_NE(cached.source.find("cached in"), std::string::npos) << cached.source;
  EXPECT_TRUE(std::filesystem::exists(cache / "peak_flops.json"));
}

// The line of `output` that holds `text`, or "" when none does.
std::string line_with(const std::string& output, const std::string& text) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (line.find(text) != std::string::npos) return line;
  return "";
}

// Four steps of llama_micro on one CPU thread (the peak's cache entry is the 1-thread one), with the
// peak's cache in SCRATCH/cache and the run in SCRATCH/run.
testing::CommandResult micro_run(const testing::ScratchDir& scratch, const std::string& extra) {
  return testing::run_command("TRAINER_CACHE=" + (scratch / "cache").string() + " OMP_NUM_THREADS=1 " +
                              testing::trainer_binary().string() + " --config " +
                              (testing::source_dir() / "configs/llama_micro.json").string() +
                              " --device cpu --batch_size 4 --max_length 16 --num_training_steps 4 --eval_every 0"
                              " --run_dir " + (scratch / "run").string() + " " + extra);
}

// Every step's MFU is a share of the peak: above 0 (the peak is known) and at most 1.
void expect_every_mfu_a_share(const std::filesystem::path& run_dir) {
  const auto steps = testing::read_metrics_events(run_dir, "train");
  ASSERT_EQ(steps.size(), 4u);
  for (const nlohmann::json& step : steps) {
    EXPECT_GT(step.at("mfu").get<double>(), 0) << step.dump();
    EXPECT_LE(step.at("mfu").get<double>(), 1.0) << step.dump();
  }
}

// A CPU peak cached while the machine was busy (issue 55: 92.9 GFLOP/s cached where the idle peak is
// 186, and every later run read an MFU of 1.13 to 1.51), here 1 MFLOP/s, which any run outpaces at its
// first step: the peak is measured again, the cache keeps the higher figure, a warning names the stale
// one and where it came from, and no step's MFU is above 1.
TEST(ModelFlops, APeakCachedWhileTheMachineWasBusyIsMeasuredAgainWhenARunOutpacesIt) {
  testing::ScratchDir scratch("mfu_stale_peak");
  const std::filesystem::path cache = scratch / "cache" / "peak_flops.json";
  const std::string key = cpu_peak_cache_key(at::kFloat, 1);
  constexpr double kStale = 1e6;
  std::filesystem::create_directories(cache.parent_path());
  std::ofstream(cache) << nlohmann::json{{key, kStale}}.dump(1) << "\n";
  const auto run = micro_run(scratch, "");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // The start: the stale peak, named with the file it came from.
  const nlohmann::json start = testing::read_metrics_events(scratch / "run", "start").at(0);
  EXPECT_EQ(start.at("peak_flops").get<double>(), kStale);
  const std::string stale_source = start.at("peak_flops_source").get<std::string>();
  EXPECT_NE(stale_source.find("cached in " + cache.string()), std::string::npos) << stale_source;
  EXPECT_NE(stale_source.find("0.001 GFLOP/s"), std::string::npos) << stale_source;
  expect_every_mfu_a_share(scratch / "run");
  // The warning names the stale peak (its figure and file) and the new one.
  const std::string warning = line_with(run.output, "stale MFU peak");
  EXPECT_NE(warning.find("warning"), std::string::npos) << run.output;
  EXPECT_NE(warning.find(stale_source), std::string::npos) << run.output;
  // The cache keeps the higher figure, and a record names the peak the MFU reads against from the
  // outpaced step on: the cache's.
  const double cached = nlohmann::json::parse(testing::read_text(cache)).at(key).get<double>();
  EXPECT_GT(cached, kStale);
  const auto peaks = testing::read_metrics_events(scratch / "run", "peak_flops");
  ASSERT_EQ(peaks.size(), 1u) << run.output;
  EXPECT_EQ(peaks[0].at("stale_peak_flops").get<double>(), kStale);
  EXPECT_EQ(peaks[0].at("peak_flops").get<double>(), cached);
  EXPECT_FALSE(peaks[0].at("capped").get<bool>());
  EXPECT_NE(warning.find(peaks[0].at("peak_flops_source").get<std::string>()), std::string::npos) << run.output;
}

// A --peak_tflops far below what the run achieves (1 MFLOP/s) is the user's word and stays, but no
// MFU reads above 1 against it: capped, with a warning naming the flag.
TEST(ModelFlops, APeakTflopsBelowWhatTheRunAchievesCapsTheMfuWithAWarning) {
  testing::ScratchDir scratch("mfu_low_flag");
  const auto run = micro_run(scratch, "--peak_tflops 1e-6");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expect_every_mfu_a_share(scratch / "run");
  const std::string warning = line_with(run.output, "MFU capped at 1");
  EXPECT_NE(warning.find("warning"), std::string::npos) << run.output;
  EXPECT_NE(warning.find("--peak_tflops 1e-06"), std::string::npos) << run.output;
  const auto peaks = testing::read_metrics_events(scratch / "run", "peak_flops");
  ASSERT_EQ(peaks.size(), 1u) << run.output;
  EXPECT_TRUE(peaks[0].at("capped").get<bool>());
  EXPECT_DOUBLE_EQ(peaks[0].at("peak_flops").get<double>(), 1e6);
  EXPECT_FALSE(std::filesystem::exists(scratch / "cache")) << "a given peak is not measured, nor cached";
}

// bench/train_vs_pytorch.sh's summary (bench/pytorch_peers.py) gives the trainer's MFU with its own
// formula: the same FLOPs per token, and on the trainer's peak the same median over the kept steps.
TEST(ModelFlops, TheBenchPrintsTheSameFigureAsTheTrainer) {
  const std::filesystem::path python = testing::python();
  if (!std::filesystem::exists(python)) GTEST_SKIP() << "no Python environment at " << python;
  testing::ScratchDir dir("mfu_bench");
  const std::string config = (testing::source_dir() / "configs/llama_micro.json").string();
  const auto run = testing::run_command("OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " + config +
                                        " --device cpu --batch_size 4 --max_length 16 --num_training_steps 7 --eval_every 0"
                                        " --peak_tflops 0.05 --run_dir " + (dir / "run").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string metrics = (dir / "run" / "metrics.jsonl").string();
  const auto summary = testing::run_command(python.string() + " " + (testing::source_dir() / "bench/pytorch_peers.py").string() +
                                            " summarize --comparison mfu --config " + config +
                                            " --ranks 1 --batch 4 --length 16 --threads 1 --steps 7 --ours " + metrics +
                                            " --theirs " + metrics + " --json");
  ASSERT_EQ(summary.exit_code, 0) << summary.output;
  const nlohmann::json record = nlohmann::json::parse(summary.output.substr(summary.output.rfind("{\"comparison\"")));
  EXPECT_EQ(record.at("trainer_flops_per_token").get<double>(), record.at("bench_flops_per_token").get<double>());
  EXPECT_EQ(record.at("trainer_peak_flops").get<double>(), 0.05e12);
  const double trainer = record.at("ours_mfu_trainer").get<double>(), bench = record.at("ours_mfu_bench").get<double>();
  EXPECT_GT(trainer, 0);
  EXPECT_NEAR(bench, trainer, 1e-9 * trainer);
  // A peer that died (issue 55): the rounds it ran again, and the rounds it died twice, are in the table
  // and the record; a peer dead in every round leaves ours alone, said, rather than no table at all.
  const std::string summarize = python.string() + " " + (testing::source_dir() / "bench/pytorch_peers.py").string() +
                                " summarize --comparison died --config " + config +
                                " --ranks 1 --batch 4 --length 16 --threads 1 --steps 7 --ours " + metrics + " " + metrics;
  const auto some = testing::run_command(summarize + " --theirs " + metrics + " --retried 1 --died 2 --died_tuned '1 2'");
  ASSERT_EQ(some.exit_code, 0) << some.output;
  EXPECT_NE(some.output.find("pytorch died once and ran again in round(s) 1"), std::string::npos) << some.output;
  EXPECT_NE(some.output.find("pytorch DIED TWICE in round(s) 2"), std::string::npos) << some.output;
  EXPECT_NE(some.output.find("with our allocator policy DIED TWICE in round(s) 1, 2"), std::string::npos) << some.output;
  const auto none = testing::run_command(summarize + " --died '1 2' --json");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  const nlohmann::json alone = nlohmann::json::parse(none.output.substr(none.output.rfind("{\"comparison\"")));
  EXPECT_EQ(alone.at("pytorch_died_rounds"), nlohmann::json::array({1, 2}));
  EXPECT_GT(alone.at("ours_s").get<double>(), 0);
}

}  // namespace
}  // namespace llm::model_flops_test
