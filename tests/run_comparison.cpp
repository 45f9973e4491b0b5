#include "tests/run_comparison.h"

#include <fstream>

#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "checkpoint/checkpoint.h"

namespace llm::testing {

Checkpoint load_checkpoint(const std::string& folder) {
  const CheckpointReader reader(folder);
  Checkpoint checkpoint;
  checkpoint.manifest = reader.manifest();
  for (const std::string& key : reader.keys()) {
    const bool state = key.ends_with(".exp_avg") || key.ends_with(".exp_avg_sq") || key.ends_with(".projector");
    (state ? checkpoint.optimizer : checkpoint.model)[key] = reader.read_full(key);
  }
  checkpoint.optimizer["step"] = at::scalar_tensor(reader.manifest().at("optimizer_step").get<int64_t>(), at::kLong);
  return checkpoint;
}

std::string trainer_launcher(int ranks) {
  return ranks == 1 ? "OMP_NUM_THREADS=1 " + trainer_binary().string() : mpirun(ranks) + trainer_binary().string();
}

void expect_same_run(const std::filesystem::path& expected, const std::filesystem::path& actual, size_t steps) {
  const auto expected_steps = read_metrics_events(expected / "run", "train");
  const auto actual_steps = read_metrics_events(actual / "run", "train");
  ASSERT_EQ(expected_steps.size(), steps);
  ASSERT_EQ(actual_steps.size(), steps);
  for (size_t i = 0; i < steps; ++i)
    for (const char* field : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(actual_steps[i].at(field).get<double>(), expected_steps[i].at(field).get<double>())
          << field << " of step " << i + 1;
  const auto expected_eval = read_metrics_events(expected / "run", "eval");
  const auto actual_eval = read_metrics_events(actual / "run", "eval");
  ASSERT_EQ(actual_eval.size(), expected_eval.size());
  for (size_t i = 0; i < actual_eval.size(); ++i)
    EXPECT_EQ(actual_eval[i].at("eval_loss").get<double>(), expected_eval[i].at("eval_loss").get<double>())
        << "evaluation " << i + 1;
  const std::string step = "ckpt/step_" + std::to_string(steps);
  expect_same_checkpoint(expected / step, actual / step);
}

void expect_same_checkpoint(const std::filesystem::path& expected, const std::filesystem::path& actual) {
  const Checkpoint want = load_checkpoint(expected.string());
  const Checkpoint got = load_checkpoint(actual.string());
  for (const char* field : {"step", "samples_consumed", "tokens_seen", "optimizer_step"})
    EXPECT_EQ(got.manifest.at(field), want.manifest.at(field)) << field << " in " << actual;
  ASSERT_EQ(got.model.size(), want.model.size());
  for (const auto& [name, tensor] : want.model) EXPECT_TRUE(at::equal(got.model.at(name), tensor)) << "parameter " << name;
  ASSERT_EQ(got.optimizer.size(), want.optimizer.size());
  for (const auto& [key, tensor] : want.optimizer)
    EXPECT_TRUE(at::equal(got.optimizer.at(key), tensor)) << "optimizer " << key;
}

int64_t ledger_summary_max(const std::filesystem::path& run_dir, int rank, const std::string& category) {
  std::ifstream in(run_dir / ("memory.rank" + std::to_string(rank) + ".jsonl"));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.at("event") == "end") return record.at("summary").at("max").at(category).get<int64_t>();
  }
  ADD_FAILURE() << run_dir << ": rank " << rank << " has no end record";
  return -1;
}

}  // namespace llm::testing
