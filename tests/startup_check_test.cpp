// The memory check before training (memory/startup_check.h): the verdict for given figures,
// and end to end, a config whose vocabulary cannot fit stops with exit 2 and the numbers before it
// allocates anything, where it used to abort in the allocator.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "memory/startup_check.h"
#include "model/model_config.h"

namespace llm::startup_check_test {
namespace {

using testing::run_command;
using testing::ScratchDir;

constexpr int64_t kGiB = int64_t{1} << 30;

void expect_mentions(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* part : parts) EXPECT_NE(text.find(part), std::string::npos) << "no '" << part << "' in: " << text;
}

// Two ranks on one node, 10 GiB each at the peak.
MemoryEstimate two_ranks(const std::string& device, int64_t host_per_rank) {
  MemoryEstimate estimate;
  estimate.device = device;
  for (int r = 0; r < 2; ++r) {
    RankEstimate rank;
    rank.rank = r;
    rank.peak_bytes = 10 * kGiB;
    rank.peak_phase = "backward:head";
    rank.at_peak.parameters = 4 * kGiB;
    rank.at_peak.activations = 6 * kGiB;
    rank.host_bytes = host_per_rank;
    estimate.ranks.push_back(rank);
  }
  estimate.nodes.push_back({0, 2, 2 * host_per_rank, 0});
  return estimate;
}

TEST(MemoryCheck, CpuNodeAgainstAvailableRam) {
  RunConfig run;
  run.data.batch_size = 8;
  const MemoryEstimate estimate = two_ranks("cpu", 10 * kGiB);
  const auto refused = memory_check_failure(estimate, 1, 2, {0, 15 * kGiB}, run);
  ASSERT_TRUE(refused);
  expect_mentions(*refused, {"memory check", "the 2 ranks on this node need about 20.00 GiB of host memory",
                             "rank 1: 10.00 GiB", "at backward:head: parameters 4.00 GiB", "activations 6.00 GiB",
                             "15.00 GiB available (MemAvailable)", "--batch_size (now 8)", "more ranks",
                             "--dtype bfloat16 --precision pure", "trainer estimate", "--skip_memory_check"});
  EXPECT_EQ(refused->find("--offload optimizer"), std::string::npos) << "offload is a GPU remedy";
  EXPECT_FALSE(memory_check_failure(estimate, 1, 2, {0, 20 * kGiB}, run)) << "equal fits: no margin";
  EXPECT_FALSE(memory_check_failure(estimate, 0, 2, {0, 0}, run)) << "unknown RAM is not checked";
}

TEST(MemoryCheck, GpuPeakAgainstFreeDeviceMemoryThenNodeHost) {
  RunConfig run;
  run.precision.dtype = DType::bfloat16;
  const MemoryEstimate estimate = two_ranks("cuda", 3 * kGiB);
  const auto device = memory_check_failure(estimate, 1, 2, {8 * kGiB, 100 * kGiB}, run);
  ASSERT_TRUE(device);
  expect_mentions(*device, {"rank 1 needs about 10.00 GiB of device memory", "its GPU has 8.00 GiB free",
                            "--offload optimizer"});
  EXPECT_FALSE(memory_check_failure(estimate, 1, 2, {12 * kGiB, 100 * kGiB}, run));
  // Host memory on a GPU rank: the offloaded optimizer's, --async_save's copy, or both, named.
  RunConfig offloaded = run;
  offloaded.sharding.offload = Offload::optimizer;
  const auto host = memory_check_failure(estimate, 0, 2, {12 * kGiB, 5 * kGiB}, offloaded);
  ASSERT_TRUE(host);
  expect_mentions(*host, {"need about 6.00 GiB of host memory for the offloaded optimizer", "5.00 GiB available"});
  EXPECT_EQ(host->find("--async_save"), std::string::npos);
  offloaded.checkpoint.async_save = true;
  const auto both = memory_check_failure(estimate, 0, 2, {12 * kGiB, 5 * kGiB}, offloaded);
  ASSERT_TRUE(both);
  expect_mentions(*both, {"for the offloaded optimizer (masters, state, landing and staging buffers) and --async_save's "
                          "copy of each rank's state", "or drop --async_save"});
}

// On CUDA the device holds more than the tensors: kernel modules, cuBLAS workspaces, NCCL's buffers,
// the caching allocator's slack (estimate.h, CudaRuntimeBytes). A run whose tensors fit in the free
// memory but not with those is refused, naming each term; before, tensors alone were compared.
TEST(MemoryCheck, OnCudaTheRuntimesOwnMemoryCounts) {
  RunConfig run;
  MemoryEstimate estimate = two_ranks("cuda", 3 * kGiB);
  for (RankEstimate& rank : estimate.ranks) rank.runtime = cuda_runtime_bytes(rank.peak_bytes, /*nccl_communicators=*/1);
  const CudaRuntimeBytes& runtime = estimate.ranks[1].runtime;
  EXPECT_EQ(runtime.nccl_buffers, 576 * (int64_t{1} << 20));
  EXPECT_EQ(runtime.allocator_slack, 10 * kGiB / 16 + 40 * (int64_t{1} << 20));
  const int64_t need = 10 * kGiB + runtime.total();
  const auto refused = memory_check_failure(estimate, 1, 2, {10 * kGiB + kGiB / 2, 100 * kGiB}, run);
  ASSERT_TRUE(refused) << "10 GiB of tensors and " << runtime.total() << " bytes of runtime in 10.5 GiB";
  expect_mentions(*refused, {"rank 1 needs about 11.88 GiB of device memory", "10.00 GiB of tensors",
                             "kernel modules 0.50 GiB", "cuBLAS workspaces 0.1", "NCCL buffers 0.56 GiB",
                             "allocator slack 0.66 GiB", "10.50 GiB free"});
  EXPECT_FALSE(memory_check_failure(estimate, 1, 2, {need, 100 * kGiB}, run)) << "equal fits";
  // One rank (or MPI): no NCCL buffers.
  EXPECT_EQ(cuda_runtime_bytes(kGiB, /*nccl_communicators=*/0).nccl_buffers, 0);
  // Two ranks on one GPU (--communicator mpi) share its free memory: twice the need must fit.
  MemoryAvailable shared{2 * need - 1, 100 * kGiB};
  shared.ranks_per_gpu = 2;
  const auto two_on_one = memory_check_failure(estimate, 1, 2, shared, run);
  ASSERT_TRUE(two_on_one);
  expect_mentions(*two_on_one, {"for the 2 ranks that share it (--communicator mpi)"});
  shared.device_free_bytes = 2 * need;
  EXPECT_FALSE(memory_check_failure(estimate, 1, 2, shared, run));
  // trainer estimate carries them for CUDA, not for CPU.
  ModelConfig model = load_model_config((testing::source_dir() / "configs/llama_micro.json").string());
  RunConfig small;
  small.data.batch_size = 2;
  small.data.max_length = 16;
  validate_run_config(small, model, 2);
  EstimateOptions options;
  options.world_size = 2;
  options.device = "cuda";
  EXPECT_GT(estimate_memory(model, small, options).ranks[0].runtime.nccl_buffers, 0);
  small.sharding.communicator = CommunicatorChoice::mpi;
  EXPECT_EQ(estimate_memory(model, small, options).ranks[0].runtime.nccl_buffers, 0) << "no NCCL over MPI";
  options.device = "cpu";
  EXPECT_EQ(estimate_memory(model, small, options).ranks[0].runtime.total(), 0);
}

TEST(MemoryCheck, HugeVocabularyStopsBeforeAllocating) {
  ScratchDir dir("memory_check");
  nlohmann::json config;
  std::ifstream(testing::source_dir() / "configs/llama_micro.json") >> config;
  config["vocab_size"] = 1000000000;  // 10^9: the embedding alone is hundreds of GiB
  std::ofstream(dir / "huge_vocab.json") << config.dump(2);
  const std::string base = "OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                           (dir / "huge_vocab.json").string() +
                           " --device cpu --num_training_steps 2 --batch_size 2 --max_length 16 --run_dir " +
                           (dir / "run").string();
  const auto started = std::chrono::steady_clock::now();
  const auto refused = run_command(base);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_mentions(refused.output, {"memory check: this rank needs about", "GiB available (MemAvailable)",
                                   "--skip_memory_check"});
  EXPECT_EQ(refused.output.find("alloc"), std::string::npos) << "no allocator message:\n" << refused.output;
  EXPECT_LT(seconds, 30.0) << "refused before building the model";
}

TEST(MemoryCheck, AFittingRunSaysSoAndTheFlagSkipsIt) {
  ScratchDir checked("memory_check_ok"), skipped("memory_check_skip");
  const std::string base = "OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
                           (testing::source_dir() / "configs/llama_micro.json").string() +
                           " --device cpu --num_training_steps 1 --batch_size 2 --max_length 16 --eval_batches 1";
  const auto ran = run_command(base + " --run_dir " + checked.path().string());
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  expect_mentions(ran.output, {"memory check: about", "per rank at the peak", "available"});
  const auto unchecked = run_command(base + " --skip_memory_check --run_dir " + skipped.path().string());
  ASSERT_EQ(unchecked.exit_code, 0) << unchecked.output;
  EXPECT_EQ(unchecked.output.find("memory check"), std::string::npos) << unchecked.output;
}


// A micro config with some fields changed, written into `dir`.
std::filesystem::path micro_config_with(const ScratchDir& dir, const std::string& name, const nlohmann::json& changes) {
  nlohmann::json config;
  std::ifstream(testing::source_dir() / "configs/llama_micro.json") >> config;
  config.update(changes);
  std::ofstream(dir / name) << config.dump(2);
  return dir / name;
}

std::string train_command(const std::filesystem::path& config, const ScratchDir& dir, const std::string& flags) {
  return "OMP_NUM_THREADS=1 timeout 120 " + testing::trainer_binary().string() + " --config " + config.string() +
         " --device cpu --num_training_steps 2 --max_length 16 --run_dir " + (dir / "run").string() + " " + flags;
}

// 10^6 layers: the estimate threw std::bad_alloc, the run logged "memory check skipped" and went on
// to build the model. Now the estimate is made (extrapolated from a few layers) and the check refuses
// the run with its figures.
TEST(MemoryCheck, AMillionLayersIsCheckedNotSkipped) {
  ScratchDir dir("memory_check_deep");
  const auto config = micro_config_with(dir, "million_layers.json", {{"num_hidden_layers", 1000000}});
  const auto refused = run_command(train_command(config, dir, "--batch_size 2"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_mentions(refused.output, {"memory check: this rank needs about", "GiB of host memory", "MemAvailable",
                                   "--skip_memory_check"});
  EXPECT_EQ(refused.output.find("skipped"), std::string::npos) << refused.output;
}

// An estimate that cannot be made (here a micro-batch past an exbibyte, which the estimate does not
// count to) used to be a warning, "memory check skipped", and the run went on unchecked. It stops
// the run, saying why and that --skip_memory_check skips the check.
TEST(MemoryCheck, ACheckThatCannotBeMadeStopsTheRun) {
  ScratchDir dir("memory_check_unmade");
  const auto config = micro_config_with(dir, "big_vocab.json", {{"vocab_size", 2147483647}});
  const auto refused = run_command(train_command(config, dir, "--batch_size 1073741824"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  expect_mentions(refused.output, {"the start-up memory check could not be made, so the run does not start",
                                   "--batch_size 1073741824 x --max_length 16", "exbibyte",
                                   "--skip_memory_check starts the run without the check"});
  EXPECT_EQ(refused.output.find("skipped"), std::string::npos) << refused.output;
}

// --skip_memory_check with a vocabulary of 2^31 - 1: the embedding (256 GiB) cannot be allocated.
// LibTorch's CPU allocator failed a CAFFE_ENFORCE, which aborted the process (SIGABRT, rc 134, a
// backtrace): libsentencepiece's FLAGS_minloglevel overwrote libc10's FLAGS_caffe2_use_fatal_for_enforce
// (sharding/world.cpp). Now it is a plain error on every rank, exit 2, naming the unit and the bytes
// and what to change. `ulimit -v` makes the allocation fail on any machine (without overcommit
// limits the kernel might grant 256 GiB and kill the process when it is touched).
TEST(MemoryCheck, AnAllocationThatFailsIsAPlainErrorOnEveryRank) {
  ScratchDir dir("memory_check_alloc");
  const auto config = micro_config_with(dir, "big_vocab.json", {{"vocab_size", 2147483647}});
  const std::string limited = "ulimit -v 16000000; ";
  for (int ranks : {1, 2}) {
    const std::string command =
        ranks == 1 ? limited + train_command(config, dir, "--skip_memory_check --batch_size 2")
                   : limited + testing::mpirun(ranks) + train_command(config, dir, "--skip_memory_check --batch_size 2")
                                                            .substr(std::string("OMP_NUM_THREADS=1 ").size());
    const auto failed = run_command(command);
    EXPECT_EQ(failed.exit_code, 2) << ranks << " rank(s):\n" << failed.output;
    expect_mentions(failed.output, {"error: out of memory: allocating unit embed of the model (256.00 GiB, "
                                    "274877906816 bytes) failed on rank 0",
                                    "lower the model size, use more ranks or --offload optimizer, or check the config"});
    if (ranks == 2) expect_mentions(failed.output, {"failed on rank 1"});
    for (const char* crash : {"Signal: Aborted", "Logging.cpp", "frame #", "Process received signal"})
      EXPECT_EQ(failed.output.find(crash), std::string::npos) << crash << " in:\n" << failed.output;
  }
}

}  // namespace
}  // namespace llm::startup_check_test
