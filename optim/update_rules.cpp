#include "optim/update_rules.h"

#include <chrono>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/accumulate.h>

#include "common/errors.h"
#include "optim/adamw.h"

#ifdef TRAINER_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "optim/adamw_kernels.h"
#endif

namespace llm {
namespace {

// A state tensor sharded like the parameter, in whole rows: this rank owns and needs its rows.
StateSpan rows_span(const ShardedParameter& p, const std::vector<int64_t>& full_shape) {
  const int64_t per_row = c10::multiply_integers(full_shape) / p.rows;
  const int64_t begin = p.first_row * per_row, count = p.rows_held * per_row;
  return {begin, count, 0, begin, count};
}

// A state tensor every rank holds whole: written once, by the rank holding the parameter's first
// row (rank 0 of the parameter's shard group; a no_shard rank holds every row), read by all.
StateSpan replicated_span(const ShardedParameter& p, const std::vector<int64_t>& full_shape) {
  const int64_t count = c10::multiply_integers(full_shape);
  return {0, p.first_row == 0 ? count : 0, 0, 0, count};
}

// A flat state tensor cut in chunks of `chunk` elements, rank r holding [r * chunk, (r + 1) * chunk).
StateSpan chunk_span(int64_t total, int64_t chunk, int rank) {
  const int64_t begin = std::min<int64_t>(total, rank * chunk);
  const int64_t count = std::min<int64_t>(total, begin + chunk) - begin;
  return {begin, count, 0, begin, count};
}

std::vector<int64_t> flat_like_parameter(const ParameterState& state) {
  return {state.parameter.shard_numel()};
}

// torch.optim.AdamW, fused: one pass reads p, g, m, v once and writes p, m, v once.
class TorchAdamW final : public Rule {
 public:
  StateShapes plan(ParameterState& state, const OptimizerSettings&, const RulePosition&) const override {
    return {flat_like_parameter(state), flat_like_parameter(state), std::nullopt};
  }
  std::map<std::string, FullStateShape> full_shapes(const ParameterState& state) const override {
    return {{".exp_avg", {state.parameter.full_shape}}, {".exp_avg_sq", {state.parameter.full_shape}}};
  }
  std::map<std::string, StateSpan> spans(const ParameterState& state) const override {
    const StateSpan rows = rows_span(state.parameter, state.parameter.full_shape);
    return {{".exp_avg", rows}, {".exp_avg_sq", rows}};
  }
  void update(ParameterState& state, const MomentInputs& inputs, const OptimizerSettings& settings,
              const StepScalars& scalars, Communicator*) const override {
    at::Tensor none;
    update_and_round(state, inputs, settings, scalars, nullptr, none);
  }
  // The host kernel writes the bf16 copy in its one pass (optim/adamw_host.h).
  void update_and_round(ParameterState& state, const MomentInputs& inputs, const OptimizerSettings& settings,
                        const StepScalars& scalars, Communicator*, at::Tensor& compute_out) const override {
    const AdamWOptions options{settings.beta1, settings.beta2, settings.eps, settings.weight_decay};
    const AdamWSources sources{state.master_from, state.exp_avg_from, state.exp_avg_sq_from};
    adamw_update(state.master, inputs.first, state.exp_avg, state.exp_avg_sq, scalars.lr, options,
                 state.parameter.decay ? settings.weight_decay : 0.0, scalars.t, compute_out, state.exp_avg_rounding,
                 scalars.gradient_scale, state.master_from.defined() ? &sources : nullptr);
  }
};

// The HF-style AdamW of the references, which the three rules below share: moments on what
// inputs() feeds them, the denominator sqrt(v) + eps, a rule-specific update, then decoupled weight
// decay after the update (as the references apply it).
class HfStyleRule : public Rule {
 public:
  // bf16 state (--optimizer_state_dtype bfloat16) is stepped in fp32 copies and stored back rounded
  // stochastically; the update uses the fp32 moments, as AdamW's fused kernel does.
  void update(ParameterState& state, const MomentInputs& inputs, const OptimizerSettings& settings,
              const StepScalars& scalars, Communicator* across) const final {
    const bool bf16 = state.exp_avg_sq.scalar_type() == at::kBFloat16;
    const auto in_fp32 = [bf16](const at::Tensor& moment) { return bf16 ? moment.to(at::kFloat) : moment; };
    const at::Tensor& x = inputs.first;
    at::Tensor numerator = x;
    if (settings.beta1 > 0) {
      at::Tensor exp_avg = in_fp32(state.exp_avg);
      exp_avg.mul_(settings.beta1).add_(x, 1.0 - settings.beta1);
      if (bf16) store_stochastically_rounded(state.exp_avg, exp_avg, state.exp_avg_rounding, false);
      numerator = exp_avg;
    }
    at::Tensor exp_avg_sq = in_fp32(state.exp_avg_sq);
    if (inputs.second.defined())
      exp_avg_sq.mul_(settings.beta2).add_(inputs.second, 1.0 - settings.beta2);
    else
      exp_avg_sq.mul_(settings.beta2).addcmul_(x, x, 1.0 - settings.beta2);
    if (bf16) store_stochastically_rounded(state.exp_avg_sq, exp_avg_sq, state.exp_avg_sq_rounding, true);
    const at::Tensor denominator = exp_avg_sq.sqrt().add_(settings.eps);
    apply(state, numerator, denominator, settings, scalars, across);
    if (state.parameter.decay && settings.weight_decay > 0)
      state.master.add_(state.master, -scalars.lr * settings.weight_decay);
  }

 protected:
  // master -= step_size * (the rule's normalised update).
  virtual void apply(ParameterState& state, const at::Tensor& numerator, const at::Tensor& denominator,
                     const OptimizerSettings& settings, const StepScalars& scalars, Communicator* across) const = 0;
  static std::optional<std::vector<int64_t>> first_moment(const OptimizerSettings& settings,
                                                          std::vector<int64_t> shape) {
    if (settings.beta1 > 0) return shape;
    return std::nullopt;  // beta1 = 0: no first moment (RMSProp-SN)
  }
};

class HfAdam final : public HfStyleRule {
 public:
  StateShapes plan(ParameterState& state, const OptimizerSettings& settings, const RulePosition&) const override {
    return {first_moment(settings, flat_like_parameter(state)), flat_like_parameter(state), std::nullopt};
  }
  std::map<std::string, FullStateShape> full_shapes(const ParameterState& state) const override {
    std::map<std::string, FullStateShape> shapes = {{".exp_avg_sq", {state.parameter.full_shape}}};
    if (state.exp_avg.defined()) shapes[".exp_avg"] = {state.parameter.full_shape};
    return shapes;
  }
  std::map<std::string, StateSpan> spans(const ParameterState& state) const override {
    const StateSpan rows = rows_span(state.parameter, state.parameter.full_shape);
    std::map<std::string, StateSpan> spans = {{".exp_avg_sq", rows}};
    if (state.exp_avg.defined()) spans[".exp_avg"] = rows;
    return spans;
  }

 protected:
  void apply(ParameterState& state, const at::Tensor& numerator, const at::Tensor& denominator,
             const OptimizerSettings&, const StepScalars& scalars, Communicator*) const override {
    state.master.add_(numerator / denominator, -scalars.step_size);
  }
};

class SubsetNorm final : public HfStyleRule {
 public:
  StateShapes plan(ParameterState& state, const OptimizerSettings& settings,
                   const RulePosition& position) const override {
    state.subsets = make_subset_geometry(state.parameter, settings.subset_size, position.world);
    return {first_moment(settings, flat_like_parameter(state)), state.subsets.local_state_shape, std::nullopt};
  }
  std::map<std::string, FullStateShape> full_shapes(const ParameterState& state) const override {
    std::map<std::string, FullStateShape> shapes = {
        {".exp_avg_sq", {state.subsets.full_state_shape, "the subset-norm state"}}};
    if (state.exp_avg.defined()) shapes[".exp_avg"] = {state.parameter.full_shape};
    return shapes;
  }
  std::map<std::string, StateSpan> spans(const ParameterState& state) const override {
    const ShardedParameter& p = state.parameter;
    const SubsetGeometry& g = state.subsets;
    std::map<std::string, StateSpan> spans;
    if (state.exp_avg.defined()) spans[".exp_avg"] = rows_span(p, p.full_shape);
    switch (g.kind) {
      case SubsetKind::row:
        spans[".exp_avg_sq"] = rows_span(p, g.full_state_shape);
        break;
      case SubsetKind::column:
        spans[".exp_avg_sq"] = replicated_span(p, g.full_state_shape);
        break;
      case SubsetKind::block: {
        // A block is owned by the rank holding its first element; a rank needs every block it touches.
        const int64_t first_owned = (g.local_begin + g.subset_size - 1) / g.subset_size;
        const int64_t end = g.first_block + g.blocks_held;
        const int64_t owned = std::max<int64_t>(0, end - first_owned);
        spans[".exp_avg_sq"] = {first_owned, owned, first_owned - g.first_block, g.first_block, g.blocks_held};
        break;
      }
    }
    return spans;
  }
  MomentInputs inputs(ParameterState& state, Communicator* across) const override {
    return {state.gradient, subset_square_sums(state.subsets, state.parameter, state.gradient),
            state.subsets.spans_ranks && across != nullptr};
  }

 protected:
  void apply(ParameterState& state, const at::Tensor& numerator, const at::Tensor& denominator,
             const OptimizerSettings&, const StepScalars& scalars, Communicator*) const override {
    apply_subset_update(state.subsets, state.parameter, state.master, numerator, denominator, scalars.step_size);
  }
};

class GaLore final : public HfStyleRule {
 public:
  StateShapes plan(ParameterState& state, const OptimizerSettings& settings,
                   const RulePosition& position) const override {
    state.galore = make_galore_geometry(state.parameter, settings, position.index, position.rank, position.world);
    state.projector_seed = 0x9a10e + static_cast<uint64_t>(position.index + 1);
    if (settings.stagger_projectors)
      state.refresh_offset = position.index * settings.update_proj_gap / position.count;
    return {first_moment(settings, state.galore.local_state_shape), state.galore.local_state_shape,
            state.galore.local_projector_shape};
  }
  std::map<std::string, FullStateShape> full_shapes(const ParameterState& state) const override {
    std::map<std::string, FullStateShape> shapes = {
        {".exp_avg_sq", {state.galore.full_state_shape, "the low-rank moment"}},
        {".projector", {state.galore.full_projector_shape, "the projector"}}};
    if (state.exp_avg.defined()) shapes[".exp_avg"] = {state.galore.full_state_shape, "the low-rank moment"};
    return shapes;
  }
  std::map<std::string, StateSpan> spans(const ParameterState& state) const override {
    const ShardedParameter& p = state.parameter;
    const GaLoreGeometry& g = state.galore;
    // Right projection: moments in the parameter's rows, the projector the same on every rank. Left:
    // moments in flat chunks of the low-rank gradient, the projector in the parameter's rows.
    const StateSpan moment = g.right ? rows_span(p, g.full_state_shape) : chunk_span(g.lowrank_numel, g.chunk, g.shard_rank);
    std::map<std::string, StateSpan> spans = {
        {".exp_avg_sq", moment},
        {".projector", g.right ? replicated_span(p, g.full_projector_shape) : rows_span(p, g.full_projector_shape)}};
    if (state.exp_avg.defined()) spans[".exp_avg"] = moment;
    return spans;
  }

  // GaLore's schedule: a new projector at steps 1, T + 1, 2T + 1, ... from that step's gradient
  // (shifted per matrix by refresh_offset when staggered; every matrix gets one at step 1). Every
  // projector exists after step 1 (a checkpoint of a later step carries them).
  void refresh(ParameterState& state, const OptimizerSettings& settings, int64_t t, Communicator* across,
               double* projector_seconds) const override {
    const bool have_projectors = t > 1;
    if (!galore_refreshes_at(state, settings, t)) return;
    const auto started = std::chrono::steady_clock::now();
    if (settings.projector_method == "subspace")
      refresh_projector_subspace(state.galore, state.parameter, state.gradient, state.projector, have_projectors,
                                 have_projectors ? settings.subspace_iterations : 3 * settings.subspace_iterations,
                                 state.projector_seed, across);
    else
      refresh_projector(state.galore, state.parameter, state.gradient, state.projector, across);
    *projector_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  MomentInputs inputs(ParameterState& state, Communicator* across) const override {
    return {project(state.galore, state.parameter, state.gradient, state.projector, across), at::Tensor(), false};
  }

 protected:
  void apply(ParameterState& state, const at::Tensor& numerator, const at::Tensor& denominator,
             const OptimizerSettings& settings, const StepScalars& scalars, Communicator* across) const override {
    state.master.add_(project_back(state.galore, state.parameter, numerator / denominator, state.projector,
                                   settings.galore_scale, across),
                      -scalars.step_size);
  }
};

}  // namespace

bool galore_refreshes_at(const ParameterState& state, const OptimizerSettings& settings, int64_t t) {
  const int64_t phase = t - 1 - state.refresh_offset;
  return t == 1 || (phase >= 0 && phase % settings.update_proj_gap == 0);
}

const char* to_string(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::adamw: return "adamw";
    case UpdateRule::adam_hf: return "adam_hf";
    case UpdateRule::subset_norm: return "subset_norm";
    case UpdateRule::galore: return "galore";
  }
  return "?";
}

int64_t StateShapes::numel(const std::optional<std::vector<int64_t>>& shape) {
  if (!shape) return 0;
  int64_t count = 1;
  for (int64_t size : *shape) count *= size;
  return count;
}

const Rule& rule_of(UpdateRule rule) {
  static const TorchAdamW adamw;
  static const HfAdam adam_hf;
  static const SubsetNorm subset_norm;
  static const GaLore galore;
  switch (rule) {
    case UpdateRule::adamw: return adamw;
    case UpdateRule::adam_hf: return adam_hf;
    case UpdateRule::subset_norm: return subset_norm;
    case UpdateRule::galore: return galore;
  }
  throw std::logic_error("rule_of: unknown update rule");
}

void store_stochastically_rounded(const at::Tensor& destination, const at::Tensor& values,
                                  const StateRounding& rounding, bool high_half) {
  const at::Tensor flat = values.reshape({-1}).contiguous();
  LLM_REQUIRE(destination.scalar_type() == at::kBFloat16 && destination.is_contiguous() &&
                  flat.scalar_type() == at::kFloat && flat.numel() == destination.numel() &&
                  flat.device() == destination.device(),
              "store_stochastically_rounded", "destination",
              "must be a contiguous bf16 tensor of values' numel on values' device (values: fp32)");
  auto* to = reinterpret_cast<uint16_t*>(destination.data_ptr<at::BFloat16>());
  if (destination.device().is_cuda()) {
#ifdef TRAINER_HAVE_CUDA
    const c10::cuda::CUDAGuard device_guard(destination.device());
    launch_stochastic_round_cuda(flat.const_data_ptr<float>(), to, flat.numel(), rounding, high_half,
                                 at::cuda::getCurrentCUDAStream(destination.device().index()).stream());
    return;
#else
    throw SystemError("store_stochastically_rounded: the state is on " + destination.device().str() +
                      " but this build has no CUDA kernels");
#endif
  }
  // One pass of the specification's own functions (optim/state_rounding.h), on LibTorch's threads.
  const float* from = flat.const_data_ptr<float>();
  at::parallel_for(0, flat.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      to[i] = round_moment_element(from[i], rounding, static_cast<uint32_t>(i), high_half);
  });
}

}  // namespace llm
