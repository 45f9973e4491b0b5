// The training loss: mean next-token cross entropy over the labels that are not -100, computed in
// fp32 from logits of any dtype, as transformers' LlamaForCausalLM computes it (upcast, log-softmax,
// NLL, mean over the counted tokens).
//
// Fused. ATen's cross_entropy makes about six passes over the (tokens x vocab) logits: log-softmax
// written and read by NLL, then in backward a zero-filled NLL gradient, and log-softmax's backward
// reading two such tensors and writing a third. Here the forward walks blocks of rows small enough
// to stay in cache and, when a gradient will be needed, writes d loss / d logits =
// (softmax - onehot(label)) / count straight away: one read of the logits, one write of the
// gradient (in the logits' dtype, rounded once, as ATen's backward through the upcast rounds it).
// The backward only scales that gradient by the incoming scalar, in place. Evaluation (no grad)
// writes nothing. Loss and gradient equal ATen's to fp32 rounding (summation order within a row).
#pragma once

#include <ATen/core/Tensor.h>

namespace llm {

// How the loss walks the logits.
//   blocked:     the row blocks above, in ATen operations, on every device (the default).
//   single_pass: model/cross_entropy_functor.h: an online max and sum per row (the logits read once),
//                then the gradient written in one more read, over the logits themselves when they are
//                an intermediate (the head's output, which nothing else reads): no (tokens x vocab)
//                buffer beyond the logits. The CUDA kernel on a GPU (--fused_ops cross_entropy), the
//                same functions in a loop on the CPU (what the CPU tests check).
enum class CrossEntropyForm { blocked, single_pass };

// logits (..., W) fp32 or bf16 of which the first `vocab` columns count (-1: all W; a padded
// vocabulary's logits, --pad_matmul_dims, are read in place, without a copy), labels (...) int64
// (-100: ignored). Returns a 0-d fp32 loss: NaN when every label is ignored (as ATen's mean over no
// element). The logits' gradient has their W columns, zero past `vocab`.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels,
                          CrossEntropyForm form = CrossEntropyForm::blocked, int64_t vocab = -1);

// The row blocks the fused loss works in, and so what it allocates beyond the loss and the
// gradient it keeps, which trainer estimate counts (memory/estimate_simulation.cpp). On the host a block
// is about 2 MiB of fp32 rows, and as many blocks run at once as LibTorch has threads; on a GPU a
// block is about 64 MiB of fp32 rows (at a 32k vocabulary: 512 rows, a few dozen launches per
// thousand rows), one at a time: all the rows at once would hold an fp32 copy of every logit and an
// fp32 buffer of exponentials beside the gradient, 8 x rows x V bytes (2.1 GB at 8 x 1024 tokens).
struct CrossEntropyBlocks {
  int64_t rows_per_block = 0;
  int64_t blocks = 0;
  int64_t concurrent = 0;  // blocks in flight at once
};
CrossEntropyBlocks cross_entropy_blocks(int64_t rows, int64_t vocab, bool on_cuda, int64_t threads);
// The most bytes the loss holds at once beyond its (rows) per-row losses and the gradient it
// writes: per block in flight, the fp32 upcast of the block (logits not fp32) and its exponentials
// (unless they are written straight into an fp32 gradient: training with fp32 logits). The (rows, 1)
// per-row vectors are left out (8 bytes a row, a few per block).
int64_t cross_entropy_transient_bytes(int64_t rows, int64_t vocab, at::ScalarType logits_dtype, bool with_gradient,
                                      bool on_cuda, int64_t threads);

// The same through ATen's cross_entropy (the reference the fused loss is tested against).
at::Tensor causal_lm_loss_reference(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace llm
