// AdamW (optim/adamw.h) against its references:
//  * LibTorch's own torch::optim::AdamW, run in this process on the same tensors;
//  * Python's torch.optim.AdamW, through tests/golden/adamw_golden.pt (made by
//    tests/golden/make_adamw_golden.py);
//  * itself: bf16 gradients against the same gradients upcast to fp32, and a state_dict round trip
//    against an uninterrupted run;
//  * the CUDA kernel against the same references on cuda tensors (skipped without a GPU).
// Sizes hit the SIMD tails (1, 7, 22, 1023), a multi-thread size (100003) and a 2-D matrix.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include "common/errors.h"
#include "optim/adamw.h"
#include "tests/tensor_checks.h"
#include "tests/test_util.h"

namespace optim_adamw_test {
namespace {

using llm::testing::expect_all_close;
using llm::testing::load_golden;

constexpr int kSteps = 10;

// Shapes that hit every vector tail (AVX-512 holds 16 floats, AVX2 8, SSE 4), a size large enough
// for several OpenMP threads, and a matrix.
const std::vector<std::vector<int64_t>> kShapes = {{1}, {7}, {22}, {1023}, {100003}, {37, 29}};

void expect_identical(const at::Tensor& actual, const at::Tensor& expected,
                      const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::equal(actual.cpu(), expected.cpu()))
      << what << ": max |diff| " << (actual.cpu() - expected.cpu()).abs().max().item<double>();
}

std::string shape_name(const std::vector<int64_t>& shape) {
  std::string name = "shape";
  for (int64_t size : shape) name += "_" + std::to_string(size);
  return name;
}

// The learning rate of step (0-based): a ramp, so a kernel that ignores per-step lr fails.
double learning_rate(int step) { return 1e-3 * (1.0 + 0.25 * step); }

llm::OptimizedTensor optimized(const std::string& name, const at::Tensor& param, bool decay) {
  llm::OptimizedTensor tensor;
  tensor.name = name;
  tensor.param = param;
  tensor.decay = decay;
  return tensor;
}

// (a) Ten steps of ours and LibTorch's torch::optim::AdamW (weight decay 0.1, lr changing every
// step) from the same parameters with the same gradients, on the given device.
void compare_with_libtorch(const at::Device& device) {
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(shape_name(shape) + " on " + device.str());
    torch::manual_seed(7);
    const auto on_device = at::TensorOptions().dtype(at::kFloat).device(device);
    const at::Tensor initial = torch::randn(shape, on_device);
    std::vector<at::Tensor> grads;
    for (int step = 0; step < kSteps; ++step) grads.push_back(torch::randn(shape, on_device));

    at::Tensor reference_param = initial.clone().requires_grad_(true);
    torch::optim::AdamW reference({reference_param}, torch::optim::AdamWOptions(learning_rate(0))
                                                         .betas({0.9, 0.999})
                                                         .eps(1e-8)
                                                         .weight_decay(0.1));
    at::Tensor our_param = initial.clone().requires_grad_(true);
    llm::AdamW ours({optimized("w", our_param, /*decay=*/true)},
                    llm::AdamWOptions{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                      .weight_decay = 0.1});
    for (int step = 0; step < kSteps; ++step) {
      static_cast<torch::optim::AdamWOptions&>(reference.param_groups()[0].options())
          .lr(learning_rate(step));
      reference_param.mutable_grad() = grads[step].clone();
      reference.step();
      our_param.mutable_grad() = grads[step].clone();
      ours.step(learning_rate(step));
    }
    const auto& reference_state = static_cast<const torch::optim::AdamWParamState&>(
        *reference.state().at(reference_param.unsafeGetTensorImpl()));
    const auto state = ours.state_dict();
    // LibTorch computes m as m*beta1 + (1-beta1)*g; we follow Python's lerp (and the GPU build
    // contracts to FMA). Each step the two differ by a few fp32 ulps of m, v and p (2^-23 = 1.2e-7
    // relative); ten steps of that stay below 1e-6 relative for values near 1 (randn params and
    // gradients). A real bug (wrong bias correction, decay or lr) moves p by ~lr = 1e-3.
    expect_all_close(our_param, reference_param, 1e-6, 1e-6, "param");
    expect_all_close(state.at("w.exp_avg"), reference_state.exp_avg(), 1e-6, 1e-6, "exp_avg");
    expect_all_close(state.at("w.exp_avg_sq"), reference_state.exp_avg_sq(), 1e-7, 1e-6,
                     "exp_avg_sq");
    EXPECT_EQ(ours.steps_taken(), kSteps);
  }
}


// (b) Replays the golden file's ten steps with our AdamW on the given device. Every tensor has its
// own betas and weight decay in the file, so each gets its own optimizer.
void compare_with_golden(const at::Device& device) {
  const auto golden = load_golden("adamw_golden.pt");
  const double eps = golden.at("meta.eps").item<double>();
  const at::Tensor lrs = golden.at("lrs");
  ASSERT_EQ(lrs.numel(), kSteps);
  const std::string initial_suffix = ".initial";
  int tensors_checked = 0;
  for (const auto& [key, initial] : golden) {
    if (key.size() <= initial_suffix.size() ||
        key.compare(key.size() - initial_suffix.size(), initial_suffix.size(), initial_suffix)) {
      continue;
    }
    const std::string name = key.substr(0, key.size() - initial_suffix.size());
    SCOPED_TRACE(name + " on " + device.str());
    const at::Tensor betas = golden.at(name + ".betas");
    const double weight_decay = golden.at(name + ".weight_decay").item<double>();
    const llm::AdamWOptions options{.beta1 = betas[0].item<double>(),
                                    .beta2 = betas[1].item<double>(),
                                    .eps = eps,
                                    .weight_decay = weight_decay};
    at::Tensor param = initial.to(device).clone().requires_grad_(true);
    llm::AdamW optimizer({optimized(name, param, /*decay=*/weight_decay > 0.0)}, options);
    const at::Tensor grads = golden.at(name + ".grads");  // (steps, *shape)
    for (int step = 0; step < kSteps; ++step) {
      param.mutable_grad() = grads[step].to(device);
      optimizer.step(lrs[step].item<double>());
    }
    const auto state = optimizer.state_dict();
    // Same operations in the same order as torch's single-tensor CPU path; what remains is FMA
    // contraction (ATen's vectorised lerp uses fmadd, nvcc contracts by default) and vector versus
    // scalar tails: measured at most 1.5 ulps after ten steps, so allow 4 ulps (4 * 2^-23 = 4.8e-7
    // relative). The absolute floors cover values near zero: p and m can land there by
    // cancellation of terms of the gradients' size (up to ~30 here), v cannot (a sum of squares).
    expect_all_close(param, golden.at(name + ".final"), 1e-7, 4.8e-7, "param");
    expect_all_close(state.at(name + ".exp_avg"), golden.at(name + ".exp_avg"), 5e-7, 4.8e-7,
                     "exp_avg");
    expect_all_close(state.at(name + ".exp_avg_sq"), golden.at(name + ".exp_avg_sq"), 1e-9,
                     4.8e-7, "exp_avg_sq");
    ++tensors_checked;
  }
  EXPECT_EQ(tensors_checked, 6) << "the golden file holds six tensors; regenerate it?";
}

// (c) bf16 gradients against the same values upcast to fp32: bf16 -> fp32 is exact and the rest
// of the arithmetic is the same code, so the results must be bit-identical.
void compare_bf16_with_fp32_gradients(const at::Device& device) {
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(shape_name(shape) + " on " + device.str());
    torch::manual_seed(11);
    const auto on_device = at::TensorOptions().dtype(at::kFloat).device(device);
    const at::Tensor initial = torch::randn(shape, on_device);
    at::Tensor bf16_param = initial.clone();
    at::Tensor fp32_param = initial.clone();
    at::Tensor bf16_m = torch::zeros(shape, on_device), bf16_v = torch::zeros(shape, on_device);
    at::Tensor fp32_m = torch::zeros(shape, on_device), fp32_v = torch::zeros(shape, on_device);
    const llm::AdamWOptions options{.weight_decay = 0.1};
    for (int step = 1; step <= kSteps; ++step) {
      const at::Tensor bf16_grad = torch::randn(shape, on_device).to(at::kBFloat16);
      const at::Tensor fp32_grad = bf16_grad.to(at::kFloat);
      llm::adamw_update(bf16_param, bf16_grad, bf16_m, bf16_v, learning_rate(step), options,
                        options.weight_decay, step);
      llm::adamw_update(fp32_param, fp32_grad, fp32_m, fp32_v, learning_rate(step), options,
                        options.weight_decay, step);
    }
    expect_identical(bf16_param, fp32_param, "param");
    expect_identical(bf16_m, fp32_m, "exp_avg");
    expect_identical(bf16_v, fp32_v, "exp_avg_sq");
    EXPECT_FALSE(at::equal(bf16_param.cpu(), initial.cpu())) << "the update did nothing";
  }
}

std::map<std::string, at::Tensor> clone_state(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, at::Tensor> copy;
  for (const auto& [key, value] : state) copy[key] = value.clone();
  return copy;
}

}  // namespace

TEST(AdamWLibTorch, MatchesTorchOptimAdamWOnCpu) { compare_with_libtorch(at::kCPU); }

// beta1 <= 0.5 takes torch's other lerp form (weight 1 - beta1 >= 0.5). At beta1 = 0 that form
// makes m exactly the gradient, which the first form would miss by an ulp.
TEST(AdamWLibTorch, SmallBeta1TakesTheOtherLerpForm) {
  for (const double beta1 : {0.0, 0.3}) {
    SCOPED_TRACE("beta1 " + std::to_string(beta1));
    torch::manual_seed(13);
    const at::Tensor initial = torch::randn({1023});
    at::Tensor reference_param = initial.clone().requires_grad_(true);
    torch::optim::AdamW reference(
        {reference_param},
        torch::optim::AdamWOptions(1e-3).betas({beta1, 0.999}).eps(1e-8).weight_decay(0.1));
    at::Tensor our_param = initial.clone();
    at::Tensor exp_avg = torch::zeros({1023}), exp_avg_sq = torch::zeros({1023});
    const llm::AdamWOptions options{.beta1 = beta1, .beta2 = 0.999, .eps = 1e-8};
    at::Tensor grad;
    for (int step = 1; step <= kSteps; ++step) {
      grad = torch::randn({1023});
      reference_param.mutable_grad() = grad.clone();
      reference.step();
      llm::adamw_update(our_param, grad, exp_avg, exp_avg_sq, 1e-3, options, 0.1, step);
    }
    // Tolerances as in MatchesTorchOptimAdamWOnCpu.
    expect_all_close(our_param, reference_param, 1e-6, 1e-6, "param");
    if (beta1 == 0.0) expect_identical(exp_avg, grad, "exp_avg at beta1 = 0");
  }
}

TEST(AdamWGolden, MatchesPythonTorchOptimAdamWOnCpu) { compare_with_golden(at::kCPU); }

TEST(AdamWBf16, Bf16GradientsEqualUpcastFp32GradientsOnCpu) {
  compare_bf16_with_fp32_gradients(at::kCPU);
}

TEST(AdamWStateDict, RoundTripContinuesIdentically) {
  torch::manual_seed(3);
  const std::vector<int64_t> matrix_shape = {37, 29};
  const std::vector<int64_t> vector_shape = {1023};
  std::vector<at::Tensor> grads;
  for (int step = 0; step < 2 * kSteps; ++step) {
    grads.push_back(torch::randn(matrix_shape));
    grads.push_back(torch::randn(vector_shape));
  }
  const auto make_tensors = [&](const at::Tensor& matrix, const at::Tensor& gain) {
    return std::vector<llm::OptimizedTensor>{optimized("block.weight", matrix, true),
                                             optimized("block.norm", gain, false)};
  };
  const llm::AdamWOptions options{.beta2 = 0.95, .weight_decay = 0.1};
  auto uninterrupted = make_tensors(torch::randn(matrix_shape), torch::randn(vector_shape));
  llm::AdamW uninterrupted_optimizer(uninterrupted, options);
  const auto run_step = [&](llm::AdamW& optimizer, std::vector<llm::OptimizedTensor>& tensors,
                            int step) {
    tensors[0].param.mutable_grad() = grads[2 * step];
    tensors[1].param.mutable_grad() = grads[2 * step + 1];
    optimizer.step(learning_rate(step));
  };
  for (int step = 0; step < kSteps; ++step) run_step(uninterrupted_optimizer, uninterrupted, step);

  // "Save" after kSteps, then resume into fresh parameters and a fresh optimizer.
  const auto saved_state = clone_state(uninterrupted_optimizer.state_dict());
  auto resumed = make_tensors(uninterrupted[0].param.clone(), uninterrupted[1].param.clone());
  llm::AdamW resumed_optimizer(resumed, options);
  EXPECT_EQ(resumed_optimizer.state_bytes(), 0) << "state is allocated lazily";
  resumed_optimizer.load_state_dict(saved_state);
  EXPECT_EQ(resumed_optimizer.steps_taken(), kSteps);
  EXPECT_EQ(resumed_optimizer.state_bytes(), uninterrupted_optimizer.state_bytes());
  EXPECT_EQ(resumed_optimizer.state_bytes(), 2 * 4 * (37 * 29 + 1023));

  for (int step = kSteps; step < 2 * kSteps; ++step) {
    run_step(uninterrupted_optimizer, uninterrupted, step);
    run_step(resumed_optimizer, resumed, step);
  }
  // Same code on the same inputs: identical to the bit.
  for (size_t index = 0; index < resumed.size(); ++index) {
    expect_identical(resumed[index].param, uninterrupted[index].param, resumed[index].name);
  }
  const auto resumed_state = resumed_optimizer.state_dict();
  for (const auto& [key, value] : uninterrupted_optimizer.state_dict()) {
    expect_identical(resumed_state.at(key), value, key);
  }
}

TEST(AdamWStateDict, BadLoadsThrowUserErrorNamingTheKeyAndChangeNothing) {
  at::Tensor weight = torch::randn({4, 3});
  at::Tensor norm = torch::randn({3});
  std::vector<llm::OptimizedTensor> tensors = {optimized("weight", weight, true),
                                               optimized("norm", norm, false)};
  llm::AdamW optimizer(tensors, llm::AdamWOptions{});
  weight.mutable_grad() = torch::randn({4, 3});
  norm.mutable_grad() = torch::randn({3});
  optimizer.step(1e-3);
  const auto good = clone_state(optimizer.state_dict());
  const at::Tensor weight_before = weight.clone();

  const auto expect_load_error = [&](std::map<std::string, at::Tensor> state,
                                     const std::string& needle) {
    try {
      optimizer.load_state_dict(state);
      ADD_FAILURE() << "loading did not throw; expected a message containing '" << needle << "'";
    } catch (const llm::UserError& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << "message '" << error.what() << "' does not mention '" << needle << "'";
    }
    EXPECT_EQ(optimizer.steps_taken(), 1) << "a failed load must not change the step";
    expect_identical(optimizer.state_dict().at("weight.exp_avg"), good.at("weight.exp_avg"),
                     "state after a failed load");
  };

  auto missing = good;
  missing.erase("norm.exp_avg_sq");
  expect_load_error(missing, "'norm.exp_avg_sq' is missing");

  auto missing_step = good;
  missing_step.erase("step");
  expect_load_error(missing_step, "'step' is missing");

  auto wrong_shape = good;
  wrong_shape["weight.exp_avg"] = torch::zeros({3, 4});
  expect_load_error(wrong_shape,
                    "'weight.exp_avg' has shape [3, 4] but the parameter has shape [4, 3]");

  auto wrong_dtype = good;
  wrong_dtype["norm.exp_avg"] = torch::zeros({3}, at::kDouble);
  expect_load_error(wrong_dtype, "'norm.exp_avg' must be float32");

  auto unexpected = good;
  unexpected["head.exp_avg"] = torch::zeros({2});
  expect_load_error(unexpected, "'head.exp_avg' is unexpected");

  auto bad_step = good;
  bad_step["step"] = torch::zeros({2}, at::kLong);
  expect_load_error(bad_step, "'step' must hold one integer");

  optimizer.load_state_dict(good);  // the good one still loads
  EXPECT_TRUE(at::equal(weight, weight_before)) << "loading state must not touch parameters";
}

TEST(AdamWStateDict, TensorsWithoutGradientsAreSkippedAndStateIsLazy) {
  at::Tensor stepped = torch::randn({22});
  at::Tensor frozen = torch::randn({7});
  const at::Tensor frozen_before = frozen.clone();
  llm::AdamW optimizer({optimized("stepped", stepped, true), optimized("frozen", frozen, true)},
                       llm::AdamWOptions{.weight_decay = 0.1});
  EXPECT_EQ(optimizer.state_bytes(), 0);
  stepped.mutable_grad() = torch::randn({22});
  optimizer.step(1e-2);
  EXPECT_EQ(optimizer.state_bytes(), 2 * 4 * 22) << "only the stepped tensor holds m and v";
  EXPECT_TRUE(at::equal(frozen, frozen_before)) << "no gradient: no update, not even decay";
  const auto state = optimizer.state_dict();
  EXPECT_TRUE(at::equal(state.at("frozen.exp_avg"), torch::zeros({7})));
  EXPECT_EQ(state.at("step").item<int64_t>(), 1);
}

// A flat gradient shard handed over as per-tensor views (OptimizedTensor::grad) steps exactly like
// the same values in param.grad().
TEST(AdamWGradients, GradientViewsOfAFlatBufferStepLikeParamGrad) {
  torch::manual_seed(17);
  const at::Tensor matrix = torch::randn({37, 29});
  const at::Tensor gain = torch::randn({22});
  at::Tensor via_views_matrix = matrix.clone(), via_views_gain = gain.clone();
  at::Tensor via_grad_matrix = matrix.clone(), via_grad_gain = gain.clone();
  at::Tensor flat_gradient = torch::empty({37 * 29 + 22});  // (numel of both) fp32
  std::vector<llm::OptimizedTensor> views = {optimized("matrix", via_views_matrix, true),
                                             optimized("gain", via_views_gain, false)};
  views[0].grad = flat_gradient.slice(0, 0, 37 * 29).view({37, 29});
  views[1].grad = flat_gradient.slice(0, 37 * 29);
  const llm::AdamWOptions options{.weight_decay = 0.1};
  llm::AdamW with_views(views, options);
  llm::AdamW with_param_grad(
      {optimized("matrix", via_grad_matrix, true), optimized("gain", via_grad_gain, false)},
      options);
  for (int step = 0; step < kSteps; ++step) {
    flat_gradient.normal_();
    via_grad_matrix.mutable_grad() = flat_gradient.slice(0, 0, 37 * 29).view({37, 29}).clone();
    via_grad_gain.mutable_grad() = flat_gradient.slice(0, 37 * 29).clone();
    with_views.step(learning_rate(step));
    with_param_grad.step(learning_rate(step));
  }
  expect_identical(via_views_matrix, via_grad_matrix, "matrix");
  expect_identical(via_views_gain, via_grad_gain, "gain");
}

TEST(AdamWArguments, BadArgumentsThrowUserError) {
  const llm::AdamWOptions options{};
  at::Tensor param = torch::zeros({22});
  at::Tensor m = torch::zeros({22});
  at::Tensor v = torch::zeros({22});
  const at::Tensor grad = torch::ones({22});
  at::Tensor short_state = torch::zeros({21});
  at::Tensor double_state = torch::zeros({22}, at::kDouble);
  at::Tensor strided = torch::zeros({44}).slice(0, 0, 44, 2);
  EXPECT_THROW(llm::adamw_update(param, grad, short_state, v, 1e-3, options, 0.0, 1),
               llm::UserError);
  EXPECT_THROW(llm::adamw_update(param, grad, m, double_state, 1e-3, options, 0.0, 1),
               llm::UserError);
  EXPECT_THROW(llm::adamw_update(param, grad.to(at::kHalf), m, v, 1e-3, options, 0.0, 1),
               llm::UserError);
  EXPECT_THROW(llm::adamw_update(strided, grad, m, v, 1e-3, options, 0.0, 1), llm::UserError);
  EXPECT_THROW(llm::adamw_update(param, grad, m, v, 1e-3, options, 0.0, 0), llm::UserError)
      << "step is 1-based";
  EXPECT_THROW(llm::adamw_update(param, grad, m, v, -1.0, options, 0.0, 1), llm::UserError);
  EXPECT_TRUE(at::equal(param, torch::zeros({22}))) << "a rejected update must not write";

  EXPECT_THROW(llm::AdamW({optimized("w", param, true), optimized("w", m, true)}, options),
               llm::UserError)
      << "duplicate names";
  EXPECT_THROW(llm::AdamW({optimized("w", double_state, true)}, options), llm::UserError);
  EXPECT_THROW(llm::AdamW({optimized("w", param, true)}, llm::AdamWOptions{.beta2 = 1.0}),
               llm::UserError);

  llm::AdamW optimizer({optimized("w", param, true)}, options);
  param.mutable_grad() = torch::ones({21});
  EXPECT_THROW(optimizer.step(1e-3), llm::UserError);
  EXPECT_EQ(optimizer.steps_taken(), 0) << "a rejected step must not count";
}

TEST(AdamWCuda, MatchesLibTorchGoldenAndBf16OnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  compare_with_libtorch(at::Device(at::kCUDA, 0));
  compare_with_golden(at::Device(at::kCUDA, 0));
  compare_bf16_with_fp32_gradients(at::Device(at::kCUDA, 0));
}

TEST(AdamWCuda, CudaAgreesWithCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(shape_name(shape));
    torch::manual_seed(5);
    at::Tensor cpu_param = torch::randn(shape);
    at::Tensor cpu_m = torch::zeros(shape), cpu_v = torch::zeros(shape);
    at::Tensor cuda_param = cpu_param.to(cuda), cuda_m = cpu_m.to(cuda), cuda_v = cpu_v.to(cuda);
    const llm::AdamWOptions options{.weight_decay = 0.1};
    for (int step = 1; step <= kSteps; ++step) {
      const at::Tensor grad = torch::randn(shape);
      llm::adamw_update(cpu_param, grad, cpu_m, cpu_v, learning_rate(step), options, 0.1, step);
      llm::adamw_update(cuda_param, grad.to(cuda), cuda_m, cuda_v, learning_rate(step), options,
                        0.1, step);
    }
    // nvcc contracts a*b+c to FMA and the host build does not: a few ulps, as against LibTorch.
    expect_all_close(cuda_param, cpu_param, 1e-6, 1e-6, "param");
    expect_all_close(cuda_m, cpu_m, 1e-6, 1e-6, "exp_avg");
    expect_all_close(cuda_v, cpu_v, 1e-7, 1e-6, "exp_avg_sq");
  }
}

// The bf16 compute copy written by the CUDA kernel in the update's own pass: master.to(kBFloat16) bit
// for bit (a resident bf16 unit's compute shard), over memory poisoned with NaN first.
TEST(AdamWCuda, TheComputeCopyIsWrittenInTheSamePass) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  const llm::AdamWOptions options{.weight_decay = 0.1};
  torch::manual_seed(3);
  at::Tensor param = torch::randn({10007}).to(cuda), m = torch::zeros_like(param), v = torch::zeros_like(param);
  at::Tensor copy = torch::full({10007}, NAN, param.options().dtype(at::kBFloat16));
  llm::adamw_update(param, torch::randn({10007}).to(cuda), m, v, 1e-3, options, 0.1, 1, copy, llm::StateRounding{});
  EXPECT_TRUE(at::equal(copy, param.to(at::kBFloat16)));
}

// The clip coefficient folded into the CUDA kernel: the bits of ATen's grad.mul_(scale) on the
// device and then the unscaled step (the kit's tests stage runs it: *Cuda*).
TEST(AdamWCuda, TheFoldedClipEqualsScalingTheGradientFirst) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  const llm::AdamWOptions options{.weight_decay = 0.1};
  for (double scale : {0.3713924061, 0.5, 0.0}) {
    SCOPED_TRACE(scale);
    torch::manual_seed(9);
    const at::Tensor start = torch::randn({4099}).to(cuda), grad = torch::randn({4099}).to(cuda);
    at::Tensor expected = start.clone(), expected_m = torch::zeros_like(start), expected_v = torch::zeros_like(start);
    at::Tensor folded = start.clone(), folded_m = torch::zeros_like(start), folded_v = torch::zeros_like(start);
    at::Tensor none;
    llm::adamw_update(expected, grad * scale, expected_m, expected_v, 1e-3, options, 0.1, 1);
    llm::adamw_update(folded, grad, folded_m, folded_v, 1e-3, options, 0.1, 1, none, llm::StateRounding{}, scale);
    EXPECT_TRUE(at::equal(folded, expected));
    EXPECT_TRUE(at::equal(folded_m, expected_m));
    EXPECT_TRUE(at::equal(folded_v, expected_v));
  }
}

}  // namespace optim_adamw_test
