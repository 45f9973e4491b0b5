#include "tests/run_comparison.h"

#include <cmath>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>

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

namespace {

// The folder of this build's records: the binary's size, modification time and inode name it, so a
// rebuilt trainer never reads a run of the one before.
std::filesystem::path records_folder() {
  struct stat binary {};
  if (::stat(trainer_binary().c_str(), &binary) != 0) return {};
  const char* configured = std::getenv("TRAINER_TEST_RUNS");
  const std::filesystem::path root = configured != nullptr && *configured != '\0' ? configured : TRAINER_TEST_RUNS_DIR;
  return root / (std::to_string(binary.st_size) + "_" + std::to_string(binary.st_mtim.tv_sec) + "." +
                 std::to_string(binary.st_mtim.tv_nsec) + "_" + std::to_string(binary.st_ino));
}

// FNV-1a, 64 bits: the same name for the same command line in every process.
std::string command_key(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

}  // namespace

const RecordedRun& recorded_run(int ranks, const std::string& flags, const std::string& environment) {
  static std::mutex mutex;
  static std::map<std::string, RecordedRun> recorded;  // this process's, by command line
  const std::string command = (environment.empty() ? "" : "env " + environment + " ") + trainer_launcher(ranks) + " " + flags;
  std::lock_guard<std::mutex> guard(mutex);
  if (auto found = recorded.find(command); found != recorded.end()) return found->second;

  const std::filesystem::path folder = records_folder();
  if (folder.empty()) throw std::runtime_error("recorded_run: no trainer binary at " + trainer_binary().string());
  std::filesystem::create_directories(folder);
  RecordedRun run;
  run.dir = folder / command_key(command);
  // One writer per record across processes: the lock is held while the run is made; a process that
  // waited for it finds the exit status written last, and reads the record.
  const std::string lock_path = run.dir.string() + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0)
    throw std::runtime_error("recorded_run: cannot lock " + lock_path + ": " + std::strerror(errno));
  const std::filesystem::path status = run.dir / "exit_status";
  if (std::filesystem::exists(status)) {
    run.exit_code = std::stoi(read_text(status));
    run.output = read_text(run.dir / "output");
  } else {
    std::filesystem::remove_all(run.dir);  // a writer that died midway
    std::filesystem::create_directories(run.dir);
    std::ofstream(run.dir / "command") << command << "\n";
    const CommandResult result = run_command(command + " --run_dir " + run.run_dir().string() + " --save_dir " +
                                             run.save_dir().string());
    run.exit_code = result.exit_code;
    run.output = result.output;
    std::ofstream(run.dir / "output") << result.output;
    std::ofstream(run.dir / "exit_status.tmp") << result.exit_code << "\n";
    std::filesystem::rename(run.dir / "exit_status.tmp", status);
  }
  ::close(lock);  // releases the lock
  return recorded.emplace(command, std::move(run)).first->second;
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

void expect_same_up_to_sum_order(const std::filesystem::path& expected, const std::filesystem::path& actual,
                                 size_t steps, bool bf16_moments) {
  const auto expected_steps = read_metrics_events(expected / "run", "train");
  const auto actual_steps = read_metrics_events(actual / "run", "train");
  ASSERT_EQ(expected_steps.size(), steps);
  ASSERT_EQ(actual_steps.size(), steps);
  for (size_t i = 0; i < steps; ++i) {
    // The gradient norm too: clipping and Adam's normalisation hide a gradient off by a constant factor
    // from the losses and weights (a reduction that sums where it should average).
    for (const char* field : {"loss", "grad_norm"}) {
      const double want = expected_steps[i].at(field), got = actual_steps[i].at(field);
      EXPECT_LE(std::abs(got - want) / std::abs(want), 1e-5) << field << " of step " << i + 1 << ": " << got << " vs " << want;
    }
  }
  const std::string step = "ckpt/step_" + std::to_string(steps);
  const Checkpoint want = load_checkpoint((expected / step).string());
  const Checkpoint got = load_checkpoint((actual / step).string());
  ASSERT_EQ(got.model.size(), want.model.size());
  ASSERT_EQ(got.optimizer.size(), want.optimizer.size());
  for (const auto* tensors : {&want.model, &want.optimizer})
    for (const auto& [key, wanted] : *tensors) {
      if (key == "step") continue;
      const bool state = tensors == &want.optimizer;
      const at::Tensor& found = (state ? got.optimizer : got.model).at(key);
      ASSERT_EQ(found.sizes(), wanted.sizes()) << key;
      const double scale = wanted.abs().max().item<double>() + 1e-12;
      const double bound = state ? (bf16_moments ? 8e-3 : 1e-3) : (bf16_moments ? 1e-3 : 1e-4);
      EXPECT_LE((found - wanted).abs().max().item<double>() / scale, bound) << key;
    }
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
