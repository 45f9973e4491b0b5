// Helpers shared by the checkpoint safety tests (checkpoint_folders_test.cpp,
// checkpoint_resume_test.cpp, checkpoint_writes_test.cpp), which run the trainer binary on CPU:
// llama_micro for a few cheap steps, and what a test reads back from the folders it wrote.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace llm::testing {

namespace fs = std::filesystem;

// llama_micro, a few cheap steps.
inline std::string trainer_arguments(const std::string& flags) {
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --warmup_steps 1 --batch_size 2 --max_length 16 --eval_every 0 " + flags;
}

inline std::string trainer_command(const std::string& flags) {
  return "OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + trainer_arguments(flags);
}

inline bool mentions(const std::string& output, const std::string& part) { return output.find(part) != std::string::npos; }

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::vector<std::string> entries(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A save_dir's entries but the job lock (.trainer.lock, common/folder_lock.h), which a run leaves.
inline std::vector<std::string> entries_but_the_lock(const fs::path& folder) {
  std::vector<std::string> names = entries(folder);
  std::erase(names, ".trainer.lock");
  return names;
}

inline nlohmann::json manifest(const fs::path& checkpoint) {
  return nlohmann::json::parse(read_file(checkpoint / "manifest.json"));
}

// A run's first saves, into `ckpt`: 4 steps, saved at 2 and 4.
inline void train_four_steps(const fs::path& ckpt, const fs::path& run_dir) {
  const auto trained = run_command(trainer_command("--num_training_steps 4 --save_every 2 --save_dir " + ckpt.string() +
                                                   " --run_dir " + run_dir.string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
}

}  // namespace llm::testing
