// The synthetic Markov corpus: a random sparse transition table, then a walk on it.
//
// Construction, all from one std::mt19937_64 seeded with spec.seed:
//  1. Active ids: the vocab is cut into `active` equal strata and one id is drawn in each, so ids
//     are distinct, spread over the whole vocab (embedding rows far apart are all exercised) and
//     below vocab.
//  2. Successors: every state gets `branching` distinct successor states. One of them is its next
//     state on a random cycle through all states, so the chain is irreducible (no trap that would
//     collapse the unigram entropy); the others are drawn uniformly.
//  3. Probabilities: successor j of a state (in a random order per state) has probability
//     proportional to j + 1. Every row has the same multiset of probabilities, so the entropy rate
//     sum_s pi(s) H(row s) is exactly H(row) whatever the stationary distribution pi is.
#include "data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/errors.h"

namespace llm {
namespace {

// Uniform integer in [0, bound) without modulo bias, independent of the standard library's
// distributions (which differ between implementations), so a seed means the same corpus everywhere.
uint64_t uniform_below(std::mt19937_64& generator, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t draw = generator();
    if (draw >= threshold) return draw % bound;
  }
}

double uniform_unit(std::mt19937_64& generator) {
  return static_cast<double>(generator() >> 11) * 0x1.0p-53;  // [0, 1) with 53 random bits
}

}  // namespace

SyntheticCorpus generate_synthetic_corpus(const SyntheticCorpusSpec& spec) {
  const std::string source = "synthetic corpus";
  LLM_REQUIRE(spec.vocab_size > 0, source, "vocab_size",
              "is " + std::to_string(spec.vocab_size) + "; set a positive vocab_size in the model "
              "config");
  LLM_REQUIRE(spec.active_vocab > 0, source, "active_vocab",
              "is " + std::to_string(spec.active_vocab) + "; use at least 1");
  LLM_REQUIRE(spec.branching > 0, source, "branching",
              "is " + std::to_string(spec.branching) + "; use at least 1");
  LLM_REQUIRE(spec.num_tokens >= 0, source, "num_tokens",
              "is " + std::to_string(spec.num_tokens) + "; use a non-negative count");
  const int64_t active = std::min(spec.active_vocab, spec.vocab_size);
  LLM_REQUIRE(spec.branching <= spec.active_vocab, source, "branching",
              std::to_string(spec.branching) + " successors per token need at least that many active ids, but "
              "active_vocab is " + std::to_string(spec.active_vocab) + "; lower branching");
  LLM_REQUIRE(spec.branching <= active, source, "vocab_size",
              "the synthetic corpus needs a vocabulary of at least " + std::to_string(spec.branching) +
                  " tokens (" + std::to_string(spec.branching) + " successors per token, its branching), but only " +
                  std::to_string(active) + " are active (vocab_size " + std::to_string(spec.vocab_size) +
                  "): raise vocab_size in the model config, or train on a token file with --data FILE");
  const int64_t branching = spec.branching;

  std::mt19937_64 generator(spec.seed);

  // 1. One id per stratum [floor(i * vocab / active), floor((i + 1) * vocab / active)).
  std::vector<int64_t> state_to_id(static_cast<size_t>(active));
  const auto stratum_start = [&](int64_t stratum) {  // 128-bit product: no overflow at any vocab
    return static_cast<int64_t>(static_cast<__int128>(stratum) * spec.vocab_size / active);
  };
  for (int64_t state = 0; state < active; ++state) {
    const int64_t begin = stratum_start(state);
    const int64_t end = stratum_start(state + 1);
    state_to_id[state] = begin + static_cast<int64_t>(uniform_below(generator, end - begin));
  }

  // 2. Successor table, (active, branching) row-major, entries are states.
  std::vector<int64_t> cycle(static_cast<size_t>(active));
  std::iota(cycle.begin(), cycle.end(), 0);
  for (int64_t i = active - 1; i > 0; --i)
    std::swap(cycle[i], cycle[uniform_below(generator, static_cast<uint64_t>(i) + 1)]);
  std::vector<int64_t> next_on_cycle(static_cast<size_t>(active));
  for (int64_t i = 0; i < active; ++i) next_on_cycle[cycle[i]] = cycle[(i + 1) % active];

  std::vector<int64_t> successors(static_cast<size_t>(active * branching));
  std::vector<int64_t> chosen_for(static_cast<size_t>(active), -1);  // last state that chose it
  for (int64_t state = 0; state < active; ++state) {
    int64_t* row = successors.data() + state * branching;
    row[0] = next_on_cycle[state];
    chosen_for[row[0]] = state;
    for (int64_t j = 1; j < branching; ++j) {
      int64_t candidate;
      do {
        candidate = static_cast<int64_t>(uniform_below(generator, static_cast<uint64_t>(active)));
      } while (chosen_for[candidate] == state);
      chosen_for[candidate] = state;
      row[j] = candidate;
    }
    for (int64_t j = branching - 1; j > 0; --j)  // the cycle edge takes a random probability rank
      std::swap(row[j], row[uniform_below(generator, static_cast<uint64_t>(j) + 1)]);
  }

  // 3. Successor j has probability (j + 1) / (branching (branching + 1) / 2).
  const double total_weight = 0.5 * static_cast<double>(branching) * (branching + 1);
  std::vector<double> cumulative(static_cast<size_t>(branching));
  double running = 0;
  SyntheticCorpus corpus;
  for (int64_t j = 0; j < branching; ++j) {
    const double probability = (j + 1) / total_weight;
    running += probability;
    cumulative[j] = running;
    corpus.entropy_rate_nats -= probability * std::log(probability);
  }
  cumulative.back() = 1.0;  // no draw in [0, 1) may fall past the last successor by rounding

  // The walk, from a uniformly drawn start.
  corpus.tokens.resize(static_cast<size_t>(spec.num_tokens));
  std::vector<int64_t> visits(static_cast<size_t>(active), 0);
  int64_t state = static_cast<int64_t>(uniform_below(generator, static_cast<uint64_t>(active)));
  for (int64_t t = 0; t < spec.num_tokens; ++t) {
    corpus.tokens[t] = state_to_id[state];
    ++visits[state];
    const double draw = uniform_unit(generator);
    const int64_t pick = branching <= 16
        ? [&] { int64_t j = 0; while (draw >= cumulative[j]) ++j; return j; }()
        : std::upper_bound(cumulative.begin(), cumulative.end(), draw) - cumulative.begin();
    state = successors[state * branching + pick];
  }

  for (int64_t count : visits) {
    if (count == 0) continue;
    const double frequency = static_cast<double>(count) / static_cast<double>(spec.num_tokens);
    corpus.unigram_entropy_nats -= frequency * std::log(frequency);
  }
  return corpus;
}

}  // namespace llm
