#include "offload/lowrank_gradients.h"

#include <algorithm>

#include "common/errors.h"
#include "common/memory_stats.h"

namespace llm {

LowRankGradients::LowRankGradients(ShardOptimizer& optimizer, const std::vector<at::Tensor>& landing, c10::Device device,
                                   Communicator* across)
    : optimizer_(optimizer), settings_(optimizer.settings()), across_(across), matrices_(optimizer.unit_count()),
      landing_(landing) {
  for (size_t u = 0; u < optimizer_.unit_count(); ++u) {
    const std::vector<ParameterState>& unit = optimizer_.unit_state(u).parameters;
    if (std::none_of(unit.begin(), unit.end(), [](const ParameterState& p) { return p.rule == UpdateRule::galore; }))
      continue;
    if (device.is_cuda()) {
      // The projectors cross at each refresh: into page-locked host state, so the copy is
      // asynchronous and the next unit's device half is queued without waiting for this one's.
      ShardOptimizer::UnitBuffers buffers = optimizer_.unit_buffers(u);
      buffers.projector = exact_host_copy(buffers.projector, device);
      optimizer_.rebind_unit(u, buffers);
    }
    const std::vector<ParameterState>& parameters = optimizer_.unit_state(u).parameters;
    for (size_t i = 0; i < parameters.size(); ++i) {
      const ParameterState& host = parameters[i];
      if (host.rule != UpdateRule::galore) continue;
      Matrix matrix;
      matrix.parameter = i;
      matrix.on_device = host;  // the geometry, schedule and seed; its tensors replaced below
      matrix.on_device.master = matrix.on_device.exp_avg = matrix.on_device.exp_avg_sq = at::Tensor();
      matrix.on_device.gradient = at::Tensor();
      matrix.on_device.projector = host.projector.to(device, /*non_blocking=*/false, /*copy=*/true);
      // The host step's input: the low-rank gradient, in the first elements of the matrix's range of
      // the landing buffer (rows x r or r x cols never exceeds rows x cols).
      const at::Tensor range = landing_.at(u).narrow(0, host.parameter.shard_offset, host.parameter.shard_numel());
      int64_t numel = 1;
      for (int64_t size : host.galore.local_state_shape) numel *= size;
      LLM_REQUIRE(numel <= range.numel(), "offload", host.parameter.name,
                  "the low-rank gradient does not fit the matrix's landing range");
      optimizer_.set_precomputed_input(u, i, range.narrow(0, 0, numel).view(host.galore.local_state_shape));
      matrices_[u].push_back(std::move(matrix));
    }
  }
}

std::vector<std::pair<at::Tensor, at::Tensor>> LowRankGradients::prepare(size_t unit, const at::Tensor& device_gradient,
                                                                          double gradient_scale) {
  const std::vector<ParameterState>& parameters = optimizer_.unit_state(unit).parameters;
  const int64_t t = optimizer_.steps_taken();
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  double projector_seconds = 0;
  for (Matrix& matrix : matrices_.at(unit)) {
    const ParameterState& host = parameters[matrix.parameter];
    ParameterState& p = matrix.on_device;
    // As ShardOptimizer::step_unit does on the host: the gradient scaled in place, then the refresh,
    // then the projection.
    p.gradient = device_gradient.narrow(0, host.parameter.shard_offset, host.parameter.shard_numel());
    if (gradient_scale != 1.0) p.gradient.mul_(gradient_scale);
    const Rule& rule = rule_of(UpdateRule::galore);
    rule.refresh(p, settings_, t, across_, &projector_seconds);
    const at::Tensor lowrank = rule.inputs(p, across_).first;
    copies.emplace_back(host.precomputed_input, lowrank);
    if (galore_refreshes_at(p, settings_, t)) copies.emplace_back(host.projector, p.projector);  // a new one
    p.gradient = at::Tensor();  // nothing keeps the shard alive past its step
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (parameters[i].precomputed_input.defined()) continue;  // a GaLore matrix's, above
    const ShardedParameter& parameter = parameters[i].parameter;
    copies.emplace_back(landing_.at(unit).narrow(0, parameter.shard_offset, parameter.shard_numel()),
                        device_gradient.narrow(0, parameter.shard_offset, parameter.shard_numel()));
  }
  return copies;
}

void LowRankGradients::publish(size_t unit) {
  const std::vector<ParameterState>& parameters = optimizer_.unit_state(unit).parameters;
  for (Matrix& matrix : matrices_.at(unit)) matrix.on_device.projector.copy_(parameters[matrix.parameter].projector);
}

int64_t LowRankGradients::device_bytes() const {
  int64_t bytes = 0;
  for (const std::vector<Matrix>& unit : matrices_)
    for (const Matrix& matrix : unit) bytes += static_cast<int64_t>(matrix.on_device.projector.nbytes());
  return bytes;
}

}  // namespace llm
