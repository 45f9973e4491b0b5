// The synthetic corpus (data/synthetic.h), what --data synthetic (the default) trains on: its entropy
// rate is the exact one of its bigram process (checked against an estimate from the tokens), its ids
// spread over the whole vocabulary, it is the same for the same seed and quick to make, and
// impossible specs are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <unordered_map>

#include "data/synthetic.h"
#include "tests/data_test_util.h"

namespace llm::synthetic_corpus_test {
namespace {

using testing::expect_user_error;

// Plug-in estimate of H(X_t+1 | X_t) from bigram counts; its bias is about -(pairs - states) / 2N,
// under 0.001 nats at 2M tokens, so 0.02 leaves room for sampling noise only.
double bigram_conditional_entropy(const std::vector<int64_t>& tokens) {
  std::unordered_map<int64_t, int64_t> previous_counts;
  std::unordered_map<uint64_t, int64_t> pair_counts;
  for (size_t t = 0; t + 1 < tokens.size(); ++t) {
    ++previous_counts[tokens[t]];
    ++pair_counts[(static_cast<uint64_t>(tokens[t]) << 32) | static_cast<uint64_t>(tokens[t + 1])];
  }
  const double pairs = static_cast<double>(tokens.size() - 1);
  double entropy = 0;
  for (const auto& [pair, count] : pair_counts) {
    const double previous = static_cast<double>(previous_counts[static_cast<int64_t>(pair >> 32)]);
    entropy -= (count / pairs) * std::log(count / previous);
  }
  return entropy;
}

double unigram_entropy(const std::vector<int64_t>& tokens) {
  std::unordered_map<int64_t, int64_t> counts;
  for (int64_t id : tokens) ++counts[id];
  double entropy = 0;
  for (const auto& [id, count] : counts) {
    const double frequency = static_cast<double>(count) / static_cast<double>(tokens.size());
    entropy -= frequency * std::log(frequency);
  }
  return entropy;
}

TEST(Synthetic, EntropyRateMatchesBigramEstimate) {
  for (int64_t vocab : {37, 32000}) {
    SyntheticCorpusSpec spec;
    spec.vocab_size = vocab;
    spec.seed = 11;
    const SyntheticCorpus corpus = generate_synthetic_corpus(spec);
    ASSERT_EQ(static_cast<int64_t>(corpus.tokens.size()), spec.num_tokens);
    // Branching 4 with probabilities 1:2:3:4 / 10.
    const double expected_rate = -(0.1 * std::log(0.1) + 0.2 * std::log(0.2) +
                                   0.3 * std::log(0.3) + 0.4 * std::log(0.4));
    EXPECT_NEAR(corpus.entropy_rate_nats, expected_rate, 1e-12);
    EXPECT_NEAR(bigram_conditional_entropy(corpus.tokens), corpus.entropy_rate_nats, 0.02)
        << "vocab " << vocab;
    EXPECT_NEAR(unigram_entropy(corpus.tokens), corpus.unigram_entropy_nats, 1e-9);
    // Context must matter: a context-free model is far worse than the floor.
    const double active = static_cast<double>(std::min<int64_t>(vocab, spec.active_vocab));
    EXPECT_GT(corpus.unigram_entropy_nats, corpus.entropy_rate_nats + 1.5);
    EXPECT_LE(corpus.unigram_entropy_nats, std::log(active) + 1e-9);
    EXPECT_GT(corpus.unigram_entropy_nats, 0.8 * std::log(active));
  }
}

TEST(Synthetic, OtherBranchingHasItsOwnExactRate) {
  SyntheticCorpusSpec spec;
  spec.vocab_size = 1000;
  spec.active_vocab = 200;
  spec.branching = 7;
  spec.num_tokens = 1'000'000;
  const SyntheticCorpus corpus = generate_synthetic_corpus(spec);
  double expected_rate = 0;
  for (int j = 1; j <= 7; ++j) expected_rate -= (j / 28.0) * std::log(j / 28.0);
  EXPECT_NEAR(corpus.entropy_rate_nats, expected_rate, 1e-12);
  EXPECT_NEAR(bigram_conditional_entropy(corpus.tokens), expected_rate, 0.02);
}

TEST(Synthetic, IdsBelowVocabAndSpreadAcrossIt) {
  for (int64_t vocab : {37, 512, 32000, 32100}) {
    SyntheticCorpusSpec spec;
    spec.vocab_size = vocab;
    spec.num_tokens = 200'000;
    const SyntheticCorpus corpus = generate_synthetic_corpus(spec);
    std::set<int64_t> distinct(corpus.tokens.begin(), corpus.tokens.end());
    EXPECT_GE(*distinct.begin(), 0);
    EXPECT_LT(*distinct.rbegin(), vocab) << "vocab " << vocab;
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), std::min<int64_t>(vocab, 512))
        << "vocab " << vocab;
    // Spread: both the lowest and the highest 1% of the vocab are used.
    EXPECT_LT(*distinct.begin(), std::max<int64_t>(1, vocab / 100) + 1);
    EXPECT_GE(*distinct.rbegin(), vocab - std::max<int64_t>(1, vocab / 100) - 1);
  }
}

TEST(Synthetic, DeterministicFromSeedAndFast) {
  SyntheticCorpusSpec spec;
  spec.vocab_size = 32000;
  const auto start = std::chrono::steady_clock::now();
  const SyntheticCorpus first = generate_synthetic_corpus(spec);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(first.tokens.size(), size_t{1} << 21);
  // Typically ~0.05 s; the bound is loose because the test machine is shared.
  EXPECT_LT(seconds, 2.0) << "2M synthetic tokens took " << seconds << " s";
  EXPECT_EQ(generate_synthetic_corpus(spec).tokens, first.tokens);
  spec.seed = 1;
  EXPECT_NE(generate_synthetic_corpus(spec).tokens, first.tokens);
}

TEST(Synthetic, RejectsImpossibleSpecs) {
  SyntheticCorpusSpec spec;
  spec.vocab_size = 0;
  expect_user_error([&] { generate_synthetic_corpus(spec); }, {"vocab_size"});
  spec.vocab_size = 3;
  spec.branching = 4;
  expect_user_error([&] { generate_synthetic_corpus(spec); }, {"branching", "3 are active"});
}

}  // namespace
}  // namespace llm::synthetic_corpus_test
