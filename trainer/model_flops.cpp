#include "trainer/model_flops.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "common/device.h"
#include "common/log.h"
#include "common/output_files.h"
#include "common/json_file.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

// Dense (no sparsity) peaks in TFLOP/s from NVIDIA's data sheets: bf16 on the tensor cores with fp32
// accumulation, and fp32 on the CUDA cores (LibTorch leaves TF32 off for fp32 matmuls). First match
// of the name wins: the more specific names come first.
struct KnownDevice {
  const char* name_part;
  const char* label;
  double bf16_tflops;
  double fp32_tflops;
};
constexpr KnownDevice kKnownDevices[] = {
    {"H100 PCIe", "H100 PCIe", 756.5, 51.2},
    {"H100 NVL", "H100 NVL", 835.5, 60.0},
    {"H200 NVL", "H200 NVL", 835.5, 60.0},
    {"GH200", "GH200", 989.4, 66.9},
    {"H100", "H100 SXM", 989.4, 66.9},
    {"H200", "H200 SXM", 989.4, 66.9},
    {"B200", "B200", 2250.0, 0},
    {"A100", "A100", 312.0, 19.5},
    {"L40S", "L40S", 362.05, 91.6},
    {"RTX 4090", "GeForce RTX 4090", 165.2, 82.6},
    {"L4", "L4", 121.0, 30.3},
};

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(' '));
        return name;
      }
    }
  return "unknown CPU";
}

fs::path cache_file() {
  if (const char* cache = std::getenv("TRAINER_CACHE"); cache != nullptr && *cache != '\0')
    return fs::path(cache) / "peak_flops.json";
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : ".") / ".cache" / "llama-trainer" / "peak_flops.json";
}

// The best rate of a 1536^3 product over up to 100 tries or 2 seconds (bench/pytorch_peers.py `peak`).
double measure_gemm_flops(at::ScalarType dtype, int threads) {
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  constexpr int64_t n = 1536;
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::Tensor c = at::empty({n, n}, a.options());
  double best = 1e30;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (int i = 0; i < 100 && std::chrono::steady_clock::now() < deadline; ++i) {
    const auto started = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  at::set_num_threads(previous);
  return 2.0 * n * n * n / best;
}

std::string dtype_name(at::ScalarType dtype) { return dtype == at::kBFloat16 ? "bfloat16" : "float32"; }

// "186.4 GFLOP/s": four digits, so that a stale figure far below the device's (1 MFLOP/s) reads as
// itself rather than as 0.
std::string flops_rate(double flops) {
  std::ostringstream text;
  text << std::setprecision(4);
  if (flops >= 1e12)
    text << flops / 1e12 << " TFLOP/s";
  else
    text << flops / 1e9 << " GFLOP/s";
  return text.str();
}

nlohmann::json read_cache(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json cache = parse_json_text(text, file.string(), /*allow_exceptions=*/false);
  return cache.is_object() ? cache : nlohmann::json::object();  // unreadable: measured again and rewritten
}

double cached_flops(const nlohmann::json& cache, const std::string& key) {
  const auto found = cache.find(key);
  return found != cache.end() && found->is_number() ? found->get<double>() : 0;
}

// Keeps `flops` as the entry's figure unless the cache holds more: the best of every measurement, so a
// busy machine's reading never replaces an idle one's. The file is read again here, since another run
// may have written it since this one started.
void keep_in_cache(const fs::path& file, const std::string& key, double flops) {
  nlohmann::json cache = read_cache(file);
  if (cached_flops(cache, key) >= flops) return;
  cache[key] = flops;
  // Through a file of this process's own, renamed over the cache: a reader never sees half a file.
  std::error_code error;
  fs::create_directories(file.parent_path(), error);
  try {
    if (error) throw WriteError(file.parent_path(), error.message());
    write_file_atomically(file, cache.dump(1) + "\n", {.staging_suffix = "." + std::to_string(::getpid()) + ".tmp"});
  } catch (const UserError&) {
    log::warn("could not cache the measured GEMM peak in {}: it is measured again next run", file.string());
  }
}

std::string describe_cpu_peak(at::ScalarType dtype, int threads, double flops, const std::string& how) {
  return "measured " + dtype_name(dtype) + " GEMM peak of this CPU at " + std::to_string(threads) + " thread(s), " +
         flops_rate(flops) + " (" + how + ")";
}

PeakFlops cpu_peak(at::ScalarType dtype, int threads) {
  const fs::path file = cache_file();
  const std::string key = cpu_peak_cache_key(dtype, threads);
  if (const double cached = cached_flops(read_cache(file), key); cached > 0)
    return {cached, describe_cpu_peak(dtype, threads, cached, "cached in " + file.string()), true};
  const double flops = measure_gemm_flops(dtype, threads);
  keep_in_cache(file, key, flops);
  return {flops, describe_cpu_peak(dtype, threads, flops, "measured now, cached in " + file.string()), true};
}

}  // namespace

double model_flops_per_token(const ModelConfig& model, int64_t length) {
  const double hidden = static_cast<double>(model.hidden_size), layers = static_cast<double>(model.num_hidden_layers);
  const double norms = (2 * layers + 1) * hidden;
  const double matmul_parameters =
      static_cast<double>(model.num_parameters()) - static_cast<double>(model.vocab_size) * hidden - norms;
  return 6 * matmul_parameters + 12 * layers * hidden * static_cast<double>(length);
}

PeakFlops cuda_table_peak(const std::string& device_name, at::ScalarType dtype) {
  for (const KnownDevice& known : kKnownDevices) {
    const std::string part = known.name_part;
    const size_t at = device_name.find(part);
    if (at == std::string::npos) continue;
    // A whole word: "L4" is not "L40S"'s first letters.
    const size_t end = at + part.size();
    if (end < device_name.size() && std::isalnum(static_cast<unsigned char>(device_name[end]))) continue;
    const double tflops = dtype == at::kBFloat16 ? known.bf16_tflops : known.fp32_tflops;
    if (tflops <= 0) return {0, std::string("the table has no ") + (dtype == at::kBFloat16 ? "bf16" : "fp32") + " peak for " + known.label};
    std::ostringstream text;
    text << "table: " << device_name << " as " << known.label << ", dense " << (dtype == at::kBFloat16 ? "bf16" : "fp32")
         << " peak " << tflops << " TFLOP/s";
    return {tflops * 1e12, text.str()};
  }
  return {0, "\"" + device_name + "\" is not in the table of known devices"};
}

PeakFlops device_peak_flops(c10::Device device, at::ScalarType dtype, int threads, double peak_tflops) {
  if (peak_tflops > 0) {
    std::ostringstream text;
    text << "--peak_tflops " << peak_tflops;
    return {peak_tflops * 1e12, text.str()};
  }
  if (device.is_cuda()) {
    PeakFlops peak = cuda_table_peak(gpu_name(device), dtype);
    if (peak.flops_per_second <= 0)
      log::warn("no MFU figure: {}; give the device's dense peak with --peak_tflops", peak.source);
    return peak;
  }
  return cpu_peak(dtype, threads);
}

std::string cpu_peak_cache_key(at::ScalarType dtype, int threads) {
  return cpu_model() + " | " + std::to_string(threads) + " threads | " + dtype_name(dtype);
}

PeakFlops outpaced_peak(const PeakFlops& stale, double achieved, at::ScalarType dtype, int threads) {
  if (!stale.measured) {
    log::warn("MFU capped at 1: the peak in use, {} ({}), is below what this run achieves, {} of model FLOPs per rank; "
              "give the device's dense peak with --peak_tflops",
              flops_rate(stale.flops_per_second), stale.source, flops_rate(achieved));
    PeakFlops capped = stale;
    capped.capped = true;
    return capped;
  }
  const double measured = measure_gemm_flops(dtype, threads);
  const double flops = std::max(measured, achieved);
  const fs::path file = cache_file();
  keep_in_cache(file, cpu_peak_cache_key(dtype, threads), flops);
  const std::string how = measured >= achieved ? "measured again, cached in " + file.string()
                                               : "this run's model FLOP rate, the machine still busy measuring " +
                                                     flops_rate(measured) + " again; cached in " + file.string();
  PeakFlops raised{flops, describe_cpu_peak(dtype, threads, flops, how), true};
  log::warn("stale MFU peak: this run achieves {} of model FLOPs per rank, above the peak in use, the {}, which must "
            "have been measured while the machine was busy; the MFU's peak from here on: the {}",
            flops_rate(achieved), stale.source, raised.source);
  return raised;
}

double model_flops_utilisation(double flops_per_token, double tokens_per_second, const PeakFlops& peak, int ranks) {
  if (peak.flops_per_second <= 0 || ranks <= 0) return 0;
  return flops_per_token * tokens_per_second / (peak.flops_per_second * ranks);
}

}  // namespace llm
