// The decoder layer's element-wise operations (model/layer_ops.h) against transformers' forms, written
// in this file from transformers' source: the rotary roll form and the RMSNorm node bit for bit,
// forward and backward, in fp32 and bf16, the norm also where its input has another reader (the
// residual) and under --recompute norm (against no recomputation), and within rounding of float64.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/cuda.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <utility>

#include "common/errors.h"
#include "model/layer_ops.h"
#include "model/recompute.h"

namespace llm::layer_ops_test {
namespace {

// transformers' apply_rotary_pos_emb for one tensor: x * cos + rotate_half(x) * sin.
at::Tensor rotary_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// HF's tables: inv_freq = 1 / base^(2i / D), angles = position * inv_freq, emb = [f, f].
std::pair<at::Tensor, at::Tensor> rotary_angles(int64_t seq, int64_t dim) {
  const at::Tensor inv_freq = 1.0 / at::pow(10000.0, at::arange(0, dim, 2).to(at::kFloat) / dim);
  const at::Tensor angles = at::outer(at::arange(seq).to(at::kFloat), inv_freq);
  const at::Tensor emb = at::cat({angles, angles}, -1);
  return {emb.cos(), emb.sin()};
}

// The roll form against HF's on DEVICE: output and gradient equal.
void expect_rotary_is_hf(at::ScalarType dtype, int64_t head_dim, at::Device device) {
  at::manual_seed(7);
  const int64_t batch = 2, heads = 3, seq = 17;
  const auto [cos32, sin32] = rotary_angles(seq, head_dim);
  const at::Tensor cos = cos32.to(device, dtype), sin = sin32.to(device, dtype);
  const at::Tensor sin_signed = rotary_signed_sine(sin32).to(device, dtype);
  // Values over several binades, zeros and negative zeros among them: the signs must match too.
  at::Tensor values = at::randn({batch, heads, seq, head_dim}) *
                      at::exp2(at::randint(-6, 6, {batch, heads, seq, head_dim}).to(at::kFloat));
  values.index_put_({at::indexing::Slice(), 0, 0}, 0.0);
  values.index_put_({at::indexing::Slice(), 1, 0}, -0.0);
  values = values.to(device, dtype);
  at::Tensor ours_x = values.clone().requires_grad_(true);
  at::Tensor reference_x = values.clone().requires_grad_(true);
  const at::Tensor ours = apply_rotary(ours_x, cos, sin_signed);
  const at::Tensor reference = rotary_reference(reference_x, cos, sin);
  ASSERT_EQ(ours.scalar_type(), dtype);
  EXPECT_TRUE(at::equal(ours, reference));
  EXPECT_TRUE(at::equal(at::signbit(ours), at::signbit(reference)));
  const at::Tensor upstream = at::randn(values.sizes()).to(device, dtype);
  ours.backward(upstream);
  reference.backward(upstream);
  EXPECT_TRUE(at::equal(ours_x.grad(), reference_x.grad()));
}

class Rotary : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t>> {};

TEST_P(Rotary, RollFormIsHfBitForBitForwardAndBackward) {
  expect_rotary_is_hf(std::get<0>(GetParam()), std::get<1>(GetParam()), at::kCPU);
}

INSTANTIATE_TEST_SUITE_P(DtypesAndHeadDims, Rotary,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16),
                                            ::testing::Values<int64_t>(8, 64, 128)));

TEST(Rotary, SignedSineNegatesTheFirstHalfOnly) {
  const at::Tensor sin = at::arange(1, 9).to(at::kFloat).view({1, 8});
  const at::Tensor expected = at::tensor({-1.f, -2.f, -3.f, -4.f, 5.f, 6.f, 7.f, 8.f}).view({1, 8});
  EXPECT_TRUE(at::equal(rotary_signed_sine(sin), expected));
}

// transformers' LlamaRMSNorm.forward (modeling_llama.py), written here from its source, not taken from
// model/layer_ops (before issue 52 both sides of these comparisons ran the product's own forward):
//   hidden_states = hidden_states.to(torch.float32)
//   variance = hidden_states.pow(2).mean(-1, keepdim=True)
//   hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
//   return self.weight * hidden_states.to(input_dtype)
// Under autograd its backward is autograd's derivative of that formula.
at::Tensor hf_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * at::rsqrt(variance + eps)).to(x.scalar_type());
}

// The formula in float64 from the same (rounded) inputs: what each form's rounding is measured against.
at::Tensor rms_norm_float64(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor h = x.to(at::kDouble);
  return weight.to(at::kDouble) * h / (h.pow(2).mean(-1, /*keepdim=*/true) + eps).sqrt();
}

// The largest relative difference of `got` from `exact` (float64), over the elements.
double relative_error(const at::Tensor& got, const at::Tensor& exact) {
  return ((got.to(at::kCPU, at::kDouble) - exact).abs() / exact.abs().clamp_min(1e-30)).max().item<double>();
}

// RMSNorm in a layer's shape: y = x + f(norm(x)) as the residual stream does, so x's gradient is
// the sum of the residual's and the norm's, in the order autograd sums them. `reference`: transformers'
// formula (hf_rms_norm) without recompute, whatever the case says; else ours, recomputed where the
// case says (so the recompute's claim, bitwise equal to no recomputation, is checked too).
struct NormCase {
  at::ScalarType x_dtype, weight_dtype;
  bool recompute;
};

struct NormResult {
  at::Tensor out, x_grad, weight_grad;
};

NormResult run_norm(const NormCase& c, bool reference) {
  at::manual_seed(11);
  const int64_t hidden = 48;
  const at::Tensor values = (at::randn({3, 5, hidden}) * 2.5 + 0.3).to(c.x_dtype);
  const at::Tensor gains = (1 + 0.2 * at::randn({hidden})).to(c.weight_dtype);
  const at::Tensor upstream = at::randn({3, 5, hidden}).to(c.x_dtype);
  const at::Tensor projection = (at::randn({hidden, hidden}) / 7).to(c.x_dtype);
  at::Tensor x = values.clone().requires_grad_(true);
  at::Tensor weight = gains.clone().requires_grad_(true);
  auto norm = [&](const at::Tensor& input) {
    return reference ? hf_rms_norm(input, weight, 1e-5) : rms_norm(input, weight, 1e-5);
  };
  at::Tensor residual = x, normed;
  if (c.recompute && !reference)
    std::tie(residual, normed) = recompute_norm(norm, x);
  else
    normed = norm(x);
  const at::Tensor out = residual + at::matmul(normed.to(c.x_dtype), projection);
  out.backward(upstream);
  return {normed.detach(), x.grad(), weight.grad()};
}

class RmsNormNode : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormNode, IsTransformersFormulaBitForBit) {
  const NormCase& c = GetParam();
  const NormResult ours = run_norm(c, /*reference=*/false);
  const NormResult reference = run_norm(c, /*reference=*/true);
  EXPECT_TRUE(at::equal(ours.out, reference.out));
  EXPECT_TRUE(at::equal(ours.x_grad, reference.x_grad)) << (ours.x_grad - reference.x_grad).abs().max();
  EXPECT_TRUE(at::equal(ours.weight_grad, reference.weight_grad)) << (ours.weight_grad - reference.weight_grad).abs().max();
  // And accurate, so a slip both forms shared would show: against float64 of the same inputs, fp32
  // within (hidden + 3) u (a mean of 48 squares, the rsqrt and two products), bf16 within two
  // roundings to bf16 (the normed value's and the weight's product).
  at::manual_seed(11);  // run_norm's inputs again
  const at::Tensor values = (at::randn({3, 5, 48}) * 2.5 + 0.3).to(c.x_dtype);
  const at::Tensor gains = (1 + 0.2 * at::randn({48})).to(c.weight_dtype);
  const bool bf16 = c.x_dtype == at::kBFloat16 || c.weight_dtype == at::kBFloat16;
  EXPECT_LE(relative_error(ours.out, rms_norm_float64(values, gains, 1e-5)), bf16 ? 2 * 0x1p-8 + 1e-6 : 51 * 0x1p-24);
}

// fp32 (and mixed: the residual stream is fp32 there), pure bf16, each with and without recompute.
INSTANTIATE_TEST_SUITE_P(Modes, RmsNormNode,
                         ::testing::Values(NormCase{at::kFloat, at::kFloat, false}, NormCase{at::kFloat, at::kFloat, true},
                                           NormCase{at::kBFloat16, at::kBFloat16, false},
                                           NormCase{at::kBFloat16, at::kBFloat16, true},
                                           NormCase{at::kBFloat16, at::kFloat, false}));

TEST(RmsNormNode, IsOneNodeOverXTwiceAndTheWeightAndNoNodeWithoutGrad) {
  // What it keeps is checked where it counts: the estimate against the measured ledger
  // (memory_estimate_test.cpp).
  at::Tensor x = at::randn({4, 6, 32}).to(at::kBFloat16).requires_grad_(true);
  at::Tensor weight = at::ones({32}, at::kBFloat16).requires_grad_(true);
  const at::Tensor out = rms_norm(x, weight, 1e-6);
  ASSERT_TRUE(out.grad_fn());
  EXPECT_EQ(out.grad_fn()->next_edges().size(), 3u);  // x, x again, weight
  const at::Tensor detached = rms_norm(x.detach(), weight.detach(), 1e-6);
  EXPECT_FALSE(detached.requires_grad());
  const at::Tensor transformers = hf_rms_norm(x.detach(), weight.detach(), 1e-6);
  EXPECT_TRUE(at::equal(detached, transformers));
  EXPECT_TRUE(at::equal(out.detach(), transformers));
}

TEST(RmsNormNode, TheFusedFormIsCudaOnly) {
  const at::Tensor x = at::randn({2, 8});
  EXPECT_THROW(rms_norm(x, at::ones({8}), 1e-6, RmsNormForm::fused), std::logic_error);
}

// The fused rotary's CPU loop (model/rotary_functor.h, the CUDA kernel's algorithm) against the roll
// form on the (B, heads, T, D) view, forward and backward, bit for bit: fp32; pure bf16 (bf16
// tables); bf16 q with fp32 tables, as under autocast (an fp32 output, a bf16 gradient).
void expect_fused_rotary_is_roll_form(at::ScalarType x_dtype, at::ScalarType table_dtype, at::Device device) {
  at::manual_seed(23);
  const int64_t batch = 2, seq = 13, heads = 3, head_dim = 16;
  const auto [cos32, sin32] = rotary_angles(seq, head_dim);
  const at::Tensor cos = cos32.to(device, table_dtype), sin_signed = rotary_signed_sine(sin32).to(device, table_dtype);
  const at::Tensor values = (at::randn({batch, seq, heads, head_dim}) * 3).to(device, x_dtype);
  at::Tensor eager_x = values.clone().requires_grad_(true), fused_x = values.clone().requires_grad_(true);
  const at::Tensor eager = apply_rotary(eager_x.transpose(1, 2), cos, sin_signed);
  const at::Tensor fused = apply_rotary_fused(fused_x, cos, sin_signed).transpose(1, 2);
  ASSERT_EQ(fused.scalar_type(), eager.scalar_type());
  EXPECT_TRUE(at::equal(fused, eager));
  const at::Tensor upstream = at::randn(eager.sizes()).to(device, eager.scalar_type());
  eager.backward(upstream);
  fused.backward(upstream);
  ASSERT_EQ(fused_x.grad().scalar_type(), x_dtype);
  EXPECT_TRUE(at::equal(fused_x.grad(), eager_x.grad()));
}

TEST(FusedRotary, TheCpuFormOfTheKernelIsTheRollFormBitForBit) {
  for (const auto& [x_dtype, table_dtype] : {std::pair{at::kFloat, at::kFloat}, std::pair{at::kBFloat16, at::kBFloat16},
                                            std::pair{at::kBFloat16, at::kFloat}}) {
    SCOPED_TRACE(std::string(c10::toString(x_dtype)) + " x, " + c10::toString(table_dtype) + " tables");
    expect_fused_rotary_is_roll_form(x_dtype, table_dtype, at::kCPU);
  }
  EXPECT_THROW(apply_rotary_fused(at::randn({2, 3, 4}), at::randn({3, 4}), at::randn({3, 4})), UserError);
}

// The fused SwiGLU's CPU loop (model/swiglu_functor.h, the algorithm the CUDA kernel runs) against
// eager silu * up, forward and both gradients: fp32 to a few ulps (ATen's CPU exp is Sleef's, ours
// std::exp), bf16 to one bf16 rounding; odd sizes and a non-contiguous gate.
struct SwigluResult {
  at::Tensor out, grad_gate, grad_up;
};

SwigluResult run_swiglu(const at::Tensor& gate_values, const at::Tensor& up_values, const at::Tensor& upstream,
                        SwigluForm form) {
  at::Tensor gate = gate_values.clone().requires_grad_(true), up = up_values.clone().requires_grad_(true);
  const at::Tensor out = swiglu(form == SwigluForm::fused ? gate.t().contiguous().t() : gate, up, form);
  out.backward(upstream);
  return {out.detach(), gate.grad(), up.grad()};
}

double relative_difference(const at::Tensor& got, const at::Tensor& want) {
  return ((got.to(at::kDouble) - want.to(at::kDouble)).abs().max() / want.to(at::kDouble).abs().max()).item<double>();
}

// transformers' LlamaMLP's act_fn(gate) * up with SiLU written out, g / (1 + exp(-g)) * u, in float64
// from the same (rounded) inputs, its gradients autograd's: independent of model/layer_ops.
SwigluResult swiglu_float64(const at::Tensor& gate_values, const at::Tensor& up_values, const at::Tensor& upstream) {
  at::Tensor gate = gate_values.to(at::kDouble).requires_grad_(true), up = up_values.to(at::kDouble).requires_grad_(true);
  const at::Tensor out = gate / (1 + at::exp(-gate)) * up;
  out.backward(upstream.to(at::kDouble));
  return {out.detach(), gate.grad(), up.grad()};
}

TEST(FusedSwiglu, TheCpuFormOfTheKernelIsEagerToRounding) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (int64_t rows : {1, 7, 333}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " rows " + std::to_string(rows));
      at::manual_seed(rows);
      const at::Tensor gate = (at::randn({rows, 85}) * 4).to(dtype), up = at::randn({rows, 85}).to(dtype);
      const at::Tensor upstream = at::randn({rows, 85}).to(dtype);
      const SwigluResult eager = run_swiglu(gate, up, upstream, SwigluForm::eager);
      const SwigluResult fused = run_swiglu(gate, up, upstream, SwigluForm::fused);
      ASSERT_EQ(fused.out.scalar_type(), dtype);
      const double tolerance = dtype == at::kBFloat16 ? 1.0 / 128 : 1e-6;
      EXPECT_LE(relative_difference(fused.out, eager.out), tolerance);
      EXPECT_LE(relative_difference(fused.grad_gate, eager.grad_gate), tolerance);
      EXPECT_LE(relative_difference(fused.grad_up, eager.grad_up), tolerance);
      // Both forms against the formula in float64: a slip both shared would show.
      const SwigluResult exact = swiglu_float64(gate, up, upstream);
      for (const SwigluResult* form : {&eager, &fused}) {
        EXPECT_LE(relative_difference(form->out, exact.out), tolerance);
        EXPECT_LE(relative_difference(form->grad_gate, exact.grad_gate), tolerance);
        EXPECT_LE(relative_difference(form->grad_up, exact.grad_up), tolerance);
      }
    }
}

TEST(FusedSwiglu, WithoutGradItIsOnePassAndMismatchedInputsAreRefused) {
  const at::Tensor gate = at::randn({4, 9}), up = at::randn({4, 9});
  EXPECT_TRUE(at::allclose(swiglu(gate, up, SwigluForm::fused), swiglu(gate, up), 1e-6, 1e-7));
  EXPECT_FALSE(swiglu(gate, up, SwigluForm::fused).requires_grad());
  EXPECT_THROW(swiglu(gate, at::randn({4, 8}), SwigluForm::fused), UserError);
  EXPECT_THROW(swiglu(gate, up.to(at::kBFloat16), SwigluForm::fused), UserError);
}

// --- On a GPU (the kit's tests stage runs *Cuda*): the same forms on CUDA's kernels, and LibTorch's
// fused RMSNorm (--fused_ops rms_norm) against an fp32 reference.

TEST(LayerOpsOnCuda, RotaryRollFormIsHfBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this host";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (int64_t head_dim : {64, 128}) expect_rotary_is_hf(dtype, head_dim, at::kCUDA);
}

TEST(LayerOpsOnCuda, RmsNormAtenFormIsTransformersFormulaBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this host";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(3);
    const at::Tensor values = (at::randn({4, 64, 1024}) * 3).to(at::kCUDA, dtype);
    const at::Tensor gains = (1 + 0.1 * at::randn({1024})).to(at::kCUDA, dtype);
    const at::Tensor upstream = at::randn({4, 64, 1024}).to(at::kCUDA, dtype);
    auto run = [&](bool composed) {
      at::Tensor x = values.clone().requires_grad_(true), w = gains.clone().requires_grad_(true);
      const at::Tensor out = composed ? hf_rms_norm(x, w, 1e-5) : rms_norm(x, w, 1e-5);
      out.backward(upstream);
      return std::vector<at::Tensor>{out.detach(), x.grad(), w.grad()};
    };
    const auto ours = run(false), reference = run(true);
    for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(at::equal(ours[i], reference[i])) << "output " << i;
  }
}

TEST(LayerOpsOnCuda, FusedRmsNormIsWithinRoundingOfAnFp32Reference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this host";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(5);
    const int64_t hidden = 2048;
    const at::Tensor values = (at::randn({8, 256, hidden}) * 2 + 0.5).to(dtype);
    const at::Tensor gains = (1 + 0.1 * at::randn({hidden})).to(dtype);
    const at::Tensor upstream = at::randn({8, 256, hidden}).to(dtype);
    // The reference: transformers' formula on the same (rounded) inputs in float64 on the CPU, its
    // gradients autograd's.
    at::Tensor x64 = values.to(at::kDouble).requires_grad_(true), w64 = gains.to(at::kDouble).requires_grad_(true);
    const at::Tensor expected = hf_rms_norm(x64, w64, 1e-5);
    expected.backward(upstream.to(at::kDouble));
    // Ours on the GPU (LibTorch allocates the outputs: an element a kernel skipped would hold
    // whatever the caching allocator's block held, which the comparison catches).
    at::Tensor x = values.to(at::kCUDA).requires_grad_(true), w = gains.to(at::kCUDA).requires_grad_(true);
    const at::Tensor out = rms_norm(x, w, 1e-5, RmsNormForm::fused);
    out.backward(upstream.to(at::kCUDA));
    ASSERT_EQ(out.scalar_type(), dtype);
    // bf16: one rounding of an fp32 value (2^-8 relative) against the reference's; fp32: the sums'
    // order (a few ulps of the row's sum, relative to the largest element).
    const double output_tolerance = dtype == at::kBFloat16 ? 1.0 / 128 : 1e-5;
    const double grad_tolerance = dtype == at::kBFloat16 ? 1.0 / 64 : 1e-4;
    auto relative = [](const at::Tensor& got, const at::Tensor& want) {
      return ((got.to(at::kCPU, at::kDouble) - want).abs().max() / want.abs().max()).item<double>();
    };
    for (const at::Tensor& t : {out, x.grad(), w.grad()}) EXPECT_TRUE(at::isfinite(t).all().item<bool>());
    EXPECT_LE(relative(out, expected.detach()), output_tolerance);
    EXPECT_LE(relative(x.grad(), x64.grad()), grad_tolerance);
    EXPECT_LE(relative(w.grad(), w64.grad()), grad_tolerance);
  }
}

TEST(LayerOpsOnCuda, FusedRotaryIsTheRollFormBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this host";
  for (const auto& [x_dtype, table_dtype] : {std::pair{at::kFloat, at::kFloat}, std::pair{at::kBFloat16, at::kBFloat16},
                                            std::pair{at::kBFloat16, at::kFloat}}) {
    SCOPED_TRACE(std::string(c10::toString(x_dtype)) + " x, " + c10::toString(table_dtype) + " tables");
    expect_fused_rotary_is_roll_form(x_dtype, table_dtype, at::kCUDA);
  }
}

// The CUDA kernel against eager on the GPU (expf on both sides: equal, or an ulp apart where nvcc
// contracts differently from ATen's build), on fresh random inputs, with the caching allocator's
// blocks poisoned first: an element the kernel skipped would hold NaN.
TEST(LayerOpsOnCuda, FusedSwigluIsEagerToAnUlpAndWritesEveryElement) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this host";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(17);
    const at::Tensor gate = (at::randn({8 * 1024, 5504}) * 4).to(at::kCUDA, dtype);
    const at::Tensor up = at::randn({8 * 1024, 5504}).to(at::kCUDA, dtype);
    const at::Tensor upstream = at::randn({8 * 1024, 5504}).to(at::kCUDA, dtype);
    const SwigluResult eager = run_swiglu(gate, up, upstream, SwigluForm::eager);
    { at::Tensor poison = at::full({4, 8 * 1024, 5504}, NAN, gate.options()); }  // freed: its blocks hold NaN
    const SwigluResult fused = run_swiglu(gate, up, upstream, SwigluForm::fused);
    for (const at::Tensor& t : {fused.out, fused.grad_gate, fused.grad_up}) EXPECT_TRUE(at::isfinite(t).all().item<bool>());
    const double tolerance = dtype == at::kBFloat16 ? 1.0 / 128 : 1e-6;
    EXPECT_LE(relative_difference(fused.out, eager.out), tolerance);
    EXPECT_LE(relative_difference(fused.grad_gate, eager.grad_gate), tolerance);
    EXPECT_LE(relative_difference(fused.grad_up, eager.grad_up), tolerance);
    // And against an fp32 reference of the same (rounded) inputs: the kernel is no less accurate.
    const SwigluResult reference = run_swiglu(gate.to(at::kFloat), up.to(at::kFloat), upstream.to(at::kFloat),
                                              SwigluForm::eager);
    EXPECT_LE(relative_difference(fused.out, reference.out), tolerance);
    std::printf("[swiglu %s] equal to eager: out %s, d gate %s, d up %s\n", c10::toString(dtype),
                at::equal(fused.out, eager.out) ? "yes" : "no", at::equal(fused.grad_gate, eager.grad_gate) ? "yes" : "no",
                at::equal(fused.grad_up, eager.grad_up) ? "yes" : "no");
  }
}

}  // namespace
}  // namespace llm::layer_ops_test
