// The clip coefficient folded into the host AdamW step (issue 42 point 5, issue 43 point 1), side by
// side in one run: the step as it was (grad.mul_(clip) over the gradient, then the one-pass AdamW
// kernel) against the kernel scaling as it reads (AdamWScalars::gradient_scale), on the same arrays,
// interleaved rep by rep so load from other processes falls on both. Both end in the same bits,
// checked at every element. This is the CPU-offload host step's work per unit when clipping fires.
//
//   build/bench/clip_fold_bench [--elements 2^24] [--reps 15] [--threads 2]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "optim/adamw.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Arrays {
  at::Tensor param, grad, exp_avg, exp_avg_sq;
};

Arrays make_arrays(int64_t n) {
  at::manual_seed(1);
  return {at::randn({n}), at::randn({n}), at::randn({n}) * 0.1, at::rand({n}) * 0.01};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The clip coefficient folded into the host AdamW step, against a separate pass"};
  std::string elements = "2^24";
  int reps = 15, threads = 2;
  app.add_option("--elements", elements, "elements of each array, N or 2^K");
  app.add_option("--reps", reps, "interleaved repetitions (the median and the spread are reported)");
  app.add_option("--threads", threads, "threads for both sides");
  CLI11_PARSE(app, argc, argv);
  const size_t caret = elements.find('^');
  const int64_t n = caret == std::string::npos ? std::stoll(elements) : int64_t{1} << std::stoll(elements.substr(caret + 1));
  at::set_num_threads(threads);
  omp_set_num_threads(threads);

  const double clip = 0.3713924061, lr = 1e-3;
  const llm::AdamWOptions options{.weight_decay = 0.1};
  Arrays separate = make_arrays(n), folded = make_arrays(n);
  const at::Tensor gradient = separate.grad.clone();
  std::vector<double> separate_s, folded_s;
  at::Tensor none;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    separate.grad.copy_(gradient);          // each step scales a fresh gradient, as a step does
    auto start = Clock::now();
    separate.grad.mul_(clip);
    llm::adamw_update(separate.param, separate.grad, separate.exp_avg, separate.exp_avg_sq, lr, options, 0.1, rep + 1);
    const double a = seconds_since(start);
    folded.grad.copy_(gradient);
    start = Clock::now();
    llm::adamw_update(folded.param, folded.grad, folded.exp_avg, folded.exp_avg_sq, lr, options, 0.1, rep + 1, none,
                      llm::StateRounding{}, clip);
    const double b = seconds_since(start);
    if (rep > 0) {
      separate_s.push_back(a);
      folded_s.push_back(b);
    }
  }
  const bool same = at::equal(separate.param, folded.param) && at::equal(separate.exp_avg, folded.exp_avg) &&
                    at::equal(separate.exp_avg_sq, folded.exp_avg_sq);
  std::vector<double> ratios;
  for (size_t i = 0; i < folded_s.size(); ++i) ratios.push_back(separate_s[i] / folded_s[i]);
  std::sort(ratios.begin(), ratios.end());
  std::printf("host AdamW step with clipping, %lld fp32 elements, %d threads, %d interleaved reps after 1 warm-up\n",
              static_cast<long long>(n), threads, reps);
  std::printf("  separate pass (grad.mul_ then the step): median %.2f ms\n", 1e3 * median(separate_s));
  std::printf("  folded (the kernel scales as it reads):  median %.2f ms\n", 1e3 * median(folded_s));
  std::printf("  separate / folded per rep: median %.2fx, min %.2fx, max %.2fx; same bits: %s\n", median(ratios),
              ratios.front(), ratios.back(), same ? "yes" : "NO");
  return same ? 0 : 1;
}
