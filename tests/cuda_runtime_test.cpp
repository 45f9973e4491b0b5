// LibTorch's CUDA half is loaded by the trainer only where a GPU could be used (common/device.h): the
// binary does not need it to start (launch/detach_cuda_libraries.py), a CPU machine's process never
// maps it, and where it is loaded (LLM_DEBUG_LOAD_CUDA=1 takes that way without a driver) the
// trainer's calls bind to it and its self-checks pass: the CUDA hooks are LibTorch's real ones, and
// the caching allocator reached the binary's pointer to it.
#include <gtest/gtest.h>

#include <string>

#include "tests/test_util.h"

namespace llm::cuda_runtime_test {
namespace {

using testing::run_command;

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The objects the dynamic linker loaded for a command (LD_DEBUG=files writes one "file=" line each).
std::string loaded_objects(const std::string& environment, const std::string& arguments) {
  return run_command(environment + " LD_DEBUG=files " + testing::trainer_binary().string() + " " + arguments).output;
}

TEST(CudaRuntime, NotALoadTimeDependencyOfTheTrainer) {
  const auto needed = run_command("readelf -d " + testing::trainer_binary().string());
  ASSERT_EQ(needed.exit_code, 0) << needed.output;
  ASSERT_TRUE(mentions(needed.output, "libtorch_cpu.so")) << needed.output;
  for (const char* library : {"libtorch_cuda.so", "libc10_cuda.so", "libnccl.so", "[libtorch.so]"})
    EXPECT_FALSE(mentions(needed.output, library)) << library << " in:\n" << needed.output;
}

TEST(CudaRuntime, ACpuMachinesProcessNeverLoadsItAndAForcedLoadBindsTheTrainersCalls) {
  const std::string micro = "--config " + (testing::source_dir() / "configs/llama_micro.json").string() +
                            " --num_training_steps 1 --max_length 16 --batch_size 2 --eval_every 0 --device cuda"
                            " --run_dir " + (std::filesystem::temp_directory_path() / "cuda_runtime_test").string();
  if (mentions(run_command("ldconfig -p 2>/dev/null || /sbin/ldconfig -p").output, "libcuda.so.1"))
    GTEST_SKIP() << "this machine has an NVIDIA driver: the trainer loads the CUDA runtime here";
  const std::string plain = loaded_objects("", micro);
  EXPECT_FALSE(mentions(plain, "libtorch_cuda.so")) << plain.substr(0, 4000);
  EXPECT_FALSE(mentions(plain, "libcublas")) << plain.substr(0, 4000);
  EXPECT_TRUE(mentions(plain, "error: --device: cuda: no CUDA device is visible (no NVIDIA driver on this machine: "
                              "libcuda.so.1 is not found); use --device cpu or auto"))
      << plain.substr(plain.size() > 4000 ? plain.size() - 4000 : 0);
  // Forced: loaded, every check passed (the message names no reason), and the binary's first call into
  // libc10_cuda (c10::cuda::device_count) was bound to it: the process got as far as the message.
  const std::string forced = loaded_objects("LLM_DEBUG_LOAD_CUDA=1", micro);
  EXPECT_TRUE(mentions(forced, "libtorch_cuda.so")) << forced.substr(0, 4000);
  EXPECT_TRUE(mentions(forced, "error: --device: cuda: no CUDA device is visible; use --device cpu or auto"))
      << forced.substr(forced.size() > 4000 ? forced.size() - 4000 : 0);
}

}  // namespace
}  // namespace llm::cuda_runtime_test
