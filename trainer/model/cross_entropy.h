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

// logits (..., V) fp32 or bf16, labels (...) int64 (-100: ignored). Returns a 0-d fp32 loss: NaN
// when every label is ignored (as ATen's mean over no element).
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels);

// The same through ATen's cross_entropy (the reference the fused loss is tested against).
at::Tensor causal_lm_loss_reference(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace llm
