#include "sharding/sharded_model.h"

#include "common/collective_log.h"

#include <optional>

#include <stdexcept>

#include <ATen/core/grad_mode.h>

namespace llm {

const char* to_string(UnitEvent event) {
  switch (event) {
    case UnitEvent::before_shard_read: return "before_shard_read";
    case UnitEvent::before_gather: return "before_gather";
    case UnitEvent::after_forward: return "after_forward";
    case UnitEvent::after_backward: return "after_backward";
    case UnitEvent::gradient_shard_ready: return "gradient_shard_ready";
  }
  return "?";
}

ShardingStrategy plan_strategy(const ShardingOptions& options, bool resident) {
  // Resident units (the whole unit on this rank) are never gathered nor released: no_shard's plan.
  if (resident) return ShardingStrategy::no_shard;
  // With parameter offload no_shard's units are copied in and freed around each use.
  if (options.offload_parameters && options.strategy == ShardingStrategy::no_shard) return ShardingStrategy::full_shard;
  return options.strategy;
}

ShardedModel::ShardedModel(Communicator& communicator, ShardingOptions options)
    : communicator_(communicator), options_(options) {
  if (options_.prefetch) gather_stream_ = make_gather_stream(communicator_.device());
  reduce_stream_ = make_gather_stream(communicator_.device());  // std::nullopt on CPU
}

ShardedModel::~ShardedModel() = default;

size_t ShardedModel::add_unit(std::string name, std::vector<std::pair<std::string, at::Tensor>> parameters,
                              UnitForward forward, std::vector<std::vector<int64_t>> logical_shapes) {
  if (started_) throw std::logic_error("ShardedModel: unit " + name + " added after the first pass");
  units_.push_back(std::make_unique<ShardedUnit>(std::move(name), std::move(parameters), communicator_,
                                                 options_.strategy, options_.compute_dtype,
                                                 options_.resident_when_whole, options_.offload_parameters,
                                                 std::move(logical_shapes), options_.replicas,
                                                 options_.state_across_replicas));
  units_.back()->set_reduce_stream(reduce_stream_);
  if (options_.host_replicas != nullptr) units_.back()->set_host_replicas(*options_.host_replicas);
  if (options_.backward_gather != nullptr && !units_.back()->resident())
    units_.back()->gather_backward_within(*options_.backward_gather);
  if (options_.bf16_gradient_shards) units_.back()->keep_bf16_gradient();
  forwards_.push_back(std::move(forward));
  // Nothing has run yet, so a fresh plan over the units so far is the plan.
  plan_ = StepPlan(static_cast<int64_t>(units_.size()), plan_strategy(options_, units_.back()->resident()),
                   options_.prefetch);
  plan_.set_recomputed(recomputed_);
  count_gathered_units();  // no_shard units stay gathered from the start
  return units_.size() - 1;
}

void ShardedModel::set_forward(size_t unit, UnitForward forward) { forwards_.at(unit) = std::move(forward); }

void ShardedModel::set_recomputed_units(std::vector<bool> units) {
  if (started_) throw std::logic_error("ShardedModel: set_recomputed_units after the first forward");
  if (!units_.empty() && units.size() >= units_.size() && units[units_.size() - 1])
    throw std::logic_error("ShardedModel: the last unit's output is the loss's input; it cannot be recomputed");
  recomputed_ = std::move(units);
  plan_.set_recomputed(recomputed_);
}

void ShardedModel::emit(UnitEvent event, size_t unit, Pass pass) const {
  for (const Listener& listener : listeners_) listener(event, unit, pass);
}

Activations ShardedModel::forward(const at::Tensor& input, Pass pass) {
  started_ = true;
  Activations boundaries;
  at::Tensor x = input;
  for (const UnitAction& action : plan_.forward_pass()) {
    if (action.op != UnitOp::forward) {
      // A training forward's release keeps the node's copy for the backward's gather (hpZ).
      if (action.op == UnitOp::release && pass == Pass::train && at::GradMode::is_enabled())
        units_.at(static_cast<size_t>(action.unit))->keep_backward_copy();
      apply(action, pass);
      continue;
    }
    const size_t u = static_cast<size_t>(action.unit);
    if (!forwards_[u]) throw std::logic_error("ShardedModel: unit " + units_[u]->name() + " has no forward");
    const bool track = pass == Pass::train && at::GradMode::is_enabled();
    at::Tensor unit_input = (u == 0 || !track) ? x : x.detach().requires_grad_(true);
    at::Tensor output;
    emit(UnitEvent::before_shard_read, u, pass);
    {
      StepTimer::Scope timed(timer_, StepPhase::forward);
      // A recomputed unit keeps no graph now; its backward runs the forward again (recompute).
      std::optional<at::NoGradGuard> without_graph;
      if (track && plan_.recomputed(static_cast<int64_t>(u))) without_graph.emplace();
      output = forwards_[u](unit_input);
    }
    emit(UnitEvent::after_forward, u, pass);
    boundaries.push_back({unit_input, output});
    x = output;
  }
  return boundaries;
}

void ShardedModel::backward(Activations& boundaries, const at::Tensor& loss, bool reduce) {
  if (boundaries.size() != units_.size())
    throw std::logic_error("ShardedModel::backward: boundaries of " + std::to_string(boundaries.size()) +
                           " units for a model of " + std::to_string(units_.size()));
  at::Tensor grad_output;
  for (const UnitAction& action : plan_.backward_pass(reduce)) {
    const size_t u = static_cast<size_t>(action.unit);
    switch (action.op) {
      case UnitOp::backward: {
        units_[u]->prepare_gradients();
        {
          StepTimer::Scope timed(timer_, StepPhase::backward);
          if (u + 1 == units_.size())
            loss.backward();
          else
            boundaries[u].output.backward(grad_output);
        }
        if (u > 0) grad_output = boundaries[u].input.grad();
        boundaries[u] = {};
        emit(UnitEvent::after_backward, u, Pass::train);
        break;
      }
      case UnitOp::recompute: {
        // The unit's forward again from its saved input (a leaf: the gradient for the unit before
        // arrives in its .grad as before), with the graph, in the forward's autocast state.
        StepTimer::Scope timed(timer_, StepPhase::forward);
        UnitBoundary& boundary = boundaries[u];
        auto run = [&] { boundary.output = forwards_[u](boundary.input); };
        if (recompute_scope_)
          recompute_scope_(run);
        else
          run();
        break;
      }
      case UnitOp::reduce_gradients: {
        {
          StepTimer::Scope timed(timer_, StepPhase::collectives);
          // One reduction in flight (CUDA): the compute stream waits for the last unit's before this
          // one's, and its flat input goes (sharding/fsdp_unit.h).
          for (auto& unit : units_) unit->wait_reduced();
          const CollectiveLog::UnitScope logged(static_cast<int64_t>(u));
          units_[u]->reduce_gradients();
        }
        emit(UnitEvent::gradient_shard_ready, u, Pass::train);
        break;
      }
      default:
        apply(action, Pass::train);
    }
  }
  // What follows on the compute stream (the norm, the optimizer, the next step) reads the shards.
  if (reduce)
    for (auto& unit : units_) unit->wait_reduced();
}

void ShardedModel::release_all() {
  for (const UnitAction& action : plan_.release_all()) apply(action, Pass::eval);
}

void ShardedModel::publish_shards() {
  for (auto& unit : units_) unit->publish_shard();
}

void ShardedModel::apply(const UnitAction& action, Pass pass) {
  ShardedUnit& unit = *units_.at(static_cast<size_t>(action.unit));
  StepTimer::Scope timed(timer_, StepPhase::collectives);
  const CollectiveLog::UnitScope logged(action.unit);  // the unit a gather's collective belongs to (the stall message names it)
  switch (action.op) {
    case UnitOp::gather:
      emit(UnitEvent::before_shard_read, static_cast<size_t>(action.unit), pass);
      emit(UnitEvent::before_gather, static_cast<size_t>(action.unit), pass);
      unit.gather();
      break;
    case UnitOp::prefetch:
      emit(UnitEvent::before_shard_read, static_cast<size_t>(action.unit), pass);
      emit(UnitEvent::before_gather, static_cast<size_t>(action.unit), pass);
      unit.gather_async(gather_stream_);
      break;
    case UnitOp::wait: unit.wait_gathered(); break;
    case UnitOp::release: unit.release(); break;
    default:
      throw std::logic_error(std::string("ShardedModel: ") + to_string(action.op) + " is not a gather action");
  }
  // The plan's bookkeeping must describe the units, or its bound would mean nothing.
  const int64_t gathered_now = count_gathered_units();
  if (unit.gathered() != (action.op != UnitOp::release) || gathered_now != action.gathered_units)
    throw std::logic_error("gather plan: after " + std::string(to_string(action.op)) + " of unit " + unit.name() +
                           " the unit is " + (unit.gathered() ? "gathered" : "released") + " and " +
                           std::to_string(gathered_now) + " unit(s) are gathered, but the plan counts " +
                           std::to_string(action.gathered_units));
}

int64_t ShardedModel::count_gathered_units() {
  int64_t gathered_now = 0;
  for (const auto& unit : units_) gathered_now += unit->gathered() ? 1 : 0;
  peak_gathered_units_ = std::max(peak_gathered_units_, gathered_now);
  return gathered_now;
}

OwnedBytes ShardedModel::owned_bytes() const {
  OwnedBytes owned;
  for (const auto& unit : units_) owned += unit->owned_bytes();
  return owned;
}

}  // namespace llm
