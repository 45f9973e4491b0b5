// Windows that start at documents (--window_start document, data/document_windows.h), read from
// Megatron datasets written by the reference writer (tests/data/write_shards.py, Megatron-LM's
// published layout): the windows are the specified walk (window k + 1 at the first document at or
// after window k's end), checked window by window against a plain vector walk past several of the
// kept marks; every row of every epoch, rank and split starts at a document; N ranks read what one
// rank with an N times larger micro-batch reads; a shard that records no documents is a UserError
// naming it. `trainer prepare --format megatron` writes the reference writer's bytes, shards that
// hold whole documents, and a run on them trains, records its windows and refuses a resume with
// the other kind of windows.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "data/batches.h"
#include "data/document_windows.h"
#include "data/prepare.h"
#include "data/token_corpus.h"
#include "data/token_file.h"
#include "tests/checkpoint_test_util.h"
#include "tests/data_test_util.h"
#include "tests/run_comparison.h"
#include "tests/shard_writer.h"
#include "tests/test_util.h"

namespace llm::document_windows_test {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;
using testing::mentions;
using testing::run_command;
using testing::ScratchDir;

constexpr int64_t kVocab = 100;
constexpr int64_t kBos = 1;  // a document's first id, and found nowhere else

struct Documents {
  std::vector<int64_t> tokens;
  std::vector<int64_t> lengths;
};

// `count` documents of 1 to `longest` tokens, each starting with kBos, the rest in [2, kVocab).
Documents make_documents(int count, int64_t longest, uint64_t seed) {
  std::mt19937_64 random(seed);
  Documents documents;
  for (int d = 0; d < count; ++d) {
    const int64_t length = 1 + static_cast<int64_t>(random() % static_cast<uint64_t>(longest));
    documents.lengths.push_back(length);
    documents.tokens.push_back(kBos);
    for (int64_t i = 1; i < length; ++i) documents.tokens.push_back(2 + static_cast<int64_t>(random() % (kVocab - 2)));
  }
  return documents;
}

std::string joined(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t value : values) text += (text.empty() ? "" : ",") + std::to_string(value);
  return text;
}

// The walk as specified, over document starts held in a vector.
std::vector<int64_t> reference_windows(const std::vector<int64_t>& starts, int64_t corpus_tokens, int64_t window) {
  std::vector<int64_t> windows;
  int64_t end = 0;
  for (int64_t start : starts) {
    if (start < end) continue;
    if (start + window > corpus_tokens) break;
    windows.push_back(start);
    end = start + window;
  }
  return windows;
}

// Two Megatron shards from the reference writer; their document starts in the corpus.
std::vector<int64_t> write_two_shards(const fs::path& folder, const Documents& first, const Documents& second) {
  testing::write_shard("megatron", folder / "a.bin", first.tokens, "--vocab " + std::to_string(kVocab) + " --docs " + joined(first.lengths));
  testing::write_shard("megatron", folder / "b.bin", second.tokens, "--vocab " + std::to_string(kVocab) + " --docs " + joined(second.lengths));
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (const Documents* documents : {&first, &second})
    for (int64_t length : documents->lengths) {
      starts.push_back(at);
      at += length;
    }
  return starts;
}

TEST(DocumentWindows, AreTheSpecifiedWalkWindowByWindow) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("document_windows_walk");
  const Documents first = make_documents(2500, 12, 1), second = make_documents(2000, 30, 2);
  const std::vector<int64_t> starts = write_two_shards(dir.path(), first, second);
  const auto corpus = TokenCorpus::open((dir / "a.bin").string() + "," + (dir / "b.bin").string(), kVocab);
  ASSERT_EQ(corpus->num_documents(), 4500);
  std::vector<int64_t> read(starts.size());
  corpus->document_starts(0, read);
  EXPECT_EQ(read, starts);

  for (int64_t window : {8, 17, 64}) {
    const std::vector<int64_t> expected = reference_windows(starts, corpus->size(), window);
    const auto shared = std::make_shared<const DocumentWindows>(corpus, window);
    DocumentWindows::Reader windows(shared);
    ASSERT_EQ(shared->size(), static_cast<int64_t>(expected.size())) << window;
    if (window == 8) {
      ASSERT_GT(shared->size(), 2 * DocumentWindows::kStride);  // past several marks
    }
    // In a scattered order, as the sampler asks.
    std::mt19937_64 random(window);
    for (int i = 0; i < 3000; ++i) {
      const auto k = static_cast<int64_t>(random() % expected.size());
      ASSERT_EQ(windows.start(k), expected[static_cast<size_t>(k)]) << "window " << k << " of " << window;
    }
    EXPECT_EQ(windows.start(shared->size() - 1), expected.back());
  }
}

TEST(DocumentWindows, EveryRowOfEveryEpochRankAndSplitStartsAtADocument) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("document_windows_rows");
  write_two_shards(dir.path(), make_documents(300, 20, 3), make_documents(200, 9, 4));
  const auto corpus = TokenCorpus::open((dir / "a.bin").string() + "," + (dir / "b.bin").string(), kVocab);
  constexpr int64_t kMaxLength = 11;
  BatchSampler one(corpus, Split::train, kMaxLength, 0.1, 5, 0, 1, 4, false, WindowStart::document);
  BatchSampler rank0(corpus, Split::train, kMaxLength, 0.1, 5, 0, 2, 2, false, WindowStart::document);
  BatchSampler rank1(corpus, Split::train, kMaxLength, 0.1, 5, 1, 2, 2, false, WindowStart::document);
  const int64_t steps = 3 * one.num_windows() / 4;  // three epochs
  for (int64_t step = 0; step < steps; ++step) {
    const Batch batch = one.next();
    ASSERT_TRUE(at::all(batch.input_ids.select(1, 0) == kBos).item<bool>()) << "step " << step;
    EXPECT_TRUE(at::equal(batch.input_ids, at::cat({rank0.next().input_ids, rank1.next().input_ids})));
  }
  BatchSampler eval(corpus, Split::eval, kMaxLength, 0.1, 5, 0, 1, 3, false, WindowStart::document);
  for (int step = 0; step < 5; ++step)
    EXPECT_TRUE(at::all(eval.next().input_ids.select(1, 0) == kBos).item<bool>());
  // The same corpus cut anywhere starts rows mid-document.
  BatchSampler anywhere(corpus, Split::train, kMaxLength, 0.1, 5, 0, 1, 64);
  EXPECT_FALSE(at::all(anywhere.next().input_ids.select(1, 0) == kBos).item<bool>());
}

TEST(DocumentWindows, AShardWithoutDocumentsIsAUserErrorNamingIt) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("document_windows_refused");
  const Documents documents = make_documents(50, 20, 6);
  testing::write_shard("megatron", dir / "m.bin", documents.tokens, "--vocab 100 --docs " + joined(documents.lengths));
  testing::write_shard("llmc", dir / "l.bin", documents.tokens, "--vocab 100");
  const auto corpus = TokenCorpus::open((dir / "m.bin").string() + "," + (dir / "l.bin").string(), kVocab);
  EXPECT_EQ(corpus->num_documents(), -1);
  expect_user_error([&] { DocumentWindows(corpus, 8); },
                    {(dir / "l.bin").string(), "--window_start document", "(llm.c) records no document boundaries",
                     "trainer prepare --format megatron"});
  // A window longer than any document's tail: no window, said with the tokens it has.
  const auto short_corpus = TokenCorpus::open((dir / "m.bin").string(), kVocab);
  expect_user_error([&] { BatchSampler(short_corpus, Split::train, 5000, 0.1, 1, 0, 1, 1, false, WindowStart::document); },
                    {"no document with max_length + 1 = 5001 tokens"});
}

// prepare --format megatron writes what Megatron-LM's writer writes for the same documents (the
// reference writer's bytes, .bin and .idx), the ids of our own format, and shards of whole documents.
TEST(PrepareMegatron, WritesTheReferenceBytesAndShardsOfWholeDocuments) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("prepare_megatron");
  std::string text;
  std::mt19937_64 random(7);
  const std::vector<std::string> words = {"alpha", "beta", "gamma", "delta", "river", "stone", "light", "cloud"};
  for (int d = 0; d < 400; ++d) {
    for (int w = 0, n = 2 + static_cast<int>(random() % 30); w < n; ++w) text += (w ? " " : "") + words[random() % words.size()];
    text += "\n";
  }
  std::ofstream(dir / "docs.txt") << text;
  PrepareOptions ours;
  ours.inputs = {(dir / "docs.txt").string()};
  ours.output = (dir / "ours.tok").string();
  ours.vocab_size = 40;
  const std::string tokenizer = prepare_token_file(ours).tokenizer_path;
  PrepareOptions megatron = ours;
  megatron.vocab_size = 0;
  megatron.tokenizer = tokenizer;
  megatron.format = "megatron";
  megatron.output = (dir / "m.bin").string();
  prepare_token_file(megatron);

  const auto ours_file = TokenFile::open((dir / "ours.tok").string(), 40);
  const auto megatron_file = TokenFile::open((dir / "m.bin").string(), 40);
  std::vector<int64_t> ids(static_cast<size_t>(ours_file->size())), megatron_ids(static_cast<size_t>(megatron_file->size()));
  ours_file->read(0, ids);
  megatron_file->read(0, megatron_ids);
  EXPECT_EQ(megatron_ids, ids);
  // A document per line: each ends with the EOS id prepare puts after it.
  ASSERT_EQ(megatron_file->num_documents(), 400);
  std::vector<int64_t> starts(400);
  megatron_file->document_starts(0, starts);
  const int64_t eos = ids.back();
  std::vector<int64_t> lengths;
  for (size_t d = 0; d < starts.size(); ++d) {
    const int64_t end = d + 1 < starts.size() ? starts[d + 1] : megatron_file->size();
    EXPECT_EQ(ids[static_cast<size_t>(end - 1)], eos) << "document " << d;
    lengths.push_back(end - starts[d]);
  }
  // The reference writer's bytes for the same ids and documents.
  testing::write_shard("megatron", dir / "reference" / "r.bin", ids, "--vocab 40 --docs " + joined(lengths));
  auto bytes = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(bytes(dir / "m.bin"), bytes(dir / "reference" / "r.bin"));
  EXPECT_EQ(bytes(dir / "m.idx"), bytes(dir / "reference" / "r.idx"));

  // Shards: each at least --shard_tokens but the last, each ending at a document's end; read as a
  // folder, the same ids and documents.
  PrepareOptions sharded = megatron;
  sharded.output = (dir / "shards").string();
  sharded.shard_tokens = 1024;
  const PrepareResult result = prepare_token_file(sharded);
  ASSERT_GT(result.shards.size(), 2u);
  for (size_t s = 0; s < result.shards.size(); ++s) {
    const auto shard = TokenFile::open(result.shards[s], 40);
    if (s + 1 < result.shards.size()) {
      EXPECT_GE(shard->size(), 1024);
    }
    EXPECT_EQ(shard->token(shard->size() - 1), eos) << result.shards[s];
    EXPECT_TRUE(fs::exists(fs::path(result.shards[s]).replace_extension(".idx")));
  }
  const auto folder = TokenCorpus::open((dir / "shards").string(), 40);
  std::vector<int64_t> folder_ids(static_cast<size_t>(folder->size())), folder_starts(400);
  folder->read(0, folder_ids);
  EXPECT_EQ(folder_ids, ids);
  ASSERT_EQ(folder->num_documents(), 400);
  folder->document_starts(0, folder_starts);
  EXPECT_EQ(folder_starts, starts);

  PrepareOptions unnamed = megatron;
  unnamed.output = (dir / "m.data").string();
  expect_user_error([&] { prepare_token_file(unnamed); }, {"m.data", "--format megatron/--output", "names the .bin"});
  // A .tok (our format's name) with --format megatron: both flags named, and what each choice means.
  unnamed.output = (dir / "m.tok").string();
  expect_user_error([&] { prepare_token_file(unnamed); },
                    {"m.tok", "--format megatron/--output", "PREFIX.bin with PREFIX.idx beside it",
                     "for a .tok, our format, drop --format megatron"});
  EXPECT_FALSE(fs::exists(dir / "m.tok"));
}

// Through the trainer: windows at documents train and are recorded; a resume with the other kind
// is refused naming --window_start; the synthetic corpus has no documents.
TEST(DocumentWindows, TrainRecordTheirKindAndRefuseAResumeWithTheOther) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("document_windows_train");
  const Documents documents = make_documents(600, 40, 8);
  testing::write_shard("megatron", dir / "m.bin", documents.tokens, "--vocab 100 --docs " + joined(documents.lengths));
  auto command = [&](const std::string& tag, const std::string& more) {
    return testing::trainer_launcher(1) + " --config " + (testing::source_dir() / "configs/llama_micro.json").string() +
           " --device cpu --max_length 16 --warmup_steps 1 --eval_every 0 --eval_sequences 4 --batch_size 2 --data " +
           (dir / "m.bin").string() + " --save_dir " + (dir / "ckpt").string() + " --run_dir " + (dir / tag).string() +
           " " + more;
  };
  const auto trained = run_command(command("a", "--window_start document --num_training_steps 3 --save_every 3"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_EQ(testing::manifest(dir / "ckpt" / "step_3").at("data_identity").at("window_start"), "document");
  const auto refused = run_command(command("b", "--num_training_steps 4 --continue_from " + (dir / "ckpt").string()));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(mentions(refused.output, "its windows started at documents, now anywhere (--window_start")) << refused.output;
  const auto same = run_command(command("c", "--window_start document --num_training_steps 4 --continue_from " +
                                                 (dir / "ckpt").string()));
  EXPECT_EQ(same.exit_code, 0) << same.output;
  const auto synthetic = run_command(testing::trainer_launcher(1) + " --config " +
                                     (testing::source_dir() / "configs/llama_micro.json").string() +
                                     " --device cpu --max_length 16 --window_start document --num_training_steps 1 --run_dir " +
                                     (dir / "s").string());
  EXPECT_EQ(synthetic.exit_code, 2) << synthetic.output;
  EXPECT_TRUE(mentions(synthetic.output, "the synthetic corpus records none")) << synthetic.output;
}

}  // namespace
}  // namespace llm::document_windows_test
