// `trainer estimate --profile SECONDS`: each unit kind's forward and backward, and the AdamW kernel,
// timed on the local device (memory/step_time.h).
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unistd.h>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include "common/autocast.h"
#include "common/device.h"
#include "common/errors.h"
#include "common/input_paths.h"
#include "common/json_file.h"
#include "common/output_files.h"
#include "common/step_timer.h"
#include "memory/categories.h"
#include "memory/step_time.h"
#include "model/cross_entropy.h"
#include "model/llama.h"
#include "optim/adamw.h"

namespace llm {
namespace {

using Clock = std::chrono::steady_clock;

// Everything queued on the device so far is done (a read of one element; nothing to wait for on a CPU).
void settle(const at::Tensor& tensor) {
  if (tensor.is_cuda()) read_to_host(tensor.detach().flatten()[0].to(at::kFloat));
}

}  // namespace

ComputeRates profile_compute(const ModelConfig& model, const RunConfig& run, c10::Device device, double seconds,
                             int threads) {
  const int previous_threads = at::get_num_threads();
  at::set_num_threads(threads);
  ModelConfig one_layer = model;
  one_layer.num_hidden_layers = 1;
  at::manual_seed(0);
  LlamaForCausalLM network(one_layer);
  const bool pure = run.precision.dtype == DType::bfloat16 && run.precision.mode == Precision::pure;
  const bool autocast = run.precision.dtype == DType::bfloat16 && run.precision.mode == Precision::mixed;
  network->to(device, pure ? at::kBFloat16 : at::kFloat);
  const at::Tensor ids =
      at::randint(model.vocab_size, {run.data.batch_size, run.data.max_length}, at::TensorOptions().dtype(at::kLong).device(device));
  constexpr size_t kUnits = 3;  // the embedding, the one layer, the head
  std::vector<std::vector<double>> forward(kUnits), backward(kUnits);
  const Clock::time_point started = Clock::now();
  // Two warm-up passes (the allocator's first blocks, oneDNN's first primitives: a run's first steps
  // are several times slower than the rest), then passes until the time is up, at least three.
  constexpr int kWarmUp = 2;
  for (int iteration = 0; iteration < 200 && (iteration < kWarmUp + 3 || seconds_since(started) < seconds); ++iteration) {
    UnitContext context;
    std::vector<at::Tensor> inputs(kUnits), outputs(kUnits);
    at::Tensor loss;
    for (size_t u = 0; u < kUnits; ++u) {
      const Clock::time_point start = Clock::now();
      {
        AutocastRegion region(device.type(), at::kBFloat16, autocast);
        inputs[u] = u == 0 ? ids : outputs[u - 1].detach().requires_grad_(true);
        outputs[u] = network->forward_unit(u, inputs[u], context);
        if (u + 1 == kUnits) loss = causal_lm_loss(outputs[u], ids, CrossEntropyForm::blocked, model.vocab_size);
      }
      settle(u + 1 == kUnits ? loss : outputs[u]);
      if (iteration >= kWarmUp) forward[u].push_back(seconds_since(start));
    }
    for (size_t u = kUnits; u-- > 0;) {  // unit by unit, as ShardedModel's backward
      const Clock::time_point start = Clock::now();
      if (u + 1 == kUnits)
        loss.backward();
      else
        torch::autograd::backward({outputs[u]}, {inputs[u + 1].grad()});
      settle(u > 0 ? inputs[u].grad() : network->parameters().front().grad());
      if (iteration >= kWarmUp) backward[u].push_back(seconds_since(start));
    }
    for (at::Tensor parameter : network->parameters()) parameter.mutable_grad() = at::Tensor();
  }
  // The later half of the passes: the heap grows to its steady size over the first ones, each faulting
  // in new pages (a run's first steps are slower for the same reason).
  const auto settled = [](const std::vector<double>& passes) {
    return median(std::vector<double>(passes.begin() + static_cast<std::ptrdiff_t>(passes.size() / 2), passes.end()));
  };
  ComputeRates rates;
  rates.embed = {settled(forward[0]), settled(backward[0])};
  rates.layer = {settled(forward[1]), settled(backward[1])};
  rates.head = {settled(forward[2]), settled(backward[2])};
  rates.threads = threads;

  // The optimizer: the AdamW kernel over the model's rows, at least 2^22 (16 MiB an array: past the
  // caches, as a step over the model's shards is) and at most 2^24, the median of five passes.
  if (device.is_cpu()) {
    const int64_t numel = std::clamp<int64_t>(model.num_parameters(), int64_t{1} << 22, int64_t{1} << 24);
    const at::TensorOptions fp32 = at::TensorOptions().dtype(at::kFloat);
    at::Tensor master = at::randn({numel}, fp32), grad = at::randn({numel}, fp32), m = at::zeros({numel}, fp32),
               v = at::zeros({numel}, fp32);
    std::vector<double> passes;
    for (int pass = 0; pass < 6; ++pass) {
      const Clock::time_point start = Clock::now();
      adamw_update_host(master.data_ptr<float>(), grad.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), numel,
                        adamw_scalars(1e-3, AdamWOptions{}, 0.0, pass + 1), nullptr, threads);
      if (pass > 0) passes.push_back(seconds_since(start));
    }
    rates.optimizer_seconds_per_element = median(passes) / static_cast<double>(numel);
  } else {
    rates.optimizer_seconds_per_element = 28.0 / 3e12;  // HBM at about 3 TB/s: the kernel reads and writes 28 B
  }
  // A unit's staging copies (the gathered rows into the parameters, the gradients into the flat
  // buffer a reduction sends): a copy as large as the largest unit's fp32 rows, at least 16 MiB (past
  // the caches, as those copies are), the median of five passes; per byte read and written.
  {
    const int64_t numel = std::clamp<int64_t>(largest_unit_parameters(model), int64_t{1} << 22, int64_t{1} << 26);
    const at::TensorOptions fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const at::Tensor from = at::ones({numel}, fp32);
    at::Tensor to = at::empty({numel}, fp32);
    std::vector<double> passes;
    for (int pass = 0; pass < 6; ++pass) {
      const Clock::time_point start = Clock::now();
      to.copy_(from);
      settle(to);
      if (pass > 0) passes.push_back(seconds_since(start));
    }
    rates.copy_seconds_per_byte = median(passes) / (8.0 * static_cast<double>(numel));
  }
  at::set_num_threads(previous_threads);
  char text[160];
  std::snprintf(text, sizeof(text), "measured by --profile for %.3g s on %s at %d thread(s), %zu passes", seconds,
                device.str().c_str(), threads, forward[0].size());
  rates.source = text;
  return rates;
}

namespace {

constexpr const char* kProfileCacheFormat = "trainer profile cache 1";

// FNV-1a over the model's config: the same text, the same digits, on every build (std::hash is not).
std::string digest(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char byte : text) hash = (hash ^ byte) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

nlohmann::json unit_json(const UnitTimes& unit) { return nlohmann::json::array({unit.forward, unit.backward}); }

// The cache file's JSON, checked: an empty cache for a missing file; exit 2 naming the flag for one
// that is not a regular file (a fifo would block), not JSON (nesting bounded as every reader's,
// common/json_file.h) or not a profile cache.
nlohmann::json read_cache_file(const std::string& path) {
  const std::string problem = regular_file_problem(path);
  if (problem == "is missing") return {{"format", kProfileCacheFormat}, {"entries", nlohmann::json::object()}};
  LLM_REQUIRE(problem.empty(), path, "--profile_cache", problem + ": name a JSON file, or a new one");
  std::ifstream in(path);
  LLM_REQUIRE(in.good(), path, "--profile_cache", "cannot be read");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json cache;
  try {
    cache = parse_json_text(text, path);
  } catch (const nlohmann::json::exception& error) {
    fail_user(path, "--profile_cache", std::string("is not JSON (") + error.what() + "): remove it, or name another file");
  }
  LLM_REQUIRE(cache.is_object() && cache.value("format", "") == kProfileCacheFormat && cache.contains("entries") &&
                  cache.at("entries").is_object(),
              path, "--profile_cache",
              std::string("is not a profile cache (an object with \"format\": \"") + kProfileCacheFormat +
                  "\" and its \"entries\"): remove it, or name another file");
  return cache;
}

}  // namespace

std::string profile_cache_key(const ModelConfig& model, const RunConfig& run, const std::string& device, int threads,
                              double seconds) {
  std::ostringstream key;
  key << device << " threads=" << threads << " micro_batch=" << run.data.batch_size << "x" << run.data.max_length << " "
      << to_string(run.precision.dtype) << " " << to_string(run.precision.mode) << " profile=" << seconds
      << "s model=" << digest(model.to_json().dump());
  return key.str();
}

std::optional<ComputeRates> read_profile_cache(const std::string& path, const std::string& key) {
  const nlohmann::json cache = read_cache_file(path);
  const nlohmann::json& entries = cache.at("entries");
  if (!entries.contains(key)) return std::nullopt;
  const nlohmann::json& entry = entries.at(key);
  ComputeRates rates;
  try {
    const auto unit = [&](const char* name) {
      const nlohmann::json& times = entry.at(name);
      if (!times.is_array() || times.size() != 2) throw std::invalid_argument(std::string(name) + " is not [forward, backward]");
      return UnitTimes{times.at(0).get<double>(), times.at(1).get<double>()};
    };
    rates.embed = unit("embed");
    rates.layer = unit("layer");
    rates.head = unit("head");
    rates.optimizer_seconds_per_element = entry.at("optimizer_seconds_per_element").get<double>();
    rates.copy_seconds_per_byte = entry.at("copy_seconds_per_byte").get<double>();
    rates.source = entry.at("source").get<std::string>();
  } catch (const std::exception& error) {
    fail_user(path, "--profile_cache", "entry \"" + key + "\" is not a profile (" + error.what() +
                                           "): remove the file, or name another");
  }
  for (double seconds : {rates.embed.forward, rates.embed.backward, rates.layer.forward, rates.layer.backward,
                         rates.head.forward, rates.head.backward, rates.optimizer_seconds_per_element,
                         rates.copy_seconds_per_byte})
    LLM_REQUIRE(std::isfinite(seconds) && seconds >= 0, path, "--profile_cache",
                "entry \"" + key + "\" has a time that is negative or not finite: remove the file, or name another");
  return rates;
}

void write_profile_cache(const std::string& path, const std::string& key, const ComputeRates& rates) {
  // Read again: another estimate may have added an entry since this one read the file.
  nlohmann::json cache = read_cache_file(path);
  cache["entries"][key] = {{"embed", unit_json(rates.embed)},
                           {"layer", unit_json(rates.layer)},
                           {"head", unit_json(rates.head)},
                           {"optimizer_seconds_per_element", rates.optimizer_seconds_per_element},
                           {"copy_seconds_per_byte", rates.copy_seconds_per_byte},
                           {"source", rates.source}};
  // Whole or not at all, through a staging file of this process's own (several estimates may write it).
  try {
    write_file_atomically(path, cache.dump(2) + "\n", {.staging_suffix = "." + std::to_string(::getpid()) + ".tmp"});
  } catch (const WriteError& error) {
    fail_user(path, "--profile_cache", "cannot be written: " + error.reason() + " (its folder must exist and be writable)");
  }
}

}  // namespace llm
