// Tests of the data path: token files, the synthetic corpus, the batch sampler and `prepare`.
//
// The sampler tests use a file whose token at position i is i itself, so a window is identified by
// its first token and "labels are inputs shifted by one" is an exact element-wise check.
#include <gtest/gtest.h>

#include <sentencepiece_processor.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <unordered_map>

#include "common/errors.h"
#include "tests/test_util.h"
#include "data/batches.h"
#include "data/prepare.h"
#include "data/synthetic.h"
#include "data/token_file.h"

namespace llm {
namespace {

using testing::ScratchDir;

// Runs action, expects a UserError whose message contains every one of the fragments.
void expect_user_error(const std::function<void()>& action,
                       const std::vector<std::string>& fragments) {
  try {
    action();
  } catch (const UserError& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks \"" << fragment << "\": " << message;
    return;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected UserError, got another exception: " << error.what();
    return;
  }
  ADD_FAILURE() << "expected a UserError mentioning \"" << fragments.front() << "\"";
}

// Writes a token file byte by byte, so each header field can be made wrong on its own.
struct RawTokenFile {
  std::string magic = "LLMTOKv1";
  uint32_t version = 1;
  uint32_t bytes_per_token = 2;
  uint64_t num_tokens = 0;
  uint64_t vocab_size = 0;
  std::vector<uint32_t> ids;
  size_t extra_bytes = 0;  // appended after the ids

  void write(const std::string& path) const {
    std::vector<unsigned char> bytes(kTokenFileHeaderBytes, 0);
    std::memcpy(bytes.data(), magic.data(), 8);
    std::memcpy(bytes.data() + 8, &version, 4);
    std::memcpy(bytes.data() + 12, &bytes_per_token, 4);
    std::memcpy(bytes.data() + 16, &num_tokens, 8);
    std::memcpy(bytes.data() + 24, &vocab_size, 8);
    for (uint32_t id : ids) {
      unsigned char little[4];
      std::memcpy(little, &id, 4);
      bytes.insert(bytes.end(), little, little + (bytes_per_token == 4 ? 4 : 2));
    }
    bytes.resize(bytes.size() + extra_bytes, 0);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
};

RawTokenFile valid_raw_file() {
  RawTokenFile raw;
  raw.ids = {0, 5, 99, 42, 7, 1};
  raw.num_tokens = raw.ids.size();
  raw.vocab_size = 100;
  return raw;
}

// ---- TokenFile ----------------------------------------------------------------------------------

void check_round_trip(int64_t vocab_size, int expected_width, int64_t count) {
  ScratchDir scratch("token_round_trip");
  const std::string path = scratch / "tokens.bin";
  std::mt19937_64 generator(count);
  std::vector<int64_t> tokens(static_cast<size_t>(count));
  for (auto& id : tokens)
    id = static_cast<int64_t>(generator() % static_cast<uint64_t>(vocab_size));
  tokens.front() = vocab_size - 1;  // the largest id must survive the narrowing
  if (count > 1) tokens.back() = 0;
  write_token_file(path, tokens, vocab_size);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(std::filesystem::file_size(path),
            kTokenFileHeaderBytes + static_cast<size_t>(count * expected_width));

  const auto file = TokenFile::open(path, vocab_size);
  EXPECT_EQ(file->size(), count);
  EXPECT_EQ(file->vocab_size(), vocab_size);
  EXPECT_EQ(file->bytes_per_token(), expected_width);
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(file->token(i), tokens[i]) << "at " << i;
  std::vector<int64_t> all(static_cast<size_t>(count));
  file->read(0, all);
  EXPECT_EQ(all, tokens);
  if (count > 2) {
    std::vector<int64_t> middle(static_cast<size_t>(count - 2));
    file->read(1, middle);
    EXPECT_TRUE(std::equal(middle.begin(), middle.end(), tokens.begin() + 1));
  }
  std::vector<int64_t> past_end(2);
  EXPECT_THROW(file->read(count - 1, past_end), std::out_of_range);
}

TEST(TokenFile, RoundTripUint16) {
  for (int64_t count : {1, 7, 22, 1023}) check_round_trip(65536, 2, count);
  check_round_trip(37, 2, 1023);
}

TEST(TokenFile, RoundTripUint32) {
  for (int64_t count : {1, 7, 22, 1023}) check_round_trip(65537, 4, count);
  check_round_trip(128256, 4, 1023);  // LLaMA 3's vocab
}

TEST(TokenFile, ValidRawFileOpens) {  // the error tests below change one thing of this file
  ScratchDir scratch("token_raw");
  const std::string path = scratch / "raw.bin";
  valid_raw_file().write(path);
  const auto file = TokenFile::open(path, 100);
  EXPECT_EQ(file->size(), 6);
  EXPECT_EQ(file->token(2), 99);
}

TEST(TokenFile, RejectsWrongMagic) {
  ScratchDir scratch("token_magic");
  const std::string path = scratch / "raw.bin";
  RawTokenFile raw = valid_raw_file();
  raw.magic = "GGUFxxxx";
  raw.write(path);
  expect_user_error([&] { TokenFile::open(path, 100); }, {path, "magic", "trainer prepare"});
}

TEST(TokenFile, RejectsWrongVersion) {
  ScratchDir scratch("token_version");
  const std::string path = scratch / "raw.bin";
  RawTokenFile raw = valid_raw_file();
  raw.version = 2;
  raw.write(path);
  expect_user_error([&] { TokenFile::open(path, 100); }, {path, "version 2"});
}

TEST(TokenFile, RejectsBadWidth) {
  ScratchDir scratch("token_width");
  const std::string path = scratch / "raw.bin";
  RawTokenFile raw = valid_raw_file();
  raw.bytes_per_token = 3;
  raw.write(path);
  expect_user_error([&] { TokenFile::open(path, 100); }, {path, "bytes per token is 3"});
}

TEST(TokenFile, RejectsTruncatedFile) {
  ScratchDir scratch("token_truncated");
  const std::string path = scratch / "raw.bin";
  RawTokenFile raw = valid_raw_file();
  raw.num_tokens = 7;  // one more than written
  raw.write(path);
  expect_user_error([&] { TokenFile::open(path, 100); }, {path, "truncated", "7 tokens"});

  const std::string header_only = scratch / "short.bin";
  std::ofstream(header_only, std::ios::binary).write("LLMTOKv1", 8);
  expect_user_error([&] { TokenFile::open(header_only, 100); }, {header_only, "8 bytes"});
}

TEST(TokenFile, RejectsTrailingBytes) {
  ScratchDir scratch("token_trailing");
  const std::string path = scratch / "raw.bin";
  RawTokenFile raw = valid_raw_file();
  raw.extra_bytes = 1;
  raw.write(path);
  expect_user_error([&] { TokenFile::open(path, 100); }, {path, "trailing bytes"});
}

TEST(TokenFile, RejectsIdAtOrAboveVocab) {
  ScratchDir scratch("token_bad_id");
  const std::string path = scratch / "raw.bin";
  RawTokenFile raw = valid_raw_file();
  raw.ids[4] = 100;  // == vocab: the first bad one
  raw.ids[5] = 4000;
  raw.write(path);
  expect_user_error([&] { TokenFile::open(path, 100); },
                    {path, "token 4", "id 100", "vocab_size 100"});

  // The same in a uint32 file, with the bad id deep in the second scan block.
  const std::string wide = scratch / "wide.bin";
  std::vector<int64_t> tokens(200000, 1);
  write_token_file(wide, tokens, 70000);
  EXPECT_NO_THROW(TokenFile::open(wide, 70000));
  RawTokenFile wide_raw;
  wide_raw.bytes_per_token = 4;
  wide_raw.ids.assign(200000, 1);
  wide_raw.ids[123457] = 70000;
  wide_raw.num_tokens = wide_raw.ids.size();
  wide_raw.vocab_size = 70000;
  wide_raw.write(wide);
  expect_user_error([&] { TokenFile::open(wide, 70000); }, {"token 123457", "id 70000"});
}

TEST(TokenFile, RejectsHeaderVocabAboveModelVocab) {
  ScratchDir scratch("token_vocab");
  const std::string path = scratch / "tokens.bin";
  write_token_file(path, std::vector<int64_t>{1, 2, 3}, 32000);
  EXPECT_NO_THROW(TokenFile::open(path, 32000));
  EXPECT_NO_THROW(TokenFile::open(path, 32100));  // a model may have more rows than the tokenizer
  expect_user_error([&] { TokenFile::open(path, 31999); }, {path, "32000", "31999"});
}

TEST(TokenFile, RejectsMissingFile) {
  ScratchDir scratch("token_missing");
  const std::string path = scratch / "absent.bin";
  expect_user_error([&] { TokenFile::open(path, 100); }, {path, "cannot open"});
}

TEST(TokenFile, WriteRejectsIdOutsideVocab) {
  ScratchDir scratch("token_write_bad");
  const std::string path = scratch / "tokens.bin";
  expect_user_error([&] { write_token_file(path, std::vector<int64_t>{1, 10}, 10); },
                    {"token 1", "id 10"});
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// ---- BatchSampler -------------------------------------------------------------------------------

constexpr int64_t kMaxLength = 7;  // windows of 8 tokens
constexpr int64_t kWindows = 50;   // 5 held out at eval_fraction 0.1, 45 train
constexpr double kEvalFraction = 0.1;

// A file whose token i is i: window w starts with token w * (kMaxLength + 1).
std::shared_ptr<const TokenFile> identity_token_file(const ScratchDir& scratch,
                                                     int64_t windows = kWindows) {
  const std::string path = scratch / "identity.bin";
  std::vector<int64_t> tokens(static_cast<size_t>(windows * (kMaxLength + 1) + 3));  // +3: a tail
  std::iota(tokens.begin(), tokens.end(), 0);
  write_token_file(path, tokens, 65536);
  return TokenFile::open(path, 65536);
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
  const auto tokens = TokenFile::open(path, 100);
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
      {tokens->path(), "eval split", "has 5 windows", "2 * 3 = 6", "--max_length", "--batch_size",
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

// ---- Synthetic corpus ---------------------------------------------------------------------------

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

// ---- prepare ------------------------------------------------------------------------------------

// English-like text: sentences of common words, one document per line, from a fixed seed.
void write_english_like_text(const std::string& path, int lines, uint64_t seed) {
  static const std::vector<std::string> words = {
      "the", "a", "cat", "dog", "sat", "on", "mat", "and", "ran", "to", "house", "of", "little",
      "red", "big", "tree", "in", "garden", "there", "was", "old", "man", "who", "lived", "near",
      "river", "every", "day", "he", "walked", "with", "his", "quiet", "friend", "they", "talked",
      "about", "weather", "stars", "night", "morning", "bread", "water", "is", "good", "then"};
  std::mt19937_64 generator(seed);
  std::ofstream out(path);
  for (int line = 0; line < lines; ++line) {
    const int sentences = 1 + static_cast<int>(generator() % 3);
    for (int sentence = 0; sentence < sentences; ++sentence) {
      const int length = 4 + static_cast<int>(generator() % 8);
      for (int word = 0; word < length; ++word)
        out << (word == 0 && sentence == 0 ? "" : " ") << words[generator() % words.size()];
      out << ".";
    }
    out << "\n";
    if (line % 50 == 49) out << "\n";  // blank lines are not documents
  }
}

std::vector<int64_t> read_all(const TokenFile& file) {
  std::vector<int64_t> tokens(static_cast<size_t>(file.size()));
  file.read(0, tokens);
  return tokens;
}

TEST(Prepare, TrainsTokenizerThenEncodesWithIt) {
  ScratchDir scratch("prepare_train");
  const std::string text_a = scratch / "a.txt", text_b = scratch / "b.txt";
  write_english_like_text(text_a, 300, 1);
  write_english_like_text(text_b, 200, 2);

  PrepareOptions options;
  options.inputs = {text_a, text_b};
  options.output = scratch / "trained.bin";
  options.vocab_size = 64;
  const PrepareResult trained = prepare_token_file(options);
  EXPECT_EQ(trained.vocab_size, 64);
  EXPECT_EQ(trained.tokenizer_path, options.output + ".model");
  ASSERT_TRUE(std::filesystem::exists(trained.tokenizer_path));
  EXPECT_FALSE(std::filesystem::exists(options.output + ".tmp"));

  const auto file = TokenFile::open(options.output, 64);
  EXPECT_EQ(file->size(), trained.num_tokens);
  EXPECT_EQ(file->vocab_size(), 64);
  const std::vector<int64_t> tokens = read_all(*file);
  sentencepiece::SentencePieceProcessor processor;
  ASSERT_TRUE(processor.Load(trained.tokenizer_path).ok());
  const int eos = processor.eos_id();
  ASSERT_GE(eos, 0);
  // One EOS per non-blank line (500), each closing a document, and the ids decode to the text.
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), eos), 500);
  EXPECT_EQ(tokens.back(), eos);
  std::vector<int> first_document;
  for (int64_t id : tokens) {
    ASSERT_LT(id, 64);
    ASSERT_GE(id, 0);
    if (id == eos) break;
    first_document.push_back(static_cast<int>(id));
  }
  std::string first_line;
  std::getline(std::ifstream(text_a) >> std::ws, first_line);
  std::string decoded;
  ASSERT_TRUE(processor.Decode(first_document, &decoded).ok());
  EXPECT_EQ(decoded, first_line);
  // A tokenizer that learned merges: clearly fewer tokens than bytes (characters would give ~1).
  const double text_bytes = static_cast<double>(std::filesystem::file_size(text_a) +
                                                std::filesystem::file_size(text_b));
  EXPECT_LT(static_cast<double>(trained.num_tokens), 0.75 * text_bytes);

  // The saved model as an existing tokenizer gives the same token file.
  PrepareOptions reuse;
  reuse.inputs = options.inputs;
  reuse.output = scratch / "reused.bin";
  reuse.tokenizer = trained.tokenizer_path;
  const PrepareResult reused = prepare_token_file(reuse);
  EXPECT_EQ(reused.vocab_size, 64);
  EXPECT_EQ(reused.tokenizer_path, trained.tokenizer_path);
  EXPECT_EQ(read_all(*TokenFile::open(reuse.output, 64)), tokens);
}

TEST(Prepare, LongLineIsOneDocument) {
  ScratchDir scratch("prepare_long_line");
  const std::string text = scratch / "text.txt";
  write_english_like_text(text, 200, 3);
  PrepareOptions options;
  options.inputs = {text};
  options.output = scratch / "train.bin";
  options.vocab_size = 64;
  const PrepareResult trained = prepare_token_file(options);

  // A 1.25 MiB line (longer than the encoder's 1 MiB piece) without a final newline.
  const std::string long_text = scratch / "long.txt";
  {
    std::ofstream out(long_text);
    while (out.tellp() < (5 << 18)) out << "the old man walked to the river and the dog ran. ";
    out << "end";
  }
  PrepareOptions encode;
  encode.inputs = {long_text};
  encode.output = scratch / "long.bin";
  encode.tokenizer = trained.tokenizer_path;
  prepare_token_file(encode);
  const std::vector<int64_t> tokens = read_all(*TokenFile::open(encode.output, 64));
  sentencepiece::SentencePieceProcessor processor;
  ASSERT_TRUE(processor.Load(trained.tokenizer_path).ok());
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), processor.eos_id()), 1);
  EXPECT_EQ(tokens.back(), processor.eos_id());
  // The cuts at spaces lose nothing: the decoded text is the line, word for word.
  std::vector<int> ids(tokens.begin(), tokens.end() - 1);
  std::string decoded;
  ASSERT_TRUE(processor.Decode(ids, &decoded).ok());
  std::ifstream in(long_text);
  const std::string original((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ASSERT_EQ(decoded.size(), original.size());
  EXPECT_TRUE(decoded == original) << "the decoded long line differs from the text";
}

TEST(Prepare, RejectsBadInputs) {
  ScratchDir scratch("prepare_errors");
  const std::string text = scratch / "text.txt";
  write_english_like_text(text, 50, 4);
  const std::string empty = scratch / "empty.txt";
  std::ofstream(empty).flush();
  const std::string blank = scratch / "blank.txt";
  std::ofstream(blank) << "\n   \n\n";
  const std::string garbage = scratch / "garbage.model";
  std::ofstream(garbage) << "this is not a protobuf";

  PrepareOptions options;
  options.output = scratch / "out.bin";
  options.vocab_size = 64;
  options.inputs = {text, (scratch / "absent.txt").string()};
  expect_user_error([&] { prepare_token_file(options); }, {"absent.txt", "does not exist"});
  options.inputs = {text, empty};
  expect_user_error([&] { prepare_token_file(options); }, {empty, "is empty"});
  options.inputs = {};
  expect_user_error([&] { prepare_token_file(options); }, {"no input"});

  options.inputs = {text};
  options.vocab_size = 0;
  options.tokenizer = garbage;
  expect_user_error([&] { prepare_token_file(options); }, {garbage, "not a SentencePiece model"});
  options.tokenizer = scratch / "absent.model";
  expect_user_error([&] { prepare_token_file(options); }, {"absent.model", "does not exist"});
  options.tokenizer = "";
  expect_user_error([&] { prepare_token_file(options); }, {"--vocab_size"});
  options.vocab_size = 64;
  options.model_type = "wordpiece";
  expect_user_error([&] { prepare_token_file(options); }, {"wordpiece", "bpe, unigram"});
  options.model_type = "bpe";
  options.vocab_size = 100000;  // far more pieces than 50 lines of text can give
  expect_user_error([&] { prepare_token_file(options); },
                    {text, "--vocab_size", "100000 pieces", "at most", "or less"});
  EXPECT_FALSE(std::filesystem::exists(options.output));

  // A file of blank lines has no document to encode.
  options.vocab_size = 64;
  const PrepareResult trained = prepare_token_file(options);
  PrepareOptions blank_encode;
  blank_encode.inputs = {blank};
  blank_encode.output = scratch / "blank.bin";
  blank_encode.tokenizer = trained.tokenizer_path;
  expect_user_error([&] { prepare_token_file(blank_encode); }, {blank, "--input", "no text"});
  EXPECT_FALSE(std::filesystem::exists(blank_encode.output));
  EXPECT_FALSE(std::filesystem::exists(blank_encode.output + ".tmp"));
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A tokenizer trained once for the tests below that only encode (training takes about a second).
class PrepareWithTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    write_english_like_text(text_, 50, 5);
    PrepareOptions train;
    train.inputs = {text_};
    train.output = scratch_ / "trained.bin";
    train.vocab_size = 64;
    tokenizer_ = prepare_token_file(train).tokenizer_path;
  }
  PrepareOptions encode(const std::string& input, const std::string& output) const {
    PrepareOptions options;
    options.inputs = {input};
    options.output = output;
    options.tokenizer = tokenizer_;
    return options;
  }
  ScratchDir scratch_{"prepare_tokenizer"};
  std::string text_ = scratch_ / "text.txt";
  std::string tokenizer_;
};

TEST_F(PrepareWithTokenizer, ExistingOutputIsKeptWithoutOverwrite) {
  const std::string output = scratch_ / "tokens.bin";
  std::ofstream(output) << "an earlier token file";
  PrepareOptions options = encode(text_, output);
  expect_user_error([&] { prepare_token_file(options); },
                    {output, "--output", "exists", "pass --overwrite"});
  EXPECT_EQ(file_bytes(output), "an earlier token file");
  options.overwrite = true;
  const PrepareResult replaced = prepare_token_file(options);
  EXPECT_EQ(TokenFile::open(output, 64)->size(), replaced.num_tokens);
}

TEST_F(PrepareWithTokenizer, OutputIsNeverAnInputOrTheTokenizer) {
  // Not even with --overwrite: the file would be replaced while it is still being read.
  const std::string text_before = file_bytes(text_), model_before = file_bytes(tokenizer_);
  PrepareOptions onto_input = encode(text_, text_);
  onto_input.overwrite = true;
  expect_user_error([&] { prepare_token_file(onto_input); }, {text_, "--output", "is also an --input"});
  // The same file spelt another way.
  onto_input.output = (scratch_.path() / "." / "text.txt").string();
  expect_user_error([&] { prepare_token_file(onto_input); }, {"--output", "is also an --input"});
  PrepareOptions onto_tokenizer = encode(text_, tokenizer_);
  onto_tokenizer.overwrite = true;
  expect_user_error([&] { prepare_token_file(onto_tokenizer); },
                    {tokenizer_, "--output", "is the --tokenizer"});
  EXPECT_EQ(file_bytes(text_), text_before);
  EXPECT_EQ(file_bytes(tokenizer_), model_before);
}

TEST_F(PrepareWithTokenizer, OutputFolderMustExistAndOutputMustNotBeOne) {
  const std::string nowhere = scratch_ / "no_such_folder" / "tokens.bin";
  expect_user_error([&] { prepare_token_file(encode(text_, nowhere)); },
                    {nowhere, "--output", "no_such_folder does not exist"});
  PrepareOptions folder = encode(text_, scratch_.path().string());
  folder.overwrite = true;
  expect_user_error([&] { prepare_token_file(folder); }, {"--output", "is a folder"});
  expect_user_error([&] { prepare_token_file(encode(scratch_.path().string(), scratch_ / "x.bin")); },
                    {"--input", "is a folder"});
  PrepareOptions tokenizer_folder = encode(text_, scratch_ / "y.bin");
  tokenizer_folder.tokenizer = scratch_.path().string();
  expect_user_error([&] { prepare_token_file(tokenizer_folder); }, {"--tokenizer", "is a folder"});
}

TEST_F(PrepareWithTokenizer, InputMustBeUtf8Text) {
  struct Case {
    const char* name;
    std::string bytes;
    std::vector<std::string> fragments;  // empty: accepted
  };
  const std::vector<Case> cases = {
      {"nul.txt", std::string("hello\0world\n", 12), {"--input", "not UTF-8 text", "NUL byte at byte 5"}},
      {"utf16.txt", std::string("\xFF\xFEh\0i\0", 6), {"--input", "not UTF-8 text", "byte 0"}},
      {"latin1.txt", "the caf\xE9 was old\n", {"--input", "invalid UTF-8 at byte 7", "0xE9", "iconv"}},
      {"overlong.txt", "a \xC0\xAF b\n", {"invalid UTF-8 at byte 2"}},
      {"surrogate.txt", "a \xED\xA0\x80 b\n", {"invalid UTF-8 at byte 2"}},
      {"cut_at_end.txt", "the old man \xE6\x97", {"invalid UTF-8 at byte 12"}},
      {"utf8.txt", "the caf\xC3\xA9, \xE6\x97\xA5\xE6\x9C\xAC and \xF0\x9F\x98\x80 sat\n", {}},
  };
  for (const Case& text_case : cases) {
    SCOPED_TRACE(text_case.name);
    const std::string path = scratch_ / text_case.name;
    std::ofstream(path, std::ios::binary) << text_case.bytes;
    const PrepareOptions options = encode(path, scratch_ / (std::string(text_case.name) + ".bin"));
    if (text_case.fragments.empty()) {
      EXPECT_NO_THROW(prepare_token_file(options));
    } else {
      std::vector<std::string> fragments = text_case.fragments;
      fragments.push_back(path);
      expect_user_error([&] { prepare_token_file(options); }, fragments);
      EXPECT_FALSE(std::filesystem::exists(options.output));
    }
  }
  // Only the first 64 KiB are checked, and a character cut by that boundary is not held against
  // the file: 65535 bytes of text, then a 2-byte character across the boundary.
  const std::string long_text = scratch_ / "boundary.txt";
  {
    std::string line = "the old man walked to the river and the dog ran ";
    std::string bytes;
    while (bytes.size() + line.size() < kTextProbeBytes - 1) bytes += line;
    bytes.append(kTextProbeBytes - 1 - bytes.size(), 'a');
    bytes += "\xC3\xA9 end\n";
    ASSERT_EQ(static_cast<unsigned char>(bytes[kTextProbeBytes - 1]), 0xC3);
    std::ofstream(long_text, std::ios::binary) << bytes;
  }
  EXPECT_NO_THROW(prepare_token_file(encode(long_text, scratch_ / "boundary.bin")));
}

TEST(Prepare, SentencePieceFailuresNameTheFlag) {
  ScratchDir scratch("prepare_sentencepiece");
  const std::string text = scratch / "text.txt";
  write_english_like_text(text, 50, 6);  // about 30 distinct characters
  PrepareOptions options;
  options.inputs = {text};
  options.output = scratch / "out.bin";
  options.vocab_size = 8;
  expect_user_error([&] { prepare_token_file(options); },
                    {text, "--vocab_size", "8 pieces is fewer than this text needs",
                     "pass a larger --vocab_size"});
  for (int64_t outside : {int64_t{3}, int64_t{1} << 33}) {
    options.vocab_size = outside;
    expect_user_error([&] { prepare_token_file(options); },
                      {"--vocab_size", "[4, 2147483647]", "got " + std::to_string(outside)});
  }
  const std::string blank = scratch / "blank.txt";
  std::ofstream(blank) << "\n   \n\n";
  options.inputs = {blank};
  options.vocab_size = 64;
  expect_user_error([&] { prepare_token_file(options); }, {blank, "--input", "no text to train"});
  // Several inputs are named in short.
  options.inputs = {blank, blank, blank, blank};
  expect_user_error([&] { prepare_token_file(options); }, {blank + ", " + blank + " and 2 more"});
  // SentencePiece's source locations and checks do not reach the user.
  const std::string garbage = scratch / "garbage.model";
  std::ofstream(garbage) << "this is not a protobuf";
  PrepareOptions encode;
  encode.inputs = {text};
  encode.output = scratch / "encoded.bin";
  encode.tokenizer = garbage;
  try {
    prepare_token_file(encode);
    ADD_FAILURE() << "a garbage tokenizer was accepted";
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("--tokenizer"), std::string::npos) << message;
    EXPECT_EQ(message.find(".cc("), std::string::npos) << message;
    EXPECT_EQ(message.find("model_proto"), std::string::npos) << message;
  }
  EXPECT_FALSE(std::filesystem::exists(options.output));
}

TEST(PrepareCommand, ExistingOutputIsExitTwoUntilOverwrite) {
  ScratchDir scratch("prepare_command");
  const std::string text = scratch / "text.txt";
  write_english_like_text(text, 50, 7);
  const std::string command = testing::trainer_binary().string() + " prepare --input " + text +
                              " --vocab_size 64 --output " + (scratch / "tokens.bin").string();
  const auto first = testing::run_command(command);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string tokens_before = file_bytes(scratch / "tokens.bin");
  const auto again = testing::run_command(command);
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("tokens.bin: --output: exists; pass --overwrite"), std::string::npos)
      << again.output;
  EXPECT_EQ(file_bytes(scratch / "tokens.bin"), tokens_before);
  // The token file gone, its tokenizer still there: that one is named.
  std::filesystem::remove(scratch / "tokens.bin");
  const auto model_left = testing::run_command(command);
  EXPECT_EQ(model_left.exit_code, 2) << model_left.output;
  EXPECT_NE(model_left.output.find("tokens.bin.model: --output: exists (the tokenizer trained for --output)"),
            std::string::npos)
      << model_left.output;
  const auto replaced = testing::run_command(command + " --overwrite");
  EXPECT_EQ(replaced.exit_code, 0) << replaced.output;
  EXPECT_GT(TokenFile::open(scratch / "tokens.bin", 64)->size(), 0);
  const auto onto_input = testing::run_command(testing::trainer_binary().string() + " prepare --input " +
                                               text + " --vocab_size 64 --overwrite --output " + text);
  EXPECT_EQ(onto_input.exit_code, 2) << onto_input.output;
  EXPECT_NE(onto_input.output.find("--output: is also an --input"), std::string::npos) << onto_input.output;
}

}  // namespace
}  // namespace llm
