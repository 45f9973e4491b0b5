#include "data/document_windows.h"

#include <algorithm>

#include "common/errors.h"

namespace llm {

DocumentWindows::DocumentWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t window_tokens,
                                 const std::string& flag)
    : corpus_(std::move(corpus)), window_tokens_(window_tokens) {
  if (const TokenFile* shard = corpus_->shard_without_documents())
    fail_user(shard->path(), "--window_start document",
              std::string("its format (") + to_string(shard->format()) +
                  ") records no document boundaries, and windows that start at documents need them: give " + flag +
                  " Megatron datasets (.bin with its .idx; `trainer prepare --format megatron` writes them), or "
                  "--window_start anywhere");
  num_documents_ = corpus_->num_documents();
  // Every document once, a block at a time: the windows, and a mark every kStride of them.
  Reader walk(*this, 0);
  Reader::Mark mark;
  bool more = num_documents_ > 0 && walk.document_start(0) + window_tokens_ <= corpus_->size();
  if (more) mark = {0, walk.document_start(0)};
  while (more) {
    if (num_windows_ % kStride == 0) marks_.push_back(mark);
    ++num_windows_;
    more = walk.next(mark);
  }
}

DocumentWindows::Reader::Reader(std::shared_ptr<const DocumentWindows> windows)
    : owner_(std::move(windows)), windows_(owner_.get()) {}

DocumentWindows::Reader::Reader(const DocumentWindows& windows, int) : windows_(&windows) {}

int64_t DocumentWindows::Reader::document_start(int64_t document) {
  if (block_first_ < 0 || document < block_first_ || document >= block_first_ + static_cast<int64_t>(block_.size())) {
    block_first_ = document;
    block_.resize(static_cast<size_t>(std::min(kBlock, windows_->num_documents_ - document)));
    windows_->corpus_->document_starts(document, block_);
  }
  return block_[static_cast<size_t>(document - block_first_)];
}

bool DocumentWindows::Reader::next(Mark& mark) {
  const int64_t end = mark.start + windows_->window_tokens_;
  for (int64_t document = mark.document + 1; document < windows_->num_documents_; ++document) {
    const int64_t start = document_start(document);
    if (start < end) continue;
    if (start + windows_->window_tokens_ > windows_->corpus_->size()) return false;  // starts never fall: none later fits
    mark = {document, start};
    return true;
  }
  return false;
}

int64_t DocumentWindows::Reader::start(int64_t window) {
  LLM_REQUIRE(window >= 0 && window < windows_->num_windows_, "data", "window",
              "window " + std::to_string(window) + " is outside the " + std::to_string(windows_->num_windows_) +
                  " windows that start at documents");
  Mark mark = windows_->marks_[static_cast<size_t>(window / kStride)];
  for (int64_t step = window % kStride; step > 0; --step) next(mark);
  return mark.start;
}

}  // namespace llm
