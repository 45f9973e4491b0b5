// The training loss (model/cross_entropy.h) against ATen's cross_entropy, side by side in one
// process on the same logits: forward, and forward + backward, for the shape of one micro-batch
// (tokens x vocab), fp32 or bf16 logits, best of several runs. Prints both, the ratio, and the
// bytes each moves per row over the memory-bandwidth bound of a copy of the same size.
//
//   build/bench/loss_bench [--tokens 1024] [--vocab 32000] [--dtype float32|bfloat16] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "common/host_memory.h"
#include "model/cross_entropy.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  double forward = 1e30, total = 1e30;
};

template <typename Loss>
Timing time_loss(Loss loss_of, const at::Tensor& logits, const at::Tensor& labels, int runs) {
  Timing best;
  for (int i = 0; i < runs; ++i) {
    at::Tensor x = logits.detach().clone().requires_grad_(true);
    const auto started = Clock::now();
    at::Tensor loss = loss_of(x, labels);
    const auto forwarded = Clock::now();
    loss.backward();
    const auto finished = Clock::now();
    best.forward = std::min(best.forward, std::chrono::duration<double>(forwarded - started).count());
    best.total = std::min(best.total, std::chrono::duration<double>(finished - started).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  llm::keep_freed_host_memory();  // as the trainer runs
  int64_t tokens = 1024, vocab = 32000;
  int threads = 2, runs = 7;
  std::string dtype = "float32";
  CLI::App app{"fused cross entropy against ATen's"};
  app.add_option("--tokens", tokens)->capture_default_str();
  app.add_option("--vocab", vocab)->capture_default_str();
  app.add_option("--dtype", dtype)->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--runs", runs)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  at::manual_seed(0);
  const at::Tensor logits = (at::randn({tokens, vocab}) * 3).to(dtype == "float32" ? at::kFloat : at::kBFloat16);
  const at::Tensor labels = at::randint(0, vocab, {tokens}, at::kLong);

  const auto blocked = [](const at::Tensor& x, const at::Tensor& y) { return llm::causal_lm_loss(x, y); };
  const Timing fused = time_loss(blocked, logits, labels, runs);
  const Timing aten = time_loss(llm::causal_lm_loss_reference, logits, labels, runs);
  // The bound: copying the logits once (read + write), the least any loss-and-gradient can move.
  double copy = 1e30;
  for (int i = 0; i < runs; ++i) {
    at::Tensor out = at::empty_like(logits);
    const auto started = Clock::now();
    out.copy_(logits);
    copy = std::min(copy, std::chrono::duration<double>(Clock::now() - started).count());
  }
  std::printf("loss %lld x %lld %s, %d thread(s), best of %d\n", static_cast<long long>(tokens),
              static_cast<long long>(vocab), dtype.c_str(), threads, runs);
  std::printf("  %-28s %10s %18s\n", "", "forward ms", "forward+backward ms");
  std::printf("  %-28s %10.1f %18.1f\n", "ours (fused)", fused.forward * 1e3, fused.total * 1e3);
  std::printf("  %-28s %10.1f %18.1f\n", "ATen cross_entropy", aten.forward * 1e3, aten.total * 1e3);
  std::printf("  ratio ATen / ours (forward+backward): %.2f\n", aten.total / fused.total);
  std::printf("  bound: one copy of the logits %.1f ms (%.1f GB/s read + write)\n", copy * 1e3,
              2.0 * static_cast<double>(logits.nbytes()) / copy / 1e9);
  return 0;
}
