// The memory estimate's step simulation: one rank's training step replayed as the bytes each of its
// actions allocates and frees (StepSimulation), over the runtime's own StepPlan, units and shard
// layouts. Apart from estimate.cpp because it is the bulk of the estimate: the step op by op. The
// extrapolation for deep models, which runs it on a few layers, is in estimate_extrapolation.cpp.
#include "memory/estimate_simulation.h"
#include "memory/estimate_optimizer.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/accumulate.h>

#include "config/optimizer_setup.h"
#include "sharding/sharded_model.h"
#include "model/cross_entropy.h"
#include "model/units.h"
#include "optim/galore.h"
#include "optim/shard_optimizer.h"
#include "optim/subset_norm.h"
#include "sharding/flat_layout.h"
#include "sharding/step_plan.h"
#include "sharding/topology.h"

namespace llm {
namespace {


// One rank's step, as train() and ShardedModel run it (docs/sharding.md), for the last step of a run
// (it evaluates) with a GaLore projector refresh (step 1 always has one). The order of the step is the
// runtime's own StepPlan (sharding/step_plan.h): each of its per-unit actions is replayed here as the
// bytes it allocates and frees.
class StepSimulation {
 public:
  // The fp32 product such a CPU writes a bf16 matmul's (M x N) output through, beside the output
  // itself: measured at every shape on the Intel Xeon (family 6, model 85), the product of
  // (128..512 x 256) @ (256 x 32000) and of (32000 x n) @ (n x 256) alike; none on a GPU, in fp32,
  // or where oneDNN has native bf16 (or only AVX2).
  int64_t widened_product_bytes(int64_t rows, int64_t columns) const {
    return !cuda_ && m_.mode != ModelShape::Mode::fp32 && cpu_bf16_matmul_widens() ? rows * columns * 4 : 0;
  }

  StepSimulation(const ModelShape& model, const std::vector<UnitSpec>& units, int world, int rank, bool cuda)
      : m_(model), world_(world), rank_(rank), cuda_(cuda),
        offload_(offloads_optimizer(model.run.sharding.offload)),
        offload_parameters_(offloads_parameters(model.run.sharding.offload)),
        fused_(model.run.fuse_optimizer_with_backward),
        device_step_(offload_ && model.run.sharding.offload_step == OffloadStep::device), timeline_(cuda) {
    // The ranks a unit is sharded over: one under no_shard, a group's under hybrid sharding (whose
    // replicas' all-reduce is in place: nothing allocated), else the world.
    layout_world_ = shard_world(m_.run, world_);
    backward_gather_ = m_.run.sharding.backward_gather_size;
    // --shard_optimizer_across_groups: the world's layout (ShardedUnit's state_across_replicas), each
    // rank holding its group's G consecutive world shards as the rows it gathers.
    if (is_hybrid(m_.run.sharding.strategy) && m_.run.sharding.optimizer_across_groups) {
      blocks_ = world_ / layout_world_;
      group_size_ = layout_world_;
      layout_world_ = world_;
    }
    // One rank or no_shard: each unit is its whole shard and stays resident (sharding/fsdp_unit.h),
    // unless its parameters are offloaded.
    resident_ = layout_world_ == 1 && !offload_parameters_ && !model.config.matmul_padded();
    bf16_gradient_ = bf16_gradient_shards(m_.run, world_);  // as ShardedModel keeps them
    int64_t galore_matrices = 0;
    for (const UnitSpec& unit : units) {
      std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
      for (const ParameterSpec& parameter : unit.parameters) shapes.emplace_back(parameter.name, parameter.shape);
      UnitGeometry geometry;
      geometry.spec = &unit;
      geometry.layout = FlatShardLayout::from_shapes(unit.name, shapes, shard_rank(), layout_world_);
      geometry.whole = FlatShardLayout::from_shapes(unit.name, shapes, 0, 1);
      geometry.rules = update_rules_for(geometry.layout, m_.run);
      geometry.first_galore = galore_matrices;
      for (UpdateRule rule : geometry.rules) galore_matrices += rule == UpdateRule::galore;
      for (const ParameterSpec& parameter : unit.parameters) {
        geometry.numel += parameter.numel();
        geometry.compute_numels.push_back(parameter.compute_numel());
        geometry.compute_numel += parameter.compute_numel();
      }
      geometry.shard_numel = geometry.layout.shard_numel;
      geometry.gathered_numel = layout_world_ * geometry.shard_numel;
      if (backward_gather_ > 0)  // the node's copy for the backward (ShardedUnit::gather_backward_within)
        geometry.backward_numel =
            FlatShardLayout::from_shapes(unit.name, shapes, rank_ % backward_gather_, backward_gather_).shard_numel;
      units_.push_back(geometry);
    }
    gathered_.assign(units_.size(), false);
    backward_copies_.assign(units_.size(), false);
    ShardingOptions options;
    options.strategy = within_group(m_.run.sharding.strategy);  // as Training builds the sharded model
    options.offload_parameters = offload_parameters_;
    plan_ = StepPlan(static_cast<int64_t>(units_.size()), plan_strategy(options, resident_), m_.run.sharding.prefetch);
    plan_.set_recomputed(recomputed_units(units, m_.run.activation_checkpointing_every));  // as the trainer
  }

  int64_t peak_gathered_units() const { return plan_.gathers().peak_gathered_units(); }

  RankTotals run() {
    const int64_t n = m_.tokens;
    // Persistent: master and gradient shards (fp32), optimizer state, rotary tables. A resident
    // unit's parameters are views of its compute shard (pure bf16: a bf16 copy of the master; else
    // the master itself): nothing more. With --offload optimizer the device keeps each unit's rows
    // in the compute dtype instead of the master and no gradient shard (each exists from its
    // reduction until its copy to the host: reduce_gradients below), and host memory holds the
    // masters, a landing buffer for each gradient shard, on CUDA a staging buffer in the compute
    // dtype, and the state (offload/optimizer_offload.h). With --offload parameters the compute-dtype
    // rows are in host memory (page-locked on CUDA), and the device keeps the master alone, or nothing
    // once the optimizer is offloaded too; on CUDA they take the staging buffer's place.
    for (const UnitGeometry& unit : units_) {
      const size_t u = static_cast<size_t>(&unit - units_.data());
      shard_elements_ += unit.shard_numel;
      // (With the optimizer across the groups each is the block of G world shards: blocks_.)
      if (offload_parameters_) {
        if (!offload_) timeline_.add(kParameters, 4 * blocks_ * unit.shard_numel);
      } else if (offload_) {
        timeline_.add(kParameters, m_.compute_bytes() * blocks_ * unit.shard_numel);
      } else {
        timeline_.add(kParameters, 4 * blocks_ * unit.shard_numel);  // the block of G world shards, or the master
        if (m_.mode == Mode::pure && resident_) timeline_.add(kParameters, 2 * unit.shard_numel);
      }
      if (!transient(u)) timeline_.add(kGradients, gradient_shard_bytes(unit));
    }
    if (resident_) gathered_.assign(units_.size(), true);
    // The compute-dtype rows: of this rank's shard (what the host step writes), and of the block it
    // gathers (the host's rows under parameter offload; the same but with the optimizer across groups).
    const int64_t compute_rows = m_.compute_bytes() * shard_elements_, block_rows = blocks_ * compute_rows;
    if (offload_) {
      // The gradients' host buffers (none for the device step, which reads the shards in place).
      const int64_t landing = device_step_ ? 0 : (bf16_gradient_ ? 2 : 4) * shard_elements_;
      // Staging: the updated rows on their way to the device (CUDA), a delayed update until the next
      // step, a speculative one until the norm decides (pageable beside host rows: no bus to cross).
      const bool speculative = m_.run.sharding.offload_step == OffloadStep::speculative;
      const bool staging =
          (((cuda_ || m_.run.sharding.offload_delayed_update >= 0) && !offload_parameters_) || speculative) && !device_step_;
      const int64_t host_rows = offload_parameters_ ? block_rows : 0;
      offload_host_bytes_ = optimizer_state() + 4 * shard_elements_ + landing + host_rows + (staging ? compute_rows : 0) +
                            (speculative ? unit_masters_and_state(/*largest=*/false) : 0);
      // Page-locked: what crosses the bus (the device step: master and state, both ways, every step).
      offload_pinned_bytes_ = !cuda_ ? 0
                              : device_step_ ? optimizer_state() + 4 * shard_elements_
                                             : landing + host_rows + (offload_parameters_ ? 0 : compute_rows);
      // The device step's two windows, each the largest unit's master and state (offload/device_step.h).
      if (device_step_) timeline_.add(kOptimizerDevice, 2 * unit_masters_and_state(/*largest=*/true));
      // GaLore's projection on the device: the projectors' device copies, and on CUDA their host
      // state page-locked (offload/lowrank_gradients.h).
      for (size_t u = 0; u < units_.size(); ++u)
        if (projects_on_device(u)) {
          const int64_t projectors = estimate_galore_projectors(units_[u], optimizer_settings(m_.run), optimizer_world(), shard_rank());
          timeline_.add(kOptimizerDevice, projectors);
          if (cuda_) offload_pinned_bytes_ += projectors;
        }
      timeline_.add(kOptimizerHost, offload_host_bytes_);
    } else {
      timeline_.add(kOptimizerDevice, optimizer_state());
      if (offload_parameters_) {
        offload_host_bytes_ = block_rows;
        offload_pinned_bytes_ = cuda_ ? block_rows : 0;
        timeline_.add(kOptimizerHost, offload_host_bytes_);
      }
    }
    const int64_t head_dim = m_.config.head_dim();
    timeline_.add(kOther, 2 * m_.run.data.max_length * head_dim * 4);                  // cos, sin (fp32)
    if (m_.mode == Mode::pure) timeline_.add(kOther, 2 * m_.run.data.max_length * head_dim * 2);  // bf16 copies
    timeline_.open_window();

    // Micro-batches of one kind are alike: the first (it creates the gradients), one of the middle
    // ones (each adds into them and leaves the live bytes as it found them), and the last (it
    // reduces). So the middle ones are simulated once, whatever their number: the estimate's cost
    // does not grow with --total_batch_size (2^23 micro-batches once took 21 GB and never answered).
    const int64_t micro_batches = std::max<int64_t>(1, m_.run.data.gradient_accumulation);
    for (int64_t micro = 0; micro < std::min<int64_t>(micro_batches - 1, 2); ++micro) micro_batch(micro, /*last=*/false);
    micro_batch(micro_batches - 1, /*last=*/true);

    // Clipping (a dot product per gradient shard: nothing allocated), then the optimizer, unit by
    // unit: each unit's temporaries are gone before the next unit's step.
    // With offload the steps run on the host: on a GPU they are not the device's; on a CPU rank they
    // run on the worker thread, counted here as without offload.
    // GaLore's device half under offload (refresh, projection) runs on a GPU too: its temporaries
    // counted as the whole step's, an upper bound.
    if (!fused_)  // fused: each unit stepped in backward (reduce_gradients)
      for (const UnitAction& action : plan_.optimizer_pass())
        if (!(offload_ && cuda_ && !device_step_) || projects_on_device(static_cast<size_t>(action.unit)))
          timeline_.spike(optimizer_transient(static_cast<size_t>(action.unit)));
    timeline_.point("optimizer");

    evaluation(n);
    RankTotals totals;
    totals.offload_host = offload_host_bytes_;
    totals.offload_pinned = offload_pinned_bytes_;
    totals.gathered_units = peak_gathered_units();
    // --async_save: the host copy of what the rank saves, its master rows and optimizer state, one
    // buffer kept from the first save on (pinned on a GPU unless offloaded: the state is in host
    // memory already). At most: padding rows and a projector every rank holds are counted on each.
    // Under no_shard rank 0 alone saves.
    if (m_.run.checkpoint.async_save && writes_checkpoint_state()) {
      totals.async_save = true;
      totals.async_save_bytes = 4 * shard_elements_ + optimizer_state();
    }
    return totals;
  }
  void record_to(std::vector<TimelineOp>* tape) { timeline_.record_to(tape); }
  const std::vector<PhaseEstimate>& phases() const { return timeline_.phases(); }

 private:
  using Mode = ModelShape::Mode;

  int64_t compute_bytes(size_t u) const { return m_.compute_bytes() * units_[u].compute_numel; }
  int64_t full_grad_bytes(size_t u) const { return m_.compute_bytes() * units_[u].compute_numel; }
  bool gradients_in_shard() const { return resident_ && (m_.compute_bytes() == 4 || bf16_gradient_); }
  // A unit's gradient shard: fp32, or bf16 where pure bf16 AdamW at one rank keeps it so.
  int64_t gradient_shard_bytes(const UnitGeometry& unit) const { return (bf16_gradient_ ? 2 : 4) * unit.shard_numel; }
  bool is_head(size_t u) const { return u + 1 == units_.size(); }
  bool is_embed(size_t u) const { return u == 0; }
  const std::string& name(size_t u) const { return units_[u].spec->name; }

  // ShardedUnit::gather: under pure bf16 the send buffer (the master rounded, S_u), the all-gather
  // buffer (the compute dtype, world x S_u), the send buffer freed, then each parameter's storage
  // in turn, filled from its rows of every rank's block by strided copies.
  void gather_one(size_t u) {
    if (gathered_[u]) return;
    const UnitGeometry& unit = units_[u];
    const int64_t element = m_.compute_bytes();
    if (backward_copies_[u]) {
      // The backward's gather from the node's copy: its all-gather buffer (R x the copy), the copy
      // freed, then the parameters (ShardedUnit::fill_compute_parameters).
      const int64_t buffer = element * backward_gather_ * unit.backward_numel;
      timeline_.add(kActivations, buffer);
      timeline_.remove(kParameters, element * unit.backward_numel);
      backward_copies_[u] = false;
      for (int64_t numel : unit.compute_numels) timeline_.add(kParameters, element * numel);
      timeline_.remove(kActivations, buffer);
      gathered_[u] = true;
      return;
    }
    // The send buffer: parameter offload's copy of the host rows (a CPU rank sends them in place);
    // else pure bf16's rounded master (optimizer offload keeps a compute shard on the device).
    const int64_t send = offload_parameters_ ? (cuda_ ? element * blocks_ * unit.shard_numel : 0)
                         : m_.mode == Mode::pure && !offload_ ? 2 * blocks_ * unit.shard_numel
                                                              : 0;
    // A whole-unit layout fills the parameters from the send buffer itself: no all-gather buffer.
    const int64_t buffer = layout_world_ > 1 ? element * unit.gathered_numel : 0;
    timeline_.add(kActivations, send);
    timeline_.add(kActivations, buffer);
    if (layout_world_ > 1) timeline_.remove(kActivations, send);
    for (int64_t numel : unit.compute_numels) timeline_.add(kParameters, element * numel);
    timeline_.remove(kActivations, buffer);
    if (layout_world_ == 1) timeline_.remove(kActivations, send);
    gathered_[u] = true;
  }
  // A training forward's release under --backward_gather_size: this rank's rows over its node, copied
  // from the gathered parameters first (ShardedUnit::keep_backward_copy).
  void keep_backward_copy(size_t u) {
    if (backward_gather_ == 0 || !gathered_[u] || resident_) return;
    timeline_.add(kParameters, m_.compute_bytes() * units_[u].backward_numel);
    backward_copies_[u] = true;
  }
  void release(size_t u) {
    if (!gathered_[u] || resident_) return;
    timeline_.remove(kParameters, compute_bytes(u));
    gathered_[u] = false;
  }
  // A gather action of the plan: a prefetch allocates what a gather does, when it is issued.
  void apply(const UnitAction& action) {
    const size_t u = static_cast<size_t>(action.unit);
    switch (action.op) {
      case UnitOp::gather:
      case UnitOp::prefetch: gather_one(u); break;
      case UnitOp::release: release(u); break;
      default: break;  // wait: no bytes move
    }
  }

  // The fused loss's row blocks over n tokens: the fp32 upcast and exponentials of each block in
  // flight (cross_entropy_transient_bytes, the function the loss itself sizes its blocks with).
  int64_t loss_transient_bytes(int64_t n, bool with_gradient) const {
    if (m_.single_pass_loss) return 0;  // (rows) fp32 losses only
    return cross_entropy_transient_bytes(n, m_.V, m_.mode == Mode::fp32 ? at::kFloat : at::kBFloat16, with_gradient,
                                         cuda_, at::get_num_threads());
  }

  int64_t unit_output_bytes(size_t u, int64_t n) const {
    return is_head(u) ? n * m_.V * m_.logits_bytes() : n * m_.h * m_.hidden_bytes();
  }
  // Saved by the unit's forward, its output excluded.
  int64_t unit_saved_bytes(size_t u, int64_t n) const {
    if (is_embed(u)) return 0;  // the embedding saves the ids (the batch)
    if (is_head(u)) return n * m_.head_saved_per_token() - unit_output_bytes(u, n) + m_.autocast_weight_bytes(*units_[u].spec);
    return n * m_.layer_saved_per_token() - unit_output_bytes(u, n) + m_.autocast_weight_bytes(*units_[u].spec);
  }

  // One micro-batch: its batch, the forward, the loss, the backward, and what goes when it ends.
  void micro_batch(int64_t micro, bool last) {
    const int64_t n = m_.tokens;
    const int64_t batch = 2 * n * 8;  // input_ids and labels, int64
    timeline_.add(kOther, batch);

    forward(n);
    // The loss (model/cross_entropy.h): its gradient with respect to the logits, written in
    // the forward in the logits' dtype and kept for backward (over the logits themselves in the
    // single pass), and the row blocks it works in.
    const int64_t logits_gradient = m_.single_pass_loss ? 0 : n * m_.V * m_.logits_bytes();
    timeline_.add(kActivations, logits_gradient);
    timeline_.spike(loss_transient_bytes(n, /*with_gradient=*/true));

    backward(micro, last, n, logits_gradient);
    const int64_t grad_x = input_gradient_bytes(n);
    const size_t head_input = head_input_unit();
    // On a GPU the last transient gradient shard is freed once its copy to the host is done, and
    // the last reduction's input once the compute stream waits for it.
    if (last) hand_over_gradient(0);
    timeline_.remove(kActivations, reducing_flat_);
    reducing_flat_ = 0;
    // backward() returns: its grad_output (the first layer's input gradient) goes; the micro-batch
    // ends: the loss and with it the head's input and that input's gradient, and the batch.
    if (head_input > 0) timeline_.remove(kActivations, grad_x);
    timeline_.remove(kActivations, grad_x + unit_output_bytes(head_input, n));
    timeline_.remove(kOther, batch);
  }

  // The gradient of a unit's input; the unit whose output the head reads.
  int64_t input_gradient_bytes(int64_t n) const { return n * m_.h * m_.hidden_bytes(); }
  size_t head_input_unit() const { return units_.size() - 2; }

  // Forward: each unit keeps what autograd saves and its output (held in the boundaries).
  void forward(int64_t n) {
    for (const UnitAction& action : plan_.forward_pass()) {
      if (action.op != UnitOp::forward) {
        if (action.op == UnitOp::release) keep_backward_copy(static_cast<size_t>(action.unit));
        apply(action);
        continue;
      }
      const size_t u = static_cast<size_t>(action.unit);
      if (plan_.recomputed(static_cast<int64_t>(u))) {
        // Without a graph: the output stays, the rest of the forward is a transient as in
        // evaluation. Under bf16 autocast the weights' casts are still cached (autocast caches the
        // casts of leaves that require grad, grad mode or not) until the forward's region ends.
        timeline_.add(kActivations, unit_output_bytes(u, n) + m_.autocast_weight_bytes(*units_[u].spec));
        autocast_cached_ += m_.autocast_weight_bytes(*units_[u].spec);
        timeline_.spike(n * m_.layer_eval_tail_per_token());
        timeline_.point("forward:" + name(u));
        continue;
      }
      timeline_.add(kActivations, unit_saved_bytes(u, n) + unit_output_bytes(u, n));
      if (is_head(u))
        timeline_.spike(n * m_.head_forward_tail_per_token() + widened_product_bytes(n, m_.V));
      else if (!is_embed(u))
        timeline_.spike(n * m_.layer_forward_tail_per_token());
      timeline_.point("forward:" + name(u));
    }
    // The forward's autocast region ends: the casts cached for recomputed units go.
    timeline_.remove(kActivations, autocast_cached_);
    autocast_cached_ = 0;
  }

  // Backward, down the units: the plan's recomputations, gathers and reductions, and each unit's
  // backward.
  void backward(int64_t micro, bool last, int64_t n, int64_t logits_gradient) {
    for (const UnitAction& action : plan_.backward_pass(last)) {
      const size_t u = static_cast<size_t>(action.unit);
      if (action.op == UnitOp::reduce_gradients) {
        reduce_gradients(u);
        continue;
      }
      if (action.op == UnitOp::recompute) {
        // The forward again, with its graph: what it saves (the weights' casts included), its
        // forward tail, and a new output in place of the old one (the same size).
        timeline_.add(kActivations, unit_saved_bytes(u, n));
        timeline_.spike(unit_output_bytes(u, n) + n * m_.layer_forward_tail_per_token());
        continue;
      }
      if (action.op != UnitOp::backward) {
        apply(action);
        continue;
      }
      backward_unit(u, micro, n, logits_gradient);
    }
  }

  // One unit's backward: its parameter gradients, its input's gradient, and what it saved freed.
  void backward_unit(size_t u, int64_t micro, int64_t n, int64_t logits_gradient) {
    const int64_t grad_x = input_gradient_bytes(n);
    const size_t head_input = head_input_unit();
    if (is_head(u)) {
      // The loss's backward scales its saved gradient in place; lm_head's backward turns it into
      // the input's gradient, then the weight's, then it goes. Where the CPU widens bf16 matmuls,
      // the weight's gradient (V x h) is written through an fp32 product beside its bf16 result,
      // before that result becomes the gradient (pure) or is cast to fp32 (mixed): measured
      // 6 V h bytes at once at llama_20m, the same at 128, 256 and 512 tokens.
      if (const int64_t widened = widened_product_bytes(m_.V, m_.h); widened > 0)
        timeline_.spike(grad_x + widened + 2 * m_.V * m_.h);
      parameter_gradients(u, micro);
      timeline_.add(kActivations, grad_x);
      timeline_.remove(kActivations, logits_gradient);
      timeline_.remove(kActivations, unit_saved_bytes(u, n) + unit_output_bytes(u, n));
      // The loss tensor keeps the head's graph until the micro-batch ends, and with it the head's
      // input leaf (the last layer's output) and that leaf's gradient: both stay.
    } else if (is_embed(u)) {
      parameter_gradients(u, micro);  // embedding_dense_backward: a (V x h) gradient
      if (u != head_input) timeline_.remove(kActivations, unit_output_bytes(u, n));
    } else {
      // SwiGLU's backward: the product's, silu's and up's gradients live at once while the
      // product is gone (2 I per token in the gradient dtype) plus down_proj's weight gradient.
      timeline_.spike(2 * m_.I * n * m_.activation_grad_bytes() +
                      (m_.mode == Mode::fp32 ? 4 : 2) * m_.h * m_.I);
      parameter_gradients(u, micro);
      timeline_.remove(kActivations, unit_saved_bytes(u, n));
      timeline_.add(kActivations, grad_x);  // the gradient of this layer's input
      if (u != head_input) {
        timeline_.remove(kActivations, grad_x);                   // the previous grad_output
        timeline_.remove(kActivations, unit_output_bytes(u, n));  // the boundary output
      }
    }
    timeline_.point("backward:" + name(u));
  }

  // Parameter gradients: the first micro-batch creates them, later ones add into them (the
  // new gradient is a transient of the same size). Resident fp32 units add every micro-batch's
  // into the gradient shard.
  // With offload a resident fp32 unit's shard is new each step: prepare_gradients() makes it
  // before the first micro-batch's backward of the unit.
  void parameter_gradients(size_t u, int64_t micro) {
    if (micro == 0 && gradients_in_shard() && transient(u)) timeline_.add(kGradients, gradient_shard_bytes(units_[u]));
    if (micro == 0 && !gradients_in_shard())
      timeline_.add(kGradients, full_grad_bytes(u));
    else
      timeline_.spike(full_grad_bytes(u));
  }

  // reduce_gradients: a flat fp32 buffer of world x S_u, into which each parameter's gradient is
  // copied (converted from bf16 on the way), then freed. A resident unit converts its bf16
  // gradients straight into its shard (its fp32 ones are there already) and all-reduces the shard
  // in place.
  //
  // With offload the shard itself is transient (ShardedUnit::make_gradient_transient): made here
  // (before the flat buffer goes), handed to the host copy, then freed. On a CPU rank the copy is in
  // line, so it is gone at once; on a GPU the copy runs on its own stream and the block is reused
  // only when it is done, which is counted as one unit later: the shard stays until the next
  // unit's shard is made (recordStream in OptimizerOffload::gradient_ready).
  void reduce_gradients(size_t u) {
    const UnitGeometry& unit = units_[u];
    const int64_t shard = gradient_shard_bytes(unit);
    if (resident_) {
      if (transient(u) && !gradients_in_shard()) timeline_.add(kGradients, shard);
      if (!gradients_in_shard()) timeline_.remove(kGradients, full_grad_bytes(u));
    } else {
      // On a GPU the reduction runs on the reduce stream and its flat input stays until the compute
      // stream waits for it: at the next unit's reduction, or the end of backward (the fused step
      // waits at once). One at a time: the last one goes before this one is made.
      const bool kept = cuda_ && !fused_;
      timeline_.remove(kActivations, reducing_flat_);
      reducing_flat_ = 0;
      // A bf16 shard at one rank takes the gradients straight in: no flat buffer, no reduction.
      const int64_t flat = bf16_gradient_ ? 0 : 4 * unit.gathered_numel;
      timeline_.add(kActivations, flat);
      // The block summed over the group, reduce-scattered across the groups (ShardedUnit::reduce_over_groups).
      if (blocks_ > 1) timeline_.spike(4 * blocks_ * unit.shard_numel);
      // (the bf16 shard is made first and takes each gradient as it goes; the fp32 one after the flat copies)
      if (transient(u) && bf16_gradient_) timeline_.add(kGradients, shard);
      for (int64_t numel : unit.compute_numels) timeline_.remove(kGradients, m_.compute_bytes() * numel);
      if (transient(u) && !bf16_gradient_) timeline_.add(kGradients, shard);
      if (kept)
        reducing_flat_ = flat;
      else
        timeline_.remove(kActivations, flat);
    }
    if (bf16_gradient_) timeline_.spike(4 * unit.shard_numel);  // the norm's exact fp32 upcast of the shard
    // --fuse_optimizer_with_backward: the unit's step runs here, its temporaries on top of the shard,
    // and the shard is freed right after (on a GPU too: the step runs on the stream that reuses it).
    if (fused_) {
      timeline_.spike(optimizer_transient(u));
      timeline_.remove(kGradients, shard);
    }
    if (offload_ && transient(u)) hand_over_gradient(shard);
  }
  // The transient shard of `bytes` goes to the host; the one before it is freed (GPU), or this one
  // at once (CPU).
  void hand_over_gradient(int64_t bytes) {
    if (!offload_) return;
    timeline_.remove(kGradients, cuda_ ? copying_gradient_ : bytes);
    copying_gradient_ = cuda_ ? bytes : 0;
  }

  void evaluation(int64_t n) {
    const int64_t batch = 2 * n * 8;  // the eval batch is not an owned buffer: the ledger sees it here
    // The first batch gathers what the training step released; the second stands for every later one
    // (alike: each leaves the live bytes as it found them), simulated once whatever --eval_sequences.
    const int64_t micro_steps = eval_micro_steps(eval_sequences_of_job(m_.run.data, world_), m_.run.data, world_);
    for (int64_t b = 0; b < std::min<int64_t>(micro_steps, 2); ++b) {
      timeline_.add(kActivations, batch);
      for (const UnitAction& action : plan_.forward_pass()) {
        if (action.op != UnitOp::forward) {
          apply(action);
          continue;
        }
        const size_t u = static_cast<size_t>(action.unit);
        timeline_.add(kActivations, unit_output_bytes(u, n));
        if (is_head(u))
          timeline_.spike(n * m_.head_eval_tail_per_token() + m_.autocast_weight_bytes(*units_[u].spec) +
                          widened_product_bytes(n, m_.V));
        else if (!is_embed(u))
          timeline_.spike(n * m_.layer_eval_tail_per_token());
        timeline_.point("eval:" + name(u));
      }
      timeline_.spike(loss_transient_bytes(n, /*with_gradient=*/false));
      for (size_t u = 0; u < units_.size(); ++u) timeline_.remove(kActivations, unit_output_bytes(u, n));
      timeline_.remove(kActivations, batch);
    }
    for (const UnitAction& action : plan_.release_all()) apply(action);
    timeline_.point("eval");
  }

  int optimizer_world() const { return layout_world_; }
  // Ranks in groups of consecutive ranks (hybrid: block placement; sharding/topology.h groups by host).
  int shard_rank() const {
    if (blocks_ > 1) return world_shard_index(rank_ % group_size_, rank_ / group_size_, blocks_);
    return layout_world_ == 1 ? 0 : rank_ % layout_world_;
  }
  // RunCheckpoints::save_role: rank 0 alone under no_shard, group 0 under hybrid sharding, else all.
  bool writes_checkpoint_state() const {
    if (m_.run.sharding.strategy == ShardingStrategy::no_shard) return rank_ == 0;
    return !is_hybrid(m_.run.sharding.strategy) || blocks_ > 1 || rank_ < layout_world_;
  }

  // GaLore's units under the default offload step: projected on the device, their gradient shards
  // kept there until the step (offload/lowrank_gradients.h).
  bool projects_on_device(size_t u) const {
    return offload_ && m_.run.sharding.offload_step == OffloadStep::host && m_.run.sharding.offload_delayed_update < 0 &&
           std::count(units_[u].rules.begin(), units_[u].rules.end(), UpdateRule::galore) > 0;
  }
  // A unit's gradient shard lives only from its reduction to its step (the fused step) or to its copy
  // to the host (offload), unless the step reads it on the device (the device step, GaLore's projection).
  bool transient(size_t u) const { return fused_ || (offload_ && !device_step_ && !projects_on_device(u)); }

  int64_t optimizer_state() const { return estimate_optimizer_state(units_, optimizer_settings(m_.run), optimizer_world()); }
  int64_t unit_masters_and_state(bool largest) const {
    return estimate_masters_and_state(units_, optimizer_settings(m_.run), optimizer_world(), largest);
  }
  int64_t optimizer_transient(size_t u) const {
    return estimate_optimizer_transient(units_[u], optimizer_settings(m_.run), optimizer_world(), shard_rank());
  }

  const ModelShape& m_;
  int world_, rank_;
  bool cuda_, offload_, offload_parameters_, fused_, device_step_;
  int layout_world_ = 1;
  int blocks_ = 1;                         // --shard_optimizer_across_groups: G (world shards a rank gathers)
  int group_size_ = 0;                     // and S, the group they are gathered over
  int backward_gather_ = 0;                // --backward_gather_size
  std::vector<bool> backward_copies_;      // units holding their node's copy for the backward
  bool resident_ = false;
  bool bf16_gradient_ = false;  // resident units' gradient shards in bf16 (config.h's bf16_gradient_shards)
  int64_t offload_host_bytes_ = 0, offload_pinned_bytes_ = 0;
  int64_t reducing_flat_ = 0;  // CUDA: the flat input of the reduction in flight
  int64_t shard_elements_ = 0;  // this rank's master shard elements, every unit
  int64_t autocast_cached_ = 0;   // bf16 casts of recomputed units' weights, cached to the forward's end
  int64_t copying_gradient_ = 0;  // with offload on a GPU: the shard whose copy to the host is in flight
  std::vector<UnitGeometry> units_;
  std::vector<bool> gathered_;
  StepPlan plan_;
  Timeline timeline_;
};

}  // namespace

SimulatedRank simulate_layers(const ModelShape& shape, const ModelConfig& model, int64_t layers, int world, int rank,
                              bool cuda, std::vector<TimelineOp>* tape) {
  ModelConfig config = model;
  config.num_hidden_layers = layers;
  const std::vector<UnitSpec> units = describe_units(config);
  StepSimulation simulation(shape, units, world, rank, cuda);
  simulation.record_to(tape);
  SimulatedRank simulated;
  simulated.totals = simulation.run();
  if (tape == nullptr) simulated.phases = simulation.phases();
  return simulated;
}

}  // namespace llm
