#include "optim/adamw.h"

#include <cmath>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "common/errors.h"
#include "optim/adamw_functor.h"
#include "optim/adamw_host.h"
#include "optim/shard_state.h"

#ifdef TRAINER_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "optim/adamw_kernels.h"
#endif

namespace llm {
namespace {

constexpr const char* kAdamWSource = "AdamW";

std::string describe(const at::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  std::ostringstream text;
  text << tensor.scalar_type() << " " << tensor.sizes() << " on " << tensor.device()
       << (tensor.is_contiguous() ? "" : " (not contiguous)");
  return text.str();
}

// Throws UserError naming the first argument that breaks adamw_update's contract.
void check_update_arguments(const at::Tensor& param, const at::Tensor& grad,
                            const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, double lr,
                            double weight_decay, int64_t step) {
  const std::pair<const char*, const at::Tensor*> named[] = {
      {"param", &param}, {"grad", &grad}, {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}};
  for (const auto& [name, tensor] : named) {
    LLM_REQUIRE(tensor->defined(), "adamw_update", name, "is undefined");
  }
  for (const auto& [name, tensor] : named) {
    LLM_REQUIRE(tensor->is_contiguous(), "adamw_update", name,
                "must be contiguous, got " + describe(*tensor) + "; call .contiguous() first");
    LLM_REQUIRE(tensor->numel() == param.numel(), "adamw_update", name,
                "has " + std::to_string(tensor->numel()) + " elements but param has " +
                    std::to_string(param.numel()) + " (" + describe(*tensor) + " vs " +
                    describe(param) + ")");
    LLM_REQUIRE(tensor->device() == param.device(), "adamw_update", name,
                "is on " + tensor->device().str() + " but param is on " + param.device().str() +
                    "; all four tensors must live on one device");
    const bool is_grad = tensor == &grad;
    const bool is_state = tensor == &exp_avg || tensor == &exp_avg_sq;
    const bool dtype_ok = tensor->scalar_type() == at::kFloat ||
                          ((is_grad || is_state) && tensor->scalar_type() == at::kBFloat16);
    LLM_REQUIRE(dtype_ok, "adamw_update", name,
                std::string("must be float32") + (is_grad || is_state ? " or bfloat16" : "") + ", got " +
                    describe(*tensor));
  }
  LLM_REQUIRE(exp_avg.scalar_type() == exp_avg_sq.scalar_type(), "adamw_update", "exp_avg_sq",
              "must have exp_avg's dtype, got " + describe(exp_avg_sq) + " and " + describe(exp_avg));
  const auto device_type = param.device().type();
  LLM_REQUIRE(device_type == at::kCPU || device_type == at::kCUDA, "adamw_update", "param",
              "lives on " + param.device().str() + "; only cpu and cuda are supported");
  LLM_REQUIRE(step >= 1, "adamw_update", "step",
              "is 1-based (bias correction uses it), got " + std::to_string(step));
  LLM_REQUIRE(std::isfinite(lr) && lr >= 0.0, "adamw_update", "lr",
              "must be finite and >= 0, got " + std::to_string(lr));
  LLM_REQUIRE(std::isfinite(weight_decay) && weight_decay >= 0.0, "adamw_update", "weight_decay",
              "must be finite and >= 0, got " + std::to_string(weight_decay));
}

}  // namespace

void check_adamw_options(const AdamWOptions& options) {
  LLM_REQUIRE(options.beta1 >= 0.0 && options.beta1 < 1.0, kAdamWSource, "beta1",
              "must be in [0, 1), got " + std::to_string(options.beta1));
  LLM_REQUIRE(options.beta2 >= 0.0 && options.beta2 < 1.0, kAdamWSource, "beta2",
              "must be in [0, 1), got " + std::to_string(options.beta2));
  LLM_REQUIRE(options.eps >= 0.0, kAdamWSource, "eps",
              "must be >= 0, got " + std::to_string(options.eps));
  LLM_REQUIRE(options.weight_decay >= 0.0, kAdamWSource, "weight_decay",
              "must be >= 0, got " + std::to_string(options.weight_decay));
}

namespace {

void update_on_cuda(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                    at::Tensor& exp_avg_sq, const AdamWScalars& scalars, const StateRounding& rounding,
                    uint16_t* compute_out) {
#ifdef TRAINER_HAVE_CUDA
  const c10::cuda::CUDAGuard device_guard(param.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(param.device().index()).stream();
  const auto gradient_type = grad.scalar_type() == at::kBFloat16 ? GradientElementType::kBfloat16
                                                                  : GradientElementType::kFloat32;
  launch_adamw_update_cuda(param.data_ptr<float>(), grad.const_data_ptr(), gradient_type, exp_avg.data_ptr(),
                           exp_avg_sq.data_ptr(), exp_avg.scalar_type() == at::kBFloat16, rounding,
                           param.numel(), scalars, stream, compute_out);
#else
  (void)compute_out;
  throw SystemError("adamw_update: param is on " + param.device().str() +
                    " but this build has no CUDA kernels (configured without the CUDA toolkit or "
                    "with -DTRAINER_WITH_CUDA=OFF); rebuild with CUDA or keep the step on cpu");
#endif
}

}  // namespace

void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, double lr, const AdamWOptions& options,
                  double weight_decay, int64_t step) {
  // bf16 moments need their rounding bits (a fixed key would round alike at every step: biased).
  LLM_REQUIRE(!exp_avg.defined() || exp_avg.scalar_type() != at::kBFloat16, "adamw_update", "exp_avg",
              "is bf16: pass its StateRounding (the overload with compute_out and rounding)");
  at::Tensor none;
  adamw_update(param, grad, exp_avg, exp_avg_sq, lr, options, weight_decay, step, none, StateRounding{});
}

void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, double lr, const AdamWOptions& options,
                  double weight_decay, int64_t step, at::Tensor& compute_out, const StateRounding& rounding,
                  double gradient_scale, const AdamWSources* from) {
  check_update_arguments(param, grad, exp_avg, exp_avg_sq, lr, weight_decay, step);
  if (from != nullptr) {
    LLM_REQUIRE(!param.device().is_cuda(), "adamw_update", "from", "an out-of-place step runs on the host only");
    for (auto [source, output] : {std::pair{&from->param, &param}, std::pair{&from->exp_avg, &exp_avg},
                                  std::pair{&from->exp_avg_sq, &exp_avg_sq}})
      LLM_REQUIRE(source->is_contiguous() && source->numel() == output->numel() &&
                      source->scalar_type() == output->scalar_type() && source->device() == output->device(),
                  "adamw_update", "from", "each source must be laid out like its output, got " + describe(*source));
  }
  LLM_REQUIRE(std::isfinite(gradient_scale) && gradient_scale >= 0, "adamw_update", "gradient_scale",
              "must be finite and >= 0");
  if (compute_out.defined()) {
    LLM_REQUIRE(compute_out.is_contiguous() && compute_out.numel() == param.numel() &&
                    compute_out.device() == param.device(),
                "adamw_update", "compute_out",
                "must be contiguous with param's elements on its device, got " + describe(compute_out) +
                    " for param " + describe(param));
  }
  const AdamWScalars scalars = adamw_scalars(lr, options, weight_decay, step, gradient_scale);
  // A bf16 compute_out is written in the update's own pass, on the host and on the device.
  const bool fused_copy = compute_out.defined() && compute_out.scalar_type() == at::kBFloat16;
  if (param.device().is_cuda()) {
    update_on_cuda(param, grad, exp_avg, exp_avg_sq, scalars, rounding,
                   fused_copy ? reinterpret_cast<uint16_t*>(compute_out.data_ptr<at::BFloat16>()) : nullptr);
  } else {
    AdamWHostArrays arrays{param.data_ptr<float>(), grad.const_data_ptr(), grad.scalar_type() == at::kBFloat16,
                           nullptr, nullptr,
                           fused_copy ? reinterpret_cast<uint16_t*>(compute_out.data_ptr<at::BFloat16>()) : nullptr};
    if (exp_avg.scalar_type() == at::kBFloat16) {
      arrays.exp_avg_bf16 = reinterpret_cast<uint16_t*>(exp_avg.data_ptr<at::BFloat16>());
      arrays.exp_avg_sq_bf16 = reinterpret_cast<uint16_t*>(exp_avg_sq.data_ptr<at::BFloat16>());
      arrays.rounding = rounding;
    } else {
      arrays.exp_avg = exp_avg.data_ptr<float>();
      arrays.exp_avg_sq = exp_avg_sq.data_ptr<float>();
    }
    if (from != nullptr) {
      arrays.param_from = from->param.const_data_ptr<float>();
      arrays.exp_avg_from = from->exp_avg.const_data_ptr();
      arrays.exp_avg_sq_from = from->exp_avg_sq.const_data_ptr();
    }
    adamw_host_update(arrays, param.numel(), scalars, at::get_num_threads());
  }
  if (compute_out.defined() && !fused_copy) compute_out.copy_(param);
}

AdamWScalars adamw_scalars(double lr, const AdamWOptions& options, double weight_decay,
                           int64_t step, double gradient_scale) {
  return make_adamw_scalars(lr, options.beta1, options.beta2, options.eps, weight_decay, step, gradient_scale);
}

// c10::BFloat16 is a uint16_t's worth of bits with the same layout the host kernels take.
static_assert(sizeof(at::BFloat16) == sizeof(uint16_t) && alignof(at::BFloat16) == alignof(uint16_t),
              "at::BFloat16 must be its 16 bits");

void adamw_update_host(float* master, const float* grad, float* exp_avg, float* exp_avg_sq,
                       int64_t numel, const AdamWScalars& scalars, at::BFloat16* compute_out,
                       int threads) {
  const AdamWHostArrays arrays{master, grad, /*grad_is_bf16=*/false, exp_avg, exp_avg_sq,
                               reinterpret_cast<uint16_t*>(compute_out)};
  adamw_host_update(arrays, numel, scalars, threads);
}

void adamw_update_host(float* master, const at::BFloat16* grad, float* exp_avg,
                       float* exp_avg_sq, int64_t numel, const AdamWScalars& scalars,
                       at::BFloat16* compute_out, int threads) {
  const AdamWHostArrays arrays{master, grad, /*grad_is_bf16=*/true, exp_avg, exp_avg_sq,
                               reinterpret_cast<uint16_t*>(compute_out)};
  adamw_host_update(arrays, numel, scalars, threads);
}

AdamW::AdamW(std::vector<OptimizedTensor> tensors, AdamWOptions options)
    : tensors_(std::move(tensors)), options_(options) {
  check_adamw_options(options_);
  std::set<std::string> names;
  for (const OptimizedTensor& tensor : tensors_) {
    LLM_REQUIRE(!tensor.name.empty(), kAdamWSource, "tensors", "every tensor needs a name");
    LLM_REQUIRE(names.insert(tensor.name).second, kAdamWSource, tensor.name,
                "appears twice; names key the optimizer state and must be unique");
    LLM_REQUIRE(tensor.param.defined(), kAdamWSource, tensor.name, "param is undefined");
    LLM_REQUIRE(tensor.param.scalar_type() == at::kFloat && tensor.param.is_contiguous(),
                kAdamWSource, tensor.name,
                "the master param must be a contiguous float32 tensor, got " +
                    describe(tensor.param));
  }
  exp_avg_.resize(tensors_.size());
  exp_avg_sq_.resize(tensors_.size());
}

void AdamW::step(double lr) {
  // Check every tensor before touching any, so a bad gradient leaves the optimizer unchanged.
  const int64_t next_step = step_ + 1;
  for (const OptimizedTensor& tensor : tensors_) {
    const at::Tensor& grad = tensor.gradient();
    if (!grad.defined()) continue;
    check_update_arguments(tensor.param, grad, tensor.param, tensor.param, lr,
                           options_.weight_decay, next_step);
  }
  step_ = next_step;
  for (size_t index = 0; index < tensors_.size(); ++index) {
    OptimizedTensor& tensor = tensors_[index];
    const at::Tensor& grad = tensor.gradient();
    if (!grad.defined()) continue;
    if (!exp_avg_[index].defined()) {
      exp_avg_[index] = at::zeros_like(tensor.param, at::MemoryFormat::Contiguous);
      exp_avg_sq_[index] = at::zeros_like(tensor.param, at::MemoryFormat::Contiguous);
    }
    const double weight_decay = tensor.decay ? options_.weight_decay : 0.0;
    adamw_update(tensor.param, grad, exp_avg_[index], exp_avg_sq_[index], lr, options_,
                 weight_decay, step_);
  }
}

void AdamW::allocate_state() {
  for (size_t index = 0; index < tensors_.size(); ++index) {
    if (exp_avg_[index].defined()) continue;
    exp_avg_[index] = at::zeros_like(tensors_[index].param, at::MemoryFormat::Contiguous);
    exp_avg_sq_[index] = at::zeros_like(tensors_[index].param, at::MemoryFormat::Contiguous);
  }
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (size_t index = 0; index < tensors_.size(); ++index) {
    if (exp_avg_[index].defined()) bytes += exp_avg_[index].nbytes();
    if (exp_avg_sq_[index].defined()) bytes += exp_avg_sq_[index].nbytes();
  }
  return bytes;
}

// The live state tensors, not copies: save them before the next step. A tensor that has not been
// stepped yet reports zeros, which is exactly the state it would start from.
std::map<std::string, at::Tensor> AdamW::state_dict() const {
  std::map<std::string, at::Tensor> state;
  for (size_t index = 0; index < tensors_.size(); ++index) {
    const OptimizedTensor& tensor = tensors_[index];
    const bool stepped = exp_avg_[index].defined();
    const auto fresh = [&] { return at::zeros_like(tensor.param, at::MemoryFormat::Contiguous); };
    state[tensor.name + ".exp_avg"] = stepped ? exp_avg_[index] : fresh();
    state[tensor.name + ".exp_avg_sq"] = stepped ? exp_avg_sq_[index] : fresh();
  }
  state["step"] = at::scalar_tensor(step_, at::kLong);
  return state;
}

void AdamW::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  // The one validator (optim/shard_state.h) lists every problem and throws before anything changes.
  std::map<std::string, FullStateShape> expected;
  for (const OptimizedTensor& tensor : tensors_)
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"})
      expected[tensor.name + suffix] = {tensor.param.sizes().vec()};
  const int64_t step = check_full_state(state, expected, "adamw");

  for (size_t index = 0; index < tensors_.size(); ++index) {
    const OptimizedTensor& tensor = tensors_[index];
    if (!exp_avg_[index].defined()) {
      exp_avg_[index] = at::empty_like(tensor.param, at::MemoryFormat::Contiguous);
      exp_avg_sq_[index] = at::empty_like(tensor.param, at::MemoryFormat::Contiguous);
    }
    exp_avg_[index].copy_(state.at(tensor.name + ".exp_avg"));
    exp_avg_sq_[index].copy_(state.at(tensor.name + ".exp_avg_sq"));
  }
  step_ = step;
}

}  // namespace llm
