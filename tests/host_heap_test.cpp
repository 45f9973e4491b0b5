// The host heap reaches its steady size in the first step (issue 55): with LibTorch's huge pages on
// every block of 2 MiB and more (THP_MEM_ALLOC_ENABLE=1, which the trainer set before) the 2 MiB-aligned
// blocks fragmented the heap, which grew for several steps, each faulting and zeroing new pages in:
// llama_9m's peak RSS went 469, 594, 719, 844, 907 MiB over steps 1-5 and its forward took 0.37 s a
// micro-batch there against 0.094 s from step 7. Huge pages now go to the optimizer's long-lived
// buffers alone (common/host_memory.h advise_huge_pages). The step's memory, not its time, is what is
// asserted: the peak RSS after the first step stays within 15 % of the first step's (the bug reached
// 93 % by step 5). Without the bug the heap may still step up once by a few per cent: 469 -> 485 MiB
// here, and 534 -> 574 MiB (7.5 %) at step 3 once under the full suite on CI, which a 5 % bound failed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace llm::host_heap_test {
namespace {

TEST(HostHeap, ReachesItsSteadySizeInTheFirstStep) {
  testing::ScratchDir dir("host_heap");
  const testing::CommandResult run = testing::run_command(
      "OMP_NUM_THREADS=1 " + testing::trainer_binary().string() + " --config " +
      (testing::source_dir() / "configs/llama_9m.json").string() +
      " --device cpu --max_length 128 --batch_size 4 --total_batch_size 4 --eval_every 0 --num_training_steps 5"
      " --run_dir " + (dir / "run").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<nlohmann::json> steps = testing::read_metrics_events(dir / "run", "train");
  ASSERT_EQ(steps.size(), 5u);
  const double first = steps.front().at("peak_rss_bytes").get<double>();
  for (const nlohmann::json& step : steps)
    EXPECT_LE(step.at("peak_rss_bytes").get<double>(), 1.15 * first)
        << "step " << step.at("step") << ": the heap still grows after the first step";
}

}  // namespace
}  // namespace llm::host_heap_test
