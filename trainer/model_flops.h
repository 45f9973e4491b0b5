// The speed-of-light share of a step (model FLOPs utilisation, MFU): the FLOPs the model needs for
// the tokens a second the run trains, over what the devices can do at their dense peak for the
// run's compute dtype. torchtitan's MFU and the closest C++ peer's "sol" column are this figure.
//
//   FLOPs per token = 6 x matmul parameters + 12 x layers x hidden x length
//
// PaLM's count (appendix B), as bench/pytorch_peers.py's model_flops_per_token: the matmul
// parameters are every parameter but the embedding (a lookup, no matmul) and the norms' weights;
// 6 of them per token (forward 2, backward 4); the attention scores and their weighted sum add
// 12 L H T (causal masking not taken off, as PaLM and torchtitan count it).
//
// The peak (PeakFlops) is named and sourced:
//   --peak_tflops T   the user's figure, per device;
//   CUDA              a table of known devices' dense (no sparsity) tensor-core peaks for bf16, and
//                     their fp32 (non-tensor) peaks, keyed by the device's name; a device not in it
//                     gets no MFU and a warning naming --peak_tflops;
//   CPU               the best fp32 (or bf16) GEMM rate of a 1536^3 product at the run's thread
//                     count, as bench/pytorch_peers.py `peak` measures it: measured once per CPU
//                     model, thread count and dtype, and cached in $TRAINER_CACHE/peak_flops.json
//                     (default ~/.cache/llama-trainer).
// MFU = FLOPs per token x tokens per second / (peak x ranks), never above 1. A run whose model FLOP
// rate per rank outpaces the peak in use has shown that peak wrong, and a warning names it, where it
// came from and what replaces it (outpaced_peak). A measured CPU peak under-reads when the machine was
// busy while it was measured (92.9 GFLOP/s cached where the idle peak is 186, and every later run read
// an MFU of 1.13 to 1.51): it is measured again on the spot (rank 0, up to 2 s, which the other ranks
// wait out at their next collective), raised to the run's rate if the machine is still too busy to
// show more, and the cache keeps the higher figure, so a busy machine's figure lasts only until a run
// outpaces it. A given peak (--peak_tflops, the table) is the user's or the data sheet's word and is
// not replaced: the MFU against it is capped at 1.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "model/model_config.h"

namespace llm {

// 6 x matmul parameters + 12 x layers x hidden x length (above).
double model_flops_per_token(const ModelConfig& model, int64_t length);

struct PeakFlops {
  double flops_per_second = 0;  // per device (rank); 0: unknown, no MFU
  std::string source;           // how it was found, for the start record and the log
  bool measured = false;        // this CPU's GEMM measurement, cached or new: measured again when outpaced
  bool capped = false;          // a given peak a run outpaced: the MFU against it is capped at 1
};

// The dense peak of a CUDA device of this name (cudaDeviceProp::name) for `dtype` (bf16 or fp32),
// from the table; 0 when the name is not in it. Exposed for tests.
PeakFlops cuda_table_peak(const std::string& device_name, at::ScalarType dtype);

// The peak of this run's device for its compute dtype (above): --peak_tflops when > 0, else the
// table (CUDA) or the cached measurement (CPU, `threads` threads).
PeakFlops device_peak_flops(c10::Device device, at::ScalarType dtype, int threads, double peak_tflops);

// The peak once a run has outpaced `stale`: its model FLOP rate per rank, `achieved`, is above it
// (above). A measured peak is measured again (`dtype`, `threads`) and is at least `achieved`; a given
// one stays, capped. Logs the warning.
PeakFlops outpaced_peak(const PeakFlops& stale, double achieved, at::ScalarType dtype, int threads);

// The entry of this CPU's peak in the cache: "<model name> | <threads> threads | <dtype>". Exposed for tests.
std::string cpu_peak_cache_key(at::ScalarType dtype, int threads);

// tokens_per_second x flops_per_token / (peak x ranks); 0 when the peak is unknown.
double model_flops_utilisation(double flops_per_token, double tokens_per_second, const PeakFlops& peak, int ranks);

}  // namespace llm
