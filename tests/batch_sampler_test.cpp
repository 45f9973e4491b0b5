// The batch sampler (data/batches.h): inputs and shifted labels, every train window once per epoch in
// a new order, the documented order (data/window_order.h), the same batches for the same seed, N
// ranks together equal to one rank with their union, seek() resuming the uninterrupted stream, the
// eval split as the disjoint tail of the corpus, and the splits and settings it refuses.
//
// The sampler tests use a file whose token at position i is i itself, so a window is identified by
// its first token and "labels are inputs shifted by one" is an exact element-wise check.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include "data/batches.h"
#include "data/token_corpus.h"
#include "data/token_file.h"
#include "data/window_order.h"
#include "tests/data_test_util.h"
#include "tests/test_util.h"

namespace llm::batch_sampler_test {
namespace {

using testing::expect_user_error;
using testing::ScratchDir;

constexpr int64_t kMaxLength = 7;  // windows of 8 tokens
constexpr int64_t kWindows = 50;   // 5 held out at eval_fraction 0.1, 45 train
constexpr double kEvalFraction = 0.1;

// The corpus of one token file (its name() is the file's path).
std::shared_ptr<const TokenCorpus> single_file_corpus(const std::string& path, int64_t vocab_size) {
  return std::make_shared<TokenCorpus>(
      std::vector<std::shared_ptr<TokenFile>>{TokenFile::open(path, vocab_size)});
}

// A corpus whose token i is i: window w starts with token w * (kMaxLength + 1).
std::shared_ptr<const TokenCorpus> identity_token_file(const ScratchDir& scratch,
                                                       int64_t windows = kWindows) {
  const std::string path = scratch / "identity.bin";
  std::vector<int64_t> tokens(static_cast<size_t>(windows * (kMaxLength + 1) + 3));  // +3: a tail
  std::iota(tokens.begin(), tokens.end(), 0);
  write_token_file(path, tokens, 65536);
  return single_file_corpus(path, 65536);
}

int64_t window_of_row(const Batch& batch, int64_t row) {
  return batch.input_ids[row][0].item<int64_t>() / (kMaxLength + 1);
}

std::vector<int64_t> windows_of(const Batch& batch) {
  std::vector<int64_t> windows;
  for (int64_t row = 0; row < batch.input_ids.size(0); ++row)
    windows.push_back(window_of_row(batch, row));
  return windows;
}

TEST(BatchSampler, ShapesAndShiftedLabels) {
  ScratchDir scratch("sampler_labels");
  const auto tokens = identity_token_file(scratch);
  BatchSampler sampler(tokens, Split::train, kMaxLength, kEvalFraction, 1, 0, 1, 3);
  EXPECT_EQ(sampler.num_windows(), 45);
  for (int step = 0; step < 20; ++step) {
    const Batch batch = sampler.next();
    ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{3, kMaxLength}));
    ASSERT_EQ(batch.labels.sizes(), (std::vector<int64_t>{3, kMaxLength}));
    ASSERT_EQ(batch.input_ids.scalar_type(), at::kLong);
    ASSERT_EQ(batch.labels.scalar_type(), at::kLong);
    // Token i is i, so the next token of every input is input + 1, the last label included.
    EXPECT_TRUE(at::equal(batch.labels, batch.input_ids + 1));
    // Windows are aligned: every row starts at a multiple of max_length + 1.
    EXPECT_TRUE(at::equal(batch.input_ids.select(1, 0) % (kMaxLength + 1),
                          at::zeros({3}, at::kLong)));
  }
  EXPECT_EQ(sampler.samples_consumed(), 60);
}

TEST(BatchSampler, EachEpochVisitsEveryTrainWindowOnce) {
  ScratchDir scratch("sampler_epoch");
  const auto tokens = identity_token_file(scratch);
  BatchSampler sampler(tokens, Split::train, kMaxLength, kEvalFraction, 9, 0, 1, 1);
  std::vector<int64_t> first_epoch, second_epoch;
  for (int i = 0; i < 45; ++i) first_epoch.push_back(window_of_row(sampler.next(), 0));
  for (int i = 0; i < 45; ++i) second_epoch.push_back(window_of_row(sampler.next(), 0));
  std::vector<int64_t> all_train(45);
  std::iota(all_train.begin(), all_train.end(), 0);
  std::vector<int64_t> sorted_first = first_epoch, sorted_second = second_epoch;
  std::sort(sorted_first.begin(), sorted_first.end());
  std::sort(sorted_second.begin(), sorted_second.end());
  EXPECT_EQ(sorted_first, all_train);
  EXPECT_EQ(sorted_second, all_train);
  EXPECT_NE(first_epoch, all_train) << "the train order is not shuffled";
  EXPECT_NE(first_epoch, second_epoch) << "every epoch must draw its own permutation";
}

// Sample k of the run is window WindowOrder(n, seed)(k / n, k mod n): the order batches.h documents
// (and window_order_test.cpp pins with golden values), across three epochs.
TEST(BatchSampler, FollowsTheDocumentedWindowOrder) {
  ScratchDir scratch("sampler_order");
  const auto tokens = identity_token_file(scratch);
  BatchSampler sampler(tokens, Split::train, kMaxLength, kEvalFraction, 2024, 0, 1, 5);
  const WindowOrder order(45, 2024);
  for (int64_t step = 0; step < 27; ++step) {  // 135 samples: three epochs of 45
    const std::vector<int64_t> windows = windows_of(sampler.next());
    for (int64_t row = 0; row < 5; ++row) {
      const auto sample = static_cast<uint64_t>(step * 5 + row);
      const auto expected = static_cast<int64_t>(order(sample / 45, sample % 45));
      EXPECT_EQ(windows[static_cast<size_t>(row)], expected) << "sample " << sample;
    }
  }
}

TEST(BatchSampler, DeterministicForSeedAndDifferentAcrossSeeds) {
  ScratchDir scratch("sampler_seed");
  const auto tokens = identity_token_file(scratch);
  BatchSampler first(tokens, Split::train, kMaxLength, kEvalFraction, 1234, 0, 1, 4);
  BatchSampler again(tokens, Split::train, kMaxLength, kEvalFraction, 1234, 0, 1, 4);
  BatchSampler other(tokens, Split::train, kMaxLength, kEvalFraction, 1235, 0, 1, 4);
  bool any_difference = false;
  for (int step = 0; step < 30; ++step) {
    const Batch a = first.next(), b = again.next(), c = other.next();
    ASSERT_TRUE(at::equal(a.input_ids, b.input_ids)) << "step " << step;
    ASSERT_TRUE(at::equal(a.labels, b.labels)) << "step " << step;
    any_difference = any_difference || !at::equal(a.input_ids, c.input_ids);
  }
  EXPECT_TRUE(any_difference) << "seeds 1234 and 1235 gave the same 30 batches";
}

// N ranks with micro-batch b see together what one rank with micro-batch N * b sees, step by step,
// across epoch boundaries (45 train windows, 4 per step), and ranks never share a window in a step.
TEST(BatchSampler, RanksTogetherEqualOneRankWithTheirUnion) {
  ScratchDir scratch("sampler_union");
  const auto tokens = identity_token_file(scratch);
  const int world = 4;
  BatchSampler single(tokens, Split::train, kMaxLength, kEvalFraction, 77, 0, 1, world);
  std::vector<BatchSampler> ranks;
  for (int rank = 0; rank < world; ++rank)
    ranks.emplace_back(tokens, Split::train, kMaxLength, kEvalFraction, 77, rank, world, 1);
  for (int step = 0; step < 40; ++step) {
    const Batch whole = single.next();
    std::set<int64_t> step_windows;
    for (int rank = 0; rank < world; ++rank) {
      const Batch part = ranks[rank].next();
      ASSERT_TRUE(at::equal(part.input_ids, whole.input_ids.narrow(0, rank, 1)))
          << "step " << step << " rank " << rank;
      ASSERT_TRUE(at::equal(part.labels, whole.labels.narrow(0, rank, 1)));
      step_windows.insert(window_of_row(part, 0));
    }
    // Disjoint except where the step straddles an epoch end (a window may recur there).
    const int64_t first_sample = step * world;
    if (first_sample / 45 == (first_sample + world - 1) / 45) {
      EXPECT_EQ(step_windows.size(), static_cast<size_t>(world)) << "step " << step;
    }
    for (int rank = 0; rank < world; ++rank)
      EXPECT_EQ(ranks[rank].samples_consumed(), single.samples_consumed());
  }
  // Two ranks of two against the same single stream.
  std::vector<BatchSampler> pairs;
  for (int rank = 0; rank < 2; ++rank)
    pairs.emplace_back(tokens, Split::train, kMaxLength, kEvalFraction, 77, rank, 2, 2);
  BatchSampler single_again(tokens, Split::train, kMaxLength, kEvalFraction, 77, 0, 1, 4);
  for (int step = 0; step < 25; ++step) {
    const Batch whole = single_again.next();
    for (int rank = 0; rank < 2; ++rank)
      ASSERT_TRUE(at::equal(pairs[rank].next().input_ids, whole.input_ids.narrow(0, 2 * rank, 2)));
  }
}

TEST(BatchSampler, SeekResumesTheUninterruptedStream) {
  ScratchDir scratch("sampler_seek");
  const auto tokens = identity_token_file(scratch);
  BatchSampler uninterrupted(tokens, Split::train, kMaxLength, kEvalFraction, 5, 1, 2, 3);
  std::vector<Batch> stream;
  for (int step = 0; step < 25; ++step) stream.push_back(uninterrupted.next());
  for (int resume_step : {0, 1, 7, 15, 24}) {
    BatchSampler resumed(tokens, Split::train, kMaxLength, kEvalFraction, 5, 1, 2, 3);
    resumed.seek(int64_t{resume_step} * 6);
    EXPECT_EQ(resumed.samples_consumed(), resume_step * 6);
    for (int step = resume_step; step < 25; ++step)
      ASSERT_TRUE(at::equal(resumed.next().input_ids, stream[step].input_ids))
          << "resumed at step " << resume_step << ", step " << step;
  }
  // A resume at another layout (sample 13: not a multiple of 2 * 3): rows are samples 13, 14, 15.
  BatchSampler one_by_one(tokens, Split::train, kMaxLength, kEvalFraction, 5, 0, 1, 1);
  std::vector<int64_t> sample_windows;
  for (int i = 0; i < 100; ++i) sample_windows.push_back(window_of_row(one_by_one.next(), 0));
  BatchSampler resumed(tokens, Split::train, kMaxLength, kEvalFraction, 5, 0, 1, 3);
  resumed.seek(13);
  EXPECT_EQ(windows_of(resumed.next()),
            (std::vector<int64_t>{sample_windows[13], sample_windows[14], sample_windows[15]}));
  resumed.seek(88);  // backwards and across epochs
  EXPECT_EQ(windows_of(resumed.next()),
            (std::vector<int64_t>{sample_windows[88], sample_windows[89], sample_windows[90]}));
}

TEST(BatchSampler, EvalIsTheDisjointTailInFileOrder) {
  ScratchDir scratch("sampler_eval");
  const auto tokens = identity_token_file(scratch);
  BatchSampler train(tokens, Split::train, kMaxLength, kEvalFraction, 3, 0, 1, 1);
  std::set<int64_t> train_windows;
  for (int i = 0; i < 3 * 45; ++i) train_windows.insert(window_of_row(train.next(), 0));
  EXPECT_EQ(train_windows.size(), 45u);
  EXPECT_EQ(*train_windows.rbegin(), 44);

  BatchSampler eval(tokens, Split::eval, kMaxLength, kEvalFraction, 3, 0, 1, 1);
  EXPECT_EQ(eval.num_windows(), 5);
  std::vector<int64_t> eval_windows;
  for (int i = 0; i < 7; ++i) eval_windows.push_back(window_of_row(eval.next(), 0));
  EXPECT_EQ(eval_windows, (std::vector<int64_t>{45, 46, 47, 48, 49, 45, 46}));  // file order, wraps
  for (int64_t window : eval_windows) EXPECT_EQ(train_windows.count(window), 0u);

  // Split across two ranks of micro-batch 1: rank 0 reads 45, 47, 49, ...; rank 1 reads 46, 48, ...
  BatchSampler eval_rank1(tokens, Split::eval, kMaxLength, kEvalFraction, 3, 1, 2, 1);
  EXPECT_EQ(window_of_row(eval_rank1.next(), 0), 46);
  EXPECT_EQ(window_of_row(eval_rank1.next(), 0), 48);

  // eval_fraction 0 still holds out one window, so evaluation always has data.
  BatchSampler minimal_eval(tokens, Split::eval, kMaxLength, 0.0, 3, 0, 1, 1);
  EXPECT_EQ(minimal_eval.num_windows(), 1);
  EXPECT_EQ(window_of_row(minimal_eval.next(), 0), 49);
}

TEST(BatchSampler, RejectsFileShorterThanOneWindow) {
  ScratchDir scratch("sampler_short");
  const std::string path = scratch / "short.bin";
  write_token_file(path, std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}, 100);  // 7 < max_length + 1
  const auto tokens = single_file_corpus(path, 100);
  expect_user_error(
      [&] { BatchSampler(tokens, Split::train, kMaxLength, kEvalFraction, 0, 0, 1, 1); },
      {path, "7 tokens", "shorter than one window", "8 tokens", "--max_length"});
}

TEST(BatchSampler, RejectsSplitSmallerThanOneGlobalMicroBatch) {
  ScratchDir scratch("sampler_small_split");
  const auto tokens = identity_token_file(scratch);
  // Eval holds 5 windows; 3 ranks of 2 need 6.
  expect_user_error(
      [&] { BatchSampler(tokens, Split::eval, kMaxLength, kEvalFraction, 0, 0, 3, 2); },
      {tokens->name(), "eval split", "has 5 windows", "2 * 3 = 6", "--max_length", "--batch_size",
       "raise --eval_fraction", "more data"});
  EXPECT_NO_THROW(BatchSampler(tokens, Split::eval, kMaxLength, kEvalFraction, 0, 0, 5, 1));
  // Train holds 45; 46 ranks of 1 need 46.
  expect_user_error(
      [&] { BatchSampler(tokens, Split::train, kMaxLength, kEvalFraction, 0, 0, 46, 1); },
      {"train split", "has 45 windows", "1 * 46 = 46", "lower --eval_fraction"});
  // A file of exactly one window: it is the eval window, the train split is empty.
  ScratchDir one_window("sampler_one_window");
  const auto single = identity_token_file(one_window, 1);
  expect_user_error(
      [&] { BatchSampler(single, Split::train, kMaxLength, kEvalFraction, 0, 0, 1, 1); },
      {"train split", "has 0 windows"});
}

TEST(BatchSampler, RejectsBadArguments) {
  ScratchDir scratch("sampler_arguments");
  const auto tokens = identity_token_file(scratch);
  expect_user_error([&] { BatchSampler(tokens, Split::train, 0, 0.1, 0, 0, 1, 1); },
                    {"--max_length"});
  expect_user_error([&] { BatchSampler(tokens, Split::train, 7, 0.1, 0, 0, 1, 0); },
                    {"--batch_size"});
  expect_user_error([&] { BatchSampler(tokens, Split::train, 7, 1.0, 0, 0, 1, 1); },
                    {"--eval_fraction"});
  expect_user_error([&] { BatchSampler(tokens, Split::train, 7, 0.1, 0, 2, 2, 1); }, {"rank 2"});
}

}  // namespace
}  // namespace llm::batch_sampler_test
