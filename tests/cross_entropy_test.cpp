// The fused loss (model/cross_entropy.h) against ATen's cross_entropy: the loss and the
// gradient it hands back, fp32 and bf16 logits, ignored labels, a vocabulary that is not a multiple
// of any vector width (1023) and one whose rows span several blocks' worth of rows (32000), a scaled
// backward (accumulation divides the loss), evaluation without grad, and every label ignored.
// The golden model test (model_golden_test.cpp) checks the loss against transformers' as well.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <torch/cuda.h>

#include <cmath>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "common/host_memory.h"
#include "common/memory_stats.h"
#include "model/cross_entropy.h"
#include "tests/tensor_checks.h"

namespace llm::cross_entropy_test {
namespace {

using testing::expect_all_close;

struct Case {
  int64_t rows, vocab;
  at::ScalarType dtype;
};

std::pair<at::Tensor, at::Tensor> inputs(const Case& c, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  at::Tensor logits = (at::randn({c.rows, c.vocab}) * 3).to(c.dtype);
  at::Tensor labels = at::randint(0, c.vocab, {c.rows}, at::kLong);
  labels.index_put_({at::arange(0, c.rows, 5)}, -100);  // every fifth row ignored
  return {logits, labels};
}

class FusedCrossEntropy : public ::testing::TestWithParam<Case> {};

TEST_P(FusedCrossEntropy, LossAndGradientEqualATens) {
  const Case c = GetParam();
  const auto [values, labels] = inputs(c, 1);
  at::Tensor ours_logits = values.clone().requires_grad_(true);
  at::Tensor reference_logits = values.clone().requires_grad_(true);
  const at::Tensor ours = causal_lm_loss(ours_logits, labels);
  const at::Tensor reference = causal_lm_loss_reference(reference_logits, labels);
  // fp32 throughout; the sums inside a row and over rows run in another order: a few ulps.
  EXPECT_NEAR(ours.item<double>(), reference.item<double>(), 2e-6 * std::abs(reference.item<double>()));
  (ours * 0.25).backward();  // a scaled loss, as with gradient accumulation
  (reference * 0.25).backward();
  ASSERT_EQ(ours_logits.grad().scalar_type(), c.dtype);
  // fp32: ours is exp(x - max) / sum; ATen's is exp(log_softmax), whose argument carries rounding
  // of |log p| x 2^-24 (|log p| up to ~30 for these logits and 32000 classes), so ATen's own value
  // is off by up to ~6e-6 relative: 2e-5 allows that, and a wrong label, scale or count is off by
  // far more. bf16 rounds each once from fp32, as ATen's backward through the upcast does: equal,
  // or one bf16 ulp (2^-8) apart.
  const double tolerance = c.dtype == at::kFloat ? 2e-5 : 1.0 / 128;
  expect_all_close(ours_logits.grad().to(at::kFloat), reference_logits.grad().to(at::kFloat), 1e-9, tolerance,
                   "d loss / d logits");
  EXPECT_EQ(ours_logits.grad().index({at::arange(0, c.rows, 5)}).count_nonzero().item<int64_t>(), 0)
      << "ignored rows get no gradient";
}

TEST_P(FusedCrossEntropy, EvaluationGivesTheTrainingLoss) {
  const Case c = GetParam();
  const auto [values, labels] = inputs(c, 2);
  const at::Tensor trained = causal_lm_loss(values.clone().requires_grad_(true), labels);
  at::NoGradGuard no_grad;
  EXPECT_EQ(causal_lm_loss(values, labels).item<double>(), trained.item<double>());
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedCrossEntropy,
                         ::testing::Values(Case{37, 1023, at::kFloat}, Case{64, 32000, at::kFloat},
                                           Case{37, 1023, at::kBFloat16}, Case{9, 7, at::kFloat}),
                         [](const auto& info) {
                           return std::to_string(info.param.rows) + "x" + std::to_string(info.param.vocab) +
                                  (info.param.dtype == at::kFloat ? "_fp32" : "_bf16");
                         });

// The single pass (--fused_ops cross_entropy): its CPU loop runs the CUDA kernel's algorithm (the same
// lanes, merge tree and element functions), against ATen's cross_entropy as the blocked form is.
TEST_P(FusedCrossEntropy, SinglePassEqualsATens) {
  const Case c = GetParam();
  const auto [values, labels] = inputs(c, 4);
  // An intermediate, as the head's output is: the gradient is written over it.
  at::Tensor leaf = values.clone().requires_grad_(true);
  const at::Tensor logits = leaf * 1.0;
  at::Tensor reference_logits = values.clone().requires_grad_(true);
  const at::Tensor ours = causal_lm_loss(logits, labels, CrossEntropyForm::single_pass);
  const at::Tensor reference = causal_lm_loss_reference(reference_logits, labels);
  EXPECT_NEAR(ours.item<double>(), reference.item<double>(), 2e-6 * std::abs(reference.item<double>()));
  (ours * 0.25).backward();
  (reference * 0.25).backward();
  const double tolerance = c.dtype == at::kFloat ? 2e-5 : 1.0 / 128;
  expect_all_close(leaf.grad().to(at::kFloat), reference_logits.grad().to(at::kFloat), 1e-9, tolerance,
                   "d loss / d logits");
  EXPECT_EQ(leaf.grad().index({at::arange(0, c.rows, 5)}).count_nonzero().item<int64_t>(), 0);
  at::NoGradGuard no_grad;
  EXPECT_EQ(causal_lm_loss(values, labels, CrossEntropyForm::single_pass).item<double>(), ours.item<double>())
      << "evaluation gives the training loss";
}

TEST(SinglePassCrossEntropy, WritesTheGradientOverTheLogitsAndLeavesALeafAlone) {
  at::manual_seed(6);
  const at::Tensor values = at::randn({16, 300});
  const at::Tensor labels = at::randint(0, 300, {16}, at::kLong);
  at::Tensor leaf = values.clone().requires_grad_(true);
  at::Tensor logits = leaf * 2.0;
  const void* storage = logits.const_data_ptr();
  causal_lm_loss(logits, labels, CrossEntropyForm::single_pass).backward();
  EXPECT_FALSE(at::equal(logits.detach(), values * 2.0)) << "the logits' buffer holds the gradient now";
  EXPECT_EQ(logits.const_data_ptr(), storage);
  const at::Tensor doubled = values * 2.0;
  at::Tensor own = doubled.clone().requires_grad_(true);
  causal_lm_loss(own, labels, CrossEntropyForm::single_pass).backward();
  EXPECT_TRUE(at::equal(own.detach(), doubled)) << "a caller's leaf keeps its values";
  EXPECT_TRUE(at::allclose(own.grad() * 2.0, leaf.grad(), 1e-6, 1e-7));
}

// A padded vocabulary (--pad_matmul_dims): (N, V + pad) logits of which V count, read in place by
// both forms; the gradient is (N, V + pad) with zero pads (a pad logit's weight row gets none), and
// the single pass writes it over the logits, pads included, where the blocked form allocates it.
TEST(PaddedVocabulary, BothFormsCountTheFirstVColumnsAndZeroThePadsGradient) {
  at::manual_seed(7);
  const int64_t rows = 12, vocab = 301, padded = 384;
  const at::Tensor buffer_values = at::randn({rows, padded});
  at::Tensor labels = at::randint(0, vocab, {rows}, at::kLong);
  labels.index_put_({0}, -100);
  at::Tensor reference_logits = buffer_values.narrow(1, 0, vocab).clone().requires_grad_(true);
  const at::Tensor reference = causal_lm_loss_reference(reference_logits, labels);
  reference.backward();
  for (const CrossEntropyForm form : {CrossEntropyForm::blocked, CrossEntropyForm::single_pass}) {
    SCOPED_TRACE(form == CrossEntropyForm::blocked ? "blocked" : "single pass");
    at::Tensor leaf = buffer_values.clone().requires_grad_(true);
    at::Tensor logits = leaf * 1.0;  // the head's output: an intermediate
    const at::Tensor ours = causal_lm_loss(logits, labels, form, vocab);
    EXPECT_NEAR(ours.item<double>(), reference.item<double>(), 2e-6 * std::abs(reference.item<double>()));
    ours.backward();
    ASSERT_EQ(leaf.grad().sizes(), leaf.sizes());
    expect_all_close(leaf.grad().narrow(1, 0, vocab), reference_logits.grad(), 1e-9, 2e-5, "counted columns");
    EXPECT_EQ(leaf.grad().narrow(1, vocab, padded - vocab).count_nonzero().item<int64_t>(), 0);
    if (form == CrossEntropyForm::single_pass) {
      EXPECT_EQ(logits.detach().narrow(1, vocab, padded - vocab).count_nonzero().item<int64_t>(), 0)
          << "the pads of the logits the gradient was written over";
    }
    at::NoGradGuard no_grad;
    EXPECT_NEAR(causal_lm_loss(buffer_values, labels, form, vocab).item<double>(), reference.item<double>(),
                2e-6 * std::abs(reference.item<double>()))
        << "evaluation";
  }
  EXPECT_THROW(causal_lm_loss(buffer_values, labels, CrossEntropyForm::blocked, padded + 1), UserError);
}

TEST(SinglePassCrossEntropy, EdgesAsTheBlockedForm) {
  at::Tensor logits = at::randn({4, 11}).requires_grad_(true);
  const at::Tensor ignored = at::full({4}, -100, at::kLong);
  const at::Tensor loss = causal_lm_loss(logits, ignored, CrossEntropyForm::single_pass);
  EXPECT_TRUE(std::isnan(loss.item<double>())) << "every label ignored: NaN, as ATen's";
  loss.backward();
  EXPECT_EQ(logits.grad().count_nonzero().item<int64_t>(), 0);
  // A row of -inf but its label (a masked vocabulary) and a NaN logit.
  at::Tensor masked = at::full({2, 9}, -INFINITY);
  masked.index_put_({0, 3}, 1.5);
  masked.index_put_({1, 4}, 0.0);
  masked.index_put_({1, 5}, NAN);
  const at::Tensor labels = at::tensor({3, 4}, at::kLong);
  at::NoGradGuard no_grad;
  EXPECT_EQ(causal_lm_loss(masked.narrow(0, 0, 1), labels.narrow(0, 0, 1), CrossEntropyForm::single_pass).item<double>(),
            0.0);
  EXPECT_TRUE(std::isnan(causal_lm_loss(masked, labels, CrossEntropyForm::single_pass).item<double>()));
  EXPECT_TRUE(std::isnan(causal_lm_loss(at::randn({2, 9}), at::tensor({1, 9}, at::kLong),
                                        CrossEntropyForm::single_pass).item<double>()))
      << "a label outside the vocabulary";
}

// The CUDA kernel: fresh random inputs, a gradient buffer poisoned with NaN where it is not written
// over the logits, against an fp32 reference on the CPU; fp32 and bf16, a 32000 vocabulary padded to
// 32128 and an odd one, every fifth row ignored.
TEST(CrossEntropyOnCuda, SinglePassKernelIsWithinRoundingOfAnFp32Reference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this host";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (const auto& [rows, vocab, padded] : {std::tuple<int64_t, int64_t, int64_t>{1024, 32000, 32128},
                                             std::tuple<int64_t, int64_t, int64_t>{333, 1023, 1023}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + std::to_string(vocab));
      at::manual_seed(static_cast<int64_t>(vocab));
      const at::Tensor host = (at::randn({rows, padded}) * 4).to(dtype);
      at::Tensor labels = at::randint(0, vocab, {rows}, at::kLong);
      labels.index_put_({at::arange(0, rows, 5)}, -100);
      at::Tensor reference_logits = host.narrow(1, 0, vocab).to(at::kFloat).requires_grad_(true);
      const at::Tensor expected = causal_lm_loss_reference(reference_logits, labels);
      expected.backward();
      // In place: the head's output on the device, poisoned past the vocabulary first.
      at::Tensor leaf = host.to(at::kCUDA).requires_grad_(true);
      at::Tensor buffer = leaf * 1.0;
      buffer.detach().narrow(1, vocab, padded - vocab).fill_(NAN);
      const at::Tensor ours = causal_lm_loss(buffer, labels.to(at::kCUDA), CrossEntropyForm::single_pass, vocab);
      ours.backward();
      EXPECT_NEAR(ours.item<double>(), expected.item<double>(), 1e-5 * std::abs(expected.item<double>()));
      const at::Tensor grad = leaf.grad().to(at::kCPU, at::kFloat);
      EXPECT_TRUE(at::isfinite(grad).all().item<bool>());
      EXPECT_EQ(buffer.detach().narrow(1, vocab, padded - vocab).count_nonzero().item<int64_t>(), 0)
          << "the poisoned pads of the buffer the gradient was written over";
      const double tolerance = dtype == at::kFloat ? 2e-5 : 1.0 / 128;
      expect_all_close(grad.narrow(1, 0, vocab), reference_logits.grad(), 1e-9, tolerance, "d loss / d logits");
      // Not in place (a leaf): the gradient buffer is the autograd engine's, the logits unchanged.
      at::Tensor own = host.narrow(1, 0, vocab).contiguous().to(at::kCUDA).requires_grad_(true);
      causal_lm_loss(own, labels.to(at::kCUDA), CrossEntropyForm::single_pass).backward();
      expect_all_close(own.grad().to(at::kCPU, at::kFloat), reference_logits.grad(), 1e-9, tolerance, "leaf gradient");
      EXPECT_TRUE(at::equal(own.detach().cpu(), host.narrow(1, 0, vocab)));
    }
}

TEST(FusedCrossEntropyEdges, EveryLabelIgnoredIsNaNWithNoGradient) {
  at::Tensor logits = at::randn({4, 11}).requires_grad_(true);
  const at::Tensor labels = at::full({4}, -100, at::kLong);
  const at::Tensor loss = causal_lm_loss(logits, labels);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  EXPECT_TRUE(std::isnan(causal_lm_loss_reference(logits, labels).item<double>())) << "as ATen's";
  loss.backward();
  EXPECT_EQ(logits.grad().count_nonzero().item<int64_t>(), 0);
}

TEST(FusedCrossEntropyEdges, BatchedShapesAndAWrongLabelIsNoticed) {
  // (B, T, V) logits and (B, T) labels, as the trainer passes them; a shifted label changes the loss.
  at::manual_seed(3);
  const at::Tensor logits = at::randn({2, 5, 13});
  const at::Tensor labels = at::randint(0, 13, {2, 5}, at::kLong);
  const double ours = causal_lm_loss(logits, labels).item<double>();
  EXPECT_NEAR(ours, causal_lm_loss_reference(logits, labels).item<double>(), 1e-6);
  EXPECT_GT(std::abs(causal_lm_loss(logits, (labels + 1) % 13).item<double>() - ours), 1e-3);
}


// What the loss holds beyond its gradient is what trainer estimate counts for it
// (cross_entropy_transient_bytes): measured with the counting host allocator on CPU and with the
// CUDA caching allocator's peak on a GPU. bf16 logits in training (the upcast and the exponentials
// of each block), fp32 in evaluation (the exponentials), fp32 in training (nothing: the exponentials
// are written into the gradient). Each case spans several blocks, so counting the whole rows at once
// (the CUDA path before, 8 x rows x V) would be far outside the bound. The slack: the (rows, 1)
// per-row vectors of the blocks in flight and the per-row losses, at most 64 bytes a row.
struct Measured {
  int64_t held_beyond_gradient = 0;
  int64_t counted = 0;
};

Measured loss_transient(c10::Device device, at::ScalarType dtype, bool training, int64_t rows, int64_t vocab) {
  at::manual_seed(3);
  at::Tensor logits = (at::randn({rows, vocab}) * 3).to(dtype).to(device);
  const at::Tensor labels = at::randint(0, vocab, {rows}, at::kLong).to(device);
  if (training) logits.requires_grad_(true);
  std::optional<at::NoGradGuard> no_grad;
  if (!training) no_grad.emplace();
  int64_t before = 0;
  if (device.is_cuda()) {
    reset_device_peak_stats(device);
    before = device_memory_stats(device).allocated_bytes;
  } else {
    reset_host_window_peak();
    before = host_memory_counters().current_bytes;
  }
  at::Tensor loss = causal_lm_loss(logits, labels);
  const int64_t peak =
      device.is_cuda() ? device_memory_stats(device).allocated_peak_bytes : host_memory_counters().window_peak_bytes;
  const int64_t gradient = training ? rows * vocab * static_cast<int64_t>(c10::elementSize(dtype)) : 0;
  return {peak - before - gradient,
          cross_entropy_transient_bytes(rows, vocab, dtype, training, device.is_cuda(), at::get_num_threads())};
}

void expect_counted(c10::Device device, int64_t rows, int64_t vocab) {
  const int64_t slack = 64 * rows + 4096;
  for (const auto& [dtype, training] : std::vector<std::pair<at::ScalarType, bool>>{
           {at::kBFloat16, true}, {at::kFloat, false}, {at::kFloat, true}, {at::kBFloat16, false}}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)) + (training ? " training" : " evaluation"));
    const CrossEntropyBlocks blocks = cross_entropy_blocks(rows, vocab, device.is_cuda(), at::get_num_threads());
    ASSERT_GT(blocks.blocks, 2) << "the case must span several blocks";
    const Measured m = loss_transient(device, dtype, training, rows, vocab);
    EXPECT_LE(m.held_beyond_gradient, m.counted + slack);
    // Blocks on host threads need not overlap: at least one block's worth is always there.
    EXPECT_GE(m.held_beyond_gradient, m.counted / blocks.concurrent);
    // A GPU works one block at a time; host threads may hold one block each (4 threads: half the
    // rows of this case, as the first GPU machine's 4-thread run showed).
    if (dtype == at::kBFloat16 && device.is_cuda()) {
      EXPECT_LT(m.counted, 8 * rows * vocab / 2) << "one block at a time, not all rows";
    }
  }
}

TEST(CrossEntropyMemory, WhatTheLossHoldsIsWhatTheEstimateCounts) {
  install_host_memory_tracking();
  expect_counted(c10::Device(c10::kCPU), 1024, 4096);  // 128 rows a block on the host
}

TEST(CrossEntropyMemory, OnCudaTheLossWorksInRowBlocks) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this host";
  expect_counted(c10::Device(c10::kCUDA, 0), 8192, 32000);  // 524 rows a block on a GPU
}

}  // namespace
}  // namespace llm::cross_entropy_test
