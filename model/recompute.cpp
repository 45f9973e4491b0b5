#include "model/recompute.h"

#include <algorithm>

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include "common/autocast.h"
#include "common/split.h"

namespace llm {
namespace {

// The operation travels to backward in the context, as a capsule (no class registration needed).
struct OperationHolder : torch::CustomClassHolder {
  explicit OperationHolder(RecomputedOperation run) : operation(std::move(run)) {}
  RecomputedOperation operation;
};

class Recomputed : public torch::autograd::Function<Recomputed> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* context,
                                                c10::intrusive_ptr<OperationHolder> holder,
                                                at::TensorList input_list) {
    const std::vector<at::Tensor> inputs = input_list.vec();
    std::vector<at::Tensor> outputs;
    {
      at::NoGradGuard no_graph;
      outputs = holder->operation(inputs);
    }
    context->save_for_backward(inputs);
    context->saved_data["operation"] = c10::IValue::make_capsule(std::move(holder));
    const c10::DeviceType device_type = inputs.front().device().type();
    context->saved_data["device_type"] = static_cast<int64_t>(device_type);
    context->saved_data["autocast"] = at::autocast::is_autocast_enabled(device_type);
    context->saved_data["autocast_dtype"] = static_cast<int64_t>(at::autocast::get_autocast_dtype(device_type));
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list output_grads) {
    const torch::autograd::variable_list saved = context->get_saved_variables();
    const auto holder = c10::static_intrusive_pointer_cast<OperationHolder>(context->saved_data["operation"].toCapsule());
    std::vector<at::Tensor> inputs;
    for (const at::Tensor& input : saved)
      inputs.push_back(input.defined() ? input.detach().requires_grad_(input.requires_grad()) : input);
    std::vector<at::Tensor> outputs;
    {
      at::AutoGradMode with_graph(true);
      // The autocast state the forward ran under (backward runs outside the training's region), as
      // torch.utils.checkpoint restores it, with the cast cache off (common/autocast.h says why).
      AutocastRegion autocast(static_cast<c10::DeviceType>(context->saved_data["device_type"].toInt()),
                              static_cast<at::ScalarType>(context->saved_data["autocast_dtype"].toInt()),
                              context->saved_data["autocast"].toBool(), AutocastCache::off);
      outputs = holder->operation(inputs);
    }
    std::vector<at::Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].defined() && outputs[i].requires_grad() && output_grads[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(output_grads[i]);
      }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    torch::autograd::variable_list input_grads = {at::Tensor()};  // the holder's
    for (const at::Tensor& input : inputs) input_grads.push_back(input.defined() && input.requires_grad() ? input.grad() : at::Tensor());
    return input_grads;
  }
};

}  // namespace

RecomputeSet recompute_set(const std::string& list) {
  RecomputeSet set;
  for (const std::string& item : split_list(list)) {
    set.norm = set.norm || item == "norm";
    set.swiglu = set.swiglu || item == "swiglu";
    set.mlp = set.mlp || item == "mlp";
    set.attention = set.attention || item == "attention";
  }
  return set;
}

std::vector<at::Tensor> recompute(const RecomputedOperation& operation, const std::vector<at::Tensor>& inputs) {
  const bool tracked = at::GradMode::is_enabled() &&
                       std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!tracked) return operation(inputs);
  // A TensorList, not a vector: autograd::Function counts only Tensors and TensorLists as inputs.
  return Recomputed::apply(c10::make_intrusive<OperationHolder>(operation), at::TensorList(inputs));
}

std::pair<at::Tensor, at::Tensor> recompute_norm(const std::function<at::Tensor(const at::Tensor&)>& norm,
                                                 const at::Tensor& x) {
  const std::vector<at::Tensor> outputs = recompute(
      [norm](const std::vector<at::Tensor>& in) {
        at::Tensor normed = norm(in[0]);
        // Made after the norm's operations, so its gradient reaches x first in backward, as the
        // residual add's does without recomputation.
        return std::vector<at::Tensor>{in[0].view_as(in[0]), normed};
      },
      {x});
  return {outputs[0], outputs[1]};
}

}  // namespace llm
