// adamw_bench's input and output (bench/adamw_bench.cpp): its flags' sizes and shapes, and the
// header and rows of its two sections as the terminal shows them, from the JSON rows the bench also
// prints with --json, with the CPU's name. Header-only: every .cpp in bench/ is a program of its own.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "optim/adamw_host.h"

namespace bench {

using nlohmann::json;

// "1048576" or "2^20".
inline int64_t parse_size(const std::string& text) {
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

// "2736x1024".
inline std::vector<int64_t> parse_shape(const std::string& text) {
  const size_t x = text.find('x');
  try {
    if (x != std::string::npos) {
      const std::vector<int64_t> shape = {std::stoll(text.substr(0, x)), std::stoll(text.substr(x + 1))};
      if (shape[0] >= 1 && shape[1] >= 1) return shape;
    }
  } catch (const std::exception&) {
  }
  throw llm::UserError("--rule_shapes: '" + text + "' is not a matrix shape; write ROWSxCOLS, e.g. 2736x1024");
}

// The CPU's model name (/proc/cpuinfo), for the rows: the figures differ from one CPU to another.
inline std::string cpu_model() {
  std::FILE* file = std::fopen("/proc/cpuinfo", "r");
  if (file == nullptr) return "unknown";
  char line[512];
  std::string model = "unknown";
  while (std::fgets(line, sizeof(line), file) != nullptr) {
    const std::string text(line);
    if (text.rfind("model name", 0) == 0 && text.find(':') != std::string::npos) {
      model = text.substr(text.find(':') + 2);
      while (!model.empty() && (model.back() == '\n' || model.back() == ' ')) model.pop_back();
      break;
    }
  }
  std::fclose(file);
  return model;
}

inline std::string cell(const json& value, const char* format) {
  if (value.is_null()) return "-";
  char text[64];
  std::snprintf(text, sizeof(text), format, value.get<double>());
  return text;
}

// torch_version / deepspeed_version: the peers' versions, or why they did not run.
inline void print_adamw_header(int threads, int reps, const std::string& torch_version,
                               const std::string& deepspeed_version) {
  std::printf(
      "AdamW step on the host: fp32 params, grads and state; %d threads; median of %d interleaved "
      "reps after 1 warm-up; 28 bytes/element\n"
      "  ours       llm::adamw_update, %s kernel (bit-identical to the scalar functor)\n"
      "  scalar     ours with the scalar kernel forced (the element loop of before, today's threading)\n"
      "  fused      torch.optim.AdamW(fused=True), torch %s, Python subprocess\n"
      "  deepspeed  DeepSpeedCPUAdam(adamw_mode=True), fp32 params, deepspeed %s, same subprocess\n"
      "  libtorch   torch::optim::AdamW (C++, one ATen op per term)\n"
      "  bound      best pass of AdamW's streams (4 arrays read, 3 written in place) over all reps: "
      "per-thread blocks, chunks + prefetch, or non-temporal stores\n"
      "  ratio      the faster of fused and deepspeed over ours (> 1: ours is faster)\n"
      "  bf16 state ours with bf16 moments (stochastic rounding), 20 bytes/element; ours/bound at the bound's GB/s, "
      "ratio: the faster fp32 peer over it\n",
      threads, reps, llm::to_string(llm::best_host_isa()),
      torch_version.c_str(), deepspeed_version.c_str());
  std::printf(
      "  ours/bound paired: the median over reps of (the fastest pass of any fp32 side or probe in the rep) / (ours "
      "in it); best: ours's best rep / bound; mixed: ours's median / bound (the probe's own median / bound in "
      "'probe')\n");
  std::printf("%10s %8s %8s %8s %8s %9s | %6s %6s %6s %6s %6s | %6s %6s %6s %6s | %6s | %6s %6s | %-28s\n", "N",
              "ours", "scalar", "fused", "ds", "libtorch", "ours", "fused", "ds", "lt", "bound", "ours/", "ours/",
              "ours/", "probe/", "ratio", "vs", "vs", "max |ours - x| at 4096 points");
  std::printf("%10s %8s %8s %8s %8s %9s | %6s %6s %6s %6s %6s | %6s %6s %6s %6s | %6s | %6s %6s | %-28s\n", "",
              "ms", "ms", "ms", "ms", "ms", "GB/s", "GB/s", "GB/s", "GB/s", "GB/s", "paired", "best", "mixed",
              "bound", "", "fused", "ds", "fused / ds / libtorch / =scalar");
}

inline void print_adamw_row(const json& row) {
  const auto ms = [&](const char* key) { return cell(row[key], "%.2f"); };
  const auto gbs = [&](const char* key) { return cell(row[key], "%.1f"); };
  const json& diff = row["max_abs_diff"];
  const auto vs = [&](const char* key) -> json {
    if (row[key].is_null()) return nullptr;
    return row[key].get<double>() / row["ours_ms"].get<double>();
  };
  std::printf("%10lld %8s %8s %8s %8s %9s | %6s %6s %6s %6s %6s | %6s %6s %6s %6s | %6s | %6s %6s | %s / %s / %s / %s\n",
              static_cast<long long>(row["n"].get<int64_t>()), ms("ours_ms").c_str(), ms("scalar_ms").c_str(),
              ms("torch_fused_ms").c_str(), ms("deepspeed_ms").c_str(), ms("libtorch_ms").c_str(),
              gbs("ours_gbs").c_str(), gbs("torch_fused_gbs").c_str(), gbs("deepspeed_gbs").c_str(),
              gbs("libtorch_gbs").c_str(), gbs("bound_gbs").c_str(),
              cell(row["ours_fraction_of_bound_paired"], "%.2f").c_str(),
              cell(row["ours_best_fraction_of_bound"], "%.2f").c_str(),
              cell(row["ours_fraction_of_bound"], "%.2f").c_str(),
              cell(row["probe_median_fraction_of_bound"], "%.2f").c_str(), cell(row["ratio_vs_best_peer"], "%.2fx").c_str(),
              cell(vs("torch_fused_ms"), "%.2fx").c_str(), cell(vs("deepspeed_ms"), "%.2fx").c_str(),
              cell(diff["torch_fused"], "%.1e").c_str(), cell(diff["deepspeed"], "%.1e").c_str(),
              cell(diff["libtorch"], "%.1e").c_str(), row["scalar_bit_identical"].get<bool>() ? "yes" : "NO");
  std::printf("%10s %8s %8s %8s %8s %9s | %6s %6s %6s %6s %6s | %6s %6s %6s %6s | %6s | %6s %6s | max |bf16 - ours| %s\n",
              "bf16 state", cell(row["ours_bf16_state_ms"], "%.2f").c_str(), "", "", "", "",
              cell(row["ours_bf16_state_gbs"], "%.1f").c_str(), "", "", "", "",
              cell(row["ours_bf16_state_fraction_of_bound_paired"], "%.2f").c_str(), "",
              cell(row["ours_bf16_state_fraction_of_bound"], "%.2f").c_str(), "",
              cell(row["bf16_state_ratio_vs_best_peer"], "%.2fx").c_str(), "", "",
              cell(row["bf16_state_max_abs_diff_vs_ours"], "%.1e").c_str());
  const double elements = static_cast<double>(row["n"].get<int64_t>());
  std::printf("%10s arithmetic in cache (%s): fp32 %.2f ns/element (%.2f ms at N), bf16 state %.2f (%.2f ms)\n", "",
              row["cpu"].get<std::string>().c_str(), row["ours_in_cache_ns_per_element"].get<double>(),
              row["ours_in_cache_ns_per_element"].get<double>() * elements * 1e-6,
              row["ours_bf16_state_in_cache_ns_per_element"].get<double>(),
              row["ours_bf16_state_in_cache_ns_per_element"].get<double>() * elements * 1e-6);
  if (!row["avx2_in_cache_ns_per_element"].is_null())
    std::printf("%10s the AVX2 kernel's arithmetic in cache: fp32 %.2f ns/element, bf16 state %.2f\n", "",
                row["avx2_in_cache_ns_per_element"].get<double>(),
                row["avx2_bf16_state_in_cache_ns_per_element"].get<double>());
  std::fflush(stdout);
}

inline void print_rules_header(int threads, int reps) {
  std::printf(
      "\nHF-style rules on one matrix, %d threads, median of %d interleaved reps after 1 warm-up (step 1, "
      "GaLore's SVD)\n"
      "  adamw_sn  ours: ShardOptimizer, rule subset_norm; reference: tests/golden/reference_adamw_sn.py "
      "per_matrix\n"
      "  galore    ours: ShardOptimizer, rule galore; reference: galore_torch.GaLoreAdamW (rank 128, std, "
      "gap 200)\n",
      threads, reps);
  std::printf("%12s | %9s %9s %7s %9s | %9s %9s %7s %9s\n", "shape", "sn ours", "sn ref", "ratio", "max|diff|",
              "gl ours", "gl ref", "ratio", "max|diff|");
}

inline void print_rules_row(const json& row) {
  const std::string shape =
      std::to_string(row["shape"][0].get<int64_t>()) + "x" + std::to_string(row["shape"][1].get<int64_t>());
  std::printf("%12s | %9s %9s %7s %9s | %9s %9s %7s %9s\n", shape.c_str(),
              cell(row["adamw_sn_ours_ms"], "%.2f").c_str(), cell(row["adamw_sn_reference_ms"], "%.2f").c_str(),
              cell(row["adamw_sn_ratio"], "%.2fx").c_str(), cell(row["adamw_sn_max_abs_diff"], "%.1e").c_str(),
              cell(row["galore_ours_ms"], "%.2f").c_str(), cell(row["galore_reference_ms"], "%.2f").c_str(),
              cell(row["galore_ratio"], "%.2fx").c_str(), cell(row["galore_max_abs_diff"], "%.1e").c_str());
  std::fflush(stdout);
}

}  // namespace bench
