#include "optim/shard_optimizer.h"
#include "common/host_memory.h"

#include <algorithm>

#include <cmath>
#include <cstdlib>

#include <ATen/ATen.h>

#include "common/errors.h"
#include "optim/adamw.h"
#include "optim/shard_state.h"
#include "sharding/communicator.h"

namespace llm {
namespace {

constexpr const char* kOptimizerSource = "optimizer";

// LLM_DEBUG_PERTURB_UPDATE=STEP:FACTOR[:UNIT] (tests only): optimizer step STEP (1-based, the count a
// checkpoint's optimizer_step holds) runs at FACTOR times its lr and FACTOR times its gradient scale
// (so its moments see a scaled gradient too), for unit UNIT or every unit: a deliberately wrong update
// that the tests' run comparisons must catch on CPU, as they would on a GPU (tests/rounding_bounds.h).
// Every rule and device steps through step_unit: the host kernels, the CUDA functor, offload's worker,
// the speculative and device steps, the fused step. FACTOR 0: the step's update is not applied.
struct UpdatePerturbation {
  int64_t step = 0;  // 0: none
  double factor = 1;
  int64_t unit = -1;  // -1: every unit
};

const UpdatePerturbation& update_perturbation() {
  static const UpdatePerturbation perturbation = [] {
    UpdatePerturbation p;
    const char* text = std::getenv("LLM_DEBUG_PERTURB_UPDATE");
    if (text == nullptr || *text == '\0') return p;
    char* end = nullptr;
    p.step = std::strtoll(text, &end, 10);
    LLM_REQUIRE(end != text && *end == ':' && p.step >= 1, "LLM_DEBUG_PERTURB_UPDATE", text, "expected STEP:FACTOR[:UNIT]");
    const char* factor = end + 1;
    p.factor = std::strtod(factor, &end);
    LLM_REQUIRE(end != factor && std::isfinite(p.factor) && p.factor >= 0, "LLM_DEBUG_PERTURB_UPDATE", text,
                "FACTOR must be a finite number >= 0");
    if (*end == ':') p.unit = std::strtoll(end + 1, &end, 10);
    LLM_REQUIRE(*end == '\0', "LLM_DEBUG_PERTURB_UPDATE", text, "expected STEP:FACTOR[:UNIT]");
    return p;
  }();
  return perturbation;
}

// Views of a unit's flat state buffer for each parameter, in order; the buffer is sized here.
at::Tensor allocate_views(std::vector<ParameterState>& parameters,
                          const std::vector<std::optional<std::vector<int64_t>>>& shapes,
                          at::Tensor ParameterState::*member, const at::TensorOptions& options) {
  int64_t total = 0;
  for (const auto& shape : shapes) total += StateShapes::numel(shape);
  at::Tensor flat = empty_streamed({total}, options);  // the host step streams it
  flat.zero_();
  int64_t offset = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (!shapes[i]) continue;
    const int64_t numel = StateShapes::numel(shapes[i]);
    parameters[i].*member = flat.narrow(0, offset, numel).view(*shapes[i]);
    offset += numel;
  }
  return flat;
}

}  // namespace

void check_optimizer_settings(const OptimizerSettings& settings) {
  LLM_REQUIRE(settings.kind == "adamw" || settings.kind == "adamw_sn" || settings.kind == "galore_adamw",
              "command line", "--optimizer",
              "expected adamw, adamw_sn or galore_adamw (got \"" + settings.kind + "\")");
  check_adamw_options({settings.beta1, settings.beta2, settings.eps, settings.weight_decay});
  LLM_REQUIRE(settings.galore_rank >= 1, kOptimizerSource, "--rank", "must be >= 1");
  LLM_REQUIRE(settings.update_proj_gap >= 1, kOptimizerSource, "--update_proj_gap", "must be >= 1");
  LLM_REQUIRE(settings.projector_method == "svd" || settings.projector_method == "subspace", kOptimizerSource,
              "--galore_projector", "expected svd or subspace (got \"" + settings.projector_method + "\")");
  LLM_REQUIRE(settings.subspace_iterations >= 1, kOptimizerSource, "--subspace_iterations", "must be >= 1");
  LLM_REQUIRE(settings.state_dtype == "float32" || settings.state_dtype == "bfloat16", "command line",
              "--optimizer_state_dtype", "expected float32 or bfloat16 (got \"" + settings.state_dtype + "\")");
}

UnitShard single_parameter_unit(const std::string& name, const std::vector<int64_t>& full_shape,
                                at::Tensor master, at::Tensor gradient, UpdateRule rule, bool decay, int rank,
                                int world) {
  UnitShard unit;
  unit.layout = FlatShardLayout::from_shapes(name, {{name, full_shape}}, rank, world);
  unit.layout.parameters.front().decay = decay;
  unit.master = master.view({-1});
  unit.gradient = gradient.view({-1});
  unit.rules = {rule};
  return unit;
}

ShardOptimizer::ShardOptimizer(const OptimizerSettings& settings, std::vector<UnitShard> units,
                               Communicator* across)
    : settings_(settings), across_(across) {
  check_optimizer_settings(settings_);
  // Each rule's parameters are numbered across the whole model (GaLore spreads its SVD owners and
  // staggers its refreshes by that number).
  std::map<UpdateRule, int64_t> count, index;
  int64_t model_index = 0;
  for (const UnitShard& unit : units)
    for (UpdateRule rule : unit.rules) ++count[rule];
  for (UnitShard& unit : units) {
    const FlatShardLayout& layout = unit.layout;
    LLM_REQUIRE(unit.rules.size() == layout.parameters.size(), kOptimizerSource, layout.unit,
                "needs one update rule per parameter");
    // A bf16 gradient shard (pure bf16 AdamW at one rank: config.h's bf16_gradient_shards) only where
    // every rule reads it through the AdamW kernel, which takes bf16 gradients.
    const bool adamw_only = std::all_of(unit.rules.begin(), unit.rules.end(), [](UpdateRule r) { return r == UpdateRule::adamw; });
    for (const at::Tensor* flat : {&unit.master, &unit.gradient})
      LLM_REQUIRE(flat->defined() &&
                      (flat->scalar_type() == at::kFloat ||
                       (flat == &unit.gradient && adamw_only && flat->scalar_type() == at::kBFloat16)) &&
                      flat->is_contiguous() && flat->numel() == layout.shard_numel,
                  kOptimizerSource, layout.unit,
                  "the master and gradient shards must be contiguous float32 tensors of the layout's "
                  "shard_numel elements (a bf16 gradient only for AdamW)");
    // The rules' collectives (subset norms, GaLore's projections) run over these tensors: a
    // communicator for another device would be handed tensors it cannot carry (NCCL and host
    // tensors: --offload optimizer on GPUs), and fail only at the first step on that hardware.
    LLM_REQUIRE(across_ == nullptr || across_->device() == unit.master.device(), kOptimizerSource,
                layout.unit,
                "the state is on " + unit.master.device().str() + " but the communicator across ranks (" +
                    across_->backend_name() + ") works on " + across_->device().str() +
                    "; host state needs a host communicator (MPI), device state the device's");
    UnitState state;
    state.master = unit.master;
    std::vector<std::optional<std::vector<int64_t>>> exp_avg, exp_avg_sq, projector;
    for (size_t i = 0; i < layout.parameters.size(); ++i) {
      const ShardedParameter& parameter = layout.parameters[i];
      const UpdateRule rule = unit.rules[i];
      LLM_REQUIRE((rule == UpdateRule::adamw) == (settings_.kind == "adamw"), kOptimizerSource, parameter.name,
                  std::string("rule ") + to_string(rule) + " does not belong to --optimizer " + settings_.kind);
      ParameterState p;
      p.parameter = parameter;
      p.rule = rule;
      p.master = unit.master.narrow(0, parameter.shard_offset, parameter.shard_numel());
      p.gradient = unit.gradient.narrow(0, parameter.shard_offset, parameter.shard_numel());
      const RulePosition position{index[rule]++, count[rule], layout.rank, layout.world_size};
      const StateShapes shapes = rule_of(rule).plan(p, settings_, position);
      p.model_index = model_index++;
      exp_avg.push_back(shapes.exp_avg);
      exp_avg_sq.push_back(shapes.exp_avg_sq);
      projector.push_back(shapes.projector);
      state.parameters.push_back(std::move(p));
    }
    const at::TensorOptions options = unit.master.options();
    const at::TensorOptions moments = options.dtype(settings_.state_is_bf16() ? at::kBFloat16 : at::kFloat);
    state.exp_avg = allocate_views(state.parameters, exp_avg, &ParameterState::exp_avg, moments);
    state.exp_avg_sq = allocate_views(state.parameters, exp_avg_sq, &ParameterState::exp_avg_sq, moments);
    state.projector = allocate_views(state.parameters, projector, &ParameterState::projector, options);
    // Where each moment's local elements start in its full tensor: the rounding bits are a function
    // of the full tensor's index, so every world size rounds every element alike.
    for (ParameterState& p : state.parameters)
      for (const auto& [suffix, span] : rule_of(p.rule).spans(p)) {
        if (suffix == ".exp_avg") p.exp_avg_rounding.index_base = static_cast<uint32_t>(span.needed_begin);
        if (suffix == ".exp_avg_sq") p.exp_avg_sq_rounding.index_base = static_cast<uint32_t>(span.needed_begin);
      }
    state_bytes_ += static_cast<int64_t>(state.exp_avg.nbytes() + state.exp_avg_sq.nbytes() + state.projector.nbytes());
    units_.push_back(std::move(state));
  }
}

ShardOptimizer::~ShardOptimizer() = default;

void ShardOptimizer::set_unit_gradient(size_t unit, const at::Tensor& gradient) {
  for (ParameterState& p : units_.at(unit).parameters)
    p.gradient = gradient.defined() ? gradient.narrow(0, p.parameter.shard_offset, p.parameter.shard_numel())
                                    : at::Tensor();
}

void ShardOptimizer::begin_step() {
  ++step_;
  projector_seconds_ = 0;
}

void ShardOptimizer::step(double lr) {
  begin_step();
  for (size_t u = 0; u < units_.size(); ++u) step_unit(u, lr);
}

void ShardOptimizer::step_unit(size_t unit, double lr, double gradient_scale) {
  at::Tensor none;
  step_unit(unit, lr, none, gradient_scale);
}

void ShardOptimizer::step_unit(size_t unit, double lr, at::Tensor& compute_out, double gradient_scale) {
  LLM_REQUIRE(std::isfinite(lr) && lr >= 0, kOptimizerSource, "lr", "must be finite and >= 0");
  LLM_REQUIRE(std::isfinite(gradient_scale) && gradient_scale >= 0, kOptimizerSource, "gradient_scale",
              "must be finite and >= 0");
  LLM_REQUIRE(step_ >= 1, kOptimizerSource, "step", "step_unit before the first begin_step()");
  if (const UpdatePerturbation& wrong = update_perturbation();
      wrong.step == step_ && (wrong.unit < 0 || wrong.unit == static_cast<int64_t>(unit))) {
    lr *= wrong.factor;
    gradient_scale *= wrong.factor;
  }
  std::vector<ParameterState>& parameters = units_.at(unit).parameters;
  const int64_t t = step_;
  const double bias_correction1 = 1.0 - std::pow(settings_.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(settings_.beta2, static_cast<double>(t));
  const StepScalars scalars{lr, t, lr * std::sqrt(bias_correction2) / bias_correction1, gradient_scale};

  for (ParameterState& p : parameters) {
    // Clipping: the AdamW rule's kernel scales as it reads; the others read a scaled gradient. A
    // precomputed input was scaled, refreshed and projected where it was made.
    if (!p.precomputed_input.defined()) {
      if (gradient_scale != 1.0 && p.rule != UpdateRule::adamw) p.gradient.mul_(gradient_scale);
      double refresh_seconds = 0;
      rule_of(p.rule).refresh(p, settings_, t, across_, &refresh_seconds);
      projector_seconds_ += refresh_seconds;
    }
    p.exp_avg_rounding.key = p.exp_avg_sq_rounding.key = rounding_key(settings_.state_rounding_seed, t, p.model_index);
  }

  std::vector<MomentInputs> inputs;
  std::vector<size_t> summed;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (parameters[i].precomputed_input.defined()) {
      inputs.push_back({parameters[i].precomputed_input, at::Tensor(), false});
      continue;
    }
    inputs.push_back(rule_of(parameters[i].rule).inputs(parameters[i], across_));
    if (inputs.back().sum_over_ranks) summed.push_back(i);
  }
  if (!summed.empty()) {
    // One all-reduce for every subset sum of this unit that spans ranks. Each parameter takes a
    // segment of all its subsets (the same layout on every rank); a rank's partial sums sit at their
    // global subset index, so a subset shared by two ranks adds up.
    int64_t total = 0;
    for (size_t i : summed) total += parameters[i].subsets.total_subsets;
    at::Tensor joined = at::zeros({total}, inputs[summed.front()].second.options());
    int64_t offset = 0;
    for (size_t i : summed) {
      const SubsetGeometry& subsets = parameters[i].subsets;
      const int64_t first = subsets.kind == SubsetKind::block ? subsets.first_block : 0;
      joined.narrow(0, offset + first, inputs[i].second.numel()).copy_(inputs[i].second.reshape({-1}));
      offset += subsets.total_subsets;
    }
    across_->all_reduce(joined, ReduceOp::sum);
    offset = 0;
    for (size_t i : summed) {
      const SubsetGeometry& subsets = parameters[i].subsets;
      const int64_t first = subsets.kind == SubsetKind::block ? subsets.first_block : 0;
      inputs[i].second = joined.narrow(0, offset + first, inputs[i].second.numel()).view(inputs[i].second.sizes());
      offset += subsets.total_subsets;
    }
  }

  for (size_t i = 0; i < parameters.size(); ++i) {
    ParameterState& p = parameters[i];
    if (!compute_out.defined()) {
      rule_of(p.rule).update(p, inputs[i], settings_, scalars, across_);
      continue;
    }
    LLM_REQUIRE(compute_out.dim() == 1 && p.parameter.shard_offset + p.parameter.shard_numel() <= compute_out.numel(),
                kOptimizerSource, "compute_out", "must be a flat tensor of the unit's shard_numel elements");
    at::Tensor rows = compute_out.narrow(0, p.parameter.shard_offset, p.parameter.shard_numel());
    rule_of(p.rule).update_and_round(p, inputs[i], settings_, scalars, across_, rows);
  }
}

ShardOptimizer::UnitBuffers ShardOptimizer::unit_buffers(size_t unit) const {
  const UnitState& state = units_.at(unit);
  return {state.master, state.exp_avg, state.exp_avg_sq, state.projector};
}

namespace {

// `view`, a view of `from`, moved to the same place in `to` (a buffer of from's size and dtype).
at::Tensor moved_view(const at::Tensor& view, const at::Tensor& from, const at::Tensor& to) {
  if (!view.defined()) return view;
  return to.as_strided(view.sizes(), view.strides(), to.storage_offset() + (view.storage_offset() - from.storage_offset()));
}

}  // namespace

ShardOptimizer::UnitBuffers ShardOptimizer::rebind_unit(size_t unit, const UnitBuffers& buffers) {
  UnitState& state = units_.at(unit);
  const UnitBuffers old = unit_buffers(unit);
  for (auto [now, next] : {std::pair{&old.master, &buffers.master}, std::pair{&old.exp_avg, &buffers.exp_avg},
                           std::pair{&old.exp_avg_sq, &buffers.exp_avg_sq}, std::pair{&old.projector, &buffers.projector}})
    LLM_REQUIRE(next->defined() && next->is_contiguous() && next->numel() == now->numel() &&
                    next->scalar_type() == now->scalar_type(),
                kOptimizerSource, "rebind_unit", "needs contiguous buffers like the unit's own");
  for (ParameterState& p : state.parameters) {
    p.master = moved_view(p.master, old.master, buffers.master);
    p.exp_avg = moved_view(p.exp_avg, old.exp_avg, buffers.exp_avg);
    p.exp_avg_sq = moved_view(p.exp_avg_sq, old.exp_avg_sq, buffers.exp_avg_sq);
    p.projector = moved_view(p.projector, old.projector, buffers.projector);
  }
  state.master = buffers.master;
  state.exp_avg = buffers.exp_avg;
  state.exp_avg_sq = buffers.exp_avg_sq;
  state.projector = buffers.projector;
  return old;
}

void ShardOptimizer::step_unit_from(size_t unit, const UnitBuffers& from, double lr, at::Tensor& compute_out,
                                    double gradient_scale) {
  UnitState& state = units_.at(unit);
  const bool adamw_only = std::all_of(state.parameters.begin(), state.parameters.end(),
                                      [](const ParameterState& p) { return p.rule == UpdateRule::adamw; });
  if (!adamw_only) {
    unit_buffers(unit).copy_from(from);
    step_unit(unit, lr, compute_out, gradient_scale);
    return;
  }
  for (ParameterState& p : state.parameters) {
    p.master_from = moved_view(p.master, state.master, from.master);
    p.exp_avg_from = moved_view(p.exp_avg, state.exp_avg, from.exp_avg);
    p.exp_avg_sq_from = moved_view(p.exp_avg_sq, state.exp_avg_sq, from.exp_avg_sq);
  }
  struct ClearSources {  // however the step ends, the next one is in place again
    std::vector<ParameterState>& parameters;
    ~ClearSources() {
      for (ParameterState& p : parameters) p.master_from = p.exp_avg_from = p.exp_avg_sq_from = at::Tensor();
    }
  } clear{state.parameters};
  step_unit(unit, lr, compute_out, gradient_scale);
}

bool ShardOptimizer::unit_needs_collectives(size_t unit) const {
  if (across_ == nullptr) return false;
  for (const ParameterState& p : units_.at(unit).parameters)
    if (p.rule == UpdateRule::subset_norm || p.rule == UpdateRule::galore) return true;
  return false;
}

OwnedBytes ShardOptimizer::owned_bytes() const {
  OwnedBytes owned;
  owned.optimizer_device = state_bytes();
  return owned;
}

std::map<std::string, FullStateShape> ShardOptimizer::full_state_shapes() const {
  std::map<std::string, FullStateShape> expected;
  for (const UnitState& unit : units_)
    for (const ParameterState& p : unit.parameters)
      for (const auto& [suffix, shape] : rule_of(p.rule).full_shapes(p)) expected[p.parameter.name + suffix] = shape;
  return expected;
}

namespace {

// The parameter's buffer of one kind of state, flat.
at::Tensor state_tensor(const ParameterState& p, const std::string& suffix) {
  const at::Tensor& tensor = suffix == ".exp_avg" ? p.exp_avg : suffix == ".exp_avg_sq" ? p.exp_avg_sq : p.projector;
  return tensor.view({-1});
}

}  // namespace

std::vector<StatePiece> ShardOptimizer::state_pieces() const {
  std::vector<StatePiece> pieces;
  for (const UnitState& unit : units_)
    for (const ParameterState& p : unit.parameters) {
      const Rule& rule = rule_of(p.rule);
      const std::map<std::string, FullStateShape> shapes = rule.full_shapes(p);
      for (const auto& [suffix, span] : rule.spans(p)) {
        if (span.owned_count == 0) continue;
        pieces.push_back({p.parameter.name + suffix, shapes.at(suffix).shape, span.owned_begin,
                          state_tensor(p, suffix).narrow(0, span.owned_local, span.owned_count)});
      }
    }
  return pieces;
}

void ShardOptimizer::load_state_pieces(const ReadPiece& read, int64_t step) {
  for (UnitState& unit : units_)
    for (ParameterState& p : unit.parameters)
      for (const auto& [suffix, span] : rule_of(p.rule).spans(p)) {
        at::Tensor local = state_tensor(p, suffix);
        local.zero_();
        if (span.needed_count > 0) read(p.parameter.name + suffix, span.needed_begin, local.narrow(0, 0, span.needed_count));
      }
  step_ = step;
}

// Each full tensor is a zero tensor into which every rank writes the part it owns (Rule::spans: the
// parts tile it), summed over ranks: one all-reduce per tensor, every rank in the same order.
std::map<std::string, at::Tensor> ShardOptimizer::full_state_dict() {
  std::map<std::string, at::Tensor> state;
  for (const UnitState& unit : units_)
    for (const ParameterState& p : unit.parameters) {
      const Rule& rule = rule_of(p.rule);
      const std::map<std::string, FullStateShape> shapes = rule.full_shapes(p);
      for (const auto& [suffix, span] : rule.spans(p)) {
        const at::Tensor local = state_tensor(p, suffix);
        // fp32 whatever the state's dtype (bf16 widens exactly; loading rounds it back exactly).
        at::Tensor full = at::zeros(shapes.at(suffix).shape, local.options().dtype(at::kFloat));
        if (span.owned_count > 0)
          full.view({-1}).narrow(0, span.owned_begin, span.owned_count).copy_(local.narrow(0, span.owned_local, span.owned_count));
        sum_over_ranks(full, across_);
        state[p.parameter.name + suffix] = full;
      }
    }
  state["step"] = at::scalar_tensor(step_, at::kLong);
  return state;
}

void ShardOptimizer::load_full_state_dict(const std::map<std::string, at::Tensor>& state) {
  // Every key, shape and dtype is checked before anything is written, so a bad dict changes nothing.
  const int64_t step = check_full_state(state, full_state_shapes(), settings_.kind);
  load_state_pieces(
      [&](const std::string& key, int64_t begin, const at::Tensor& destination) {
        destination.copy_(state.at(key).reshape({-1}).narrow(0, begin, destination.numel()));
      },
      step);
}

int64_t optimizer_state_bytes(const OptimizerSettings& settings, const ShardedParameter& parameter,
                              UpdateRule rule, int world_size) {
  ParameterState state;
  state.parameter = parameter;
  state.rule = rule;
  // The rank only moves a block subset's boundaries or picks GaLore's SVD owner; the parameter's
  // first_row already says which rows it holds.
  const RulePosition position{0, 1, 0, world_size};
  const StateShapes shapes = rule_of(rule).plan(state, settings, position);
  const int64_t moment_bytes = settings.state_is_bf16() ? 2 : 4;
  return moment_bytes * (StateShapes::numel(shapes.exp_avg) + StateShapes::numel(shapes.exp_avg_sq)) +
         4 * StateShapes::numel(shapes.projector);
}

}  // namespace llm
