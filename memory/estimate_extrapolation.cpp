// The memory estimate for deep models: the step of L identical decoder layers built exactly from
// three simulations of a few layers (the margins and one, two, three repetitions), so that the cost
// of an estimate does not grow with the depth. Apart from the step simulation it extrapolates
// (estimate_simulation.cpp): it knows nothing of tensors, only the tape of timeline operations.
#include "memory/estimate_simulation.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config/optimizer_setup.h"

namespace llm {
namespace {

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

// The totals of K periods from those of 1, 2 and 3, or nothing when they are not affine in k.
std::optional<RankTotals> extrapolated_totals(const RankTotals (&totals)[3], int64_t K) {
  RankTotals extrapolated;
  const RankTotals& t1 = totals[0];
  const RankTotals& t2 = totals[1];
  const RankTotals& t3 = totals[2];
  if (t1.async_save != t2.async_save || t1.async_save != t3.async_save) return std::nullopt;
  extrapolated.async_save = t1.async_save;
  for (auto [into, v1, v2, v3] : {std::tuple{&extrapolated.offload_host, t1.offload_host, t2.offload_host, t3.offload_host},
                                  std::tuple{&extrapolated.offload_pinned, t1.offload_pinned, t2.offload_pinned, t3.offload_pinned},
                                  std::tuple{&extrapolated.async_save_bytes, t1.async_save_bytes, t2.async_save_bytes, t3.async_save_bytes},
                                  std::tuple{&extrapolated.gathered_units, t1.gathered_units, t2.gathered_units, t3.gathered_units}}) {
    const std::optional<int64_t> value = affine_at(v1, v2, v3, K);
    if (!value) return std::nullopt;
    *into = *value;
  }
  return extrapolated;
}

// Item i, a pass's run of repeated layers, played K times onto `timeline` (with every_layer, each
// repetition's points; else the first and the last, the ones between skipped over); false when the
// three simulations' repetitions are not the same.
bool replay_repeated(Timeline& timeline, const std::vector<TimelineItem> (&items)[3], size_t i, int64_t period,
                     int64_t K, bool every_layer) {
  const TimelineItem& item = items[0][i];
  for (int k = 1; k < 3; ++k)
    for (int64_t r = 0; r < period; ++r)
      if (items[k][i].down != item.down || items[k][i].stretches[r].layer != item.stretches[r].layer ||
          !same_ops_but_labels(items[k][i].stretches[r], item.stretches[r]))
        return false;
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
  if (K == 1) return true;
  MemoryCategories delta = timeline.live();
  for (int c = 0; c < MemoryCategories::kCount; ++c) delta.at(c) -= before.at(c);
  if (every_layer) {
    for (int64_t j = 1; j < K; ++j) play(j);
  } else {
    timeline.skip(delta, K - 2);
    play(K - 1);
  }
  return true;
}

// Item i, a stretch outside the repeated layers, played onto `timeline` with each of its byte counts
// extrapolated to K; false when they are not affine in k.
bool replay_outside(Timeline& timeline, const std::vector<TimelineItem> (&items)[3], size_t i, int64_t first,
                    int64_t period, int64_t K) {
  const Stretch& a = items[0][i].stretches[0];
  const Stretch& b = items[1][i].stretches[0];
  const Stretch& c = items[2][i].stretches[0];
  if (a.layer != b.layer || a.layer != c.layer || a.ops.size() != b.ops.size() || a.ops.size() != c.ops.size())
    return false;
  const bool after = a.layer >= first;  // a layer after the repeated ones: numbered K - 1 periods on
  for (size_t o = 0; o < a.ops.size(); ++o) {
    TimelineOp x = a.ops[o], y = b.ops[o], z = c.ops[o];
    if (x.kind == TimelineOp::Kind::point && after) {
      x.label = label_with_layer(x.label, a.layer + (K - 1) * period);
      y.label = z.label = x.label;
      if (label_layer(b.ops[o].label) != a.layer + period || label_layer(c.ops[o].label) != a.layer + 2 * period)
        return false;
    }
    const std::optional<TimelineOp> op = extrapolated_op(x, y, z, K);
    if (!op) return false;
    timeline.replay(*op, op->label);
  }
  return true;
}

// The rank's step for model.num_hidden_layers = first + K period + margin layers from three small
// simulations, or nothing when they are not translations of one another.
std::optional<SimulatedRank> extrapolate_layers(const ModelShape& shape, const ModelConfig& model, int64_t first,
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
  const std::optional<RankTotals> extrapolated = extrapolated_totals(totals, K);
  if (!extrapolated) return std::nullopt;
  simulated.totals = *extrapolated;

  const bool every_layer = model.num_hidden_layers <= kListedLayers;
  Timeline timeline(cuda);
  for (size_t i = 0; i < items[0].size(); ++i) {
    const TimelineItem& item = items[0][i];
    if (item.repeated != items[1][i].repeated || item.repeated != items[2][i].repeated) return std::nullopt;
    const bool played = item.repeated ? replay_repeated(timeline, items, i, period, K, every_layer)
                                      : replay_outside(timeline, items, i, first, period, K);
    if (!played) return std::nullopt;
  }
  simulated.phases = timeline.phases();
  return simulated;
}

int64_t greatest_common_divisor(int64_t a, int64_t b) { return b == 0 ? a : greatest_common_divisor(b, a % b); }

}  // namespace

// One rank's step: simulated unit by unit, or for a deep model extrapolated from a few layers.
SimulatedRank simulate_rank(const ModelShape& shape, const ModelConfig& model, const EstimateOptions& options, int rank,
                            bool cuda) {
  const RunConfig& run = shape.run;
  // The layers repeat every `period`: activation checkpointing recomputes every K-th; GaLore's
  // projectors have owners in turn over the ranks.
  const int64_t every = std::max<int64_t>(1, run.activation_checkpointing_every);
  const int64_t owners =
      optimizer_settings(run).kind == "galore_adamw" ? shard_world(run, options.world_size) : 1;
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

}  // namespace llm
