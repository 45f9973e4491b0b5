// Launchers other than MPI (sharding/world.h, refuse_launch_without_mpi): torchrun and srun without
// PMIx start N processes that MPI does not join, so each would be a world of one training alone on
// the same device and run folder. The trainer refuses with exit 2 and says how to launch; a real
// torchrun (from the project's Python environment) is tried too, and the variables alone with
// WORLD_SIZE=1, or under mpirun, change nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace llm::launcher_test {
namespace {

using testing::run_command;
using testing::ScratchDir;

std::string train_flags(const ScratchDir& dir) {
  return " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
         " --device cpu --num_training_steps 2 --batch_size 2 --max_length 16 --eval_batches 1 --run_dir " +
         (dir / "run").string();
}

void expect_mentions(const std::string& text, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) EXPECT_NE(text.find(part), std::string::npos) << "no '" << part << "' in:\n" << text;
}

TEST(Launcher, TorchrunVariablesWithoutMpiAreRefusedWithHowToLaunch) {
  ScratchDir dir("torchrun_env");
  const auto refused = run_command("WORLD_SIZE=4 RANK=1 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 " +
                                   testing::trainer_binary().string() + train_flags(dir));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_mentions(refused.output, {"launcher:", "WORLD_SIZE=4", "RANK=1", "LOCAL_RANK=1", "torchrun",
                                   "mpirun -np 4 build/trainer", "srun --mpi=pmix"});
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "nothing is written before the refusal";
  // The other verbs are refused too (four `trainer prepare` would write one file at once).
  const auto estimate = run_command("WORLD_SIZE=2 " + testing::trainer_binary().string() + " estimate --config " +
                                    (testing::source_dir() / "configs/llama_micro.json").string() + " --world_size 2");
  EXPECT_EQ(estimate.exit_code, 2) << estimate.output;
  // --help still answers.
  EXPECT_EQ(run_command("WORLD_SIZE=4 " + testing::trainer_binary().string() + " --help").exit_code, 0);
}

TEST(Launcher, OneProcessOrAnMpiWorldIsUnaffected) {
  ScratchDir alone("torchrun_one"), mpi("torchrun_mpi");
  const auto one = run_command("WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 " + testing::trainer_binary().string() +
                               train_flags(alone));
  EXPECT_EQ(one.exit_code, 0) << one.output;
  // mpirun's ranks are a world of 2: a stray WORLD_SIZE from the environment does not matter.
  const auto joined = run_command("WORLD_SIZE=2 " + testing::mpirun(2) + testing::trainer_binary().string() +
                                  train_flags(mpi));
  EXPECT_EQ(joined.exit_code, 0) << joined.output;
  EXPECT_EQ(testing::read_metrics_events(mpi / "run", "start").at(0).at("world_size"), 2);
}

TEST(Launcher, SrunWithoutPmixIsRefused) {
  ScratchDir dir("srun_env");
  const auto refused = run_command("SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=2 " + testing::trainer_binary().string() +
                                   train_flags(dir));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_mentions(refused.output, {"launcher: srun started 4 tasks", "SLURM_PROCID=2", "srun --mpi=pmix -n 4"});
}

TEST(Launcher, RealTorchrunGetsTheMessageOnEveryProcess) {
  const std::filesystem::path python = testing::python();
  if (!std::filesystem::exists(python)) GTEST_SKIP() << "no Python environment at " << python;
  if (run_command(python.string() + " -c 'import torch.distributed.run'").exit_code != 0)
    GTEST_SKIP() << "torch.distributed.run is not importable from " << python;
  ScratchDir dir("torchrun_real");
  // torchrun's agent SIGTERMs the other workers once it sees one fail: polling every 5 s (not its
  // default 0.1 s) gives the slower one time to print its own message on a loaded machine, where the
  // first to refuse could take the other down before it spoke (seen once in a clean-clone CI run).
  const auto launched = run_command(python.string() +
                                    " -m torch.distributed.run --nproc_per_node 2 --master_port 29517 "
                                    "--monitor-interval 5 --no-python " +
                                    testing::trainer_binary().string() + train_flags(dir));
  EXPECT_NE(launched.exit_code, 0) << launched.output;
  expect_mentions(launched.output, {"launcher:", "WORLD_SIZE=2", "RANK=0", "RANK=1", "mpirun -np 2 build/trainer"});
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

}  // namespace
}  // namespace llm::launcher_test
