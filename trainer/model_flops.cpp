#include "trainer/model_flops.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

PeakFlops cpu_peak(at::ScalarType dtype, int threads) {
  const std::string dtype_name = dtype == at::kBFloat16 ? "bfloat16" : "float32";
  const std::string key = cpu_model() + " | " + std::to_string(threads) + " threads | " + dtype_name;
  const fs::path file = cache_file();
  nlohmann::json cache = nlohmann::json::object();
  if (std::ifstream in(file); in) {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    cache = parse_json_text(text, file.string(), /*allow_exceptions=*/false);
    if (!cache.is_object()) cache = nlohmann::json::object();  // unreadable: measured again and rewritten
  }
  auto describe = [&](double flops, const std::string& how) {
    std::ostringstream text;
    text << "measured " << dtype_name << " GEMM peak of this CPU at " << threads << " thread(s), "
         << static_cast<int64_t>(flops / 1e9) << " GFLOP/s (" << how << " " << file.string() << ")";
    return text.str();
  };
  if (const auto found = cache.find(key); found != cache.end() && found->is_number() && found->get<double>() > 0)
    return {found->get<double>(), describe(found->get<double>(), "cached in")};
  const double flops = measure_gemm_flops(dtype, threads);
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
  return {flops, describe(flops, "measured now, cached in")};
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

double model_flops_utilisation(double flops_per_token, double tokens_per_second, const PeakFlops& peak, int ranks) {
  if (peak.flops_per_second <= 0 || ranks <= 0) return 0;
  return flops_per_token * tokens_per_second / (peak.flops_per_second * ranks);
}

}  // namespace llm
