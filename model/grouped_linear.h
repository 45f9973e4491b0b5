// q/k/v (and gate/up) as one GEMM: the projections of one input whose weights lie one after another
// in memory, as a gathered unit's parameters do (sharding/fsdp_unit.cpp allocates them in one block,
// in registration order) and a resident unit's do (views of its flat shard).
//
// Forward: one GEMM over the weights as one (sum of rows, in) matrix, the outputs views of its
// result: one launch where there were three, with a wider N (k and v are narrow under GQA). Backward:
// the input's gradient as one GEMM and accumulating GEMMs (beta = 1: no addition kernels, where the
// separate projections' three gradients are summed by autograd in two adds), each weight's gradient
// a GEMM of its own into its own tensor. Saved for backward: the input once and the weights
// themselves (not the block, which a release frees and the next gather replaces), or under autocast
// their bf16 casts, made as one cast of the whole block. Under autocast it saves one bf16 cast of the
// input where each separate projection kept its own (--grouped_projections: 2h bytes a token per
// projection folded in, which trainer estimate counts).
//
// Equal to the separate projections to rounding: each output element is the same dot product, and
// the input's gradient sums the same products in another grouping (tests/grouped_linear_test.cpp).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace llm {

// True when the weights (2 or 3, each (rows_i, in), contiguous, of one dtype and device) are adjacent
// in this order, so one (sum rows_i, in) matrix views them all.
bool adjacent_weights(const std::vector<at::Tensor>& weights);

// The outputs x W_i^T, as views of one (..., sum rows_i) tensor. The weights must be adjacent
// (adjacent_weights); a logic_error if not.
std::vector<at::Tensor> grouped_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights);

}  // namespace llm
