// A built-in corpus with structure a model can learn and a known entropy floor, so that "the loss
// falls" is checkable without downloading anything.
//
// The corpus is a first-order Markov chain over `active_vocab` token ids spread across the model's
// vocabulary (so any vocab size works): from each token the next is one of `branching` successors,
// chosen with fixed, unequal probabilities. Its entropy rate (the best achievable mean loss, in nats)
// is the entropy of that successor distribution; its unigram entropy (what a model that ignores
// context reaches) is that of the chain's stationary distribution, measured on the generated tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llm {

struct SyntheticCorpusSpec {
  int64_t vocab_size = 0;       // model vocab; ids are always < vocab_size
  int64_t active_vocab = 512;   // distinct ids used (clamped to vocab_size)
  int64_t branching = 4;        // successors per token
  int64_t num_tokens = 1 << 21;
  uint64_t seed = 0;

  // The smallest model vocabulary the corpus can be built over: every token needs `branching`
  // distinct successors (validate_run_config refuses a smaller vocab_size with --data synthetic).
  int64_t min_vocab_size() const { return branching; }
};

struct SyntheticCorpus {
  std::vector<int64_t> tokens;
  double entropy_rate_nats = 0;     // floor for next-token loss
  double unigram_entropy_nats = 0;  // empirical entropy of the token frequencies
};

SyntheticCorpus generate_synthetic_corpus(const SyntheticCorpusSpec& spec);

}  // namespace llm
