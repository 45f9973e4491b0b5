// Two trainer runs that must be one and the same run, bit for bit: what the equivalence tests of
// offload, activation checkpointing and the fused optimizer step check.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace llm::testing {

// A checkpoint's full tensors, its ranks' parts put together (checkpoint/checkpoint.h's reader): the
// parameters by HF name, the optimizer state ("NAME.exp_avg", ..., and "step"), and its manifest.
struct Checkpoint {
  std::map<std::string, at::Tensor> model, optimizer;
  nlohmann::json manifest;
};
Checkpoint load_checkpoint(const std::string& folder);

// The trainer binary for `ranks` ranks: alone with one thread, or under mpirun.
std::string trainer_launcher(int ranks);

// A trainer run several tests read, recorded once and then shared: by the tests of one ctest entry
// (one process) and by those of the others (files under the runs folder, one writer at a time
// through a lock; the others wait for it and read what it recorded). `flags` is the command line
// after the binary, without --run_dir and --save_dir, which the record adds (DIR/run and DIR/ckpt).
// The record is kept per build of the trainer binary (its size, time and inode name the folder), in
// TRAINER_TEST_RUNS or else the build's test-runs folder, which ctest empties before the tests run.
struct RecordedRun {
  std::filesystem::path dir;  // run/ and ckpt/
  int exit_code = 0;
  std::string output;
  std::filesystem::path run_dir() const { return dir / "run"; }
  std::filesystem::path save_dir() const { return dir / "ckpt"; }
};
// environment: "NAME=VALUE ..." set for the run (the launcher's ranks inherit it), "" for none.
const RecordedRun& recorded_run(int ranks, const std::string& flags, const std::string& environment = "");

// Each folder holds a run's run/ (--run_dir) and ckpt/ (--save_dir). Every train step's loss,
// gradient norm and lr, every eval loss, and the parameters and optimizer state of ckpt/step_<steps>
// are the same bits in both; `steps` train steps each.
void expect_same_run(const std::filesystem::path& expected, const std::filesystem::path& actual, size_t steps);
// (Runs that differ by rounding only: tests/rounding_bounds.h.)
// Two fp32 runs that differ only in the order of their cross-rank sums (another world size, another
// sharding strategy, hybrid groups): each step's loss and gradient norm within 1e-5 relative, the
// parameters of ckpt/step_<steps> within 1e-4 of each tensor's largest element and its optimizer state
// within 1e-3. With bf16 moments, whose stochastic rounding takes the other neighbour where the fp32
// value moved by an ulp, a moment may differ by one bf16 step (2^-8 of it: 8e-3) and so may that
// element's update, lr 2^-8 a step (measured 2.4e-4 of max|w| after 6 steps at lr 1e-2: 1e-3).
// Both folders hold a run's run/ and ckpt/.
void expect_same_up_to_sum_order(const std::filesystem::path& expected, const std::filesystem::path& actual,
                                 size_t steps, bool bf16_moments = false);
// Two checkpoint folders: the same position and the same bits in every parameter and state tensor.
void expect_same_checkpoint(const std::filesystem::path& expected, const std::filesystem::path& actual);

// The end summary's largest value of a ledger category ("gradients", "activations", ...) on `rank`.
int64_t ledger_summary_max(const std::filesystem::path& run_dir, int rank, const std::string& category);

}  // namespace llm::testing
