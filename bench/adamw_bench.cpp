// The host optimizer steps (the CPU-offload path) against what a user would run instead, side by
// side in one invocation, one thread count for every side.
//
// Section "adamw": one fp32 tensor of N elements (params, grads, state fp32; lr 1e-3, betas 0.9 /
// 0.999, eps 1e-8, weight decay 0.1, the same gradient every step):
//   ours         llm::adamw_update on CPU tensors: the fused one-pass step with the widest kernel
//                this CPU runs (optim/adamw_host.h; AVX-512, AVX2 or scalar), bit-identical to the
//                scalar functor
//   scalar       ours with the scalar kernel forced: the element functor under `omp simd`, the loop
//                the host step ran before the vector kernels (same threading as ours now: shows what
//                the vector kernels and their prefetching gain)
//   torch fused  torch.optim.AdamW(fused=True) in the project's Python (bench/adamw_peers.py)
//   deepspeed    DeepSpeedCPUAdam(adamw_mode=True), fp32 params, op built for DS_ACCELERATOR=cpu
//                (bench/install_peers.sh installs it; without it the column is empty)
//   libtorch     torch::optim::AdamW, LibTorch's C++ optimizer (one ATen op per term)
//   avx2         ours with the AVX2 kernel forced, where AVX-512 is the widest (what it gains here)
//   arithmetic   ours's step over arrays that stay in the cores' caches, in ns per element (times N:
//                the step's floor when memory costs nothing; in the rows with the CPU's name)
//   bound        the memory bound, measured: AdamW's streams with no arithmetic to speak of (four
//                arrays read, three written back in place) three ways: STREAM's (each thread one
//                contiguous block, ordinary stores), our kernel's (dynamic chunks, software
//                prefetch), and with non-temporal stores; the best time of any over all reps, or
//                the best rep of any side that moved its bytes faster (then bound_from names it)
//   ours bf16    ours with bf16 moments (--optimizer_state_dtype bfloat16: read exactly, stepped in
//                fp32, stored with stochastic rounding; optim/state_rounding.h): 20 bytes per element
//                (p 4 + 4, g 4, m 2 + 2, v 2 + 2). Its bound is the measured bound's GB/s over its 20
//                bytes; "bf16 vs best peer" is the faster fp32 peer's time over its time.
// Each rep runs one step of every side in turn (ours, torch fused, deepspeed, libtorch, scalar,
// the three bound passes), each after a 20 ms pause, so load from other processes falls on all
// of them; a side's figure is its median over the reps (the bound's, its best). GB/s counts 28 bytes per element (read p,
// g, m, v; write p, m, v). "vs best peer" is the faster of torch fused and deepspeed over ours.
// Ours against the bound, three ways: paired (each rep's fastest pass of any fp32 side or probe
// over ours in that rep, the median over the reps: one statistic on both sides, and the pairs ran
// within a few hundred ms of each other), best (ours's best rep over the bound) and mixed (ours's
// median over the bound, the best pass of the run). On a machine with bursts of bandwidth one pass
// can run far above every median, and the mixed figure then marks the probe's own median down too:
// "probe" is that control, the median rep's fastest probe pass over the same bound.
// Agreement: every side starts from the same values (made from the element index, so the Python
// peers build them too) and takes the same steps; ours is compared with each at 4096 sampled
// elements and with the scalar kernel at every element, bit for bit.
//
// Section "rules": the HF-style rules of adamw_sn and galore_adamw on single llama-shaped matrices
// (default llama_350m's attention, MLP-up and MLP-down shapes), ours (llm::ShardOptimizer, one
// rank) against their Python references: tests/golden/reference_adamw_sn.py ("per_matrix", the
// published AdamwSN) and galore_torch.GaLoreAdamW (rank 128, std projection, scale 1, gap 200 so
// the timed steps refresh no projector: step 1, with the SVD, is the untimed warm-up). eps 1e-6,
// weight decay 0.1.
//
//   build/bench/adamw_bench [--threads 2] [--sizes 2^22,2^24,2^26] [--reps 5] [--json]
//                           [--sections adamw,rules] [--rule_shapes 1024x1024,2736x1024,1024x2736]
//                           [--python PATH]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/optim/adamw.h>

#include "bench/adamw_bench_io.h"
#include "bench/bandwidth_probe.h"
#include "bench/python_peer.h"
#include "common/errors.h"
#include "common/host_memory.h"
#include "optim/adamw.h"
#include "optim/adamw_host.h"
#include "optim/shard_optimizer.h"
#include "optim/state_rounding.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using bench::cell;
using bench::cpu_model;
using bench::parse_shape;
using bench::parse_size;

constexpr double kBytesPerElement = 28.0;  // read p, g, m, v (16 B); write p, m, v (12 B)
constexpr double kBf16StateBytesPerElement = 20.0;  // the same with m and v in bf16
constexpr double kLearningRate = 1e-3;
constexpr double kWeightDecay = 0.1;
constexpr int64_t kSamples = 4096;

#ifndef TRAINER_PYTHON
#define TRAINER_PYTHON ""
#endif
#ifndef TRAINER_SOURCE_DIR
#define TRAINER_SOURCE_DIR "."
#endif

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

// scale * (((i * multiplier + offset) mod 2^32) / 2^31 - 1): bench/adamw_peers.py's index_values,
// exact in double, so both languages make the same fp32 values.
at::Tensor index_values(int64_t n, uint64_t multiplier, uint64_t offset, double scale) {
  at::Tensor values = at::empty({n});
  float* out = values.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hashed = (static_cast<uint64_t>(i) * multiplier + offset) % (uint64_t{1} << 32);
    out[i] = static_cast<float>((static_cast<double>(hashed) / 2147483648.0 - 1.0) * scale);
  }
  return values;
}

// kSamples indices spread over [0, n), first and last included.
std::vector<int64_t> sample_indices(int64_t n) {
  std::vector<int64_t> indices;
  const int64_t count = std::min(n, kSamples);
  for (int64_t k = 0; k < count; ++k) indices.push_back(count == 1 ? 0 : k * (n - 1) / (count - 1));
  return indices;
}

double max_abs_difference(const at::Tensor& flat, const std::vector<int64_t>& indices,
                          const std::vector<double>& values) {
  const float* data = flat.const_data_ptr<float>();
  double largest = 0;
  for (size_t k = 0; k < indices.size(); ++k)
    largest = std::max(largest, std::fabs(static_cast<double>(data[indices[k]]) - values.at(k)));
  return largest;
}

std::vector<double> samples_of(const at::Tensor& flat, const std::vector<int64_t>& indices) {
  const float* data = flat.const_data_ptr<float>();
  std::vector<double> values;
  for (int64_t index : indices) values.push_back(data[index]);
  return values;
}

// One timed side: step() runs one step and returns its seconds.
struct Side {
  std::string name;
  std::function<double()> step;
  std::vector<double> seconds = {};
};

// Warm-up once each, then `reps` rounds of one step per side in order. Each step starts after a
// pause: an OpenMP team spins for a while after its parallel region ends (libgomp's
// GOMP_SPINCOUNT), and the next side, in the other process, would otherwise share the cores with
// the previous side's spinning threads.
void interleave(std::vector<Side>& sides, int reps) {
  const auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  for (Side& side : sides) {
    pause();
    side.step();
  }
  for (int rep = 0; rep < reps; ++rep)
    for (Side& side : sides) {
      pause();
      side.seconds.push_back(side.step());
    }
}

const Side* find(const std::vector<Side>& sides, const std::string& name) {
  for (const Side& side : sides)
    if (side.name == name) return &side;
  return nullptr;
}

json ms_or_null(const Side* side) {
  if (side == nullptr || side->seconds.empty()) return nullptr;
  return 1e3 * median(side->seconds);
}

// The Python peers, when they run: torch fused and (when installed) deepspeed.
struct Peers {
  std::unique_ptr<bench::PythonPeer> process;
  bool torch = false, deepspeed = false;
};

// Ours's arithmetic alone: nanoseconds per element of one step over arrays that stay in the cores'
// caches (2^15 elements a thread: 512 KiB of fp32 arrays), the best of 5 trials of 200 steps. On a
// CPU whose step is slow in arithmetic (measured: a 2-core Skylake-SP VM with AVX-512) this floor
// times the elements is near the memory time, and the two add up where they do not overlap.
double in_cache_ns_per_element(int threads, bool bf16_state, llm::HostIsa isa) {
  const int64_t n = (int64_t{1} << 15) * std::max(threads, 1);
  std::vector<float> param(n, 0.5f), grad(n, 1e-3f), exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
  std::vector<uint16_t> exp_avg_bf16(n, 0), exp_avg_sq_bf16(n, 0);
  llm::AdamWHostArrays arrays{param.data(), grad.data(), false, bf16_state ? nullptr : exp_avg.data(),
                              bf16_state ? nullptr : exp_avg_sq.data(), nullptr};
  if (bf16_state) {
    arrays.exp_avg_bf16 = exp_avg_bf16.data();
    arrays.exp_avg_sq_bf16 = exp_avg_sq_bf16.data();
  }
  constexpr int kSteps = 200;
  double best = std::numeric_limits<double>::infinity();
  for (int trial = 0; trial < 5; ++trial)
    best = std::min(best, seconds_of([&] {
                      for (int step = 1; step <= kSteps; ++step) {
                        arrays.rounding = {llm::rounding_key(0, step, 0), 0};
                        llm::adamw_host_update(arrays, n, llm::adamw_scalars(kLearningRate, llm::AdamWOptions{.weight_decay = kWeightDecay}, kWeightDecay, step),
                                               threads, isa);
                      }
                    }));
  return best / kSteps / static_cast<double>(n) * 1e9;
}

json measure_adamw(int64_t n, int reps, int threads, Peers& peers) {
  const llm::AdamWOptions options{.weight_decay = kWeightDecay};
  const auto make_param = [&] { return index_values(n, 2654435761u, 12345, 1.0); };
  const at::Tensor grad = index_values(n, 2246822519u, 777, 0.0625);

  at::Tensor param = make_param(), exp_avg = at::zeros({n}), exp_avg_sq = at::zeros({n});
  at::Tensor scalar_param = make_param(), scalar_m = at::zeros({n}), scalar_v = at::zeros({n});
  at::Tensor bf16_param = make_param(), bf16_m = at::zeros({n}, at::kBFloat16), bf16_v = at::zeros({n}, at::kBFloat16);
  int64_t our_step = 0, scalar_step = 0, bf16_step = 0;

  at::Tensor libtorch_param = make_param().requires_grad_(true);
  libtorch_param.mutable_grad() = grad.clone();
  torch::optim::AdamW libtorch({libtorch_param}, torch::optim::AdamWOptions(kLearningRate)
                                                     .betas({0.9, 0.999})
                                                     .eps(1e-8)
                                                     .weight_decay(kWeightDecay));
  llm::bench::BandwidthProbe probe(n);
  if (peers.torch)
    peers.process->ask({{"cmd", "setup"}, {"kind", "adamw"}, {"n", n}, {"lr", kLearningRate},
                        {"weight_decay", kWeightDecay}});

  std::vector<Side> sides;
  sides.push_back({"ours", [&] {
                     return seconds_of([&] {
                       llm::adamw_update(param, grad, exp_avg, exp_avg_sq, kLearningRate, options,
                                         kWeightDecay, ++our_step);
                     });
                   }});
  sides.push_back({"ours_bf16_state", [&] {
                     return seconds_of([&] {
                       at::Tensor none;
                       ++bf16_step;
                       llm::adamw_update(bf16_param, grad, bf16_m, bf16_v, kLearningRate, options, kWeightDecay,
                                         bf16_step, none, {llm::rounding_key(0, bf16_step, 0), 0});
                     });
                   }});
  for (const char* peer : {"torch_fused", "deepspeed"}) {
    if (std::string(peer) == "torch_fused" ? !peers.torch : !peers.deepspeed) continue;
    sides.push_back({peer, [&peers, peer] {
                       return peers.process->ask({{"cmd", "step"}, {"side", peer}})["seconds"]
                           .get<double>();
                     }});
  }
  sides.push_back({"libtorch", [&] { return seconds_of([&] { libtorch.step(); }); }});
  sides.push_back({"scalar", [&] {
                     return seconds_of([&] {
                       const llm::AdamWScalars scalars =
                           llm::adamw_scalars(kLearningRate, options, kWeightDecay, ++scalar_step);
                       const llm::AdamWHostArrays arrays{
                           scalar_param.data_ptr<float>(), grad.const_data_ptr<float>(), false,
                           scalar_m.data_ptr<float>(), scalar_v.data_ptr<float>(), nullptr};
                       llm::adamw_host_update(arrays, n, scalars, threads, llm::HostIsa::scalar);
                     });
                   }});
  // Where AVX-512 is the widest kernel, the AVX2 one beside it (what the wider kernel gains here).
  at::Tensor avx2_param, avx2_m, avx2_v;
  int64_t avx2_step = 0;
  if (llm::best_host_isa() == llm::HostIsa::avx512) {
    avx2_param = make_param();
    avx2_m = at::zeros({n});
    avx2_v = at::zeros({n});
    sides.push_back({"avx2", [&] {
                       return seconds_of([&] {
                         const llm::AdamWScalars scalars =
                             llm::adamw_scalars(kLearningRate, options, kWeightDecay, ++avx2_step);
                         const llm::AdamWHostArrays arrays{avx2_param.data_ptr<float>(), grad.const_data_ptr<float>(),
                                                           false, avx2_m.data_ptr<float>(), avx2_v.data_ptr<float>(),
                                                           nullptr};
                         llm::adamw_host_update(arrays, n, scalars, threads, llm::HostIsa::avx2);
                       });
                     }});
  }
  sides.push_back({"bound", [&] { return seconds_of([&] { probe.pass(); }); }});
  sides.push_back({"bound_prefetch", [&] { return seconds_of([&] { probe.pass_chunked_prefetch(); }); }});
  sides.push_back({"bound_nt", [&] { return seconds_of([&] { probe.pass_non_temporal(); }); }});
  interleave(sides, reps);

  // Agreement after the same 1 + reps steps on every side.
  const std::vector<int64_t> indices = sample_indices(n);
  json diff;
  diff["libtorch"] = max_abs_difference(param, indices, samples_of(libtorch_param.detach(), indices));
  for (const char* peer : {"torch_fused", "deepspeed"}) {
    if (find(sides, peer) == nullptr) {
      diff[peer] = nullptr;
      continue;
    }
    const json answer = peers.process->ask({{"cmd", "samples"}, {"side", peer}, {"indices", indices}});
    diff[peer] = max_abs_difference(param, indices, answer["values"].get<std::vector<double>>());
  }
  const bool scalar_identical =
      std::memcmp(param.const_data_ptr(), scalar_param.const_data_ptr(), n * sizeof(float)) == 0 &&
      std::memcmp(exp_avg.const_data_ptr(), scalar_m.const_data_ptr(), n * sizeof(float)) == 0 &&
      std::memcmp(exp_avg_sq.const_data_ptr(), scalar_v.const_data_ptr(), n * sizeof(float)) == 0;

  const double bytes = kBytesPerElement * static_cast<double>(n);
  const auto gbs = [&](const json& ms) -> json {
    if (ms.is_null()) return nullptr;
    return bytes / (ms.get<double>() * 1e-3) / 1e9;
  };
  const auto best_seconds = [&](const char* name) {
    const std::vector<double>& seconds = find(sides, name)->seconds;
    return *std::min_element(seconds.begin(), seconds.end());
  };
  const double best_regular = best_seconds("bound"), best_prefetch = best_seconds("bound_prefetch"),
               best_nt = best_seconds("bound_nt");

  json row;
  row["section"] = "adamw";
  row["n"] = n;
  row["threads"] = threads;
  row["reps"] = reps;
  row["kernel"] = llm::to_string(llm::best_host_isa());
  row["cpu"] = cpu_model();
  row["ours_in_cache_ns_per_element"] = in_cache_ns_per_element(threads, false, llm::best_host_isa());
  row["ours_bf16_state_in_cache_ns_per_element"] = in_cache_ns_per_element(threads, true, llm::best_host_isa());
  const bool avx2_beside = llm::best_host_isa() == llm::HostIsa::avx512;
  row["avx2_in_cache_ns_per_element"] = avx2_beside ? json(in_cache_ns_per_element(threads, false, llm::HostIsa::avx2)) : json(nullptr);
  row["avx2_bf16_state_in_cache_ns_per_element"] =
      avx2_beside ? json(in_cache_ns_per_element(threads, true, llm::HostIsa::avx2)) : json(nullptr);
  row["ours_ms"] = ms_or_null(find(sides, "ours"));
  row["scalar_ms"] = ms_or_null(find(sides, "scalar"));
  row["avx2_ms"] = ms_or_null(find(sides, "avx2"));
  row["torch_fused_ms"] = ms_or_null(find(sides, "torch_fused"));
  row["deepspeed_ms"] = ms_or_null(find(sides, "deepspeed"));
  row["libtorch_ms"] = ms_or_null(find(sides, "libtorch"));
  // The bound is the fastest these bytes moved on this machine in this run: the probe's passes, or any
  // side's best rep where one beat them (a bound a kernel beats is no bound); bound_from names it.
  row["bound_gbs"] = bytes / std::min({best_regular, best_prefetch, best_nt}) / 1e9;
  row["bound_from"] = "probe";
  for (const Side& side : sides) {
    if (side.name.rfind("bound", 0) == 0 || side.seconds.empty()) continue;
    const double side_bytes = side.name == "ours_bf16_state" ? kBf16StateBytesPerElement * static_cast<double>(n) : bytes;
    const double side_gbs = side_bytes / *std::min_element(side.seconds.begin(), side.seconds.end()) / 1e9;
    if (side_gbs > row["bound_gbs"].get<double>()) {
      row["bound_gbs"] = side_gbs;
      row["bound_from"] = side.name;
    }
  }
  row["bound_regular_gbs"] = bytes / best_regular / 1e9;
  row["bound_prefetch_gbs"] = bytes / best_prefetch / 1e9;
  row["bound_non_temporal_gbs"] = bytes / best_nt / 1e9;
  for (const char* side : {"ours", "scalar", "torch_fused", "deepspeed", "libtorch"})
    row[std::string(side) + "_gbs"] = gbs(row[std::string(side) + "_ms"]);
  row["ours_fraction_of_bound"] = row["ours_gbs"].get<double>() / row["bound_gbs"].get<double>();
  // Like for like. The bound above is the fastest pass of the whole run and ours is its median: where
  // one pass caught a burst of bandwidth, every median sits far under it, the probe's own too
  // (probe_median_fraction_of_bound: the median rep's fastest probe pass over that bound). So the
  // kernel is also measured against the bound with one statistic on both sides: rep by rep, the
  // fastest way the bytes moved in that rep (the probe's three passes and every fp32 side, all run
  // within a few hundred ms) over ours in it, and the median of those ratios over the reps (paired);
  // and ours's best rep over the run's bound (best against best).
  const auto rep_bound_seconds = [&](size_t rep) {
    double fastest = std::numeric_limits<double>::infinity();
    for (const Side& side : sides)
      if (side.name != "ours_bf16_state" && rep < side.seconds.size()) fastest = std::min(fastest, side.seconds[rep]);
    return fastest;
  };
  std::vector<double> probe_per_rep, paired, paired_bf16;
  for (size_t rep = 0; rep < find(sides, "ours")->seconds.size(); ++rep) {
    probe_per_rep.push_back(std::min({find(sides, "bound")->seconds[rep], find(sides, "bound_prefetch")->seconds[rep],
                                      find(sides, "bound_nt")->seconds[rep]}));
    paired.push_back(rep_bound_seconds(rep) / find(sides, "ours")->seconds[rep]);
    // bf16 state moves 20 bytes where the bound moved 28: its GB/s over the rep's bound GB/s.
    paired_bf16.push_back(kBf16StateBytesPerElement / kBytesPerElement * rep_bound_seconds(rep) /
                          find(sides, "ours_bf16_state")->seconds[rep]);
  }
  row["probe_median_fraction_of_bound"] = bytes / median(probe_per_rep) / 1e9 / row["bound_gbs"].get<double>();
  row["ours_fraction_of_bound_paired"] = median(paired);
  row["ours_bf16_state_fraction_of_bound_paired"] = median(paired_bf16);
  const std::vector<double>& ours_seconds = find(sides, "ours")->seconds;
  row["ours_best_fraction_of_bound"] =
      bytes / *std::min_element(ours_seconds.begin(), ours_seconds.end()) / 1e9 / row["bound_gbs"].get<double>();
  json best_peer_ms = nullptr;
  for (const char* peer : {"torch_fused_ms", "deepspeed_ms"})
    if (!row[peer].is_null() && (best_peer_ms.is_null() || row[peer].get<double>() < best_peer_ms.get<double>()))
      best_peer_ms = row[peer];
  row["ratio_vs_best_peer"] =
      best_peer_ms.is_null() ? json(nullptr) : json(best_peer_ms.get<double>() / row["ours_ms"].get<double>());
  // bf16 state: its own bytes at the same measured bandwidth bound.
  row["ours_bf16_state_ms"] = ms_or_null(find(sides, "ours_bf16_state"));
  row["ours_bf16_state_gbs"] =
      kBf16StateBytesPerElement * static_cast<double>(n) / (row["ours_bf16_state_ms"].get<double>() * 1e-3) / 1e9;
  row["ours_bf16_state_fraction_of_bound"] = row["ours_bf16_state_gbs"].get<double>() / row["bound_gbs"].get<double>();
  row["bf16_state_ratio_vs_best_peer"] =
      best_peer_ms.is_null() ? json(nullptr)
                             : json(best_peer_ms.get<double>() / row["ours_bf16_state_ms"].get<double>());
  row["bf16_state_max_abs_diff_vs_ours"] = max_abs_difference(bf16_param, indices, samples_of(param, indices));
  row["max_abs_diff"] = diff;
  row["scalar_bit_identical"] = scalar_identical;
  return row;
}

json measure_rules(const std::vector<int64_t>& shape, int reps, int threads, Peers& peers) {
  const int64_t numel = shape[0] * shape[1];
  llm::OptimizerSettings sn;
  sn.kind = "adamw_sn";
  sn.eps = 1e-6;
  sn.weight_decay = kWeightDecay;
  llm::OptimizerSettings galore = sn;
  galore.kind = "galore_adamw";
  galore.galore_rank = 128;
  galore.update_proj_gap = 200;
  galore.galore_scale = 1.0;

  struct Ours {
    at::Tensor master, gradient;
    std::unique_ptr<llm::ShardOptimizer> optimizer;
  };
  const auto make = [&](const llm::OptimizerSettings& settings, llm::UpdateRule rule) {
    Ours ours;
    ours.master = index_values(numel, 2654435761u, 12345, 0.03125);
    ours.gradient = index_values(numel, 2246822519u, 777, 0.0625);
    std::vector<llm::UnitShard> units;
    units.push_back(llm::single_parameter_unit("w", shape, ours.master, ours.gradient, rule, true));
    ours.optimizer = std::make_unique<llm::ShardOptimizer>(settings, std::move(units), nullptr);
    return ours;
  };
  Ours ours_sn = make(sn, llm::UpdateRule::subset_norm);
  Ours ours_galore = make(galore, llm::UpdateRule::galore);
  if (peers.torch)
    peers.process->ask({{"cmd", "setup"}, {"kind", "rules"}, {"shapes", json::array({json(shape)})}, {"lr", kLearningRate},
                        {"weight_decay", kWeightDecay},
                        {"galore", {{"rank", galore.galore_rank}, {"gap", galore.update_proj_gap},
                                    {"scale", galore.galore_scale}}}});

  std::vector<Side> sides;
  sides.push_back({"ours_adamw_sn", [&] { return seconds_of([&] { ours_sn.optimizer->step(kLearningRate); }); }});
  sides.push_back({"ours_galore", [&] { return seconds_of([&] { ours_galore.optimizer->step(kLearningRate); }); }});
  if (peers.torch)
    for (const char* peer : {"adamw_sn", "galore"})
      sides.push_back({peer, [&peers, peer] {
                         return peers.process->ask({{"cmd", "step"}, {"side", peer}})["seconds"].get<double>();
                       }});
  interleave(sides, reps);

  json row;
  row["section"] = "rules";
  row["shape"] = shape;
  row["threads"] = threads;
  row["reps"] = reps;
  const std::vector<int64_t> indices = sample_indices(numel);
  for (const auto& [rule, ours] : {std::pair<std::string, Ours*>{"adamw_sn", &ours_sn}, {"galore", &ours_galore}}) {
    const json ours_ms = ms_or_null(find(sides, "ours_" + rule));
    const json reference_ms = ms_or_null(find(sides, rule));
    row[rule + "_ours_ms"] = ours_ms;
    row[rule + "_reference_ms"] = reference_ms;
    row[rule + "_ratio"] = reference_ms.is_null() ? json(nullptr)
                                                  : json(reference_ms.get<double>() / ours_ms.get<double>());
    row[rule + "_max_abs_diff"] = nullptr;
    if (peers.torch) {
      const json answer = peers.process->ask({{"cmd", "samples"}, {"side", rule}, {"indices", indices}});
      row[rule + "_max_abs_diff"] =
          max_abs_difference(ours->master, indices, answer["values"].get<std::vector<double>>());
    }
  }
  return row;
}

// The project's Python: --python, else $TRAINER_PYTHON, else the one this build was configured with.
std::string python_path(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* environment = std::getenv("TRAINER_PYTHON"); environment && *environment) return environment;
  return TRAINER_PYTHON;
}

Peers start_peers(const std::string& python, int threads, bool quiet) {
  Peers peers;
  if (python.empty() || access(python.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "note: no Python at '%s' (set --python or TRAINER_PYTHON): Python peers not run\n",
                 python.c_str());
    return peers;
  }
  const std::string bin = python.substr(0, python.find_last_of('/'));
  const char* path = std::getenv("PATH");
  peers.process = std::make_unique<bench::PythonPeer>(
      python,
      std::vector<std::string>{std::string(TRAINER_SOURCE_DIR) + "/bench/adamw_peers.py", "--serve", "--threads",
                               std::to_string(threads)},
      std::vector<std::pair<std::string, std::string>>{
          {"OMP_NUM_THREADS", std::to_string(threads)},
          {"MKL_NUM_THREADS", std::to_string(threads)},
          {"DS_ACCELERATOR", "cpu"},
          {"PATH", bin + ":" + (path ? path : "/usr/bin:/bin")}});
  if (!peers.process->started()) {
    std::fprintf(stderr, "note: Python peers not run: %s\n", peers.process->why().c_str());
    return peers;
  }
  const json& hello = peers.process->greeting();
  peers.torch = true;
  peers.deepspeed = !hello["deepspeed"].is_null();
  if (hello["threads"].get<int>() != threads)
    std::fprintf(stderr, "warning: the Python peers run %d threads, not %d\n", hello["threads"].get<int>(), threads);
  if (!peers.deepspeed && !quiet)
    std::fprintf(stderr,
                 "note: DeepSpeed is not usable in %s (%s): its column stays empty. Install it with\n"
                 "  bash bench/install_peers.sh   (pip install deepspeed, then builds its CPU Adam op with "
                 "DS_ACCELERATOR=cpu)\n",
                 python.c_str(), hello["deepspeed_error"].is_null() ? "?" : hello["deepspeed_error"].get<std::string>().c_str());
  return peers;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Host optimizer steps: ours vs torch fused AdamW, DeepSpeedCPUAdam, LibTorch, the memory bound "
               "and the AdamwSN / GaLore references"};
  int threads = 2;
  std::vector<std::string> size_texts = {"2^22", "2^24", "2^26"};
  std::vector<std::string> shape_texts = {"1024x1024", "2736x1024", "1024x2736"};
  std::vector<std::string> sections = {"adamw", "rules"};
  int reps = 5;
  bool as_json = false;
  std::string python;
  app.add_option("--threads", threads, "threads for every side (OpenMP, torch.set_num_threads)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--sizes", size_texts, "AdamW element counts, e.g. 2^22,2^24 or 1048576")->delimiter(',');
  app.add_option("--reps", reps, "timed repetitions per side (after one warm-up)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--sections", sections, "adamw, rules or both")->delimiter(',')
      ->check(CLI::IsMember({"adamw", "rules"}));
  app.add_option("--rule_shapes", shape_texts, "matrices for the rules section, ROWSxCOLS")->delimiter(',');
  app.add_option("--python", python, "the Python with torch (default: $TRAINER_PYTHON, else the build's)");
  app.add_flag("--json", as_json, "one JSON object per row instead of the tables");
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<int64_t> sizes;
    for (const std::string& text : size_texts) {
      sizes.push_back(parse_size(text));
      if (sizes.back() < 1) throw llm::UserError("--sizes: '" + text + "' must be >= 1");
    }
    std::vector<std::vector<int64_t>> shapes;
    for (const std::string& text : shape_texts) shapes.push_back(parse_shape(text));
    // As the trainer runs: freed host memory stays in the process (the HF-style rules make
    // temporaries every step; without this each would be a fresh, page-faulting mapping).
    llm::keep_freed_host_memory();
    // Huge pages on every array of 2 MiB and more, as the trainer asks for its optimizer's buffers
    // (common/host_memory.h advise_huge_pages); LibTorch reads this at its first allocation.
    setenv("THP_MEM_ALLOC_ENABLE", "1", /*overwrite=*/0);
    // LibTorch's wheel ships the libgomp we link, so this is one thread pool for ours and LibTorch.
    omp_set_num_threads(threads);
    at::set_num_threads(threads);
    Peers peers = start_peers(python_path(python), threads, as_json);

    const auto wants = [&](const char* section) {
      return std::find(sections.begin(), sections.end(), section) != sections.end();
    };
    if (wants("adamw")) {
      if (!as_json) bench::print_adamw_header(
          threads, reps, peers.torch ? peers.process->greeting()["torch"].get<std::string>() : "(not run)",
          peers.deepspeed ? peers.process->greeting()["deepspeed"].get<std::string>() : "(not installed)");
      for (int64_t n : sizes) {
        const json row = measure_adamw(n, reps, threads, peers);
        if (as_json) std::printf("%s\n", row.dump().c_str());
        else bench::print_adamw_row(row);
        std::fflush(stdout);
      }
    }
    if (wants("rules")) {
      if (!as_json) bench::print_rules_header(threads, reps);
      for (const auto& shape : shapes) {
        const json row = measure_rules(shape, reps, threads, peers);
        if (as_json) std::printf("%s\n", row.dump().c_str());
        else bench::print_rules_row(row);
        std::fflush(stdout);
      }
    }
  } catch (const llm::UserError& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  } catch (const std::runtime_error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
