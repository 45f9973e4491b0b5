// Recompute by operation (--recompute norm,swiglu,mlp,attention): an operation that keeps nothing
// for its backward but its inputs, and runs its forward again when its gradient is asked for, as
// torch.utils.checkpoint's reentrant form does for one operation. Its forward runs without a
// graph; its backward runs the forward again on its saved inputs (detached), back-propagates the
// incoming gradients through that graph (the parameters used inside accumulate their gradients as
// they would without recomputation) and returns the inputs' gradients.
//
// Bitwise equal to no recomputation: the same forward operations run in the same order, and the
// same backward operations. Where an input has consumers both inside and outside the operation
// (a norm's input, which the residual add also reads), the gradients meeting at it are summed in
// another grouping than without recomputation ((outside + inside a) + inside b, against outside +
// (inside a + inside b)); recompute_norm below passes the input through the operation for that
// reason, so the sum keeps its grouping.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace llm {

// Which operations of a decoder layer recompute (the head's final norm with `norm`).
struct RecomputeSet {
  bool norm = false;       // the RMSNorms: keep x, free rstd (all the norm node keeps besides x)
  bool swiglu = false;     // silu(gate) * up: keep gate and up, free silu(gate)
  bool mlp = false;        // the whole MLP: keep its input, free gate, up, silu and their product
  bool attention = false;  // the attention: keep its input, free q, k, v, rotary, SDPA's outputs
  bool any() const { return norm || swiglu || mlp || attention; }
};

// The choices of --recompute, in order; "block" is the whole-layer checkpointing of
// --activation_checkpointing, handled by the unit plan (sharding/step_plan.h), not here.
inline constexpr const char* kRecomputeChoices[] = {"norm", "swiglu", "mlp", "attention", "block"};

// The set a validated --recompute list names ("block" is not in it: see above).
RecomputeSet recompute_set(const std::string& list);

// Runs `operation` on `inputs` keeping only the inputs for backward (above). The outputs require
// grad when any input does and grad mode is on; otherwise it is `operation(inputs)` itself.
using RecomputedOperation = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
std::vector<at::Tensor> recompute(const RecomputedOperation& operation, const std::vector<at::Tensor>& inputs);

// norm(x) recomputed, and x passed through the operation: returns (x, norm(x)); the caller uses the
// first in place of x (the residual add), so every gradient reaching x is summed inside the
// operation's backward in the order it would be without recomputation.
std::pair<at::Tensor, at::Tensor> recompute_norm(const std::function<at::Tensor(const at::Tensor&)>& norm,
                                                 const at::Tensor& x);

}  // namespace llm
