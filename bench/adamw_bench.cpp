// The CPU AdamW step (the offload path's optimizer) against LibTorch's torch::optim::AdamW and
// against the memory-bandwidth bound, in one process with one thread count.
//
// AdamW reads p, g, m, v and writes p, m, v in place: 28 bytes per element and a few flops, so a
// good step runs at memory speed. The bound is measured here, not quoted: an OpenMP loop with
// exactly AdamW's streams (four arrays read, three of them written back in place, the same static
// schedule) and no arithmetic to speak of. Its best time is the ideal; "fraction" is ideal time
// over our median time.
//
//   build/bench/adamw_bench [--threads 2] [--sizes 2^20,2^24,2^26] [--reps 5]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include "common/errors.h"
#include "optim/adamw.h"

namespace {

constexpr double kBytesPerElement = 28.0;  // read p, g, m, v (16 B); write p, m, v (12 B)
constexpr double kLearningRate = 1e-3;
constexpr double kWeightDecay = 0.1;

using Clock = std::chrono::steady_clock;

template <typename Body>
double seconds_of(Body&& body) {
  const auto start = Clock::now();
  body();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// "1048576" or "2^20".
int64_t parse_size(const std::string& text) {
  try {
    const size_t caret = text.find('^');
    if (caret == std::string::npos) return std::stoll(text);
    const int64_t base = std::stoll(text.substr(0, caret));
    const int64_t exponent = std::stoll(text.substr(caret + 1));
    int64_t value = 1;
    for (int64_t i = 0; i < exponent; ++i) value *= base;
    return value;
  } catch (const std::exception&) {
    throw llm::UserError("--sizes: '" + text + "' is not a size; write 1048576 or 2^20");
  }
}

// The bound: AdamW's memory streams without its arithmetic. Four arrays of n floats; the first
// three are read and written in place, the fourth (the gradient) only read.
struct BandwidthProbe {
  std::vector<float> param, exp_avg, exp_avg_sq, grad;

  explicit BandwidthProbe(int64_t n) : param(n), exp_avg(n), exp_avg_sq(n), grad(n) {
    // First touch with the same static schedule as the measured loop, so pages land where the
    // thread that streams them runs.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      param[i] = 1.0f;
      exp_avg[i] = 0.5f;
      exp_avg_sq[i] = 0.25f;
      grad[i] = 1e-3f;
    }
  }

  void run_once(float scale) {
    const int64_t n = static_cast<int64_t>(param.size());
    float* p = param.data();
    float* m = exp_avg.data();
    float* v = exp_avg_sq.data();
    const float* g = grad.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      p[i] += scale * g[i];
      m[i] += scale * g[i];
      v[i] += scale * g[i];
    }
  }
};

struct Row {
  int64_t numel;
  double ours_seconds, libtorch_seconds, bound_seconds, max_abs_difference;
};

Row measure(int64_t numel, int reps) {
  torch::manual_seed(0);
  const at::Tensor initial = torch::randn({numel});
  const at::Tensor grad = torch::randn({numel});

  // Ours: the fused step on p, g, m, v.
  at::Tensor our_param = initial.clone();
  at::Tensor exp_avg = torch::zeros({numel});
  at::Tensor exp_avg_sq = torch::zeros({numel});
  const llm::AdamWOptions options{.weight_decay = kWeightDecay};
  int64_t our_step = 0;
  const auto our_step_once = [&] {
    llm::adamw_update(our_param, grad, exp_avg, exp_avg_sq, kLearningRate, options, kWeightDecay,
                      ++our_step);
  };
  our_step_once();  // warm-up: page faults, thread pool start
  std::vector<double> ours;
  for (int rep = 0; rep < reps; ++rep) ours.push_back(seconds_of(our_step_once));

  // LibTorch's AdamW on its own copy of the same tensors, for the same number of steps.
  at::Tensor reference_param = initial.clone().requires_grad_(true);
  reference_param.mutable_grad() = grad.clone();
  torch::optim::AdamW reference(
      {reference_param},
      torch::optim::AdamWOptions(kLearningRate).betas({0.9, 0.999}).eps(1e-8).weight_decay(
          kWeightDecay));
  reference.step();  // warm-up; allocates its state
  std::vector<double> libtorch;
  for (int rep = 0; rep < reps; ++rep) libtorch.push_back(seconds_of([&] { reference.step(); }));
  const double difference =
      (our_param - reference_param.detach()).abs().max().item<double>();
  reference_param.mutable_grad() = at::Tensor();

  // The bound, on arrays of the same size (so the same cache regime).
  BandwidthProbe probe(numel);
  probe.run_once(1e-7f);
  std::vector<double> bound;
  for (int rep = 0; rep < reps; ++rep) {
    bound.push_back(seconds_of([&] { probe.run_once(1e-7f); }));
  }
  return {numel, median(ours), median(libtorch), *std::min_element(bound.begin(), bound.end()),
          difference};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU AdamW step: ours vs torch::optim::AdamW vs the memory-bandwidth bound"};
  int threads = omp_get_max_threads();
  std::vector<std::string> size_texts = {"2^20", "2^24", "2^26"};
  int reps = 5;
  app.add_option("--threads", threads, "OpenMP threads for ours, LibTorch and the bound")
      ->check(CLI::PositiveNumber);
  app.add_option("--sizes", size_texts, "element counts, e.g. 2^20,2^24 or 1048576")
      ->delimiter(',');
  app.add_option("--reps", reps, "timed repetitions per measurement (after one warm-up)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<int64_t> sizes;
    for (const std::string& text : size_texts) {
      sizes.push_back(parse_size(text));
      if (sizes.back() < 1) throw llm::UserError("--sizes: '" + text + "' must be >= 1");
    }
    // LibTorch's pip wheel ships the same libgomp.so.1 we link, so this is one thread pool.
    omp_set_num_threads(threads);
    at::set_num_threads(threads);

    std::printf("AdamW step on the host, fp32, %d threads, median of %d reps after 1 warm-up; "
                "%.0f bytes/element; bound = best in-place 4-read/3-write stream\n",
                threads, reps, kBytesPerElement);
    std::printf("%12s %10s %12s %8s %10s %10s %9s %14s\n", "N", "ours ms", "libtorch ms",
                "speedup", "ours GB/s", "bound GB/s", "fraction", "max|ours-lt|");
    for (int64_t numel : sizes) {
      const Row row = measure(numel, reps);
      const double bytes = kBytesPerElement * static_cast<double>(row.numel);
      std::printf("%12lld %10.3f %12.3f %7.2fx %10.2f %10.2f %9.2f %14.3g\n",
                  static_cast<long long>(row.numel), 1e3 * row.ours_seconds,
                  1e3 * row.libtorch_seconds, row.libtorch_seconds / row.ours_seconds,
                  bytes / row.ours_seconds / 1e9, bytes / row.bound_seconds / 1e9,
                  row.bound_seconds / row.ours_seconds, row.max_abs_difference);
      std::fflush(stdout);
    }
  } catch (const llm::UserError& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
  return 0;
}
