// Windows that start at documents (--window_start document), for corpora whose shards record where
// documents start (Megatron's .idx: TokenCorpus::document_starts).
//
// The windows, as modded-nanogpt's BOS-aligned loader cuts them, specified so a run can be replayed:
// window 0 starts at the corpus's first document; window k + 1 starts at the first document that
// starts at or after window k's end (its start + W, W = max_length + 1 tokens). A window is W tokens:
// it runs on into the documents after its own when its document is shorter; where its document is
// longer, the rest of that document is not read (no window starts inside a document). The windows
// end with the last whose W tokens lie inside the corpus. Empty documents start nowhere new.
//
// The sampler (data/batches.h) then treats them as it treats fixed windows: the last --eval_fraction
// held out, the rest ordered by the keyed permutation of data/window_order.h.
//
// Memory: the start of every kStride-th window (and its document) is kept, 16 bytes per 1,024
// windows (15 MiB for 10^12 tokens in windows of 1,025); opening walks every document once, a
// block at a time. Window k's start is found from the kept start below it, walking at most
// kStride - 1 windows through the document index. The kept starts do not change once built, so
// the train and eval samplers of one corpus share them (WeightedCorpus::documents); each sampler
// reads through its own Reader, which holds one block of the document index.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/token_corpus.h"

namespace llm {

class DocumentWindows {
 public:
  static constexpr int64_t kStride = 1024;

  // Throws UserError naming `flag` and the first shard that records no documents (with what to do).
  DocumentWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t window_tokens, const std::string& flag = "--data");

  int64_t size() const { return num_windows_; }
  int64_t window_tokens() const { return window_tokens_; }
  const TokenCorpus& corpus() const { return *corpus_; }

  // Where windows start, read through a cache of one block of the document index (one per reader:
  // it is not shared between threads).
  class Reader {
   public:
    explicit Reader(std::shared_ptr<const DocumentWindows> windows);
    // The first token (an index into the corpus) of window `window` < size().
    int64_t start(int64_t window);

   private:
    friend class DocumentWindows;
    Reader(const DocumentWindows& windows, int);  // the constructor's own walk
    int64_t document_start(int64_t document);
    // The window after the one at `mark`: the first document at or after its end; false when none
    // starts there with W tokens left in the corpus.
    struct Mark {
      int64_t document = 0;  // the document the window starts at
      int64_t start = 0;     // its first token
    };
    bool next(Mark& mark);

    std::shared_ptr<const DocumentWindows> owner_;
    const DocumentWindows* windows_;
    static constexpr int64_t kBlock = 4096;
    int64_t block_first_ = -1;
    std::vector<int64_t> block_;
  };

 private:
  std::shared_ptr<const TokenCorpus> corpus_;
  int64_t window_tokens_ = 0;
  int64_t num_documents_ = 0;
  int64_t num_windows_ = 0;
  std::vector<Reader::Mark> marks_;  // marks_[i]: window i * kStride
};

}  // namespace llm
