// GaLore's projector cost on the attention and MLP weights of a LLaMA config, one rank, side by side:
//   adamw              the fused torch-style AdamW step on the same matrices (the baseline)
//   galore together    the reference schedule: every projector recomputed (thin SVD, as
//                      galore-torch) at steps 1, T + 1, ...: the step that does it stalls
//   galore staggered   --galore_stagger: after step 1, about K / T projectors per step
//   galore subspace    --galore_projector subspace: warm-started power iteration instead of the SVD
//                      (with and without --galore_stagger); its quality is the gradient energy its
//                      basis captures at the last refresh over what the SVD's basis captures, and
//                      (every GaLore row) the share of the noise-free matrix's energy in the span
// Gradients are a fixed rank-deficient matrix (singular values falling 10 % per index) plus fresh
// noise every step: correlated from step to step, as training gradients are.
// For each it prints the median step, the slowest step after step 1 (the stall), their ratio, and
// the projector seconds per step. Step 1 (every projector, in both schedules) is reported apart.
//
//   build/bench/galore_bench [--config configs/llama_60m.json] [--rank 128] [--gap 8] [--steps 17]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "optim/shard_optimizer.h"
#include "config/config.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  double first = 0, median = 0, slowest = 0, projector_per_step = 0;
  double captured = 0;  // subspace: energy captured at the last refresh / the SVD's (mean over matrices)
  double signal = 0;    // galore: share of the noise-free matrix's energy inside the projector's span
};

// A fixed (m x n) matrix with singular values 0.9^i (orthonormal factors from QR of Gaussians).
at::Tensor structured(const std::vector<int64_t>& shape) {
  const int64_t k = std::min(shape[0], shape[1]);
  const at::Tensor u = std::get<0>(at::linalg_qr(at::randn({shape[0], k})));
  const at::Tensor v = std::get<0>(at::linalg_qr(at::randn({shape[1], k})));
  const at::Tensor sigma = at::pow(at::full({k}, 0.9), at::arange(k, at::kFloat)) * 10.0;
  return at::matmul(u * sigma, v.t());
}

Timing run(const llm::OptimizerSettings& settings, const std::vector<std::vector<int64_t>>& shapes, int steps) {
  std::vector<at::Tensor> params, grads, bases;
  std::vector<llm::UnitShard> units;
  const llm::UpdateRule rule = settings.kind == "adamw" ? llm::UpdateRule::adamw : llm::UpdateRule::galore;
  at::manual_seed(0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    params.push_back(at::randn(shapes[i]) * 0.02);
    bases.push_back(structured(shapes[i]));
    grads.push_back(bases.back().clone());
    units.push_back(llm::single_parameter_unit("w" + std::to_string(i), shapes[i], params.back(), grads.back(), rule, true));
  }
  auto optimizer = std::make_unique<llm::ShardOptimizer>(settings, std::move(units), nullptr);
  std::vector<double> seconds;
  double projector = 0;
  Timing timing;
  for (int step = 1; step <= steps; ++step) {
    for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(bases[i] + 0.1 * at::randn(shapes[i]));
    const auto start = Clock::now();
    optimizer->step(1e-3);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (step == 1) {
      timing.first = elapsed;
      continue;
    }
    seconds.push_back(elapsed);
    projector += optimizer->last_projector_seconds();
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  timing.median = sorted[sorted.size() / 2];
  timing.slowest = sorted.back();
  timing.projector_per_step = projector / static_cast<double>(seconds.size());
  if (settings.kind != "galore_adamw") return timing;
  const auto state = optimizer->full_state_dict();
  double captured = 0, signal = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const at::Tensor p = state.at("w" + std::to_string(i) + ".projector");
    const bool right = p.size(1) == shapes[i][1] && p.size(0) != shapes[i][0];
    auto energy = [&](const at::Tensor& m) {
      return (right ? at::matmul(m, p.t()) : at::matmul(p.t(), m)).square().sum().item<double>();
    };
    const at::Tensor sigma = std::get<1>(at::linalg_svd(grads[i], /*full_matrices=*/false));
    captured += energy(grads[i]) / sigma.narrow(0, 0, p.size(right ? 0 : 1)).square().sum().item<double>();
    signal += energy(bases[i]) / bases[i].square().sum().item<double>();
  }
  // The last refresh used the last step's gradient only when every projector refreshed together.
  if (settings.projector_method == "subspace" && !settings.stagger_projectors)
    timing.captured = captured / static_cast<double>(shapes.size());
  timing.signal = signal / static_cast<double>(shapes.size());
  return timing;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GaLore projector cost against AdamW, reference schedule and staggered"};
  std::string config = "configs/llama_60m.json";
  int64_t rank = 128, gap = 8;
  int steps = 17, threads = 0;
  int64_t iterations = 2;
  app.add_option("--config", config, "model config")->capture_default_str();
  app.add_option("--rank", rank, "GaLore rank")->capture_default_str();
  app.add_option("--gap", gap, "--update_proj_gap")->capture_default_str();
  app.add_option("--steps", steps, "steps per run (>= 2 gaps + 1)")->capture_default_str();
  app.add_option("--subspace_iterations", iterations, "power iterations per subspace refresh")->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads; 0 = LibTorch's default")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) at::set_num_threads(threads);

  const llm::ModelConfig model = llm::load_model_config(config);
  const int64_t h = model.hidden_size, I = model.intermediate_size;
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t layer = 0; layer < model.num_hidden_layers; ++layer) {
    for (int i = 0; i < 4; ++i) shapes.push_back({h, h});
    shapes.push_back({I, h});
    shapes.push_back({I, h});
    shapes.push_back({h, I});
  }
  std::printf("galore_bench: %s, %zu matrices (attention + MLP of %lld layers), rank %lld, gap %lld, %d steps, "
              "%d threads\n",
              model.name.c_str(), shapes.size(), static_cast<long long>(model.num_hidden_layers),
              static_cast<long long>(rank), static_cast<long long>(gap), steps, at::get_num_threads());

  llm::OptimizerSettings adamw;
  adamw.kind = "adamw";
  llm::OptimizerSettings together;
  together.kind = "galore_adamw";
  together.eps = 1e-6;
  together.galore_rank = rank;
  together.update_proj_gap = gap;
  llm::OptimizerSettings staggered = together;
  staggered.stagger_projectors = true;
  llm::OptimizerSettings subspace = together;
  subspace.projector_method = "subspace";
  subspace.subspace_iterations = iterations;
  llm::OptimizerSettings subspace_staggered = subspace;
  subspace_staggered.stagger_projectors = true;

  std::printf("%-26s %10s %12s %12s %10s %18s %14s %14s\n", "optimizer", "step 1 ms", "median ms", "slowest ms",
              "stall", "projector ms/step", "energy vs SVD", "signal in span");
  for (const auto& [name, settings] : {std::pair<const char*, llm::OptimizerSettings>{"adamw", adamw},
                                       {"galore together", together},
                                       {"galore staggered", staggered},
                                       {"galore subspace", subspace},
                                       {"galore subspace staggered", subspace_staggered}}) {
    const Timing timing = run(settings, shapes, steps);
    char quality[32] = "-", signal[32] = "-";
    if (timing.captured > 0) std::snprintf(quality, sizeof(quality), "%.5f", timing.captured);
    if (timing.signal > 0) std::snprintf(signal, sizeof(signal), "%.5f", timing.signal);
    std::printf("%-26s %10.1f %12.1f %12.1f %9.1fx %18.1f %14s %14s\n", name, 1e3 * timing.first, 1e3 * timing.median,
                1e3 * timing.slowest, timing.slowest / timing.median, 1e3 * timing.projector_per_step, quality, signal);
  }
  return 0;
}
