#include "model/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

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
    const at::Tensor max = std::get<0>(x.max(1, /*keepdim=*/true));                 // (n, 1)
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

// Mean over counted rows; the gradient of that mean is computed with it and handed to backward.
struct FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& logits,
                            const at::Tensor& labels) {
    const at::Tensor flat_logits = logits.detach().contiguous(), flat_labels = labels.contiguous();
    const at::Tensor count = flat_labels.ne(kIgnoreIndex).sum().to(at::kFloat);
    at::Tensor gradient = at::empty_like(flat_logits);
    const at::Tensor losses = cross_entropy_rows(flat_logits, flat_labels, gradient, count.reciprocal());
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
    return {gradient, at::Tensor()};
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

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t vocab = logits.size(-1);
  const at::Tensor flat_logits = logits.reshape({-1, vocab});
  const at::Tensor flat_labels = labels.reshape({-1});
  if (at::GradMode::is_enabled() && flat_logits.requires_grad())
    return FusedCrossEntropy::apply(flat_logits, flat_labels);
  const at::Tensor contiguous_labels = flat_labels.contiguous();
  const at::Tensor count = contiguous_labels.ne(kIgnoreIndex).sum().to(at::kFloat);
  return cross_entropy_rows(flat_logits.detach().contiguous(), contiguous_labels, at::Tensor(), at::Tensor()).sum() /
         count;
}

at::Tensor causal_lm_loss_reference(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t vocab = logits.size(-1);
  return at::cross_entropy_loss(logits.reshape({-1, vocab}).to(at::kFloat), labels.reshape({-1}),
                                /*weight=*/{}, at::Reduction::Mean, kIgnoreIndex);
}

}  // namespace llm
