// The FSDP executor: a model's units, each wrapped as a ShardedUnit, run through the StepPlan
// (sharding/step_plan.h) in the order docs/sharding.md draws. FSDP2 keeps one such object per unit
// group (_fsdp_param_group.py: unshard, reshard, post-backward reduce); here one object holds them
// all because the plan, not per-module hooks, decides when each unit is gathered and released.
//
// The model is described from outside (this folder knows no LLaMA): a unit is a name, the tensors
// of its modules (initialised identically on every rank) and its forward. Units are added as the
// model builds them, so each is sharded before the next one exists.
//
//   forward(input, pass)         every unit's forward, with the plan's gathers and releases; unit
//                                inputs after the first are detached leaves, so each unit's backward
//                                runs on its own, between its gather and its release
//   backward(boundaries, loss, reduce)
//                                every unit's backward in reverse; reduce (the last micro-batch of a
//                                step): each unit's gradients are reduced into its gradient shard as
//                                soon as its backward ends; otherwise they accumulate in .grad
//   release_all()                after evaluation: free whatever is still gathered
//   publish_shards()             after the optimizer: masters -> compute shards (-> no_shard params)
//
// Per-unit events, for what acts per unit (the memory ledger today; offload, a fused optimizer step
// and checkpoints next). Listeners run on the calling thread, in the order they were added:
//   before_shard_read      the unit's rows are about to be read: before a gather or prefetch is
//                          issued, and before every forward (a resident or no_shard unit reads its
//                          parameters, views of or copies of its shard, with no gather); offload
//                          waits here for the unit's host step
//   before_gather          the unit's all-gather is about to be issued (gather or prefetch)
//   after_forward          the unit's forward has run; its parameters are still gathered
//   after_backward         the unit's backward has run; its gradients are not reduced yet
//   gradient_shard_ready   the unit's gradient shard holds this step's reduced gradient
//
// After every gather action the units' real state is checked against the plan's count of gathered
// units (a logic_error if they disagree), and the largest number gathered at once is measured.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/owned_bytes.h"
#include "common/step_timer.h"
#include "sharding/communicator.h"
#include "sharding/fsdp_unit.h"
#include "sharding/step_plan.h"

namespace llm {

struct ShardingOptions {
  ShardingStrategy strategy = ShardingStrategy::full_shard;
  bool prefetch = true;                       // gather the next unit while one runs
  at::ScalarType compute_dtype = at::kFloat;  // the parameters' dtype in compute (and in the gather)
  // A unit whose shard is the whole unit (one rank, or no_shard) keeps its parameters as views of
  // its shards instead of gathering them (sharding/fsdp_unit.h); the plan then has no gathers.
  bool resident_when_whole = true;
  // --offload parameters: each unit's compute shard in host memory, copied in at each gather
  // (sharding/fsdp_unit.h). No unit is resident; no_shard's units gather (a copy) and release as
  // full_shard's do.
  bool offload_parameters = false;
  // bf16 units at one rank keep their gradient shard in bf16 (ShardedUnit::keep_bf16_gradient);
  // the trainer sets it for pure bf16 AdamW (config/config.h's bf16_gradient_shards).
  bool bf16_gradient_shards = false;
  // Hybrid sharding (sharding/topology.h): the model's communicator is this rank's group and
  // `strategy` what the group does (full_shard, shard_grad_op); each gradient shard is all-reduced
  // over `replicas` (the ranks holding the same shard in the other groups) once per optimizer step.
  Communicator* replicas = nullptr;
  // --backward_gather_size (full_shard): each gathered unit keeps its rows over this group (a node)
  // after its training forward, and its backward gathers them over it (ShardedUnit::gather_backward_within).
  Communicator* backward_gather = nullptr;
  // --shard_optimizer_across_groups: each unit's masters and state split over `replicas` too
  // (ShardedUnit's state_across_replicas).
  bool state_across_replicas = false;
  // The replicas for host tensors (a GPU rank's; nullptr: `replicas`): parameter offload's host rows
  // all-gathered across them (ShardedUnit::set_host_replicas).
  Communicator* host_replicas = nullptr;
};

// The gather plan's strategy for units built with these options: no_shard's for resident units,
// full_shard's for no_shard with parameter offload, else the run's (the estimate plans the same).
ShardingStrategy plan_strategy(const ShardingOptions& options, bool resident);

enum class Pass { train, eval };
enum class UnitEvent { before_shard_read, before_gather, after_forward, after_backward, gradient_shard_ready };
const char* to_string(UnitEvent event);

// One unit's forward as its backward needs it: the input (a leaf that requires grad, for units
// after the first) and the output.
struct UnitBoundary {
  at::Tensor input, output;
};
using Activations = std::vector<UnitBoundary>;

class ShardedModel {
 public:
  using UnitForward = std::function<at::Tensor(const at::Tensor&)>;
  using Listener = std::function<void(UnitEvent event, size_t unit, Pass pass)>;

  ShardedModel(Communicator& communicator, ShardingOptions options);
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  // Shards a unit now (before the first forward). Returns its index.
  // logical_shapes: the parameters' shapes without the compute side's pads (ShardedUnit), or none.
  size_t add_unit(std::string name, std::vector<std::pair<std::string, at::Tensor>> parameters,
                  UnitForward forward = nullptr, std::vector<std::vector<int64_t>> logical_shapes = {});
  // The layout add_unit will give this rank's shard of such a unit (ShardedUnit::layout_for).
  FlatShardLayout layout_for(const std::string& name,
                             const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                             const std::vector<std::vector<int64_t>>& logical_shapes = {}) const {
    return ShardedUnit::layout_for(name, parameters, communicator_, options_.strategy, logical_shapes);
  }
  void set_forward(size_t unit, UnitForward forward);
  // Activation checkpointing: one flag per unit (fewer than units: the rest are not), set before the
  // first forward. A flagged unit's training forward keeps no graph and its backward recomputes it
  // (StepPlan's recompute); the last unit (whose output the loss reads) cannot be flagged.
  void set_recomputed_units(std::vector<bool> units);
  // Runs a recompute; what the caller's forward ran under (bf16 autocast) goes here, since backward
  // runs outside it. None: the recompute runs as is.
  using RecomputeScope = std::function<void(const std::function<void()>& recompute)>;
  void set_recompute_scope(RecomputeScope scope) { recompute_scope_ = std::move(scope); }

  Activations forward(const at::Tensor& input, Pass pass);
  // loss: a scalar computed from forward()'s last output. Consumes the boundaries.
  void backward(Activations& boundaries, const at::Tensor& loss, bool reduce);
  void release_all();
  void publish_shards();

  void add_listener(Listener listener) { listeners_.push_back(std::move(listener)); }
  // Forward, backward and collective time goes to this clock (none: untimed).
  void set_timer(StepTimer* timer) { timer_ = timer; }

  size_t unit_count() const { return units_.size(); }
  ShardedUnit& unit(size_t index) { return *units_.at(index); }
  const ShardedUnit& unit(size_t index) const { return *units_.at(index); }
  const StepPlan& plan() const { return plan_; }
  const ShardingOptions& options() const { return options_; }
  bool has_gather_stream() const { return gather_stream_.has_value(); }
  int64_t peak_gathered_units() const { return peak_gathered_units_; }
  // Every unit's owned bytes (parameters and gradients), summed.
  OwnedBytes owned_bytes() const;

 private:
  void apply(const UnitAction& action, Pass pass);  // a gather action of the plan
  void emit(UnitEvent event, size_t unit, Pass pass) const;
  int64_t count_gathered_units();  // gathered now; raises the peak

  Communicator& communicator_;
  ShardingOptions options_;
  std::vector<std::unique_ptr<ShardedUnit>> units_;
  std::vector<UnitForward> forwards_;
  StepPlan plan_;
  CollectiveStream gather_stream_;  // CUDA side stream for prefetches; none on CPU
  CollectiveStream reduce_stream_;  // CUDA side stream for the gradients' reductions; none on CPU
  std::vector<Listener> listeners_;
  std::vector<bool> recomputed_;
  RecomputeScope recompute_scope_;
  StepTimer* timer_ = nullptr;
  int64_t peak_gathered_units_ = 0;
  bool started_ = false;  // a pass has run: no more units
};

}  // namespace llm
