// GaLore's projector cost on the attention and MLP weights of a LLaMA config, one rank, side by side:
//   adamw              the fused torch-style AdamW step on the same matrices (the baseline)
//   galore together    the reference schedule: every projector recomputed (thin SVD, as
//                      galore-torch) at steps 1, T + 1, ...: the step that does it stalls
//   galore staggered   --galore_stagger: after step 1, about K / T projectors per step
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
#include "trainer/config.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  double first = 0, median = 0, slowest = 0, projector_per_step = 0;
};

Timing run(const llm::OptimizerSettings& settings, const std::vector<std::vector<int64_t>>& shapes, int steps) {
  std::vector<at::Tensor> params, grads;
  std::vector<llm::ParameterShard> shards;
  const llm::UpdateRule rule = settings.kind == "adamw" ? llm::UpdateRule::adamw : llm::UpdateRule::galore;
  at::manual_seed(0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    params.push_back(at::randn(shapes[i]) * 0.02);
    grads.push_back(at::randn(shapes[i]));
    shards.push_back(llm::ParameterShard::whole("w" + std::to_string(i), params.back(), grads.back(), true, rule));
  }
  auto optimizer = llm::make_shard_optimizer(settings, shards, nullptr);
  std::vector<double> seconds;
  double projector = 0;
  Timing timing;
  for (int step = 1; step <= steps; ++step) {
    for (auto& grad : grads) grad.normal_();
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
  return timing;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GaLore projector cost against AdamW, reference schedule and staggered"};
  std::string config = "configs/llama_60m.json";
  int64_t rank = 128, gap = 8;
  int steps = 17, threads = 0;
  app.add_option("--config", config, "model config")->capture_default_str();
  app.add_option("--rank", rank, "GaLore rank")->capture_default_str();
  app.add_option("--gap", gap, "--update_proj_gap")->capture_default_str();
  app.add_option("--steps", steps, "steps per run (>= 2 gaps + 1)")->capture_default_str();
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

  std::printf("%-18s %10s %12s %12s %10s %16s\n", "optimizer", "step 1 ms", "median ms", "slowest ms",
              "stall", "projector ms/step");
  for (const auto& [name, settings] : {std::pair<const char*, llm::OptimizerSettings>{"adamw", adamw},
                                       {"galore together", together},
                                       {"galore staggered", staggered}}) {
    const Timing timing = run(settings, shapes, steps);
    std::printf("%-18s %10.1f %12.1f %12.1f %9.1fx %16.1f\n", name, 1e3 * timing.first, 1e3 * timing.median,
                1e3 * timing.slowest, timing.slowest / timing.median, 1e3 * timing.projector_per_step);
  }
  return 0;
}
