#include "model/grouped_linear.h"

#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace llm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class GroupedLinearFunction : public torch::autograd::Function<GroupedLinearFunction> {
 public:
  static variable_list forward(AutogradContext* context, const at::Tensor& x, at::TensorList weights) {
    const at::Tensor& w0 = weights[0];
    int64_t rows = 0;
    for (const at::Tensor& w : weights) rows += w.size(0);
    const int64_t in = w0.size(1);
    // The block as one matrix (not a view of w0: its storage ends where w0 does).
    const at::Tensor joined = at::from_blob(const_cast<void*>(w0.const_data_ptr()), {rows, in}, w0.options());
    at::Tensor x_used = x, joined_used = joined;
    const c10::DeviceType device_type = x.device().type();
    if (at::autocast::is_autocast_enabled(device_type)) {  // what autocast's linear would run in
      const at::ScalarType dtype = at::autocast::get_autocast_dtype(device_type);
      x_used = x.to(dtype);
      joined_used = joined.to(dtype);
    }
    const at::Tensor y = at::linear(x_used, joined_used);
    variable_list outputs, saved{x_used};
    int64_t offset = 0;
    for (const at::Tensor& w : weights) {
      outputs.push_back(y.narrow(-1, offset, w.size(0)));
      // A cast is this node's own tensor; the weights themselves are saved as the parameters they are.
      saved.push_back(joined_used.is_same(joined) ? w : joined_used.narrow(0, offset, w.size(0)));
      offset += w.size(0);
    }
    context->save_for_backward(saved);
    context->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    context->saved_data["w_type"] = static_cast<int64_t>(w0.scalar_type());
    return outputs;
  }

  static variable_list backward(AutogradContext* context, variable_list output_grads) {
    const variable_list saved = context->get_saved_variables();
    const at::Tensor& x = saved[0];
    const int64_t in = x.size(-1);
    const at::Tensor x_rows = x.reshape({-1, in});
    at::Tensor grad_x;
    variable_list grads(saved.size());
    for (size_t i = 0; i + 1 < saved.size(); ++i) {
      const at::Tensor& w = saved[i + 1];
      if (!output_grads[i].defined()) continue;
      const at::Tensor g = output_grads[i].reshape({-1, output_grads[i].size(-1)});
      if (!grad_x.defined())
        grad_x = at::mm(g, w);
      else
        grad_x.addmm_(g, w);
      grads[i + 1] = at::mm(g.t(), x_rows).to(static_cast<at::ScalarType>(context->saved_data["w_type"].toInt()));
    }
    if (grad_x.defined())
      grads[0] = grad_x.view(x.sizes()).to(static_cast<at::ScalarType>(context->saved_data["x_type"].toInt()));
    return grads;
  }
};

}  // namespace

bool adjacent_weights(const std::vector<at::Tensor>& weights) {
  if (weights.size() < 2 || weights.size() > 3) return false;
  const at::Tensor& first = weights.front();
  const char* next = nullptr;
  for (const at::Tensor& w : weights) {
    if (!w.defined() || w.dim() != 2 || !w.is_contiguous() || w.size(1) != first.size(1) ||
        w.scalar_type() != first.scalar_type() || w.device() != first.device())
      return false;
    const char* data = static_cast<const char*>(w.const_data_ptr());
    if (data == nullptr || (next != nullptr && data != next)) return false;
    next = data + w.numel() * w.element_size();
  }
  return true;
}

std::vector<at::Tensor> grouped_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights) {
  if (!adjacent_weights(weights)) throw std::logic_error("grouped_linear: the weights are not adjacent in memory");
  return GroupedLinearFunction::apply(x, at::TensorList(weights));
}

}  // namespace llm
