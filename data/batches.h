// Turns a token corpus (--data's shards, data/token_corpus.h) into this rank's batches,
// deterministically.
//
// The corpus is cut into non-overlapping windows of max_length + 1 tokens (inputs and shifted labels);
// a window may span two shards. With WindowStart::document, the windows are those of
// data/document_windows.h (each starts at a document), numbered in corpus order, and all below is the same. The last `eval_fraction` of the windows (at least one) is the
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
// A mixture (several weighted sources, data/token_corpus.h's data_sources): each source is split
// and ordered on its own as above, source s's order keyed with seed + s * 0x9E3779B97F4A7C15 (source
// 0's is the single corpus's), and global sample k goes to a source by integer weights W_s (the
// weights times 10^6, rounded) in nested Bresenham steps: with R_j = W_j + ... + W_last, sample k of
// level j's stream is source j's sample floor(k W_j / R_j) when floor((k+1) W_j / R_j) exceeds
// floor(k W_j / R_j), else sample k - floor((k+1) W_j / R_j) of level j+1's stream (the last source
// takes what reaches it). So every prefix of the run holds each source's share to within a sample
// per level, the assignment is a pure function of k (a resume seeks exactly), and no memory grows
// with the run. Eval walks each source's held-out windows in turn (source order, corpus order).
// Exactly: each next() reads global samples [c + r * batch, c + (r + 1) * batch) on rank r, where c is
// samples_consumed(), then advances c by batch * world_size. seek(c) may land anywhere (not only on a
// micro-batch boundary, and in any epoch), so a run can resume at another world size or batch size.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include <ATen/core/Tensor.h>

#include "data/token_corpus.h"

namespace llm {

class DocumentWindows;

struct Batch {
  at::Tensor input_ids;  // (batch, max_length) int64
  at::Tensor labels;     // (batch, max_length) int64: input_ids shifted left by one
};

enum class Split { train, eval };

// Where windows start: anywhere (the corpus cut every max_length + 1 tokens, across documents), or at
// documents (data/document_windows.h: shards that record them).
enum class WindowStart { anywhere, document };

struct WeightedCorpus {
  WeightedCorpus(std::shared_ptr<const TokenCorpus> tokens_, double weight_ = 1,
                 std::shared_ptr<const DocumentWindows> documents_ = nullptr)
      : tokens(std::move(tokens_)), weight(weight_), documents(std::move(documents_)) {}

  std::shared_ptr<const TokenCorpus> tokens;
  double weight = 1;
  // WindowStart::document: the windows of `tokens`, built once and shared by the train and eval
  // samplers; a sampler builds them itself when this is null (or was built for another length).
  std::shared_ptr<const DocumentWindows> documents;
};

class BatchSampler {
 public:
  // Throws UserError if the split has fewer windows than one global micro-batch needs at least
  // once (the file is shorter than one window, or the eval split is empty).
  // whole_corpus: every window of `tokens` is this split's and eval_fraction is not used (--eval_data:
  // the held-out corpus is a corpus of its own, and --data is all train).
  BatchSampler(std::shared_ptr<const TokenCorpus> tokens, Split split, int64_t max_length,
               double eval_fraction, uint64_t seed, int rank, int world_size, int64_t batch_size,
               bool whole_corpus = false, WindowStart window_start = WindowStart::anywhere);
  // A mixture: the sources in order with their weights (one source of any weight: as above).
  BatchSampler(std::vector<WeightedCorpus> sources, Split split, int64_t max_length, double eval_fraction,
               uint64_t seed, int rank, int world_size, int64_t batch_size, bool whole_corpus = false,
               WindowStart window_start = WindowStart::anywhere);

  Batch next();                        // this rank's next micro-batch
  int64_t samples_consumed() const;    // global samples consumed so far (all ranks)
  void seek(int64_t global_samples);   // resume: continue as if that many were consumed
  int64_t num_windows() const;         // windows in this split (all sources')
  // Which source global sample k of the train split comes from, and its index within that source's
  // samples (the nested Bresenham assignment above); (0, k) for one source.
  std::pair<size_t, int64_t> source_of_sample(int64_t sample) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace llm
