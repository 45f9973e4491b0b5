// The batch sampler: window arithmetic, the per-epoch order, and the copy into tensors.
//
// The order is data/window_order.h's keyed permutation, computed a window at a time: integer
// arithmetic only (no library distribution, no floating point), so a run replays bit for bit on any
// toolchain, and the sampler's memory is the same for 10^3 windows or 10^12.
#include "data/batches.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "common/errors.h"
#include "data/document_windows.h"
#include "data/window_order.h"

namespace llm {

struct BatchSampler::Impl {
  struct Source {
    std::shared_ptr<const TokenCorpus> tokens;
    uint64_t weight = 1;       // its share in units: the weight over the largest, times 2^52, rounded
    int64_t first_window = 0;  // index of this split's first window in the source
    int64_t num_windows = 0;   // this split's windows in the source
    std::optional<DocumentWindows::Reader> documents;  // WindowStart::document: where each window starts
    std::optional<WindowOrder> order;             // train only
    int64_t cached_epoch = -1;
    std::optional<KeyedPermutation> epoch_order;  // the cached epoch's: its round keys, O(1) bytes
  };
  std::vector<Source> sources;
  std::vector<uint64_t> remaining_weight;  // R_j: the weights of sources j.. together
  Split split = Split::train;
  int64_t max_length = 0;
  int64_t num_windows = 0;   // windows in this split, all sources
  int rank = 0;
  int world_size = 1;
  int64_t batch_size = 0;
  int64_t samples_consumed = 0;  // global, all ranks
  std::vector<int64_t> window;   // (max_length + 1) scratch

  std::pair<size_t, int64_t> source_of_sample(int64_t sample) const;
  // (source, window index in it) of a sample.
  std::pair<size_t, int64_t> window_of_sample(int64_t sample);
};

namespace {

std::string split_name(Split split) { return split == Split::train ? "train" : "eval"; }

// A weight as a user wrote it (17 significant digits at most, no trailing zeros).
std::string format_weight(double weight) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", weight);
  for (int digits = 1; digits <= 17; ++digits) {
    char shorter[32];
    std::snprintf(shorter, sizeof(shorter), "%.*g", digits, weight);
    if (std::strtod(shorter, nullptr) == weight) return shorter;
  }
  return text;
}

constexpr uint64_t kSourceKeyStep = 0x9E3779B97F4A7C15ULL;
// Weights become integers in proportion: the largest is 2^52 units, each other its ratio to the
// largest times that, rounded (a double's precision: the ratio, not the weights' magnitude, counts,
// so weights of 1e13 or 1e300 or 1e-7 mean what they say). A weight below a billionth of the largest
// is refused: it would keep at least 4.5 million units (its ratio to 2e-7 at worst), but no run
// draws a sample from it. Up to 4096 sources, so the units' sum fits 64 bits.
constexpr double kLargestWeightUnits = 0x1p52;
constexpr double kSmallestWeightRatio = 1e-9;
constexpr size_t kMostSources = 4096;

}  // namespace

std::pair<size_t, int64_t> BatchSampler::Impl::source_of_sample(int64_t sample) const {
  using Wide = unsigned __int128;
  auto k = static_cast<uint64_t>(sample);
  for (size_t j = 0; j + 1 < sources.size(); ++j) {
    const Wide w = sources[j].weight, r = remaining_weight[j];
    const auto before = static_cast<uint64_t>(Wide{k} * w / r);
    const auto through = static_cast<uint64_t>((Wide{k} + 1) * w / r);
    if (through > before) return {j, static_cast<int64_t>(before)};
    k -= through;
  }
  return {sources.size() - 1, static_cast<int64_t>(k)};
}

std::pair<size_t, int64_t> BatchSampler::Impl::window_of_sample(int64_t sample) {
  if (split == Split::eval) {  // each source's held-out windows in turn
    int64_t offset = sample % num_windows;
    for (size_t s = 0;; ++s) {
      if (offset < sources[s].num_windows) return {s, sources[s].first_window + offset};
      offset -= sources[s].num_windows;
    }
  }
  const auto [s, index] = source_of_sample(sample);
  Source& source = sources[s];
  const int64_t offset = index % source.num_windows;
  const int64_t epoch = index / source.num_windows;
  if (epoch != source.cached_epoch) {
    source.epoch_order = source.order->epoch(static_cast<uint64_t>(epoch));
    source.cached_epoch = epoch;
  }
  return {s, source.first_window + static_cast<int64_t>((*source.epoch_order)(static_cast<uint64_t>(offset)))};
}

BatchSampler::BatchSampler(std::shared_ptr<const TokenCorpus> tokens, Split split, int64_t max_length,
                           double eval_fraction, uint64_t seed, int rank, int world_size, int64_t batch_size,
                           bool whole_corpus, WindowStart window_start)
    : BatchSampler(std::vector<WeightedCorpus>{{std::move(tokens), 1.0}}, split, max_length, eval_fraction, seed,
                   rank, world_size, batch_size, whole_corpus, window_start) {}

BatchSampler::BatchSampler(std::vector<WeightedCorpus> sources, Split split, int64_t max_length,
                           double eval_fraction, uint64_t seed, int rank, int world_size, int64_t batch_size,
                           bool whole_corpus, WindowStart window_start)
    : impl_(std::make_shared<Impl>()) {
  LLM_REQUIRE(!sources.empty(), "data", "token file", "no token file was opened");
  for (const WeightedCorpus& source : sources)
    LLM_REQUIRE(source.tokens != nullptr, "data", "token file", "no token file was opened");
  const std::string path = sources.size() == 1 ? sources.front().tokens->name()
                                               : "--data (a mixture of " + std::to_string(sources.size()) + " sources)";
  LLM_REQUIRE(max_length > 0, "--max_length", "",
              "is " + std::to_string(max_length) + "; use a positive sequence length");
  LLM_REQUIRE(batch_size > 0, "--batch_size", "",
              "is " + std::to_string(batch_size) + "; use a positive micro-batch size");
  LLM_REQUIRE(world_size > 0 && rank >= 0 && rank < world_size, "data", "rank",
              "rank " + std::to_string(rank) + " is outside a world of " +
                  std::to_string(world_size));
  LLM_REQUIRE(std::isfinite(eval_fraction) && eval_fraction >= 0 && eval_fraction < 1,
              "--eval_fraction", "",
              "is " + std::to_string(eval_fraction) + "; use a fraction in [0, 1), e.g. 0.01");

  LLM_REQUIRE(sources.size() <= kMostSources, path, "sources",
              "a mixture of at most " + std::to_string(kMostSources) + " sources (got " + std::to_string(sources.size()) + ")");
  double largest_weight = 0;
  for (const WeightedCorpus& source : sources) {
    LLM_REQUIRE(std::isfinite(source.weight) && source.weight > 0, source.tokens->name(), "weight",
                "is " + format_weight(source.weight) + ": a weight is a finite number above 0");
    largest_weight = std::max(largest_weight, source.weight);
  }
  for (const WeightedCorpus& source : sources)
    LLM_REQUIRE(source.weight / largest_weight >= kSmallestWeightRatio, source.tokens->name(), "weight",
                "is " + format_weight(source.weight) + ", below a billionth of the largest weight (" +
                    format_weight(largest_weight) + "): no run would draw a sample from it. Weights count by their "
                    "ratios, from 1e-9 to 1; drop this source or raise its weight");

  const int64_t window_tokens = max_length + 1;
  Impl& state = *impl_;
  int64_t total_windows = 0, eval_windows = 0, train_windows = 0;
  for (size_t s = 0; s < sources.size(); ++s) {
    const TokenCorpus& tokens = *sources[s].tokens;
    std::shared_ptr<const DocumentWindows> documents;
    if (window_start == WindowStart::document) {
      documents = sources[s].documents;
      if (documents == nullptr || documents->window_tokens() != window_tokens || &documents->corpus() != &tokens)
        documents = std::make_shared<const DocumentWindows>(sources[s].tokens, window_tokens,
                                                            whole_corpus && split == Split::eval ? "--eval_data" : "--data");
    }
    const int64_t windows = documents ? documents->size() : tokens.size() / window_tokens;
    LLM_REQUIRE(windows >= 1, tokens.name(), "length",
                "has " + std::to_string(tokens.size()) + " tokens, " +
                    (documents ? "no document with " : "shorter than one window of ") + "max_length + 1 = " +
                    std::to_string(window_tokens) + " tokens" + (documents ? " after its start left in the corpus" : "") +
                    "; lower --max_length or use more data");
    const int64_t held_out =
        whole_corpus ? (split == Split::eval ? windows : 0)
                     : std::max<int64_t>(1, static_cast<int64_t>(std::floor(eval_fraction * static_cast<double>(windows))));
    const int64_t trained = std::max<int64_t>(0, windows - held_out);
    if (sources.size() > 1 && split == Split::train)
      LLM_REQUIRE(trained >= 1, tokens.name(), "train split",
                  "has no window to train on (" + std::to_string(windows) + " windows of " + std::to_string(window_tokens) +
                      " tokens, " + std::to_string(held_out) + " held out): give this source more data");
    Impl::Source source;
    source.tokens = sources[s].tokens;
    if (documents) source.documents.emplace(std::move(documents));
    source.weight = static_cast<uint64_t>(std::llround(sources[s].weight / largest_weight * kLargestWeightUnits));
    source.first_window = split == Split::train ? 0 : trained;
    source.num_windows = split == Split::train ? trained : held_out;
    if (split == Split::train && trained > 0)
      source.order.emplace(static_cast<uint64_t>(trained), seed + kSourceKeyStep * static_cast<uint64_t>(s));
    state.sources.push_back(std::move(source));
    total_windows += windows;
    eval_windows += held_out;
    train_windows += trained;
  }
  const int64_t global_micro_batch = batch_size * world_size;
  const int64_t split_windows = split == Split::train ? train_windows : eval_windows;
  if (split_windows < global_micro_batch) {
    const char* more = whole_corpus ? (split == Split::train ? "or use more data" : "or use more held-out data in --eval_data")
                       : split == Split::train ? "lower --eval_fraction, or use more data"
                                               : "raise --eval_fraction, or use more data";
    const std::string remedy = std::string("lower --max_length (more, shorter windows) or --batch_size, ") + more;
    fail_user(path, split_name(split) + " split",
              "has " + std::to_string(split_windows) + " windows of " +
                  std::to_string(window_tokens) + " tokens (" + std::to_string(total_windows) +
                  " in the corpus, " + std::to_string(eval_windows) + " held out for eval) but one "
                  "global micro-batch needs batch_size * world_size = " +
                  std::to_string(batch_size) + " * " + std::to_string(world_size) + " = " +
                  std::to_string(global_micro_batch) + "; " + remedy);
  }
  state.remaining_weight.assign(state.sources.size(), 0);
  uint64_t remaining = 0;
  for (size_t s = state.sources.size(); s-- > 0;) {
    remaining += state.sources[s].weight;
    state.remaining_weight[s] = remaining;
  }
  state.split = split;
  state.max_length = max_length;
  state.num_windows = split_windows;
  state.rank = rank;
  state.world_size = world_size;
  state.batch_size = batch_size;
  state.window.resize(static_cast<size_t>(window_tokens));
}

Batch BatchSampler::next() {
  Impl& state = *impl_;
  const int64_t length = state.max_length;
  Batch batch{at::empty({state.batch_size, length}, at::kLong),
              at::empty({state.batch_size, length}, at::kLong)};
  int64_t* inputs = batch.input_ids.data_ptr<int64_t>();
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  const int64_t first_sample = state.samples_consumed + state.rank * state.batch_size;
  for (int64_t row = 0; row < state.batch_size; ++row) {
    const auto [source, window_index] = state.window_of_sample(first_sample + row);
    Impl::Source& from = state.sources[source];
    from.tokens->read(from.documents ? from.documents->start(window_index) : window_index * (length + 1), state.window);
    std::copy(state.window.begin(), state.window.end() - 1, inputs + row * length);
    std::copy(state.window.begin() + 1, state.window.end(), labels + row * length);
  }
  state.samples_consumed += state.batch_size * state.world_size;
  return batch;
}

int64_t BatchSampler::samples_consumed() const { return impl_->samples_consumed; }

void BatchSampler::seek(int64_t global_samples) {
  LLM_REQUIRE(global_samples >= 0, "data", "resume",
              "cannot resume at a negative sample count (" + std::to_string(global_samples) +
                  "); the checkpoint's data position is corrupt");
  impl_->samples_consumed = global_samples;
}

int64_t BatchSampler::num_windows() const { return impl_->num_windows; }

std::pair<size_t, int64_t> BatchSampler::source_of_sample(int64_t sample) const {
  return impl_->source_of_sample(sample);
}

}  // namespace llm
