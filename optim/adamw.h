// AdamW with torch.optim.AdamW semantics on contiguous fp32 tensors (whole parameters or a rank's
// flat shard): one fused pass reads p, g, m, v once and writes p, m, v once. The update is written
// once as an element-wise functor (optim/adamw_functor.h) and compiled for CUDA with Thrust
// (optim/adamw_cuda.cu) and for the host, where vector kernels chosen per CPU (AVX-512, AVX2,
// optim/adamw_host.h) give the functor's bits.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/adamw_functor.h"

namespace llm {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Throws UserError naming the option out of range (betas in [0, 1), eps and weight decay >= 0).
void check_adamw_options(const AdamWOptions& options);

// One fused AdamW update in place. p, g, m, v: contiguous, same numel and device; p, m, v fp32;
// g fp32 or bf16 (m, v fp32 here; bf16 moments need the overload below, with their rounding). step is 1-based (bias correction uses it). Decoupled decay: p *= 1 - lr * wd.
void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, double lr, const AdamWOptions& options,
                  double weight_decay, int64_t step);

// adamw_update, then the updated param rounded into compute_out (contiguous, param's numel, on its
// device; bf16 or fp32), unless compute_out is undefined. On the host with a bf16 compute_out the
// one pass writes it (CPU offload's copy for the device, no second read of the master); elsewhere it
// is copied after the update. exp_avg and exp_avg_sq may both be bf16 (--optimizer_state_dtype
// bfloat16): read exactly, the step computed in fp32, stored rounded stochastically by `rounding`
// (optim/state_rounding.h).
// gradient_scale: the gradient is multiplied by it first, in the same pass (the clip coefficient:
// the same bits as grad.mul_(gradient_scale) before the update, on an fp32 gradient).
// from: an out-of-place step on the host (offload's speculative step): the master and moments before
// the step are read from these (each like its output) and param, exp_avg, exp_avg_sq only written.
struct AdamWSources {
  const at::Tensor& param;
  const at::Tensor& exp_avg;
  const at::Tensor& exp_avg_sq;
};
void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, double lr, const AdamWOptions& options,
                  double weight_decay, int64_t step, at::Tensor& compute_out,
                  const StateRounding& rounding, double gradient_scale = 1.0, const AdamWSources* from = nullptr);

// The scalars of one update (lr >= 0, weight_decay >= 0, step >= 1: the caller checked them).
AdamWScalars adamw_scalars(double lr, const AdamWOptions& options, double weight_decay,
                           int64_t step, double gradient_scale = 1.0);

// The host step on raw arrays, as CPU offload calls it: one pass over numel elements that reads
// grad (fp32 or bf16), master, exp_avg and exp_avg_sq (fp32) and writes master and the moments in
// place and, when compute_out is not null, the updated master rounded to bf16 (nearest even, as
// master.to(at::kBFloat16) gives) into compute_out[0, numel). Up to `threads` OpenMP threads
// (default_host_step_threads() in optim/host_threads.h picks a count per rank); the fastest kernel
// this CPU runs, each bit-identical to the scalar functor. The arrays must not overlap; nothing is
// checked (the caller owns them). adamw_update's CPU case is this, on at::get_num_threads() threads.
void adamw_update_host(float* master, const float* grad, float* exp_avg, float* exp_avg_sq,
                       int64_t numel, const AdamWScalars& scalars, at::BFloat16* compute_out,
                       int threads);
void adamw_update_host(float* master, const at::BFloat16* grad, float* exp_avg,
                       float* exp_avg_sq, int64_t numel, const AdamWScalars& scalars,
                       at::BFloat16* compute_out, int threads);

struct OptimizedTensor {
  std::string name;
  at::Tensor param;  // fp32 master, contiguous; its .grad() holds the gradient at step time
  bool decay = true; // weight decay applies (matrices yes, norm gains no)
  at::Tensor grad;   // when defined (a view of a flat gradient shard), used instead of param.grad()
  const at::Tensor& gradient() const { return grad.defined() ? grad : param.grad(); }
};

class AdamW {
 public:
  AdamW(std::vector<OptimizedTensor> tensors, AdamWOptions options);

  // Applies one update at learning rate lr to every tensor that has a gradient. One step counter
  // serves all tensors and advances on every call (torch keeps one per parameter and skips those
  // without a gradient; the two agree whenever every tensor has a gradient at every step).
  // Every tensor is checked before any is touched: a bad gradient throws UserError and changes
  // nothing.
  void step(double lr);
  int64_t steps_taken() const { return step_; }
  int64_t state_bytes() const;  // bytes of m and v
  // Allocates m and v (zeros) for every tensor now rather than at its first step, so the state's
  // memory is counted (and reserved) before training starts.
  void allocate_state();

  // Checkpointing: "NAME.exp_avg", "NAME.exp_avg_sq" and "step" (a 0-d int64 tensor). state_dict
  // returns the live state tensors, not copies (zeros for a tensor not stepped yet): save or clone
  // them before the next step. load_state_dict copies in; it needs every key with the parameter's
  // shape and float32, rejects unknown keys, lists every problem in one UserError, and changes
  // nothing unless the whole dict fits.
  std::map<std::string, at::Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

 private:
  std::vector<OptimizedTensor> tensors_;
  std::vector<at::Tensor> exp_avg_;
  std::vector<at::Tensor> exp_avg_sq_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace llm
