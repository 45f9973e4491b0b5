// The memory estimate's simulation of one rank's step (memory/estimate.h), shared by its files:
// the timeline the step's tensor lifetimes are replayed on (Timeline, recorded as a tape of
// TimelineOps for deep models), the sizes of those tensors (ModelShape), and the two ways of running
// the step:
//   estimate_simulation.cpp     simulate_layers: the step unit by unit, as the trainer runs it
//   estimate_extrapolation.cpp  simulate_rank: that, or for a deep model the step of its identical
//                               layers extrapolated from three small simulations
//   estimate.cpp                estimate_memory: each rank's phases into its RankEstimate
// Internal to the estimate: everything else reads memory/estimate.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "memory/categories.h"
#include "memory/estimate.h"
#include "model/recompute.h"
#include "model/units.h"

namespace llm {

// Category indices of MemoryCategories::at().
constexpr int kParameters = 0, kGradients = 1, kOptimizerDevice = 2, kOptimizerHost = 3, kActivations = 4, kOther = 5;

// One step of the timeline as recorded for extrapolation (see extrapolate_layers,
// estimate_extrapolation.cpp): consecutive adds of non-negative bytes are one add (the window's peak
// after them is the total after the last), consecutive removes one remove, consecutive spikes one
// spike of the largest.
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

// The sizes of the step's tensors for a model config and the run's precision: per element, per
// token, per unit. Only sizes: the simulation (StepSimulation) places them on the timeline.
struct ModelShape {
  enum class Mode { fp32, mixed, pure };

  const ModelConfig& config;
  const RunConfig& run;
  Mode mode;
  int64_t tokens;  // per micro-batch on this rank: batch_size x max_length
  int64_t h, I, V, kv, heads;
  RecomputeSet recompute;  // --recompute's operations

  ModelShape(const ModelConfig& model, const RunConfig& run_config)
      : config(model), run(run_config),
        mode(run_config.precision.dtype == DType::float32 ? Mode::fp32
             : run_config.precision.mode == Precision::mixed ? Mode::mixed : Mode::pure),
        tokens(run_config.data.batch_size * run_config.data.max_length),
        h(model.hidden_size), I(model.intermediate_size), V(model.vocab_size),
        kv(model.num_key_value_heads * model.head_dim()), heads(model.num_attention_heads),
        recompute(recompute_set(run_config.recompute)) {}

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
      case Mode::fp32: return 4 * (8 * h + 2 * kv + 4 * I + heads + 2) - layer_recompute_frees_per_token();
      case Mode::mixed: return 30 * h + 4 * kv + 8 * I + 8 + 4 * heads - layer_recompute_frees_per_token();
      case Mode::pure: return 22 * h + 4 * kv + 8 * I + 8 + 4 * heads - layer_recompute_frees_per_token();
    }
    return 0;
  }
  // What --recompute frees of the above (model/recompute.h: an operation keeps only its inputs):
  //   norm       fp32: rsqrt and x * rsqrt of each norm, 4 (2h + 2); mixed: the fp32 normed x and
  //              rsqrt of each (8h + 8; the norms' outputs are saved by no one, the linears keep their
  //              casts); pure: each norm's fp32 copy, rsqrt and normed x (2 (6h + 4)), less the
  //              residual sum the post-attention norm now keeps as its input (2h): 10h + 8
  //   swiglu     silu(gate): fp32 4I, bf16 2I
  //   mlp        gate, up, silu, product: fp32 16I; pure 8I; mixed 8I and gate's and up's casts of
  //              the input (4h), less the fp32 input the operation keeps (4h): 8I
  //   attention  q_rot, k_rot, v, SDPA's output and logsumexp: fp32 4 (2h + 2kv + heads); pure
  //              4h + 4kv + 4 heads; mixed also q's, k's, v's casts of the input (6h) less the fp32
  //              input kept (4h): 6h + 4kv + 4 heads
  int64_t layer_recompute_frees_per_token() const {
    int64_t frees = 0;
    if (recompute.norm) frees += mode == Mode::fp32 ? 4 * (2 * h + 2) : mode == Mode::mixed ? 8 * h + 8 : 10 * h + 8;
    if (recompute.mlp)
      frees += mode == Mode::fp32 ? 16 * I : 8 * I;
    else if (recompute.swiglu)
      frees += mode == Mode::fp32 ? 4 * I : 2 * I;
    if (recompute.attention)
      frees += mode == Mode::fp32 ? 4 * (2 * h + 2 * kv + heads) : mode == Mode::mixed ? 6 * h + 4 * kv + 4 * heads
                                                                  : 4 * h + 4 * kv + 4 * heads;
    return frees;
  }
  // The head: final norm (rsqrt, normed, the lm_head input) and the logits.
  //   fp32 4 (2h + 1) + 4V; mixed 4 + 4h + 2h (the bf16 cast) + 2V, plus the bf16 cast of lm_head's
  //   weight; pure 4h (fp32 copy) + 4 + 2h + 2h + 2V.
  // --recompute norm frees the final norm's rsqrt and normed x (fp32 4 (h + 1), mixed 4h + 4, pure
  // its fp32 copy too: 6h + 4).
  int64_t head_saved_per_token() const {
    switch (mode) {
      case Mode::fp32: return 4 * (2 * h + 1) + 4 * V - (recompute.norm ? 4 * (h + 1) : 0);
      case Mode::mixed: return 4 + 6 * h + 2 * V - (recompute.norm ? 4 * h + 4 : 0);
      case Mode::pure: return 8 * h + 4 + 2 * V - (recompute.norm ? 6 * h + 4 : 0);
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

// What a rank's simulation gives beside its timeline.
struct RankTotals {
  int64_t offload_host = 0, offload_pinned = 0;  // --offload optimizer's host memory
  bool async_save = false;                         // this rank keeps --async_save's host copy
  int64_t async_save_bytes = 0;
  int64_t gathered_units = 0;                      // the gather schedule's peak
};

// One rank's step: its phases (the windows closed at its points) and its totals.
struct SimulatedRank {
  std::vector<PhaseEstimate> phases;
  RankTotals totals;
};

// The step of `model` with `layers` decoder layers, simulated unit by unit (estimate_simulation.cpp).
// With a `tape`, every timeline operation is recorded to it and the phases are left empty.
SimulatedRank simulate_layers(const ModelShape& shape, const ModelConfig& model, int64_t layers, int world, int rank,
                              bool cuda, std::vector<TimelineOp>* tape);

// One rank's step: simulated unit by unit, or for a deep model extrapolated from a few layers
// (estimate_extrapolation.cpp).
SimulatedRank simulate_rank(const ModelShape& shape, const ModelConfig& model, const EstimateOptions& options, int rank,
                            bool cuda);

}  // namespace llm
