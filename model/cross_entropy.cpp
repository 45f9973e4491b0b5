#include "model/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>

#include "common/errors.h"
#include "model/cross_entropy_functor.h"
#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "model/layer_kernels.h"
#endif

namespace llm {
namespace {

constexpr int64_t kIgnoreIndex = -100;
// Bytes of fp32 a block of rows may take on the host. Large enough that ATen's per-op overhead is
// small against the block's work (2 rows of a 32000-word vocabulary per block was 1.6x slower than
// ATen's cross_entropy), small enough that the passes over a block run from cache
// (bench/loss_bench.cpp).
constexpr int64_t kHostBlockBytes = 2048 * 1024;
// On a GPU the device's kernels are the parallelism: a block large enough that each of its dozen
// launches fills the device (tens of thousands of elements per SM), small enough that the upcast
// and the exponentials stay a fraction of the logits.
constexpr int64_t kDeviceBlockBytes = 64 * 1024 * 1024;

// logits (N, V) contiguous, labels (N) int64 contiguous on the same device. Returns the per-row
// losses (N) fp32 (0 for ignored rows) and, when `gradient` is defined ((N, V) in the logits'
// dtype), fills it with (softmax - onehot) * scale per row (0 for ignored rows).
at::Tensor cross_entropy_rows(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& gradient,
                              const at::Tensor& scale) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  at::Tensor losses = at::empty({rows}, logits.options().dtype(at::kFloat));
  auto block = [&](int64_t begin, int64_t end) {
    const at::Tensor x = logits.narrow(0, begin, end - begin).to(at::kFloat);  // (n, V) fp32
    const at::Tensor y = labels.narrow(0, begin, end - begin);
    const at::Tensor valid = y.ne(kIgnoreIndex);
    const at::Tensor target = at::where(valid, y, at::zeros_like(y)).unsqueeze(1);  // (n, 1)
    const at::Tensor max = x.amax(1, /*keepdim=*/true);  // (n, 1); amax: max(1) also finds the indices (2.6 % of a step)
    // exp(x - max), written where the gradient goes when it is fp32 (no temporary, no copy).
    const bool in_place = gradient.defined() && gradient.scalar_type() == at::kFloat;
    at::Tensor exponentials = in_place ? gradient.narrow(0, begin, end - begin) : at::empty_like(x);
    at::sub_out(exponentials, x, max).exp_();
    const at::Tensor sums = exponentials.sum(1, /*keepdim=*/true);                    // (n, 1)
    const at::Tensor log_sum = max + sums.log();                                      // logsumexp
    losses.narrow(0, begin, end - begin).copy_(at::where(valid, (log_sum - x.gather(1, target)).squeeze(1), 0.0));
    if (!gradient.defined()) return;
    // (softmax - onehot) / count on counted rows, 0 on ignored ones: one scaling pass, then the label.
    const at::Tensor row_scale = at::where(valid, scale, 0.0).unsqueeze(1);           // (n, 1)
    exponentials.mul_(row_scale / sums);
    exponentials.scatter_add_(1, target, -row_scale);
    if (!in_place) gradient.narrow(0, begin, end - begin).copy_(exponentials);
  };
  const CrossEntropyBlocks blocks = cross_entropy_blocks(rows, vocab, logits.is_cuda(), at::get_num_threads());
  const int64_t per_block = blocks.rows_per_block;
  if (logits.is_cuda()) {
    for (int64_t b = 0; b < blocks.blocks; ++b) block(b * per_block, std::min(rows, (b + 1) * per_block));
  } else {
    // Blocks in parallel; the ATen ops inside each run on the thread that owns the block.
    at::parallel_for(0, blocks.blocks, 1, [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b) block(b * per_block, std::min(rows, (b + 1) * per_block));
    });
  }
  return losses;
}

// The single-pass form's rows: logits (N, V) with unit column stride, labels (N) contiguous; the
// per-row losses, and when `gradient` is defined (the logits' layout; may be the logits) the gradient
// times *scale. One thread block a row on a GPU; on the host the same lanes and merge tree, a row at
// a time.
at::Tensor single_pass_rows(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& gradient,
                            const at::Tensor& scale) {
  const int64_t rows = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  at::Tensor losses = at::empty({rows}, logits.options().dtype(at::kFloat));
  const bool bf16 = logits.scalar_type() == at::kBFloat16;
  void* gradient_data = gradient.defined() ? gradient.data_ptr() : nullptr;
  const float* scale_data = scale.defined() ? scale.const_data_ptr<float>() : nullptr;
  if (logits.is_cuda()) {
#ifdef TRAINER_HAVE_CUDA
    const c10::cuda::CUDAGuard guard(logits.device());
    launch_cross_entropy_cuda(logits.const_data_ptr(), labels.const_data_ptr<int64_t>(), gradient_data, scale_data,
                              losses.data_ptr<float>(), rows, vocab, stride, bf16,
                              c10::cuda::getCurrentCUDAStream(logits.device().index()));
    return losses;
#else
    throw SystemError("cross entropy: a CUDA tensor, and this build has no CUDA kernels");
#endif
  }
  const auto run = [&](const auto& row_pass) {
    at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
      std::array<SoftmaxState, kCrossEntropyLanes> states;
      for (int64_t row = first; row < last; ++row) {
        for (int lane = 0; lane < kCrossEntropyLanes; ++lane) states[lane] = row_pass.lane_state(row, lane, kCrossEntropyLanes);
        for (int k = kCrossEntropyLanes / 2; k >= 1; k /= 2)
          for (int lane = 0; lane < k; ++lane) states[lane] = softmax_merge(states[lane], states[lane + k]);
        row_pass.write_loss(row, states[0]);
        if (row_pass.gradient == nullptr) continue;
        for (int lane = 0; lane < kCrossEntropyLanes; ++lane) row_pass.write_gradient(row, states[0], lane, kCrossEntropyLanes);
      }
    });
  };
  if (bf16)
    run(CrossEntropyRow<uint16_t>{static_cast<const uint16_t*>(logits.const_data_ptr()), labels.const_data_ptr<int64_t>(),
                                  static_cast<uint16_t*>(gradient_data), scale_data, losses.data_ptr<float>(), vocab,
                                  stride});
  else
    run(CrossEntropyRow<float>{logits.const_data_ptr<float>(), labels.const_data_ptr<int64_t>(),
                               static_cast<float*>(gradient_data), scale_data, losses.data_ptr<float>(), vocab, stride});
  return losses;
}

// Rows with unit column stride and one row stride (a (N, V) view of a padded (N, V') buffer is), as the
// single pass reads them; anything else is made contiguous.
at::Tensor single_pass_layout(const at::Tensor& flat_logits) {
  return flat_logits.stride(1) == 1 && flat_logits.stride(0) >= flat_logits.size(1) ? flat_logits
                                                                                     : flat_logits.contiguous();
}

// Mean over counted rows; the gradient of that mean is computed with it and handed to backward.
// logits (N, W) contiguous, of which the first `vocab` columns count: the gradient is (N, W), zero
// past them.
struct FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& logits,
                            const at::Tensor& labels, int64_t vocab, bool single_pass, bool may_overwrite) {
    const at::Tensor flat_labels = labels.contiguous();
    const at::Tensor count = flat_labels.ne(kIgnoreIndex).sum().to(at::kFloat);
    const at::Tensor all = logits.detach();
    // The head's output has no other reader: the single pass writes its gradient over it. A leaf (a
    // caller's own tensor) keeps its values.
    at::Tensor gradient = single_pass && may_overwrite ? all : at::empty_like(all);
    const at::Tensor rows = all.narrow(1, 0, vocab), gradient_rows = gradient.narrow(1, 0, vocab);
    const at::Tensor losses = single_pass ? single_pass_rows(rows, flat_labels, gradient_rows, count.reciprocal())
                                          : cross_entropy_rows(rows, flat_labels, gradient_rows, count.reciprocal());
    // (the single pass zeroes the pads itself)
    if (!single_pass && vocab < all.size(1)) gradient.narrow(1, vocab, all.size(1) - vocab).zero_();
    context->saved_data["gradient"] = gradient;
    context->mark_non_differentiable({labels});
    return losses.sum() / count;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grad_outputs) {
    // Taken out of the context so that it is freed once the next node has used it (saved_data
    // outlives backward: the loss keeps the graph until the micro-batch ends).
    at::Tensor gradient = context->saved_data["gradient"].toTensor();
    context->saved_data.erase("gradient");
    const at::Tensor& scale = grad_outputs[0];
    // On a GPU the scale is never read (a read drains the device): it multiplies. On the host a
    // scale of exactly 1 (no accumulation) saves a pass over N x V.
    if (scale.is_cuda() || !(scale.numel() == 1 && scale.item<double>() == 1.0)) gradient.mul_(scale);
    return {gradient, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

CrossEntropyBlocks cross_entropy_blocks(int64_t rows, int64_t vocab, bool on_cuda, int64_t threads) {
  CrossEntropyBlocks blocks;
  blocks.rows_per_block = std::max<int64_t>(1, (on_cuda ? kDeviceBlockBytes : kHostBlockBytes) / (4 * vocab));
  blocks.blocks = (rows + blocks.rows_per_block - 1) / blocks.rows_per_block;
  // at::parallel_for with a grain of 1 gives each thread a contiguous run of blocks.
  blocks.concurrent = on_cuda ? std::min<int64_t>(1, blocks.blocks) : std::min(blocks.blocks, std::max<int64_t>(1, threads));
  return blocks;
}

int64_t cross_entropy_transient_bytes(int64_t rows, int64_t vocab, at::ScalarType logits_dtype, bool with_gradient,
                                      bool on_cuda, int64_t threads) {
  const CrossEntropyBlocks blocks = cross_entropy_blocks(rows, vocab, on_cuda, threads);
  const int64_t block_rows = std::min(rows, blocks.rows_per_block);
  const bool fp32 = logits_dtype == at::kFloat;
  // The gradient is made in the logits' dtype: fp32 logits in training take the exponentials in place.
  const int64_t per_block = 4 * block_rows * vocab * ((fp32 ? 0 : 1) + (fp32 && with_gradient ? 0 : 1));
  return per_block * blocks.concurrent;
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, CrossEntropyForm form, int64_t vocab) {
  const int64_t width = logits.size(-1);
  if (vocab < 0) vocab = width;
  LLM_REQUIRE(vocab >= 1 && vocab <= width, "cross entropy", "vocab",
              "must be within the logits' " + std::to_string(width) + " columns (got " + std::to_string(vocab) + ")");
  const at::Tensor flat_logits = logits.reshape({-1, width});
  const at::Tensor flat_labels = labels.reshape({-1});
  const bool single_pass = form == CrossEntropyForm::single_pass;
  if (single_pass)
    LLM_REQUIRE(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16, "cross entropy",
                "single_pass", "needs fp32 or bf16 logits");
  if (at::GradMode::is_enabled() && flat_logits.requires_grad()) {
    // A view of the caller's intermediate (the head's output) may be written over; a copy may too.
    const at::Tensor rows = flat_logits.contiguous();
    return FusedCrossEntropy::apply(rows, flat_labels, vocab, single_pass, /*may_overwrite=*/!logits.is_leaf());
  }
  const at::Tensor contiguous_labels = flat_labels.contiguous();
  const at::Tensor count = contiguous_labels.ne(kIgnoreIndex).sum().to(at::kFloat);
  const at::Tensor rows = flat_logits.detach().narrow(1, 0, vocab);
  const at::Tensor losses = single_pass ? single_pass_rows(single_pass_layout(rows), contiguous_labels, at::Tensor(), at::Tensor())
                                        : cross_entropy_rows(rows, contiguous_labels, at::Tensor(), at::Tensor());
  return losses.sum() / count;
}

at::Tensor causal_lm_loss_reference(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t vocab = logits.size(-1);
  return at::cross_entropy_loss(logits.reshape({-1, vocab}).to(at::kFloat), labels.reshape({-1}),
                                /*weight=*/{}, at::Reduction::Mean, kIgnoreIndex);
}

}  // namespace llm
