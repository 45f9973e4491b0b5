// Weighted sources (issue 27): --data ITEM:WEIGHT,... draws each global sample from a source by the
// nested Bresenham assignment of data/batches.h, each source through its own window order. Every
// prefix of the run holds each source's share to within a sample per source; a source's samples are
// its own 0, 1, 2, ... in order (so a resume seeks exactly, at any world size); one weighted source
// is the unweighted corpus. Through the trainer: a mixture trains, its checkpoint records the
// weights, and a resume with other weights is refused naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>

#include "data/batches.h"
#include "data/token_corpus.h"
#include "data/token_file.h"
#include "tests/checkpoint_test_util.h"
#include "tests/data_test_util.h"
#include "tests/run_comparison.h"
#include "tests/test_util.h"

namespace llm::mixture_test {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;
using testing::mentions;
using testing::run_command;
using testing::ScratchDir;

constexpr int64_t kMaxLength = 7;  // windows of 8 tokens

// A source whose every id lies in [low, low + 40): a row's source shows in its first id.
std::shared_ptr<const TokenCorpus> banded_corpus(const fs::path& path, int64_t windows, int64_t low) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < windows * (kMaxLength + 1); ++i) tokens.push_back(low + (i * 7) % 40);
  write_token_file(path.string(), tokens, 128);
  return TokenCorpus::open(path.string(), 128);
}

TEST(Mixture, EveryPrefixHoldsTheSharesAndEachSourceCountsUpInOrder) {
  ScratchDir scratch("mixture_shares");
  const auto a = banded_corpus(scratch / "a.tok", 500, 0), b = banded_corpus(scratch / "b.tok", 300, 40),
             c = banded_corpus(scratch / "c.tok", 80, 80);
  for (const std::vector<double>& weights : std::vector<std::vector<double>>{{0.7, 0.3}, {0.5, 0.3, 0.2}, {1, 1, 3}}) {
    SCOPED_TRACE(::testing::PrintToString(weights));
    std::vector<WeightedCorpus> sources = {{a, weights[0]}, {b, weights[1]}};
    if (weights.size() == 3) sources.push_back({c, weights[2]});
    const BatchSampler sampler(sources, Split::train, kMaxLength, 0.1, 3, 0, 1, 4);
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    std::vector<int64_t> counts(weights.size(), 0);
    for (int64_t k = 0; k < 20000; ++k) {
      const auto [source, index] = sampler.source_of_sample(k);
      ASSERT_LT(source, weights.size());
      ASSERT_EQ(index, counts[source]) << "sample " << k << ": a source's samples count up one by one";
      ++counts[source];
      for (size_t s = 0; s < weights.size(); ++s)
        ASSERT_LE(std::abs(static_cast<double>(counts[s]) - weights[s] / total * static_cast<double>(k + 1)),
                  static_cast<double>(weights.size()))
            << "prefix " << k + 1 << ", source " << s;
    }
  }
}

// Weights mean their ratio, whatever their magnitude (issue 44): 1e13 and 1e13 (an integer scaling
// of them wrapped to 0 and the rank died of SIGFPE), three of 1e300 (all went to the first), 1e-7 and
// 3e-7 (both rounded to the same minimum); a scale by a power of two gives the very same samples;
// a weight below a billionth of the largest, and a non-finite one, is refused naming the range.
TEST(Mixture, WeightsMeanTheirRatioAtAnyMagnitude) {
  ScratchDir scratch("mixture_magnitudes");
  const auto a = banded_corpus(scratch / "a.tok", 500, 0), b = banded_corpus(scratch / "b.tok", 300, 40),
             c = banded_corpus(scratch / "c.tok", 80, 80);
  auto shares = [&](const std::vector<double>& weights) {
    std::vector<WeightedCorpus> sources = {{a, weights[0]}, {b, weights[1]}};
    if (weights.size() == 3) sources.push_back({c, weights[2]});
    const BatchSampler sampler(sources, Split::train, kMaxLength, 0.1, 3, 0, 1, 4);
    std::vector<int64_t> order;
    for (int64_t k = 0; k < 12000; ++k) order.push_back(static_cast<int64_t>(sampler.source_of_sample(k).first));
    return order;
  };
  auto fraction = [](const std::vector<int64_t>& order, int64_t source) {
    return static_cast<double>(std::count(order.begin(), order.end(), source)) / static_cast<double>(order.size());
  };
  const auto equal_huge = shares({1e13, 1e13});
  EXPECT_NEAR(fraction(equal_huge, 0), 0.5, 1e-3);
  const auto thirds = shares({1e300, 1e300, 1e300});
  for (int64_t s = 0; s < 3; ++s) EXPECT_NEAR(fraction(thirds, s), 1.0 / 3, 1e-3) << "source " << s;
  const auto tiny = shares({1e-7, 3e-7});
  EXPECT_NEAR(fraction(tiny, 0), 0.25, 1e-3);
  EXPECT_EQ(shares({1, 3}), shares({0x1p-40, 0x1p-40 * 3})) << "a power-of-two scale changes nothing";
  EXPECT_EQ(shares({1, 3}), shares({0x1p+900, 0x1p+900 * 3}));
  EXPECT_EQ(shares({1, 1}), equal_huge);
  expect_user_error([&] { shares({1, 1e-10}); }, {"b.tok", "weight", "is 1e-10, below a billionth of the largest weight (1)",
                                                  "from 1e-9 to 1"});
  expect_user_error([&] { shares({1, std::numeric_limits<double>::infinity()}); },
                    {"b.tok", "weight", "is inf: a weight is a finite number above 0"});
}

TEST(Mixture, RowsComeFromTheirSourceAndASeekRepeatsTheStream) {
  ScratchDir scratch("mixture_rows");
  const auto a = banded_corpus(scratch / "a.tok", 200, 0), b = banded_corpus(scratch / "b.tok", 100, 40);
  const std::vector<WeightedCorpus> sources = {{a, 0.25}, {b, 0.75}};
  BatchSampler straight(sources, Split::train, kMaxLength, 0.1, 5, 0, 1, 6);
  const BatchSampler lookup(sources, Split::train, kMaxLength, 0.1, 5, 0, 1, 6);
  std::vector<Batch> stream;
  for (int step = 0; step < 60; ++step) {  // 360 samples: b's 90 train windows pass three epochs
    stream.push_back(straight.next());
    for (int64_t row = 0; row < 6; ++row) {
      const int64_t first = stream.back().input_ids[row][0].item<int64_t>();
      EXPECT_EQ(first >= 40 ? 1u : 0u, lookup.source_of_sample(step * 6 + row).first) << "step " << step << " row " << row;
    }
  }
  // Two ranks of 3 together are the one rank of 6; a seek at sample 123 (mid micro-batch) repeats it.
  BatchSampler rank0(sources, Split::train, kMaxLength, 0.1, 5, 0, 2, 3), rank1(sources, Split::train, kMaxLength, 0.1, 5, 1, 2, 3);
  for (int step = 0; step < 10; ++step) {
    const Batch r0 = rank0.next(), r1 = rank1.next();
    EXPECT_TRUE(at::equal(at::cat({r0.input_ids, r1.input_ids}), stream[step].input_ids)) << "step " << step;
  }
  BatchSampler resumed(sources, Split::train, kMaxLength, 0.1, 5, 0, 1, 3);
  resumed.seek(123);
  const Batch row = resumed.next();
  for (int64_t r = 0; r < 3; ++r)
    EXPECT_TRUE(at::equal(row.input_ids[r], stream[(123 + r) / 6].input_ids[(123 + r) % 6])) << r;
}

TEST(Mixture, OneWeightedSourceIsTheCorpusItself) {
  ScratchDir scratch("mixture_one");
  const auto a = banded_corpus(scratch / "a.tok", 120, 0);
  BatchSampler plain(a, Split::train, kMaxLength, 0.1, 7, 0, 1, 4);
  BatchSampler weighted(std::vector<WeightedCorpus>{{a, 0.4}}, Split::train, kMaxLength, 0.1, 7, 0, 1, 4);
  for (int step = 0; step < 40; ++step) EXPECT_TRUE(at::equal(plain.next().input_ids, weighted.next().input_ids));
}

TEST(Mixture, SpecsWithWeightsAndTheirErrors) {
  ScratchDir scratch("mixture_specs");
  banded_corpus(scratch / "a.tok", 10, 0);
  fs::create_directories(scratch / "code");
  banded_corpus(scratch / "code" / "b.tok", 10, 40);
  const std::string a = (scratch / "a.tok").string(), code = (scratch / "code").string();
  const std::vector<DataSource> sources = data_sources(a + ":0.7," + code + ":0.3");
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[1].spec, code);
  EXPECT_DOUBLE_EQ(sources[1].weight, 0.3);
  EXPECT_EQ(expand_data_spec(a + ":0.7," + code + ":0.3").size(), 2u);
  EXPECT_FALSE(is_mixture(a + "," + code));
  EXPECT_EQ(data_sources(a + "," + code).size(), 1u);
  expect_user_error([&] { data_sources(a + ":0.7," + code); },
                    {"--data", "\"" + code + "\" has no weight while other items have one"});
  expect_user_error([&] { data_sources(a + ":0," + code + ":1"); }, {"--data", "the weight 0 is not a positive number"});
  expect_user_error([&] { data_sources(a + ":1e400," + code + ":1"); }, {"--data", "the weight 1e400 is not a finite number"});
}

// A mixture file (--data mixture.json) is the same sources as ITEM:WEIGHT, its relative paths taken
// from its own folder; every malformed file is a UserError naming the file and the entry.
TEST(Mixture, AMixtureFileIsTheSameSourcesAndItsErrorsNameTheEntry) {
  ScratchDir scratch("mixture_file");
  const auto a = banded_corpus(scratch / "a.tok", 60, 0);
  fs::create_directories(scratch / "code");
  const auto b = banded_corpus(scratch / "code" / "b.tok", 60, 40);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(scratch / name) << text;
    return (scratch / name).string();
  };
  const std::string file =
      write("mix.json", R"({"sources": [{"data": "a.tok", "weight": 0.7}, {"data": ["code"], "weight": 0.3}]})");
  EXPECT_TRUE(is_mixture(file));
  const std::vector<DataSource> sources = data_sources(file);
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0].spec, (scratch / "a.tok").string());
  EXPECT_EQ(sources[1].spec, (scratch / "code").string());
  EXPECT_DOUBLE_EQ(sources[0].weight, 0.7);
  EXPECT_DOUBLE_EQ(sources[1].weight, 0.3);
  const std::string inline_spec = (scratch / "a.tok").string() + ":0.7," + (scratch / "code").string() + ":0.3";
  EXPECT_EQ(expand_data_spec(file), expand_data_spec(inline_spec));
  // The same batches as the inline spec, through split_sources.
  auto sampler = [&](const std::string& spec) {
    const auto all = TokenCorpus::open(spec, 128);
    std::vector<WeightedCorpus> weighted;
    const auto corpora = TokenCorpus::split_sources(all, spec);
    for (size_t s = 0; s < corpora.size(); ++s) weighted.push_back({corpora[s], data_sources(spec)[s].weight});
    return BatchSampler(weighted, Split::train, kMaxLength, 0.1, 7, 0, 1, 4);
  };
  BatchSampler from_file = sampler(file), from_flag = sampler(inline_spec);
  for (int step = 0; step < 20; ++step) EXPECT_TRUE(at::equal(from_file.next().input_ids, from_flag.next().input_ids));

  const std::vector<std::pair<std::string, std::vector<std::string>>> bad = {
      {R"({"sources": [{"data": "a.tok", "weight": 0.7}], "weights": 1})", {"weights", "is not a mixture file's key"}},
      {R"({"sources": [{"data": "a.tok"}]})", {"sources[0]", "each source is {\"data\": ..., \"weight\": ...}"}},
      {R"({"sources": [{"data": "a.tok", "weight": -1}]})", {"sources[0].weight", "is -1, not a positive number"}},
      {R"({"sources": [{"data": "a.tok", "weight": "0.5"}]})", {"sources[0].weight", "not a positive number"}},
      {R"({"sources": [{"data": "a.tok", "weight": 1, "wieght": 2}]})", {"sources[0].wieght", "is not a source's key"}},
      {R"({"sources": [{"data": "a.tok,code", "weight": 1}]})", {"sources[0].data", "no commas"}},
      {R"({"sources": [{"data": [], "weight": 1}]})", {"sources[0].data", "is an empty list"}},
      {R"({"sources": [{"data": 3, "weight": 1}]})", {"sources[0].data", "is 3: give a file, folder or glob"}},
      {R"({"sources": [{"data": "other.json", "weight": 1}]})", {"sources[0].data", "a mixture names shards, not other mixtures"}},
      {R"({"sources": []})", {"sources", "is empty"}},
      {R"([1, 2])", {"the file has no \"sources\" list"}},
      {R"({"sources": [{"data": "a.tok", "weight": 1, "weight": 2}]})", {"weight", "given twice"}},
      {R"({"sources": [)", {"invalid JSON"}},
      // A literal beyond a double: the key, the line and the literal, not nlohmann's out_of_range text.
      {"{\"sources\": [\n  {\"data\": \"a.tok\", \"weight\": 1e999}]}", {"weight", "1e999", "(line 2)", "beyond what a double holds"}},
      {"", {"is empty"}},
  };
  for (const auto& [text, words] : bad) {
    const std::string path = write("bad.json", text);
    std::vector<std::string> expected = {path};
    expected.insert(expected.end(), words.begin(), words.end());
    expect_user_error([&] { data_sources(path); }, expected);
  }
  expect_user_error([&] { data_sources((scratch / "missing.json").string()); }, {"missing.json", "no such file"});
}

// Through the trainer: a mixture trains and records its weights; a resume with other weights is
// refused naming both.
TEST(Mixture, TrainsRecordsItsWeightsAndRefusesAResumeWithOthers) {
  ScratchDir dir("mixture_train");
  banded_corpus(dir / "web.tok", 200, 0);
  fs::create_directories(dir / "code");
  banded_corpus(dir / "code" / "0.tok", 80, 40);
  banded_corpus(dir / "code" / "1.tok", 80, 60);
  auto command = [&](const std::string& data, const std::string& tag, const std::string& more) {
    return testing::trainer_launcher(1) + " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
           " --device cpu --max_length 16 --warmup_steps 1 --eval_every 0 --eval_sequences 4 --batch_size 2 --data '" +
           data + "' --save_dir " + (dir / "ckpt").string() + " --run_dir " + (dir / tag).string() + " " + more;
  };
  const std::string mixture = (dir / "web.tok").string() + ":0.7," + (dir / "code").string() + ":0.3";
  const auto trained = run_command(command(mixture, "a", "--num_training_steps 3 --save_every 3"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const nlohmann::json identity = testing::manifest(dir / "ckpt" / "step_3").at("data_identity");
  ASSERT_EQ(identity.at("mixture").size(), 2u);
  EXPECT_EQ(identity.at("mixture")[1].at("shards"), 2);
  EXPECT_DOUBLE_EQ(identity.at("mixture")[0].at("weight").get<double>(), 0.7);
  const std::string other = (dir / "web.tok").string() + ":0.5," + (dir / "code").string() + ":0.5";
  const auto refused = run_command(command(other, "b", "--num_training_steps 4 --continue_from " + (dir / "ckpt").string()));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(mentions(refused.output, "its sources were 1 shard(s) at weight 0.7, 2 shard(s) at weight 0.3; now 1 "
                                       "shard(s) at weight 0.5, 2 shard(s) at weight 0.5"))
      << refused.output;
  const auto same = run_command(command(mixture, "c", "--num_training_steps 4 --continue_from " + (dir / "ckpt").string()));
  EXPECT_EQ(same.exit_code, 0) << same.output;
  // The same sources as a mixture file are the same data: its resume goes on.
  std::ofstream(dir / "mixture.json") << R"({"sources": [{"data": "web.tok", "weight": 0.7}, {"data": "code", "weight": 0.3}]})";
  const auto from_file = run_command(command((dir / "mixture.json").string(), "d",
                                             "--num_training_steps 4 --continue_from " + (dir / "ckpt" / "step_3").string() +
                                                 " --save_dir " + (dir / "ckpt_d").string()));
  EXPECT_EQ(from_file.exit_code, 0) << from_file.output;
  EXPECT_FALSE(mentions(from_file.output, "other data")) << from_file.output;
}

}  // namespace
}  // namespace llm::mixture_test
