// The training loss (model/cross_entropy.h) against ATen's cross_entropy, side by side in one
// process on the same logits: forward, and forward + backward, for the shape of one micro-batch
// (tokens x vocab), fp32 or bf16 logits, best of several runs. Prints both, the ratio, and the
// bytes each moves per row over the memory-bandwidth bound of a copy of the same size.
//
//   build/bench/loss_bench [--tokens 1024] [--vocab 32000] [--dtype float32|bfloat16] [--threads 2]
//   build/bench/loss_bench --passes      each ATen op of the fused loss's host block (model/cross_entropy.cpp,
//                                        fp32, in the trainer's blocks) timed apart on one thread, beside
//                                        ATen's log_softmax + nll_loss forward (the peer's forward) on one thread
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

// The fused loss's host block (model/cross_entropy.cpp cross_entropy_rows, fp32 in place, every row
// counted), op by op on one thread, each op's time summed over the blocks; best of `runs`. Mirrors
// the block's ops: when they change there, change them here.
void time_passes(const at::Tensor& logits, const at::Tensor& labels, int runs) {
  at::set_num_threads(1);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const int64_t per_block = llm::cross_entropy_blocks(rows, vocab, false, 1).rows_per_block;
  const char* names[] = {"amax", "sub_out (x - max)", "exp_", "sum", "the loss (log, gather)", "mul_ (scale / sum)",
                         "scatter_add_ (label)"};
  constexpr int kPasses = 7;
  double best[kPasses] = {}, best_total = 1e30;
  at::Tensor gradient = at::empty_like(logits);
  for (int run = 0; run < runs; ++run) {
    double spent[kPasses] = {};
    const auto started = Clock::now();
    for (int64_t begin = 0; begin < rows; begin += per_block) {
      const int64_t n = std::min(rows, begin + per_block) - begin;
      const at::Tensor x = logits.narrow(0, begin, n), target = labels.narrow(0, begin, n).unsqueeze(1);
      auto at = Clock::now();
      const auto lap = [&](int pass) {
        const auto now = Clock::now();
        spent[pass] += std::chrono::duration<double>(now - at).count();
        at = now;
      };
      const at::Tensor max = x.amax(1, true);
      lap(0);
      at::Tensor exponentials = gradient.narrow(0, begin, n);
      at::sub_out(exponentials, x, max);
      lap(1);
      exponentials.exp_();
      lap(2);
      const at::Tensor sums = exponentials.sum(1, true);
      lap(3);
      const at::Tensor losses = (max + sums.log() - x.gather(1, target)).squeeze(1);
      lap(4);
      const at::Tensor scale = at::full({n, 1}, 1.0 / static_cast<double>(rows));
      exponentials.mul_(scale / sums);
      lap(5);
      exponentials.scatter_add_(1, target, -scale);
      lap(6);
    }
    const double total = std::chrono::duration<double>(Clock::now() - started).count();
    if (total < best_total) {
      best_total = total;
      std::copy(spent, spent + kPasses, best);
    }
  }
  double peer = 1e30;
  for (int run = 0; run < runs; ++run) {
    const auto started = Clock::now();
    const at::Tensor loss = at::nll_loss(at::log_softmax(logits, 1), labels);
    peer = std::min(peer, std::chrono::duration<double>(Clock::now() - started).count());
  }
  std::printf("the fused loss's host block, %lld x %lld fp32, %lld rows a block, 1 thread, best of %d: %.1f ms\n",
              static_cast<long long>(rows), static_cast<long long>(vocab), static_cast<long long>(per_block), runs,
              best_total * 1e3);
  for (int pass = 0; pass < kPasses; ++pass)
    std::printf("  %-26s %7.2f ms %5.1f %%\n", names[pass], best[pass] * 1e3, 100.0 * best[pass] / best_total);
  std::printf("ATen's log_softmax + nll_loss forward (the peer's forward; its backward makes the gradient), 1 thread: "
              "%.1f ms\n", peer * 1e3);
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
  bool passes = false;
  app.add_flag("--passes", passes, "time each op of the fused loss's host block apart (fp32, one thread)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  at::manual_seed(0);
  const at::Tensor logits = (at::randn({tokens, vocab}) * 3).to(dtype == "float32" ? at::kFloat : at::kBFloat16);
  const at::Tensor labels = at::randint(0, vocab, {tokens}, at::kLong);
  if (passes) {
    time_passes(logits.to(at::kFloat), labels, runs);
    return 0;
  }

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
