// Turns a token corpus (--data's shards, data/token_corpus.h) into this rank's batches,
// deterministically.
//
// The corpus is cut into non-overlapping windows of max_length + 1 tokens (inputs and shifted labels);
// a window may span two shards. The last `eval_fraction` of the windows (at least one) is the
// held-out split; the rest, n windows, is train.
// Order (documented so a run can be replayed): epoch e visits the n train windows in the keyed
// permutation of data/window_order.h, WindowOrder(n, seed): 8 Feistel rounds over the smallest
// even-bit domain >= n, keyed from (seed, e) through SplitMix64, cycle-walked into [0, n). Sample k
// of the whole run is window perm_e(k mod n) of epoch e = k / n; the sampler keeps the current
// epoch's round keys only (no memory grows with the corpus). Global sample k belongs to micro-batch
// k / global_micro, and within it rank r takes positions [r * batch, (r + 1) * batch): ranks read
// disjoint windows and N ranks see together exactly what one rank with an N times larger
// micro-batch sees.
// Eval walks the held-out windows in corpus order, split across ranks the same way.
// Exactly: each next() reads global samples [c + r * batch, c + (r + 1) * batch) on rank r, where c is
// samples_consumed(), then advances c by batch * world_size. seek(c) may land anywhere (not only on a
// micro-batch boundary, and in any epoch), so a run can resume at another world size or batch size.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "data/token_corpus.h"

namespace llm {

struct Batch {
  at::Tensor input_ids;  // (batch, max_length) int64
  at::Tensor labels;     // (batch, max_length) int64: input_ids shifted left by one
};

enum class Split { train, eval };

class BatchSampler {
 public:
  // Throws UserError if the split has fewer windows than one global micro-batch needs at least
  // once (the file is shorter than one window, or the eval split is empty).
  // whole_corpus: every window of `tokens` is this split's and eval_fraction is not used (--eval_data:
  // the held-out corpus is a corpus of its own, and --data is all train).
  BatchSampler(std::shared_ptr<const TokenCorpus> tokens, Split split, int64_t max_length,
               double eval_fraction, uint64_t seed, int rank, int world_size, int64_t batch_size,
               bool whole_corpus = false);

  Batch next();                        // this rank's next micro-batch
  int64_t samples_consumed() const;    // global samples consumed so far (all ranks)
  void seek(int64_t global_samples);   // resume: continue as if that many were consumed
  int64_t num_windows() const;         // windows in this split

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace llm
