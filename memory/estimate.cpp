#include "memory/estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <ATen/Parallel.h>

#include "common/errors.h"
#include "common/memory_stats.h"
#include "optim/galore.h"
#include "optim/shard_optimizer.h"
#include "optim/subset_norm.h"
#include "sharding/flat_layout.h"
#include "sharding/step_plan.h"
#include "model/cross_entropy.h"
#include "model/units.h"
#include "config/optimizer_setup.h"

namespace llm {
namespace {

// Category indices of MemoryCategories::at().
constexpr int kParameters = 0, kGradients = 1, kOptimizerDevice = 2, kOptimizerHost = 3, kActivations = 4, kOther = 5;

enum class Mode { fp32, mixed, pure };

// One step of the timeline as recorded for extrapolation (see extrapolate_layers below): consecutive
// adds of non-negative bytes are one add (the window's peak after them is the total after the last),
// consecutive removes one remove, consecutive spikes one spike of the largest.
struct TimelineOp {
  enum class Kind { add, remove, spike, point, open_window } kind = Kind::add;
  MemoryCategories bytes;  // add, remove
  int64_t spike = 0;       // spike
  std::string label;       // point
  bool merges = true;      // an add of negative bytes is kept apart

  static TimelineOp of(Kind kind, int64_t spike = 0, const std::string& label = "") {
    TimelineOp op;
    op.kind = kind;
    op.spike = spike;
    op.label = label;
    return op;
  }
  // Equal but for the label.
  bool same_bytes(const TimelineOp& other) const {
    for (int c = 0; c < MemoryCategories::kCount; ++c)
      if (bytes.at(c) != other.bytes.at(c)) return false;
    return kind == other.kind && spike == other.spike && merges == other.merges;
  }
};

// The step as the trainer runs it, one tensor lifetime at a time, with the ledger's points.
// `add`/`remove` move a category's live bytes; `spike` is a transient on top of what is live (it
// raises the window's peak only); `point` closes a window as MemoryLedger::point does.
class Timeline {
 public:
  // host_apart: the device is a GPU, so host memory (offloaded optimizer state) is counted in its
  // category but not in the device's total, as MemoryLedger::point does.
  explicit Timeline(bool host_apart = false) : host_apart_(host_apart) {}
  // Every later operation is also appended to `tape` (merged as TimelineOp says).
  void record_to(std::vector<TimelineOp>* tape) { tape_ = tape; }
  void add(int category, int64_t bytes) {
    if (tape_ != nullptr) record_bytes(TimelineOp::Kind::add, category, bytes);
    live_.at(category) += bytes;
    if (host_apart_ && category == kOptimizerHost) return;
    total_ += bytes;
    window_peak_ = std::max(window_peak_, total_);
  }
  void remove(int category, int64_t bytes) {
    if (tape_ != nullptr) record_bytes(TimelineOp::Kind::remove, category, bytes);
    live_.at(category) -= bytes;
    if (host_apart_ && category == kOptimizerHost) return;
    total_ -= bytes;
  }
  void spike(int64_t bytes) {
    if (tape_ != nullptr) {
      if (tape_->empty() || tape_->back().kind != TimelineOp::Kind::spike) tape_->push_back(TimelineOp::of(TimelineOp::Kind::spike, bytes));
      tape_->back().spike = std::max(tape_->back().spike, bytes);
    }
    window_peak_ = std::max(window_peak_, total_ + bytes);
  }
  void point(const std::string& label) {
    if (tape_ != nullptr) tape_->push_back(TimelineOp::of(TimelineOp::Kind::point, 0, label));
    phases_.push_back({label, window_peak_, live_});
    window_peak_ = total_;
  }
  void open_window() {
    if (tape_ != nullptr) tape_->push_back(TimelineOp::of(TimelineOp::Kind::open_window));
    window_peak_ = total_;
  }
  // A recorded operation again; a point under `label`.
  void replay(const TimelineOp& op, const std::string& label) {
    switch (op.kind) {
      case TimelineOp::Kind::add:
        for (int c = 0; c < MemoryCategories::kCount; ++c) move(c, op.bytes.at(c));
        window_peak_ = std::max(window_peak_, total_);
        break;
      case TimelineOp::Kind::remove:
        for (int c = 0; c < MemoryCategories::kCount; ++c) move(c, -op.bytes.at(c));
        break;
      case TimelineOp::Kind::spike: spike(op.spike); break;
      case TimelineOp::Kind::point: point(label); break;
      case TimelineOp::Kind::open_window: open_window(); break;
    }
  }
  // Right after a point: `times` more of a stretch that moved the live bytes by `delta`, without
  // listing its points (a stretch that opens after a point and closes with one only translates).
  void skip(const MemoryCategories& delta, int64_t times) {
    for (int c = 0; c < MemoryCategories::kCount; ++c) move(c, delta.at(c) * times);
    window_peak_ = total_;
  }
  int64_t total() const { return total_; }
  const MemoryCategories& live() const { return live_; }
  const std::vector<PhaseEstimate>& phases() const { return phases_; }

 private:
  void move(int category, int64_t bytes) {
    live_.at(category) += bytes;
    if (!(host_apart_ && category == kOptimizerHost)) total_ += bytes;
  }
  void record_bytes(TimelineOp::Kind kind, int category, int64_t bytes) {
    const bool merges = kind == TimelineOp::Kind::remove || bytes >= 0;
    if (tape_->empty() || tape_->back().kind != kind || !tape_->back().merges || !merges) {
      tape_->push_back(TimelineOp::of(kind));
      tape_->back().merges = merges;
    }
    tape_->back().bytes.at(category) += bytes;
  }

  bool host_apart_;
  MemoryCategories live_;
  int64_t total_ = 0;
  int64_t window_peak_ = 0;
  std::vector<PhaseEstimate> phases_;
  std::vector<TimelineOp>* tape_ = nullptr;
};

int64_t product(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  return count;
}

struct Model {
  const ModelConfig& config;
  const RunConfig& run;
  Mode mode;
  int64_t tokens;  // per micro-batch on this rank: batch_size x max_length
  int64_t h, I, V, kv, heads;

  Model(const ModelConfig& model, const RunConfig& run_config)
      : config(model), run(run_config),
        mode(run_config.precision.dtype == DType::float32 ? Mode::fp32
             : run_config.precision.mode == Precision::mixed ? Mode::mixed : Mode::pure),
        tokens(run_config.data.batch_size * run_config.data.max_length),
        h(model.hidden_size), I(model.intermediate_size), V(model.vocab_size),
        kv(model.num_key_value_heads * model.head_dim()), heads(model.num_attention_heads) {}

  int64_t compute_bytes() const { return mode == Mode::pure ? 2 : 4; }      // compute copy element
  int64_t hidden_bytes() const { return mode == Mode::pure ? 2 : 4; }       // unit boundary element
  int64_t activation_grad_bytes() const { return mode == Mode::fp32 ? 4 : 2; }  // inside a layer
  int64_t logits_bytes() const { return mode == Mode::fp32 ? 4 : 2; }

  // Bytes per token autograd saves in a decoder layer's forward, its output included (the
  // layer's input is the previous unit's output). Op by op (model/llama.cpp):
  //   fp32  input_layernorm: rsqrt (1), x * rsqrt (h), weight * normed (h, the q/k/v input);
  //         rotary: q_rot (h), k_rot (kv) (x * cos saves only cos: q itself needs no grad);
  //         v (kv); SDPA (CPU flash): output (h, o_proj's input is a view of it) and its
  //         logsumexp (heads, fp32); h = x + attention (h, post_attention_layernorm's x32);
  //         post_attention_layernorm (2h + 1); SwiGLU: gate, silu, up, product (4I); output (h).
  //         = 4 (8h + 2kv + 4I + heads + 2)
  //   mixed (bf16 autocast): the norms in fp32 (normed 4h + rsqrt 4 each, h 4h, output 4h);
  //         every linear saves its own bf16 cast of its input (3 x 2h for q, k, v; 2 x 2h for gate,
  //         up); q_rot and k_rot are fp32 (bf16 q times fp32 cos) and SDPA saves their bf16 casts
  //         (2h + 2kv), v (2kv), output (2h), logsumexp (4 heads); SwiGLU in bf16 (8I).
  //         = 30h + 4kv + 8I + 8 + 4 heads, plus the bf16 weight casts, 2 bytes per linear weight
  //         element, which autograd keeps until the layer's backward
  //   pure (bf16 weights): each norm saves its fp32 copy of x (4h), rsqrt (4), normed (2h) and the
  //         output (2h); q_rot, k_rot, v, output (4h + 4kv), logsumexp (4 heads); SwiGLU (8I);
  //         output (2h); h = x + attention is not saved (the norm saves its fp32 copy instead).
  //         = 22h + 4kv + 8I + 8 + 4 heads
  int64_t layer_saved_per_token() const {
    switch (mode) {
      case Mode::fp32: return 4 * (8 * h + 2 * kv + 4 * I + heads + 2);
      case Mode::mixed: return 30 * h + 4 * kv + 8 * I + 8 + 4 * heads;
      case Mode::pure: return 22 * h + 4 * kv + 8 * I + 8 + 4 * heads;
    }
    return 0;
  }
  // The head: final norm (rsqrt, normed, the lm_head input) and the logits.
  //   fp32 4 (2h + 1) + 4V; mixed 4 + 4h + 2h (the bf16 cast) + 2V, plus the bf16 cast of lm_head's
  //   weight; pure 4h (fp32 copy) + 4 + 2h + 2h + 2V.
  int64_t head_saved_per_token() const {
    switch (mode) {
      case Mode::fp32: return 4 * (2 * h + 1) + 4 * V;
      case Mode::mixed: return 4 + 6 * h + 2 * V;
      case Mode::pure: return 8 * h + 4 + 2 * V;
    }
    return 0;
  }
  // What is live for a moment at the end of a layer's forward, beyond what it keeps: fp32 the down
  // projection's output while the residual add writes the output (4h); mixed also
  // post_attention_layernorm's fp32 output (a temporary of the whole expression, 4h) and the fp32
  // copy CPU makes of the bf16 operand of a mixed-dtype add (4h): 10h; pure 4h (down's output and
  // its accumulation buffer).
  int64_t layer_forward_tail_per_token() const {
    return mode == Mode::fp32 ? 4 * h : mode == Mode::mixed ? 10 * h : 4 * h;
  }
  // Without grad (evaluation) a layer keeps only its output, but the SwiGLU temporaries of one
  // expression live together: gate, silu, up, product, and post_attention_layernorm's output with
  // the down projection's output (fp32: 4 (4I + 2h)); mixed adds the bf16 casts of the norm output
  // (2 x 2h) and the fp32 copy of down's output for the residual add: 8I + 14h; pure 8I + 4h.
  int64_t layer_eval_tail_per_token() const {
    return mode == Mode::fp32 ? 4 * (4 * I + 2 * h) : mode == Mode::mixed ? 8 * I + 14 * h : 8 * I + 4 * h;
  }
  // The head's forward under autocast: the final norm's fp32 output, a temporary of
  // `lm_head(norm(x))`, is live while the logits are written (lm_head keeps only its bf16 cast). In
  // fp32 and pure bf16 lm_head keeps the norm's output itself.
  int64_t head_forward_tail_per_token() const { return mode == Mode::mixed ? 4 * h : 0; }
  // Without grad also the bf16 cast of lm_head's weight is a temporary (mixed: 2 V h, not per
  // token), with the norm's fp32 output and its cast (6h).
  int64_t head_eval_tail_per_token() const { return mode == Mode::mixed ? 6 * h : 4 * h; }
  // The weights autocast casts to bf16 and autograd keeps for backward (mixed only).
  int64_t autocast_weight_bytes(const UnitSpec& unit) const {
    if (mode != Mode::mixed) return 0;
    int64_t bytes = 0;
    for (const ParameterSpec& parameter : unit.parameters)
      if (parameter.linear) bytes += 2 * parameter.numel();
    return bytes;
  }
};

// One unit as this rank holds it: the layout the runtime builds (sharding/flat_layout.h) and the
// rules the optimizer gives its parameters.
struct UnitGeometry {
  const UnitSpec* spec = nullptr;
  FlatShardLayout layout;        // this rank's rows of each parameter
  FlatShardLayout whole;         // the unsharded layout (a checkpoint's full tensors)
  std::vector<UpdateRule> rules;
  int64_t first_galore = 0;      // the model-wide index of the unit's first GaLore matrix
  int64_t numel = 0;             // P_u
  int64_t shard_numel = 0;       // S_u, padded rows
  int64_t gathered_numel = 0;    // world x S_u: the all-gather / reduce-scatter buffer
};

// What a rank's simulation gives beside its timeline.
struct RankTotals {
  int64_t offload_host = 0, offload_pinned = 0;  // --offload optimizer's host memory
  bool async_save = false;                         // this rank keeps --async_save's host copy
  int64_t async_save_bytes = 0;
  int64_t gathered_units = 0;                      // the gather schedule's peak
};

// One rank's step, as train() and ShardedModel run it (docs/sharding.md), for the last step of a run
// (it evaluates) with a GaLore projector refresh (step 1 always has one). The order of the step is the
// runtime's own StepPlan (sharding/step_plan.h): each of its per-unit actions is replayed here as the
// bytes it allocates and frees.
class StepSimulation {
 public:
  StepSimulation(const Model& model, const std::vector<UnitSpec>& units, int world, int rank, bool cuda)
      : m_(model), world_(world), rank_(rank), cuda_(cuda),
        offload_(model.run.sharding.offload == Offload::optimizer),
        fused_(model.run.fuse_optimizer_with_backward),
        transient_gradient_(offload_ || fused_), timeline_(cuda) {
    const bool no_shard = m_.run.sharding.strategy == ShardingStrategy::no_shard;
    layout_world_ = no_shard ? 1 : world_;
    // One rank or no_shard: each unit is its whole shard and stays resident (sharding/fsdp_unit.h).
    resident_ = layout_world_ == 1;
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
      for (const ParameterSpec& parameter : unit.parameters) geometry.numel += parameter.numel();
      geometry.shard_numel = geometry.layout.shard_numel;
      geometry.gathered_numel = layout_world_ * geometry.shard_numel;
      units_.push_back(geometry);
    }
    gathered_.assign(units_.size(), false);
    plan_ = StepPlan(static_cast<int64_t>(units_.size()),
                     resident_ ? ShardingStrategy::no_shard : m_.run.sharding.strategy, m_.run.sharding.prefetch);
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
    // dtype, and the state (offload/optimizer_offload.h).
    for (const UnitGeometry& unit : units_) {
      shard_elements_ += unit.shard_numel;
      if (offload_) {
        timeline_.add(kParameters, m_.compute_bytes() * unit.shard_numel);
      } else {
        timeline_.add(kParameters, 4 * unit.shard_numel);
        if (m_.mode == Mode::pure && resident_) timeline_.add(kParameters, 2 * unit.shard_numel);
      }
      if (!transient_gradient_) timeline_.add(kGradients, 4 * unit.shard_numel);
    }
    if (resident_) gathered_.assign(units_.size(), true);
    if (offload_) {
      offload_host_bytes_ = optimizer_state() + 8 * shard_elements_ + (cuda_ ? m_.compute_bytes() * shard_elements_ : 0);
      offload_pinned_bytes_ = cuda_ ? (4 + m_.compute_bytes()) * shard_elements_ : 0;  // landing + staging
      timeline_.add(kOptimizerHost, offload_host_bytes_);
    } else
      timeline_.add(kOptimizerDevice, optimizer_state());
    const int64_t head_dim = m_.config.head_dim();
    timeline_.add(kOther, 2 * m_.run.data.max_length * head_dim * 4);                  // cos, sin (fp32)
    if (m_.mode == Mode::pure) timeline_.add(kOther, 2 * m_.run.data.max_length * head_dim * 2);  // bf16 copies
    timeline_.open_window();

    const int64_t micro_batches = std::max<int64_t>(1, m_.run.data.gradient_accumulation);
    for (int64_t micro = 0; micro < micro_batches; ++micro) micro_batch(micro, micro + 1 == micro_batches);

    // Clipping (a dot product per gradient shard: nothing allocated), then the optimizer, unit by
    // unit: each unit's temporaries are gone before the next unit's step.
    // With offload the steps run on the host: on a GPU they are not the device's; on a CPU rank they
    // run on the worker thread, counted here as without offload.
    if (!(offload_ && cuda_) && !fused_)  // fused: each unit stepped in backward (reduce_gradients)
      for (const UnitAction& action : plan_.optimizer_pass())
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
    if (m_.run.checkpoint.async_save && (rank_ == 0 || m_.run.sharding.strategy != ShardingStrategy::no_shard)) {
      totals.async_save = true;
      totals.async_save_bytes = 4 * shard_elements_ + optimizer_state();
    }
    return totals;
  }
  void record_to(std::vector<TimelineOp>* tape) { timeline_.record_to(tape); }
  const std::vector<PhaseEstimate>& phases() const { return timeline_.phases(); }

 private:
  int64_t compute_bytes(size_t u) const { return m_.compute_bytes() * units_[u].numel; }
  int64_t full_grad_bytes(size_t u) const { return m_.compute_bytes() * units_[u].numel; }
  bool gradients_in_shard() const { return resident_ && m_.compute_bytes() == 4; }
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
    const int64_t send = m_.mode == Mode::pure && !offload_ ? 2 * unit.shard_numel : 0;  // offload keeps a compute shard
    timeline_.add(kActivations, send);
    timeline_.add(kActivations, element * unit.gathered_numel);
    timeline_.remove(kActivations, send);
    for (const ShardedParameter& parameter : unit.layout.parameters)
      timeline_.add(kParameters, element * parameter.rows * parameter.cols);
    timeline_.remove(kActivations, element * unit.gathered_numel);
    gathered_[u] = true;
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

  void micro_batch(int64_t micro, bool last) {
    const int64_t n = m_.tokens;
    const int64_t batch = 2 * n * 8;  // input_ids and labels, int64
    timeline_.add(kOther, batch);

    // Forward: each unit keeps what autograd saves and its output (held in the boundaries).
    for (const UnitAction& action : plan_.forward_pass()) {
      if (action.op != UnitOp::forward) {
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
        timeline_.spike(n * m_.head_forward_tail_per_token());
      else if (!is_embed(u))
        timeline_.spike(n * m_.layer_forward_tail_per_token());
      timeline_.point("forward:" + name(u));
    }
    // The forward's autocast region ends: the casts cached for recomputed units go.
    timeline_.remove(kActivations, autocast_cached_);
    autocast_cached_ = 0;
    // The loss (model/cross_entropy.h): its gradient with respect to the logits, written in
    // the forward in the logits' dtype and kept for backward, and the row blocks it works in.
    const int64_t logits_gradient = n * m_.V * m_.logits_bytes();
    timeline_.add(kActivations, logits_gradient);
    timeline_.spike(loss_transient_bytes(n, /*with_gradient=*/true));

    const int64_t grad_x = n * m_.h * m_.hidden_bytes();  // gradient of a unit's input
    const size_t head_input = units_.size() - 2;            // the unit whose output the head reads
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
      // Parameter gradients: the first micro-batch creates them, later ones add into them (the
      // new gradient is a transient of the same size). Resident fp32 units add every micro-batch's
      // into the gradient shard.
      // With offload a resident fp32 unit's shard is new each step: prepare_gradients() makes it
      // before the first micro-batch's backward of the unit.
      auto parameter_gradients = [&] {
        if (micro == 0 && gradients_in_shard() && transient_gradient_) timeline_.add(kGradients, 4 * units_[u].shard_numel);
        if (micro == 0 && !gradients_in_shard())
          timeline_.add(kGradients, full_grad_bytes(u));
        else
          timeline_.spike(full_grad_bytes(u));
      };
      if (is_head(u)) {
        // The loss's backward scales its saved gradient in place; lm_head's backward turns it into
        // the weight's gradient and the input's, then it goes.
        parameter_gradients();
        timeline_.add(kActivations, grad_x);
        timeline_.remove(kActivations, logits_gradient);
        timeline_.remove(kActivations, unit_saved_bytes(u, n) + unit_output_bytes(u, n));
        // The loss tensor keeps the head's graph until the micro-batch ends, and with it the head's
        // input leaf (the last layer's output) and that leaf's gradient: both stay.
      } else if (is_embed(u)) {
        parameter_gradients();  // embedding_dense_backward: a (V x h) gradient
        if (u != head_input) timeline_.remove(kActivations, unit_output_bytes(u, n));
      } else {
        // SwiGLU's backward: the product's, silu's and up's gradients live at once while the
        // product is gone (2 I per token in the gradient dtype) plus down_proj's weight gradient.
        timeline_.spike(2 * m_.I * n * m_.activation_grad_bytes() +
                        (m_.mode == Mode::fp32 ? 4 : 2) * m_.h * m_.I);
        parameter_gradients();
        timeline_.remove(kActivations, unit_saved_bytes(u, n));
        timeline_.add(kActivations, grad_x);  // the gradient of this layer's input
        if (u != head_input) {
          timeline_.remove(kActivations, grad_x);                   // the previous grad_output
          timeline_.remove(kActivations, unit_output_bytes(u, n));  // the boundary output
        }
      }
      timeline_.point("backward:" + name(u));
    }
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
    const int64_t shard = 4 * unit.shard_numel;
    if (resident_) {
      if (transient_gradient_ && !gradients_in_shard()) timeline_.add(kGradients, shard);
      if (!gradients_in_shard()) timeline_.remove(kGradients, full_grad_bytes(u));
    } else {
      // On a GPU the reduction runs on the reduce stream and its flat input stays until the compute
      // stream waits for it: at the next unit's reduction, or the end of backward (the fused step
      // waits at once). One at a time: the last one goes before this one is made.
      const bool kept = cuda_ && !fused_;
      timeline_.remove(kActivations, reducing_flat_);
      reducing_flat_ = 0;
      timeline_.add(kActivations, 4 * unit.gathered_numel);
      for (const ShardedParameter& parameter : unit.layout.parameters)
        timeline_.remove(kGradients, m_.compute_bytes() * parameter.rows * parameter.cols);
      if (transient_gradient_) timeline_.add(kGradients, shard);
      if (kept)
        reducing_flat_ = 4 * unit.gathered_numel;
      else
        timeline_.remove(kActivations, 4 * unit.gathered_numel);
    }
    // --fuse_optimizer_with_backward: the unit's step runs here, its temporaries on top of the shard,
    // and the shard is freed right after (on a GPU too: the step runs on the stream that reuses it).
    if (fused_) {
      timeline_.spike(optimizer_transient(u));
      timeline_.remove(kGradients, shard);
    }
    if (offload_) hand_over_gradient(shard);
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
    for (int64_t b = 0; b < m_.run.data.eval_batches; ++b) {
      timeline_.add(kActivations, batch);
      for (const UnitAction& action : plan_.forward_pass()) {
        if (action.op != UnitOp::forward) {
          apply(action);
          continue;
        }
        const size_t u = static_cast<size_t>(action.unit);
        timeline_.add(kActivations, unit_output_bytes(u, n));
        if (is_head(u))
          timeline_.spike(n * m_.head_eval_tail_per_token() + m_.autocast_weight_bytes(*units_[u].spec));
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
  int shard_rank() const { return layout_world_ == 1 ? 0 : rank_; }

  int64_t optimizer_state() const {
    const OptimizerSettings settings = optimizer_settings(m_.run);
    int64_t bytes = 0;
    for (const UnitGeometry& unit : units_)
      for (size_t i = 0; i < unit.layout.parameters.size(); ++i)
        bytes += optimizer_state_bytes(settings, unit.layout.parameters[i], unit.rules[i], optimizer_world());
    return bytes;
  }

  // One unit's optimizer step's own temporaries (optim/update_rules.cpp; AdamW's fused kernel has
  // none), and GaLore's projector refresh before them. They are gone before the next unit's step.
  int64_t optimizer_transient(size_t u) const {
    const OptimizerSettings settings = optimizer_settings(m_.run);
    if (settings.kind == "adamw") return 0;
    const int world = optimizer_world();
    const UnitGeometry& unit = units_[u];
    int64_t refresh = 0, kept = 0, phase1 = 0, phase2 = 0;
    int64_t galore_index = unit.first_galore;
    for (size_t i = 0; i < unit.layout.parameters.size(); ++i) {
      const ShardedParameter& shard = unit.layout.parameters[i];
      const int64_t local = 4 * shard.rows_per_rank * shard.cols;
      switch (unit.rules[i]) {
        case UpdateRule::adam_hf:
          phase2 = std::max(phase2, 2 * local);  // sqrt(v) + eps, m / denominator
          break;
        case UpdateRule::subset_norm: {
          const SubsetGeometry geometry = make_subset_geometry(shard, settings.subset_size, world);
          const int64_t state = 4 * product(geometry.local_state_shape);
          phase1 = std::max(phase1, kept + local);  // grad^2 before its sums
          kept += state;                             // the sums, kept for the update
          phase2 = std::max(phase2, geometry.kind == SubsetKind::block ? 2 * local : state);
          break;
        }
        case UpdateRule::galore: {
          const GaLoreGeometry geometry = make_galore_geometry(shard, settings, galore_index, shard_rank(), world);
          const int64_t lowrank = 4 * product(geometry.local_state_shape);
          const int64_t m = shard.rows, cols = shard.cols, r = geometry.rank;
          // Refresh: the gathered gradient of this one matrix, the full projector, and on its owner
          // the thin SVD: LibTorch's copy of the input for LAPACK (m n) and U, S, Vh (m k + k + k n).
          // LAPACK's own workspace is allocated by the LAPACK library, outside LibTorch's allocator
          // (not in the tracked total; in the resident set). "subspace": a few (n x r), (r x r).
          int64_t one = 4 * product(geometry.full_projector_shape);
          if (settings.projector_method == "svd") {
            if (world > 1) one += 4 * world * shard.rows_per_rank * cols;
            if (world == 1 || geometry.owner == shard_rank()) {
              const int64_t k = std::min(m, cols);
              one += 4 * (m * cols + m * k + k + k * cols);
            }
          } else {
            one += 4 * (4 * cols * r + shard.rows_per_rank * r + 2 * r * r);
          }
          refresh = std::max(refresh, one);
          // The inputs keep the projected gradient; a left projection reduce-scatters (r x n) partials.
          if (!geometry.right) phase1 = std::max(phase1, kept + 4 * (r * cols + world * geometry.chunk));
          kept += lowrank;
          // The update: denominator and normalised update, then the update projected back and scaled;
          // a left projection first all-gathers the normalised update (world x chunk), which is freed
          // before the scaling.
          int64_t back = 2 * lowrank + 2 * local;
          if (!geometry.right && world > 1) back = 2 * lowrank + std::max(4 * world * geometry.chunk + local, 2 * local);
          phase2 = std::max(phase2, back);
          ++galore_index;
          break;
        }
        case UpdateRule::adamw:
          break;
      }
    }
    return std::max({refresh, phase1, kept + phase2});
  }

  const Model& m_;
  int world_, rank_;
  bool cuda_, offload_, fused_, transient_gradient_;
  int layout_world_ = 1;
  bool resident_ = false;
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

std::string resolved_device(const RunConfig& run, const EstimateOptions& options) {
  if (!options.device.empty()) return options.device;
  return run.device == DeviceChoice::cpu ? "cpu" : "cuda";
}

// A rank's estimate from its step's phases: the peak is the first phase with the largest window,
// each category its largest value at a point.
RankEstimate finish_rank(int rank, bool cuda, bool offload, std::vector<PhaseEstimate> phases, const RankTotals& totals) {
  RankEstimate estimate;
  estimate.rank = rank;
  estimate.phases = std::move(phases);
  bool first = true;
  for (const PhaseEstimate& phase : estimate.phases) {
    estimate.max.raise_to(phase.at_point);
    if (first || phase.peak_bytes > estimate.peak_bytes) {
      estimate.peak_bytes = phase.peak_bytes;
      estimate.peak_phase = phase.label;
      estimate.at_peak = phase.at_point;
      first = false;
    }
  }
  // save(): every rank writes views of its own buffers (checkpoint/checkpoint.h), one tensor at a time:
  // on the CPU the view itself, on a GPU its host copy (outside the device's memory); nothing is
  // gathered. So the save holds what the step left behind: the point after the optimizer (the
  // host-resident offloaded state aside on CUDA, as the training peak counts the device alone).
  const PhaseEstimate& after_optimizer = *std::find_if(
      estimate.phases.begin(), estimate.phases.end(), [](const PhaseEstimate& p) { return p.label == "optimizer"; });
  estimate.checkpoint_peak_bytes = after_optimizer.at_point.total() - (cuda ? after_optimizer.at_point.optimizer_host : 0);
  estimate.host_bytes = cuda ? totals.offload_host : estimate.peak_bytes;
  estimate.pinned_bytes = totals.offload_pinned;
  if (totals.async_save) {
    estimate.async_save_host_bytes = totals.async_save_bytes;
    estimate.host_bytes += estimate.async_save_host_bytes;
    if (cuda && !offload) estimate.pinned_bytes += estimate.async_save_host_bytes;
  }
  return estimate;
}

// Deep models: the decoder layers are identical units, so a step's timeline is the same stretch of
// operations for every layer (every P layers, where activation checkpointing or GaLore's projector
// owners repeat), shifted by what each layer leaves live. So a model of M + k P + M' layers is
// simulated for k = 1, 2, 3 (M, M' layers of margin on either side, that the embedding and the head
// do not reach) and the timeline of L = M + K P + M' layers is built from them: the margins' stretches
// with each byte count extrapolated in k (they are sums over units: the persistent shards, the
// optimizer state), and each pass's repeated stretch translated K times. The three simulations are
// checked to be exactly that (every repeated stretch equal, every other count affine in k); if they
// are not, the model is simulated layer by layer. A stretch's window opens and closes at a point, so
// translating it translates every phase, and the phases and the peak are those of the full
// simulation, byte for byte. Phases: every layer's up to kListedLayers layers; beyond, each pass's
// first and last repetition only (which hold every maximum: a translated phase's largest value is at
// one end).
constexpr int64_t kListedLayers = 4096;

struct Stretch {
  std::vector<TimelineOp> ops;  // ending with a point, but the last one
  int64_t layer = -1;           // the point's decoder layer, or -1
};

int64_t label_layer(const std::string& label) {
  const size_t at = label.rfind(":layer.");
  return at == std::string::npos ? -1 : std::stoll(label.substr(at + 7));
}
std::string label_with_layer(const std::string& label, int64_t layer) {
  return label.substr(0, label.rfind(":layer.") + 7) + std::to_string(layer);
}

std::vector<Stretch> split_at_points(const std::vector<TimelineOp>& tape) {
  std::vector<Stretch> stretches(1);
  for (const TimelineOp& op : tape) {
    stretches.back().ops.push_back(op);
    if (op.kind == TimelineOp::Kind::point) {
      stretches.back().layer = label_layer(op.label);
      stretches.emplace_back();
    }
  }
  return stretches;
}

// One simulated model's timeline in items: a stretch outside the repeated layers, or a pass's run of
// repeated layers (its first repetition's P stretches).
struct TimelineItem {
  bool repeated = false;
  bool down = false;  // the pass goes down the layers (backward)
  std::vector<Stretch> stretches;  // the first repetition's, numbered as in the model of k = 1
};

bool same_ops_but_labels(const Stretch& a, const Stretch& b) {
  if (a.ops.size() != b.ops.size()) return false;
  for (size_t i = 0; i < a.ops.size(); ++i)
    if (!a.ops[i].same_bytes(b.ops[i])) return false;
  return true;
}

// The items of a model of first + k P + margin layers, or nothing when its repeated layers do not
// repeat exactly.
std::optional<std::vector<TimelineItem>> items_of(const std::vector<TimelineOp>& tape, int64_t first, int64_t period, int64_t k) {
  std::vector<TimelineItem> items;
  const std::vector<Stretch> stretches = split_at_points(tape);
  for (size_t i = 0; i < stretches.size();) {
    if (stretches[i].layer < first || stretches[i].layer >= first + k * period) {
      Stretch outside = stretches[i++];
      if (outside.layer >= first + k * period) outside.layer -= (k - 1) * period;  // as in k = 1
      items.push_back({false, false, {outside}});
      continue;
    }
    // Forward and evaluation go up the layers, backward down.
    const bool down = i > 0 && stretches[i - 1].layer == first + k * period;
    if ((down && stretches[i].layer != first + k * period - 1) || i + k * period > stretches.size()) return std::nullopt;
    TimelineItem run{true, down, {}};
    for (int64_t j = 0; j < k * period; ++j) {
      const Stretch& stretch = stretches[i + j];
      if (stretch.layer != (down ? first + k * period - 1 - j : first + j) ||
          !same_ops_but_labels(stretch, stretches[i + j % period]))
        return std::nullopt;
      if (j < period) {
        run.stretches.push_back(stretch);
        if (down) run.stretches.back().layer -= (k - 1) * period;  // as in k = 1
      }
    }
    items.push_back(run);
    i += k * period;
  }
  return items;
}

// v(K) from v(1), v(2), v(3), when v is affine in k.
std::optional<int64_t> affine_at(int64_t v1, int64_t v2, int64_t v3, int64_t K) {
  if (v3 - v2 != v2 - v1) return std::nullopt;
  return v1 + (K - 1) * (v2 - v1);
}

std::optional<TimelineOp> extrapolated_op(const TimelineOp& a, const TimelineOp& b, const TimelineOp& c, int64_t K) {
  if (a.kind != b.kind || a.kind != c.kind || a.merges != b.merges || a.merges != c.merges || a.label != b.label ||
      a.label != c.label)
    return std::nullopt;
  TimelineOp op = a;
  for (int i = 0; i < MemoryCategories::kCount; ++i) {
    const std::optional<int64_t> bytes = affine_at(a.bytes.at(i), b.bytes.at(i), c.bytes.at(i), K);
    if (!bytes) return std::nullopt;
    op.bytes.at(i) = *bytes;
  }
  const std::optional<int64_t> spike = affine_at(a.spike, b.spike, c.spike, K);
  if (!spike) return std::nullopt;
  op.spike = *spike;
  return op;
}

struct SimulatedRank {
  std::vector<PhaseEstimate> phases;
  RankTotals totals;
};

SimulatedRank simulate_layers(const Model& shape, const ModelConfig& model, int64_t layers, int world, int rank,
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

// The rank's step for model.num_hidden_layers = first + K period + margin layers from three small
// simulations, or nothing when they are not translations of one another.
std::optional<SimulatedRank> extrapolate_layers(const Model& shape, const ModelConfig& model, int64_t first,
                                                int64_t period, int64_t margin, int world, int rank, bool cuda) {
  const int64_t K = (model.num_hidden_layers - first - margin) / period;
  std::vector<TimelineOp> tapes[3];
  RankTotals totals[3];
  std::vector<TimelineItem> items[3];
  for (int64_t k = 1; k <= 3; ++k) {
    totals[k - 1] = simulate_layers(shape, model, first + k * period + margin, world, rank, cuda, &tapes[k - 1]).totals;
    std::optional<std::vector<TimelineItem>> found = items_of(tapes[k - 1], first, period, k);
    if (!found || (k > 1 && found->size() != items[0].size())) return std::nullopt;
    items[k - 1] = std::move(*found);
  }
  SimulatedRank simulated;
  const RankTotals& t1 = totals[0];
  const RankTotals& t2 = totals[1];
  const RankTotals& t3 = totals[2];
  if (t1.async_save != t2.async_save || t1.async_save != t3.async_save) return std::nullopt;
  simulated.totals.async_save = t1.async_save;
  for (auto [into, v1, v2, v3] : {std::tuple{&simulated.totals.offload_host, t1.offload_host, t2.offload_host, t3.offload_host},
                                  std::tuple{&simulated.totals.offload_pinned, t1.offload_pinned, t2.offload_pinned, t3.offload_pinned},
                                  std::tuple{&simulated.totals.async_save_bytes, t1.async_save_bytes, t2.async_save_bytes, t3.async_save_bytes},
                                  std::tuple{&simulated.totals.gathered_units, t1.gathered_units, t2.gathered_units, t3.gathered_units}}) {
    const std::optional<int64_t> value = affine_at(v1, v2, v3, K);
    if (!value) return std::nullopt;
    *into = *value;
  }

  const bool every_layer = model.num_hidden_layers <= kListedLayers;
  Timeline timeline(cuda);
  for (size_t i = 0; i < items[0].size(); ++i) {
    const TimelineItem& item = items[0][i];
    if (item.repeated != items[1][i].repeated || item.repeated != items[2][i].repeated) return std::nullopt;
    if (item.repeated) {
      for (int k = 1; k < 3; ++k)
        for (int64_t r = 0; r < period; ++r)
          if (items[k][i].down != item.down || items[k][i].stretches[r].layer != item.stretches[r].layer ||
              !same_ops_but_labels(items[k][i].stretches[r], item.stretches[r]))
            return std::nullopt;
      // The j-th repetition in time: layers j periods up, or going down, K - 1 - j.
      auto play = [&](int64_t repetition) {
        const int64_t shift = (item.down ? K - 1 - repetition : repetition) * period;
        for (const Stretch& stretch : item.stretches)
          for (const TimelineOp& op : stretch.ops)
            timeline.replay(op, op.kind == TimelineOp::Kind::point ? label_with_layer(op.label, stretch.layer + shift)
                                                                  : op.label);
      };
      const MemoryCategories before = timeline.live();
      play(0);
      if (K == 1) continue;
      MemoryCategories delta = timeline.live();
      for (int c = 0; c < MemoryCategories::kCount; ++c) delta.at(c) -= before.at(c);
      if (every_layer) {
        for (int64_t j = 1; j < K; ++j) play(j);
      } else {
        timeline.skip(delta, K - 2);
        play(K - 1);
      }
      continue;
    }
    const Stretch& a = item.stretches[0];
    const Stretch& b = items[1][i].stretches[0];
    const Stretch& c = items[2][i].stretches[0];
    if (a.layer != b.layer || a.layer != c.layer || a.ops.size() != b.ops.size() || a.ops.size() != c.ops.size())
      return std::nullopt;
    const bool after = a.layer >= first;  // a layer after the repeated ones: numbered K - 1 periods on
    for (size_t o = 0; o < a.ops.size(); ++o) {
      TimelineOp x = a.ops[o], y = b.ops[o], z = c.ops[o];
      if (x.kind == TimelineOp::Kind::point && after) {
        x.label = label_with_layer(x.label, a.layer + (K - 1) * period);
        y.label = z.label = x.label;
        if (label_layer(b.ops[o].label) != a.layer + period || label_layer(c.ops[o].label) != a.layer + 2 * period)
          return std::nullopt;
      }
      const std::optional<TimelineOp> op = extrapolated_op(x, y, z, K);
      if (!op) return std::nullopt;
      timeline.replay(*op, op->label);
    }
  }
  simulated.phases = timeline.phases();
  return simulated;
}

int64_t greatest_common_divisor(int64_t a, int64_t b) { return b == 0 ? a : greatest_common_divisor(b, a % b); }

// One rank's step: simulated unit by unit, or for a deep model extrapolated from a few layers.
SimulatedRank simulate_rank(const Model& shape, const ModelConfig& model, const EstimateOptions& options, int rank,
                            bool cuda) {
  const RunConfig& run = shape.run;
  // The layers repeat every `period`: activation checkpointing recomputes every K-th; GaLore's
  // projectors have owners in turn over the ranks.
  const int64_t every = std::max<int64_t>(1, run.activation_checkpointing_every);
  const int64_t owners =
      optimizer_settings(run).kind == "galore_adamw" && run.sharding.strategy != ShardingStrategy::no_shard
          ? options.world_size : 1;
  const int64_t period = every / greatest_common_divisor(every, owners) * owners;
  const int64_t first = 2 * period + 2;  // the margins: no boundary within reach of the repeated layers
  const int64_t layers = model.num_hidden_layers;
  if (layers > options.simulate_layers_up_to && layers >= 2 * first + 4 * period) {
    const int64_t margin = first + (layers - 2 * first) % period;
    if (std::optional<SimulatedRank> extrapolated =
            extrapolate_layers(shape, model, first, period, margin, options.world_size, rank, cuda))
      return std::move(*extrapolated);
    if (layers > kListedLayers * 16)
      throw std::logic_error("the memory estimate could not extrapolate the step of " + std::to_string(layers) +
                             " identical decoder layers from a few (a bug of the estimate: please report it)");
  }
  return simulate_layers(shape, model, layers, options.world_size, rank, cuda, nullptr);
}

}  // namespace

MemoryEstimate estimate_memory(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options) {
  LLM_REQUIRE(options.world_size >= 1, "command line", "--world_size", "expected an integer >= 1");
  MemoryEstimate estimate;
  estimate.device = resolved_device(run, options);
  LLM_REQUIRE(estimate.device == "cpu" || estimate.device == "cuda", "command line", "--device",
              "the estimate is for cpu or cuda (got \"" + estimate.device + "\")");
  // The simulation counts bytes in int64: a run whose activations and weights pass an exbibyte (no
  // machine has one) would wrap. A generous upper bound in long double decides first: every
  // layer's fp32 saved bytes and three logits-sized tensors per token, 20 bytes per parameter.
  const long double tokens = static_cast<long double>(run.data.batch_size) * static_cast<long double>(run.data.max_length);
  const long double per_token =
      4.0L * (3.0L * model.vocab_size +
              static_cast<long double>(model.num_hidden_layers) *
                  (8.0L * model.hidden_size + 2.0L * model.num_key_value_heads * model.head_dim() +
                   4.0L * model.intermediate_size + model.num_attention_heads + 2.0L));
  const long double bound = tokens * per_token + 20.0L * static_cast<long double>(model.num_parameters());
  if (bound > 0x1p60L)
    fail_user("command line", "--batch_size",
              "--batch_size " + std::to_string(run.data.batch_size) + " x --max_length " +
                  std::to_string(run.data.max_length) + " tokens per micro-batch of " + model.name +
                  " needs more than an exbibyte (2^60 bytes) per rank, which the estimate does not count to and "
                  "no machine has: lower --batch_size or --max_length (gradient accumulation, "
                  "--total_batch_size, keeps the global batch)");
  const Model shape(model, run);
  const bool cuda = estimate.device == "cuda";
  for (int rank = 0; rank < options.world_size; ++rank) {
    SimulatedRank simulated = simulate_rank(shape, model, options, rank, cuda);
    estimate.ranks.push_back(finish_rank(rank, cuda, run.sharding.offload == Offload::optimizer,
                                         std::move(simulated.phases), simulated.totals));
    estimate.gathered_units = static_cast<int>(simulated.totals.gathered_units);
    if (estimate.device == "cuda")
      estimate.ranks.back().runtime =
          cuda_runtime_bytes(estimate.ranks.back().peak_bytes,
                             options.world_size > 1 && run.sharding.communicator != CommunicatorChoice::mpi);
  }
  LLM_REQUIRE(options.ranks_per_node >= 0, "command line", "--ranks_per_node",
              "expected 0 (every rank on one node) or a positive number of ranks per node");
  const int per_node = options.ranks_per_node > 0 ? std::min(options.ranks_per_node, options.world_size)
                                                  : options.world_size;
  for (int first = 0; first < options.world_size; first += per_node) {
    NodeEstimate node;
    node.first_rank = first;
    node.ranks = std::min(per_node, options.world_size - first);
    for (int r = first; r < first + node.ranks; ++r) {
      node.host_bytes += estimate.ranks[r].host_bytes;
      node.pinned_bytes += estimate.ranks[r].pinned_bytes;
    }
    estimate.nodes.push_back(node);
  }
  return estimate;
}

CudaRuntimeBytes cuda_runtime_bytes(int64_t tensor_peak_bytes, bool nccl) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  CudaRuntimeBytes bytes;
  bytes.modules = 512 * kMiB;
  // 2 handles x (cuBLAS + cuBLASLt) x 32 MiB, and the main thread's handle on the reduce stream
  bytes.cublas_workspaces = (2 * 2 + 1) * 32 * kMiB;
  bytes.nccl_buffers = nccl ? 2 * 32 * 9 * kMiB : 0;
  bytes.allocator_slack = tensor_peak_bytes / 16 + 40 * kMiB;
  return bytes;
}

nlohmann::json estimate_to_json(const MemoryEstimate& estimate) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankEstimate& rank : estimate.ranks) {
    nlohmann::json phases = nlohmann::json::array();
    for (const PhaseEstimate& phase : rank.phases)
      phases.push_back({{"label", phase.label}, {"peak_bytes", phase.peak_bytes}, {"at_point", phase.at_point.to_json()}});
    ranks.push_back({{"rank", rank.rank},
                     {"peak_bytes", rank.peak_bytes},
                     {"peak_phase", rank.peak_phase},
                     {"max", rank.max.to_json()},
                     {"at_peak", rank.at_peak.to_json()},
                     {"checkpoint_peak_bytes", rank.checkpoint_peak_bytes},
                     {"host_bytes", rank.host_bytes},
                     {"async_save_host_bytes", rank.async_save_host_bytes},
                     {"pinned_bytes", rank.pinned_bytes},
                     {"cuda_runtime", {{"modules_bytes", rank.runtime.modules},
                                       {"cublas_workspace_bytes", rank.runtime.cublas_workspaces},
                                       {"nccl_buffer_bytes", rank.runtime.nccl_buffers},
                                       {"allocator_slack_bytes", rank.runtime.allocator_slack}}},
                     {"phases", phases}});
  }
  nlohmann::json nodes = nlohmann::json::array();
  for (const NodeEstimate& node : estimate.nodes)
    nodes.push_back({{"first_rank", node.first_rank}, {"ranks", node.ranks}, {"host_bytes", node.host_bytes},
                     {"pinned_bytes", node.pinned_bytes}});
  return {{"device", estimate.device}, {"gathered_units", estimate.gathered_units}, {"ranks", ranks}, {"nodes", nodes}};
}

namespace {

// Each node's host memory against its RAM: what --offload optimizer adds to host memory is the
// reason a run may fit the GPUs and not the node (four ranks on one node share its RAM).
std::string node_memory_section(const MemoryEstimate& estimate, const EstimateOptions& options) {
  const bool cuda = estimate.device == "cuda";
  int64_t largest = 0;
  for (const NodeEstimate& node : estimate.nodes) largest = std::max(largest, node.host_bytes);
  const int64_t ram = options.node_memory_gib > 0 ? static_cast<int64_t>(options.node_memory_gib * 1073741824.0)
                                                  : host_total_bytes();
  const ByteUnit unit = byte_unit_for(std::max(largest, ram));
  std::ostringstream out;
  out << "\nHost memory per node (" << estimate.nodes.front().ranks << " rank(s) per node, consecutive ranks; "
      << (cuda ? "what --offload optimizer keeps in host memory: masters, gradient landing buffers, staging "
                 "buffers (pinned) and optimizer state, and --async_save's copies; the processes themselves come on top"
               : "every rank's peak, all of it host memory, and --async_save's copies")
      << "). Sizes in " << unit.name << ".\n\n"
      << "| node | ranks | host | of which pinned |\n|---:|---|---:|---:|\n";
  for (size_t i = 0; i < estimate.nodes.size(); ++i) {
    const NodeEstimate& node = estimate.nodes[i];
    out << "| " << i << " | " << node.first_rank << "-" << node.first_rank + node.ranks - 1 << " | "
        << format_in(node.host_bytes, unit) << " | " << format_in(node.pinned_bytes, unit) << " |\n";
  }
  if (ram <= 0) {
    out << "\nThis machine's RAM is unknown (no /proc/meminfo): pass --node_memory_gib for the verdict.\n";
    return out.str();
  }
  char line[320];
  std::snprintf(line, sizeof(line), "\nNode RAM %.1f GiB (%s): the largest node's host memory, %.2f GiB, %s.\n",
                static_cast<double>(ram) / 1073741824.0,
                options.node_memory_gib > 0 ? "--node_memory_gib" : "this machine's; --node_memory_gib for another",
                static_cast<double>(largest) / 1073741824.0,
                largest <= ram ? "fits" : "does NOT fit: use more nodes (fewer --ranks_per_node), shard over more ranks, or a lighter optimizer");
  out << line;
  return out.str();
}

}  // namespace

std::string run_estimate_command(const ModelConfig& model, const RunConfig& run, const EstimateOptions& options) {
  const MemoryEstimate estimate = estimate_memory(model, run, options);
  if (options.json) return estimate_to_json(estimate).dump(1) + "\n";
  std::vector<RankMemorySummary> as_summaries;
  int64_t largest = 0, largest_checkpoint = 0;
  for (const RankEstimate& rank : estimate.ranks) {
    RankMemorySummary summary;
    summary.rank = rank.rank;
    summary.peak_bytes = rank.peak_bytes;
    summary.max = rank.max;
    summary.at_peak = rank.at_peak;
    summary.peak_phase = rank.peak_phase;
    as_summaries.push_back(summary);
    largest = std::max(largest, rank.peak_bytes);
    largest_checkpoint = std::max(largest_checkpoint, rank.checkpoint_peak_bytes);
  }
  const ByteUnit unit = byte_unit_for(std::max(largest, largest_checkpoint));
  std::ostringstream out;
  out << "Estimate for " << model.name << " (" << model.num_parameters() << " parameters), --optimizer "
      << run.optimizer.name << ", --dtype " << to_string(run.precision.dtype);
  if (run.precision.dtype == DType::bfloat16) out << " --precision " << to_string(run.precision.mode);
  out << ", --sharding " << to_string(run.sharding.strategy) << ", " << options.world_size << " rank(s) on "
      << estimate.device << ", micro-batch " << run.data.batch_size << " x " << run.data.max_length << " tokens"
      << (run.data.gradient_accumulation > 1 ? ", " + std::to_string(run.data.gradient_accumulation) + " micro-batches per step" : "")
      << ", " << (run.sharding.prefetch ? "prefetch" : "no prefetch") << ": at most " << estimate.gathered_units
      << " unit(s) gathered at once.\n"
      << "Peak: the largest total inside any phase of a step (evaluation included); the categories: each one's "
         "largest value at a phase boundary (docs/memory.md). Sizes in "
      << unit.name << ".\n\n";
  out << "| rank | peak | peak in | parameters | gradients | optimizer (device) | optimizer (host) | activations | other | checkpoint save |\n"
      << "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const RankEstimate& rank : estimate.ranks) {
    out << "| " << rank.rank << " | " << format_in(rank.peak_bytes, unit) << " | " << rank.peak_phase << " |";
    for (int i = 0; i < MemoryCategories::kCount; ++i) out << ' ' << format_in(rank.max.at(i), unit) << " |";
    out << ' ' << format_in(rank.checkpoint_peak_bytes, unit) << " |\n";
  }
  out << "\nCheckpoint save: every rank writes its own shards as they are (nothing is gathered), so a save "
         "holds what the step left behind (--save_dir).\n";
  if (run.checkpoint.async_save)
    out << "--async_save: each rank also holds a host copy of what it saves, at most "
        << format_in(estimate.ranks.front().async_save_host_bytes, unit) << " " << unit.name
        << " on rank 0, kept from the first save on (in the host memory below"
        << (estimate.device == "cuda" && run.sharding.offload != Offload::optimizer ? ", pinned" : "") << ").\n";
  if (options.memory_budget_gib > 0) {
    const double budget = options.memory_budget_gib * 1073741824.0;
    const bool fits = static_cast<double>(largest) <= budget;
    char line[256];
    std::snprintf(line, sizeof(line), "\nBudget %.1f GiB per rank: the training peak %s (largest rank %.2f GiB)",
                  options.memory_budget_gib, fits ? "fits" : "does NOT fit",
                  static_cast<double>(largest) / 1073741824.0);
    out << line;
    if (!run.checkpoint.save_dir.empty() || largest_checkpoint > budget) {
      std::snprintf(line, sizeof(line), "; saving a checkpoint %s (%.2f GiB)",
                    static_cast<double>(largest_checkpoint) <= budget ? "fits" : "does NOT fit",
                    static_cast<double>(largest_checkpoint) / 1073741824.0);
      out << line;
    }
    out << ".\n";
    if (estimate.device == "cuda")
      out << "(CUDA: allocated bytes; the runtime's own memory below comes on top.)\n";
  }
  if (estimate.device == "cuda") {
    const CudaRuntimeBytes& runtime = estimate.ranks.front().runtime;
    out << "\nBeside the tensors, each GPU holds about " << format_in(runtime.total(), unit) << " " << unit.name
        << " more on rank 0 (budgets, not yet measured: docs/memory.md): kernel modules "
        << format_in(runtime.modules, unit) << ", cuBLAS workspaces " << format_in(runtime.cublas_workspaces, unit)
        << ", NCCL buffers " << format_in(runtime.nccl_buffers, unit) << ", the caching allocator's slack "
        << format_in(runtime.allocator_slack, unit) << ". The start-up check counts them.\n";
  }
  out << node_memory_section(estimate, options);
  return out.str();
}

}  // namespace llm
