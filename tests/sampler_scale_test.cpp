// The batch sampler at pre-training scale (issue 27): over a simulated corpus of 10^12 tokens in
// 100 shards (sparse files, tests/sparse_corpus.h: 2 TB promised, a few blocks on disk), it reads
// exactly the windows data/window_order.h names, in any epoch and in the eval tail, and its memory
// does not grow with the corpus: the per-epoch permutation it replaced would hold 8 bytes per train
// window, 7.8 GB here, on every rank.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "common/memory_stats.h"
#include "data/batches.h"
#include "data/window_order.h"
#include "tests/sparse_corpus.h"
#include "tests/test_util.h"

namespace llm::sampler_scale_test {
namespace {

using testing::ScratchDir;

constexpr int kShards = 100;
constexpr int64_t kTokensPerShard = 10'000'000'000;  // 10^10 uint16 ids: 20 GB of hole per file
constexpr int64_t kMaxLength = 1024;                 // windows of 1025 tokens
constexpr int64_t kVocab = 65536;
constexpr double kEvalFraction = 0.001;
// floor(10^12 / 1025) windows, floor(0.001 of them) held out, the rest train.
constexpr int64_t kTotalWindows = 975609756;
constexpr int64_t kEvalWindows = 975609;
constexpr int64_t kTrainWindows = kTotalWindows - kEvalWindows;
constexpr uint64_t kSeed = 2024;

int64_t first_input(const Batch& batch, int64_t row) {
  return batch.input_ids[row][0].item<int64_t>();
}

TEST(SamplerAtScale, ReadsTheDocumentedWindowsOfATrillionTokens) {
  ScratchDir scratch("sampler_scale_windows");
  // Samples from the first, second and 1000th epoch; each one's window gets its own id at its first
  // token, so the batch says which window was read.
  const int64_t n = kTrainWindows;
  const std::vector<int64_t> samples = {0, 1, 7, n - 1, n, n + 12345, 999 * n + n / 2, 1000 * n - 1};
  const WindowOrder order(static_cast<uint64_t>(n), kSeed);
  std::map<int64_t, int64_t> id_of_window;  // window -> the id marking it
  std::vector<testing::TokenMark> marks;
  auto mark = [&](int64_t window) {
    if (id_of_window.count(window) != 0) return;
    const auto id = static_cast<int64_t>(id_of_window.size()) + 1;
    id_of_window[window] = id;
    marks.push_back({window * (kMaxLength + 1), id});
  };
  for (int64_t sample : samples) {
    const auto k = static_cast<uint64_t>(sample), epoch_size = static_cast<uint64_t>(n);
    mark(static_cast<int64_t>(order(k / epoch_size, k % epoch_size)));
  }
  mark(kTotalWindows - 1);  // the eval split's last window, the corpus's last whole window
  const auto corpus = testing::open_sparse_corpus(
      testing::write_sparse_shards(scratch.path(), kShards, kTokensPerShard, kVocab, marks), kVocab);
  ASSERT_EQ(corpus->size(), int64_t{kShards} * kTokensPerShard);

  BatchSampler train(corpus, Split::train, kMaxLength, kEvalFraction, kSeed, 0, 1, 1);
  ASSERT_EQ(train.num_windows(), kTrainWindows);
  for (int64_t sample : samples) {
    train.seek(sample);
    const Batch batch = train.next();
    const auto k = static_cast<uint64_t>(sample), epoch_size = static_cast<uint64_t>(n);
    const auto window = static_cast<int64_t>(order(k / epoch_size, k % epoch_size));
    EXPECT_EQ(first_input(batch, 0), id_of_window[window])
        << "sample " << sample << ", window " << window;
    EXPECT_EQ(batch.input_ids.sum().item<int64_t>(), id_of_window[window])
        << "the rest of the window is the hole's 0s";
  }
  BatchSampler eval(corpus, Split::eval, kMaxLength, kEvalFraction, kSeed, 0, 1, 1);
  ASSERT_EQ(eval.num_windows(), kEvalWindows);
  eval.seek(kEvalWindows - 1);
  EXPECT_EQ(first_input(eval.next(), 0), id_of_window[kTotalWindows - 1]);
}

TEST(SamplerAtScale, MemoryDoesNotGrowWithTheCorpus) {
  ScratchDir scratch("sampler_scale_memory");
  const auto corpus = testing::open_sparse_corpus(
      testing::write_sparse_shards(scratch.path(), kShards, kTokensPerShard, kVocab), kVocab);
  const int64_t batch = 8;
  {  // Warm up what any sampler uses once: ATen's first tensors, the allocator, the read path.
    BatchSampler warm(corpus, Split::train, kMaxLength, kEvalFraction, kSeed + 1, 0, 1, batch);
    for (int i = 0; i < 4; ++i) warm.next();
  }
  const int64_t before = current_resident_bytes();
  ASSERT_GT(before, 0) << "/proc/self/statm is unreadable here";
  BatchSampler sampler(corpus, Split::train, kMaxLength, kEvalFraction, kSeed, 3, 4, batch);
  // 64 micro-batches spread over 16 epochs: each new epoch is where the old sampler drew its
  // permutation of every train window.
  int64_t ids = 0;
  for (int64_t i = 0; i < 64; ++i) {
    sampler.seek(i * (kTrainWindows / 4) + 17 * i);
    const Batch drawn = sampler.next();
    ASSERT_EQ(drawn.input_ids.sizes(), (std::vector<int64_t>{batch, kMaxLength}));
    ids += drawn.input_ids.sum().item<int64_t>();
  }
  EXPECT_EQ(ids, 0) << "every id of the sparse corpus is 0";
  const int64_t grown = current_resident_bytes() - before;
  // A few MB at most (a batch's tensors and the allocator's slack); the permutation it replaced:
  // 8 bytes x 974634147 train windows = 7.8 GB.
  EXPECT_LT(grown, int64_t{8} << 20) << "the sampler's resident memory grew by " << grown
                                     << " bytes";
}

}  // namespace
}  // namespace llm::sampler_scale_test
