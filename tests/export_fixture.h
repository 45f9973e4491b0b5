// The training run, checkpoints and exports the export tests share (tests/export_test.cpp,
// tests/export_refusals_test.cpp), made once per test binary run, and their helpers.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::export_test {

namespace fs = std::filesystem;
using testing::run_command;
using testing::ScratchDir;

constexpr int64_t kWindow = 17;  // --max_length 16 + 1

inline std::vector<int64_t> window_tokens() {
  std::vector<int64_t> window;
  for (int64_t i = 0; i < kWindow; ++i) window.push_back((i * 37 + 11) % 127);
  return window;
}

inline std::string micro_config() { return (testing::source_dir() / "configs/llama_micro.json").string(); }

// The training flags every run here shares: 4 sequences per step (2 per rank at 2 ranks).
inline std::string train_flags(const fs::path& data, int ranks) {
  return " --config " + micro_config() + " --device cpu --data " + data.string() +
         " --max_length 16 --total_batch_size 4 --batch_size " + std::to_string(4 / ranks) +
         " --eval_every 0 --eval_batches 1 --warmup_steps 1 --lr 1e-2";
}

inline nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline void write_json(const fs::path& path, const nlohmann::json& json) { std::ofstream(path) << json.dump(2); }

double first_train_loss(const fs::path& run_dir, int64_t step) {
  for (const nlohmann::json& event : testing::read_metrics_events(run_dir, "train"))
    if (event.at("step") == step) return event.at("loss").get<double>();
  ADD_FAILURE() << "no train step " << step << " in " << run_dir;
  return NAN;
}

inline void expect_mentions(const testing::CommandResult& result, std::initializer_list<const char*> parts) {
  for (const char* part : parts) EXPECT_NE(result.output.find(part), std::string::npos) << part << " in:\n" << result.output;
}

// One training run, its checkpoints at steps 2 and 4, and the exports every test reads: made once.
struct Trained {
  ScratchDir root{"export"};
  fs::path data = root / "periodic.tok", checkpoints = root / "ckpt", exported = root / "exported",
           sharded = root / "sharded", bf16 = root / "bf16", earlier = root / "exported_step2";
  std::string trained_output, export_output, sharded_output;

  Trained() {
    std::vector<int64_t> tokens;
    for (int copy = 0; copy < 200; ++copy)
      for (int64_t token : window_tokens()) tokens.push_back(token);
    write_token_file(data.string(), tokens, 128);
    const auto trained = run_command(testing::trainer_launcher(1) + train_flags(data, 1) +
                                     " --num_training_steps 4 --save_every 2 --save_dir " + checkpoints.string() +
                                     " --run_dir " + (root / "run").string());
    trained_output = trained.output;
    if (trained.exit_code != 0) return;
    const std::string trainer = testing::trainer_binary().string();
    export_output = run_command(trainer + " export --from " + checkpoints.string() + " --to " + exported.string()).output;
    sharded_output = run_command(trainer + " export --from " + checkpoints.string() + " --to " + sharded.string() +
                                 " --max_shard_size 20KB").output;
    run_command(trainer + " export --from " + checkpoints.string() + " --to " + bf16.string() + " --dtype bfloat16");
    run_command(trainer + " export --from " + (checkpoints / "step_2").string() + " --to " + earlier.string());
  }
};

inline const Trained& trained() {
  static Trained* shared = new Trained();  // kept for the whole test binary; its folder goes at exit
  static const bool cleanup = (std::atexit([] { delete shared; }), true);
  (void)cleanup;
  return *shared;
}

inline std::string export_command(const std::string& flags) {
  return testing::trainer_binary().string() + " export " + flags;
}

}  // namespace llm::export_test
