// `trainer prepare` reads corpora as they are published (issue 27, data/text_input.h): JSON Lines
// with the document in --text_key, gzip (C4's .json.gz) and zstd (Dolma's .jsonl.zst), told by
// their first bytes; the same documents give the same tokens whatever the wrapping, equal to
// SentencePiece's own encoding with an EOS after each; a damaged stream or a bad record is a
// UserError naming the file (and the line); a quoted glob is its matches.
#include <gtest/gtest.h>

#include <sentencepiece_processor.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/prepare.h"
#include "data/text_input.h"
#include "data/token_corpus.h"
#include "data/token_file.h"
#include "tests/data_test_util.h"
#include "tests/test_util.h"

namespace llm::prepare_inputs_test {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;
using testing::ScratchDir;

std::vector<std::string> documents(int count, uint64_t seed) {
  static const std::vector<std::string> words = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to",
                                                 "river", "old", "man", "walked", "with", "friend", "bread", "water"};
  std::mt19937_64 generator(seed);
  std::vector<std::string> docs;
  for (int d = 0; d < count; ++d) {
    std::string doc;
    const int length = 3 + static_cast<int>(generator() % 20);
    for (int w = 0; w < length; ++w) doc += (w ? " " : "") + words[generator() % words.size()];
    docs.push_back(doc + ".");
  }
  return docs;
}

std::string json_lines(const std::vector<std::string>& docs, const std::string& key = "text") {
  std::string text;
  for (size_t i = 0; i < docs.size(); ++i)
    text += nlohmann::json{{"id", i}, {key, docs[i]}, {"url", "https://example.org/" + std::to_string(i)}}.dump() + "\n";
  return text;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void write_gzip(const fs::path& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

void write_zstd(const fs::path& path, const std::string& bytes) {
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  const size_t size = ZSTD_compress(out.data(), out.size(), bytes.data(), bytes.size(), 3);
  ASSERT_FALSE(ZSTD_isError(size));
  out.resize(size);
  write_bytes(path, out);
}

std::vector<int64_t> tokens_of(const std::string& path) {
  const auto file = TokenFile::open(path, 48);
  std::vector<int64_t> tokens(static_cast<size_t>(file->size()));
  file->read(0, tokens);
  return tokens;
}

// A tokenizer trained once on plain text; each test encodes with it.
class PrepareInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    for (const std::string& doc : documents(300, 1)) text += doc + "\n";
    write_bytes(scratch_ / "train.txt", text);
    PrepareOptions train;
    train.inputs = {scratch_ / "train.txt"};
    train.output = scratch_ / "train.tok";
    train.vocab_size = 48;
    tokenizer_ = prepare_token_file(train).tokenizer_path;
  }
  std::vector<int64_t> prepare(const std::vector<std::string>& inputs, const std::string& output,
                               const std::string& text_key = "text") const {
    PrepareOptions options;
    options.inputs = inputs;
    options.output = scratch_ / output;
    options.tokenizer = tokenizer_;
    options.text_key = text_key;
    prepare_token_file(options);
    return tokens_of(scratch_ / output);
  }
  ScratchDir scratch_{"prepare_inputs"};
  std::string tokenizer_;
};

TEST_F(PrepareInputs, JsonLinesGzipAndZstdGiveTheTokensOfTheSameDocuments) {
  const std::vector<std::string> docs = documents(200, 2);
  std::string text;
  for (const std::string& doc : docs) text += doc + "\n";
  write_bytes(scratch_ / "docs.txt", text);
  write_bytes(scratch_ / "docs.jsonl", json_lines(docs));
  write_gzip(scratch_ / "docs.json.gz", json_lines(docs));  // C4's naming
  write_zstd(scratch_ / "docs.jsonl.zst", json_lines(docs));
  write_gzip(scratch_ / "docs.txt.gz", text);
  EXPECT_EQ(compression_of(scratch_ / "docs.json.gz"), TextCompression::gzip);
  EXPECT_EQ(compression_of(scratch_ / "docs.jsonl.zst"), TextCompression::zstd);
  EXPECT_EQ(layout_of(scratch_ / "docs.jsonl.zst"), TextLayout::json_lines);
  EXPECT_EQ(layout_of(scratch_ / "docs.txt.gz"), TextLayout::lines);

  // The reference: SentencePiece itself on each document, its EOS after each.
  sentencepiece::SentencePieceProcessor processor;
  ASSERT_TRUE(processor.Load(tokenizer_).ok());
  std::vector<int64_t> expected;
  for (const std::string& doc : docs) {
    std::vector<int> ids;
    ASSERT_TRUE(processor.Encode(doc, &ids).ok());
    expected.insert(expected.end(), ids.begin(), ids.end());
    expected.push_back(processor.eos_id());
  }
  EXPECT_EQ(prepare({scratch_ / "docs.txt"}, "txt.tok"), expected);
  for (const char* input : {"docs.jsonl", "docs.json.gz", "docs.jsonl.zst", "docs.txt.gz"})
    EXPECT_EQ(prepare({scratch_ / input}, std::string(input) + ".tok"), expected) << input;
}

// A record's text is one document whatever it holds (newlines, a megabyte): one EOS after it; an
// empty text adds nothing; blank lines between records are skipped.
TEST_F(PrepareInputs, ARecordIsOneDocumentWhateverItsTextHolds) {
  std::string long_text;
  while (long_text.size() < (size_t{3} << 20)) long_text += "the old man walked to the river. ";
  std::string lines = nlohmann::json{{"text", "the cat sat.\nthe dog ran.\n\nand the man walked."}}.dump() + "\n\n" +
                      nlohmann::json{{"text", ""}}.dump() + "\n" + nlohmann::json{{"text", long_text}}.dump() + "\n";
  write_zstd(scratch_ / "records.jsonl.zst", lines);
  sentencepiece::SentencePieceProcessor processor;
  ASSERT_TRUE(processor.Load(tokenizer_).ok());
  const std::vector<int64_t> tokens = prepare({scratch_ / "records.jsonl.zst"}, "records.tok");
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), processor.eos_id()), 2);
  EXPECT_EQ(tokens.back(), processor.eos_id());
  EXPECT_GT(tokens.size(), size_t{100000}) << "the 3 MB record is encoded whole, in pieces";
}

TEST_F(PrepareInputs, TextKeyNamesTheField) {
  const std::vector<std::string> docs = documents(20, 3);
  write_bytes(scratch_ / "content.jsonl", json_lines(docs, "content"));
  write_bytes(scratch_ / "text.jsonl", json_lines(docs));
  EXPECT_EQ(prepare({scratch_ / "content.jsonl"}, "content.tok", "content"), prepare({scratch_ / "text.jsonl"}, "text.tok"));
  expect_user_error([&] { prepare({scratch_ / "content.jsonl"}, "missing.tok"); },
                    {(scratch_ / "content.jsonl").string(), "--input", "line 1 has no string \"text\" (its keys: content, id, url)",
                     "pass --text_key"});
}

TEST_F(PrepareInputs, ADamagedStreamOrABadRecordNamesTheFileAndLine) {
  const std::string lines = json_lines(documents(2000, 4));
  write_gzip(scratch_ / "whole.json.gz", lines);
  const std::string gz = testing::read_text(scratch_ / "whole.json.gz");
  write_bytes(scratch_ / "cut.json.gz", gz.substr(0, gz.size() / 2));
  expect_user_error([&] { prepare({scratch_ / "cut.json.gz"}, "cut_gz.tok"); },
                    {(scratch_ / "cut.json.gz").string(), "--input", "cut short"});
  write_zstd(scratch_ / "whole.jsonl.zst", lines);
  const std::string zst = testing::read_text(scratch_ / "whole.jsonl.zst");
  write_bytes(scratch_ / "cut.jsonl.zst", zst.substr(0, zst.size() / 2));
  expect_user_error([&] { prepare({scratch_ / "cut.jsonl.zst"}, "cut_zst.tok"); },
                    {(scratch_ / "cut.jsonl.zst").string(), "--input", "zstd stream ends inside a frame: the file is cut short"});
  std::string damaged = zst;
  for (size_t i = 40; i < 60; ++i) damaged[i] = static_cast<char>(damaged[i] ^ 0x5a);
  write_bytes(scratch_ / "damaged.jsonl.zst", damaged);
  expect_user_error([&] { prepare({scratch_ / "damaged.jsonl.zst"}, "damaged.tok"); },
                    {(scratch_ / "damaged.jsonl.zst").string(), "--input"});
  write_bytes(scratch_ / "bad.jsonl", json_lines(documents(2, 5)) + "{\"text\": \"unterminated\n");
  expect_user_error([&] { prepare({scratch_ / "bad.jsonl"}, "bad.tok"); },
                    {(scratch_ / "bad.jsonl").string(), "--input", "line 3 is not JSON"});
  write_zstd(scratch_ / "binary.jsonl.zst", std::string("\x01\x02\x00\xff binary", 12));
  expect_user_error([&] { prepare({scratch_ / "binary.jsonl.zst"}, "binary.tok"); },
                    {(scratch_ / "binary.jsonl.zst").string(), "is not UTF-8 text (zstd-compressed): a NUL byte at byte 2"});
}

TEST_F(PrepareInputs, AQuotedGlobIsItsMatchesInNameOrder) {
  fs::create_directories(scratch_ / "c4");
  write_gzip(scratch_ / "c4" / "c4-train.00001-of-00002.json.gz", json_lines(documents(30, 7)));
  write_gzip(scratch_ / "c4" / "c4-train.00000-of-00002.json.gz", json_lines(documents(30, 6)));
  EXPECT_EQ(prepare({(scratch_ / "c4" / "c4-train.*.json.gz").string()}, "glob.tok"),
            prepare({scratch_ / "c4" / "c4-train.00000-of-00002.json.gz", scratch_ / "c4" / "c4-train.00001-of-00002.json.gz"},
                    "listed.tok"));
  expect_user_error([&] { prepare({(scratch_ / "c4" / "*.jsonl.zst").string()}, "none.tok"); },
                    {"*.jsonl.zst", "--input", "the pattern matches no file"});
}

// One file given twice, by name twice, by a glob and a name, or through a link, is exit 2 naming both
// spellings (before: encoded twice, each of its documents doubled in the corpus; issue 44).
TEST_F(PrepareInputs, AFileGivenTwiceIsRefusedNamingBothSpellings) {
  fs::create_directories(scratch_ / "c4");
  const fs::path first = scratch_ / "c4" / "c4-train.00000-of-00002.json.gz";
  write_gzip(first, json_lines(documents(30, 6)));
  write_gzip(scratch_ / "c4" / "c4-train.00001-of-00002.json.gz", json_lines(documents(30, 7)));
  expect_user_error([&] { prepare({first, first}, "twice.tok"); }, {first.string(), "--input", "is named twice"});
  expect_user_error([&] { prepare({(scratch_ / "c4" / "c4-train.*.json.gz").string(), first.string()}, "glob.tok"); },
                    {first.string(), "is named twice: each input is encoded once"});
  fs::create_symlink(first, scratch_ / "link.json.gz");
  expect_user_error([&] { prepare({first, scratch_ / "link.json.gz"}, "link.tok"); },
                    {(scratch_ / "link.json.gz").string(), "is named twice (also as " + first.string() + ")"});
}

// --shard_tokens: shards of exactly N tokens (the last shorter), in our format or llm.c's, with
// index.json; read back as a folder they are the single file's tokens.
TEST_F(PrepareInputs, ShardsWithAnIndexReadBackAsTheOneFilesTokens) {
  write_zstd(scratch_ / "docs.jsonl.zst", json_lines(documents(1500, 9)));
  const std::vector<int64_t> whole = prepare({scratch_ / "docs.jsonl.zst"}, "whole.tok");
  ASSERT_GT(whole.size(), size_t{5000});
  for (const std::string format : {"trainer", "llmc"}) {
    SCOPED_TRACE(format);
    PrepareOptions options;
    options.inputs = {scratch_ / "docs.jsonl.zst"};
    options.output = scratch_ / ("shards_" + format);
    options.tokenizer = tokenizer_;
    options.shard_tokens = 1024;
    options.format = format;
    const PrepareResult result = prepare_token_file(options);
    const size_t expected_shards = (whole.size() + 1023) / 1024;
    ASSERT_EQ(result.shards.size(), expected_shards);
    const nlohmann::json index = nlohmann::json::parse(testing::read_text(fs::path(options.output) / "index.json"));
    EXPECT_EQ(index.at("format"), format == "llmc" ? "llm.c" : "trainer");
    EXPECT_EQ(index.at("tokens"), static_cast<int64_t>(whole.size()));
    ASSERT_EQ(index.at("shards").size(), expected_shards);
    for (size_t s = 0; s + 1 < expected_shards; ++s) EXPECT_EQ(index.at("shards")[s].at("tokens"), 1024);
    EXPECT_EQ(index.at("shards")[0].at("file"), format == "llmc" ? "shard_000000.bin" : "shard_000000.tok");
    const auto corpus = TokenCorpus::open(options.output, 48);
    ASSERT_EQ(corpus->shards().size(), expected_shards);
    EXPECT_EQ(corpus->shards()[0]->format(), format == "llmc" ? TokenFormat::llmc : TokenFormat::trainer);
    std::vector<int64_t> read(whole.size());
    corpus->read(0, read);
    EXPECT_EQ(read, whole);
  }
  const std::string head = testing::read_text(scratch_ / "shards_llmc" / "shard_000000.bin").substr(0, 12);
  int32_t header[3];
  std::memcpy(header, head.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);  // llm.c's GPT-2 magic: uint16 ids
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 1024);
}

// The shards' folder is new, empty or an earlier prepare's: that one only with --overwrite, which
// removes the earlier shards this run does not write again; a folder of other files is refused.
TEST_F(PrepareInputs, AShardFolderIsReplacedOnlyWithOverwrite) {
  write_bytes(scratch_ / "docs.jsonl", json_lines(documents(800, 10)));
  PrepareOptions options;
  options.inputs = {scratch_ / "docs.jsonl"};
  options.output = scratch_ / "shards";
  options.tokenizer = tokenizer_;
  options.shard_tokens = 1024;
  const size_t first = prepare_token_file(options).shards.size();
  ASSERT_GE(first, 3u);
  expect_user_error([&] { prepare_token_file(options); },
                    {options.output, "--output", "holds the shards of an earlier `trainer prepare`", "pass --overwrite"});
  options.overwrite = true;
  options.shard_tokens = 4096;
  const size_t second = prepare_token_file(options).shards.size();
  EXPECT_LT(second, first);
  EXPECT_EQ(TokenCorpus::open(options.output, 48)->shards().size(), second) << "the earlier extra shards are gone";
  fs::create_directories(scratch_ / "notes");
  write_bytes(scratch_ / "notes" / "mine.txt", "the user's");
  options.output = scratch_ / "notes";
  expect_user_error([&] { prepare_token_file(options); },
                    {"notes", "--output", "holds other files (no index.json"});
  EXPECT_EQ(testing::read_text(scratch_ / "notes" / "mine.txt"), "the user's");
  options.output = scratch_ / "small";
  options.shard_tokens = 100;
  expect_user_error([&] { prepare_token_file(options); }, {"--shard_tokens", "expected 0 (one file) or an integer in [1024"});
}

// Parquet (FineWeb's form) through pyarrow: the same documents as JSON Lines give the same ids; a
// missing column or a damaged file is a UserError naming the file. Skipped without pyarrow.
TEST_F(PrepareInputs, ParquetIsReadThroughPyarrow) {
#ifdef TRAINER_PYTHON
  const std::string python = testing::python().string();
  if (testing::run_command(python + " -c 'import pyarrow'").exit_code != 0) GTEST_SKIP() << "no pyarrow in " << python;
  write_bytes(scratch_ / "docs.jsonl", json_lines(documents(700, 11)));
  write_bytes(scratch_ / "make.py", "import json, sys\nimport pyarrow as pa, pyarrow.parquet as pq\n"
                                    "docs = [json.loads(line)['text'] for line in open(sys.argv[1])]\n"
                                    "pq.write_table(pa.table({'id': list(range(len(docs))), 'text': docs}), sys.argv[2], "
                                    "row_group_size=100)\n");
  const auto made = testing::run_command(python + " " + (scratch_ / "make.py").string() + " " +
                                         (scratch_ / "docs.jsonl").string() + " " + (scratch_ / "docs.parquet").string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_EQ(compression_of(scratch_ / "docs.parquet"), TextCompression::parquet);
  EXPECT_EQ(prepare({scratch_ / "docs.parquet"}, "parquet.tok"), prepare({scratch_ / "docs.jsonl"}, "jsonl.tok"));
  expect_user_error([&] { prepare({scratch_ / "docs.parquet"}, "content.tok", "content"); },
                    {(scratch_ / "docs.parquet").string(), "--input", "has no column \"content\" (its columns: id, text)",
                     "pass --text_key"});
  write_bytes(scratch_ / "bad.parquet", std::string("PAR1") + std::string(200, 'x') + "PAR1");
  expect_user_error([&] { prepare({scratch_ / "bad.parquet"}, "bad.tok"); },
                    {(scratch_ / "bad.parquet").string(), "--input", "is not a Parquet file pyarrow reads"});
#else
  GTEST_SKIP() << "this build names no TRAINER_PYTHON";
#endif
}

// One rule for a record's text in JSON Lines and Parquet (issue 44: Parquet skipped null rows and
// passed numbers on, where JSON Lines refused them): a null, a number or any other non-string is
// refused naming the file and the line (row); a Parquet column of another type is refused by its type.
TEST_F(PrepareInputs, ANullOrNonStringTextIsRefusedAlikeInJsonLinesAndParquet) {
  const std::string good = nlohmann::json{{"text", "the cat sat."}}.dump() + "\n";
  write_bytes(scratch_ / "null.jsonl", good + "{\"text\": null}\n" + good);
  expect_user_error([&] { prepare({scratch_ / "null.jsonl"}, "null_jsonl.tok"); },
                    {(scratch_ / "null.jsonl").string(), "--input", "line 2's \"text\" is null, not a string"});
  write_bytes(scratch_ / "number.jsonl", good + good + "{\"text\": 5}\n");
  expect_user_error([&] { prepare({scratch_ / "number.jsonl"}, "number_jsonl.tok"); },
                    {(scratch_ / "number.jsonl").string(), "line 3's \"text\" is number, not a string"});
  write_bytes(scratch_ / "nul.jsonl", good + "{\"text\": \"a\\u0000b\"}\n");
  expect_user_error([&] { prepare({scratch_ / "nul.jsonl"}, "nul_jsonl.tok"); },
                    {(scratch_ / "nul.jsonl").string(), "line 2's \"text\" holds a NUL character"});
#ifdef TRAINER_PYTHON
  const std::string python = testing::python().string();
  if (testing::run_command(python + " -c 'import pyarrow'").exit_code != 0) GTEST_SKIP() << "no pyarrow in " << python;
  write_bytes(scratch_ / "make.py", "import sys\nimport pyarrow as pa, pyarrow.parquet as pq\n"
                                    "folder = sys.argv[1]\n"
                                    "pq.write_table(pa.table({'text': ['the cat sat.', None, 'the dog ran.']}), folder + '/null.parquet')\n"
                                    "pq.write_table(pa.table({'text': ['the cat sat.', 'a\\x00b']}), folder + '/nul.parquet')\n"
                                    "pq.write_table(pa.table({'text': [5, 6]}), folder + '/number.parquet')\n"
                                    "pq.write_table(pa.table({'text': [b'the cat sat.']}), folder + '/bytes.parquet')\n");
  const auto made = testing::run_command(python + " " + (scratch_ / "make.py").string() + " " + scratch_.path().string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  expect_user_error([&] { prepare({scratch_ / "null.parquet"}, "null_parquet.tok"); },
                    {(scratch_ / "null.parquet").string(), "--input", "row 2's \"text\" is null, not a string"});
  expect_user_error([&] { prepare({scratch_ / "nul.parquet"}, "nul_parquet.tok"); },
                    {(scratch_ / "nul.parquet").string(), "row 2's \"text\" holds a NUL character"});
  expect_user_error([&] { prepare({scratch_ / "number.parquet"}, "number_parquet.tok"); },
                    {(scratch_ / "number.parquet").string(), "its column \"text\" holds int64, not strings"});
  expect_user_error([&] { prepare({scratch_ / "bytes.parquet"}, "bytes_parquet.tok"); },
                    {(scratch_ / "bytes.parquet").string(), "its column \"text\" holds binary, not strings"});
#endif
}

// Through the binary: a compressed JSON Lines corpus in, a progress line with MB/s and tokens/s out.
TEST(PrepareInputsCommand, ReadsZstdJsonLinesAndReportsThroughput) {
  ScratchDir scratch("prepare_inputs_command");
  write_zstd(scratch / "corpus.jsonl.zst", json_lines(documents(500, 8)));
  const auto result = testing::run_command(testing::trainer_binary().string() + " prepare --input " +
                                           (scratch / "corpus.jsonl.zst").string() + " --vocab_size 48 --output " +
                                           (scratch / "corpus.tok").string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("prepare: done: "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(" MB/s, "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(" tokens/s, "), std::string::npos) << result.output;
  EXPECT_GT(TokenFile::open(scratch / "corpus.tok", 48)->size(), 2000);
}

}  // namespace
}  // namespace llm::prepare_inputs_test
