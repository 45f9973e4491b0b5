// The formats --data reads (data/token_file.h), read back equal to the ids a reference writer wrote in
// each format's published layout (tests/data/write_shards.py: numpy.save,
// llm.c's write_datafile, Megatron-LM's _IndexWriter, ours), at both widths of each, through read() at
// random offsets and tail lengths (1, 7, 22, 1023); and --data's shards as one corpus
// (data/token_corpus.h): a folder, a glob and a comma-separated list, formats mixed, are their shards
// concatenated in the order expand_data_spec documents (items as listed, a folder's or a glob's files
// in name order), read across shard boundaries; an item that names nothing, or a file named twice, is a
// UserError naming the item. The bad shards are in data_format_errors_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/token_corpus.h"
#include "data/token_file.h"
#include "tests/data_test_util.h"
#include "tests/shard_writer.h"
#include "tests/test_util.h"

namespace llm::data_formats_test {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;
using testing::known_tokens;
using testing::ScratchDir;
using testing::write_shard;

constexpr int64_t kShardTokens = 5003;  // several thousand, a multiple of no width or window
constexpr int64_t kGpt2Vocab = 50257;
constexpr int64_t kLlama3Vocab = 128256;

// Reads [start, start + length) of `source` (a TokenFile or a TokenCorpus) and compares with `expected`,
// naming the first token that differs.
template <class Source>
void expect_read_equal(const Source& source, const std::vector<int64_t>& expected, int64_t start, int64_t length) {
  std::vector<int64_t> out(static_cast<size_t>(length), -1);
  source.read(start, out);
  const auto first = expected.begin() + start;
  const auto [ours, theirs] = std::mismatch(out.begin(), out.end(), first);
  EXPECT_TRUE(ours == out.end()) << "read(" << start << ", " << length << "): token " << start + (ours - out.begin())
                                 << " is " << *ours << ", written " << *theirs;
}

// The whole of `source`, its ends, the tail lengths 1, 7, 22, 1023 from random starts, a few tokens
// either side of every boundary (shard boundaries of a corpus), 300 random windows; a read past the end
// throws.
template <class Source>
void expect_reads_equal(const Source& source, const std::vector<int64_t>& expected,
                        const std::vector<int64_t>& boundaries = {}) {
  const int64_t n = static_cast<int64_t>(expected.size());
  ASSERT_EQ(source.size(), n);
  expect_read_equal(source, expected, 0, n);
  std::mt19937_64 random(static_cast<uint64_t>(n));
  for (int64_t length : {1, 7, 22, 1023}) {
    if (length > n) continue;
    expect_read_equal(source, expected, 0, length);
    expect_read_equal(source, expected, n - length, length);
    expect_read_equal(source, expected, static_cast<int64_t>(random() % static_cast<uint64_t>(n - length + 1)), length);
  }
  for (int64_t boundary : boundaries)
    for (int64_t start : {boundary - 3, boundary - 1, boundary})
      for (int64_t length : {1, 2, 5, 40})
        if (start >= 0 && start + length <= n) expect_read_equal(source, expected, start, length);
  for (int i = 0; i < 300; ++i) {
    const int64_t start = static_cast<int64_t>(random() % static_cast<uint64_t>(n));
    const int64_t length = 1 + static_cast<int64_t>(random() % static_cast<uint64_t>(std::min<int64_t>(n - start, 2048)));
    expect_read_equal(source, expected, start, length);
  }
  std::vector<int64_t> past_end(2);
  EXPECT_ANY_THROW(source.read(n - 1, past_end));
}

// --- every format at every width ------------------------------------------------------------------

struct FormatCase {
  std::string name;
  std::string format;  // write_shards.py's
  std::string dtype;
  int64_t vocab;          // the ids are below it; the model's vocab_size in the test
  std::string file;       // megatron: the .bin (the .idx beside it)
  std::string reported;   // to_string(format())
  int bytes_per_token;
  int memmap_bytes = 0;   // --memmap_dtype's width (OLMo's headerless arrays)
};

const FormatCase kFormats[] = {
    {"npy_uint16", "npy", "uint16", 65536, "part-0-00000.npy", "npy", 2},
    {"npy_uint32", "npy", "uint32", kLlama3Vocab, "part-0-00000.npy", "npy", 4},
    {"llmc_uint16", "llmc", "uint16", kGpt2Vocab, "fineweb_train_000001.bin", "llm.c", 2},
    {"llmc_uint32", "llmc", "uint32", kLlama3Vocab, "fineweb_train_000001.bin", "llm.c", 4},
    {"megatron_uint16", "megatron", "uint16", 65536, "c4_en_text_document.bin", "megatron", 2},
    {"megatron_int32", "megatron", "int32", kLlama3Vocab, "c4_en_text_document.bin", "megatron", 4},
    {"trainer_uint16", "trainer", "uint16", 65536, "corpus.tok", "trainer", 2},
    {"trainer_uint32", "trainer", "uint32", kLlama3Vocab, "corpus.tok", "trainer", 4},
    {"olmo_uint16", "olmo", "uint16", 65536, "part-0-00000.npy", "raw", 2, 2},
    {"olmo_uint32", "olmo", "uint32", kLlama3Vocab, "part-0-00000.npy", "raw", 4, 4},
};

class FormatRoundTrip : public ::testing::TestWithParam<FormatCase> {};

TEST_P(FormatRoundTrip, ReadsBackTheIdsItsReferenceWriterWrote) {
  SKIP_WITHOUT_SHARD_WRITER();
  const FormatCase& c = GetParam();
  ScratchDir dir("format_" + c.name);
  const std::vector<int64_t> tokens = known_tokens(kShardTokens, c.vocab, 27);
  const fs::path path = dir / c.file;
  write_shard(c.format, path, tokens,
              "--dtype " + c.dtype + " --vocab " + std::to_string(c.vocab) +
                  (c.format == "megatron" ? " --docs 1000,1,2,4000" : ""));

  std::vector<fs::path> names = {path};  // Megatron's dataset may be named by either file
  if (c.format == "megatron") names.push_back(fs::path(path).replace_extension(".idx"));
  for (const fs::path& name : names) {
    SCOPED_TRACE(name.string());
    const auto file = TokenFile::open(name.string(), c.vocab, c.memmap_bytes);
    EXPECT_STREQ(to_string(file->format()), c.reported.c_str());
    EXPECT_EQ(file->bytes_per_token(), c.bytes_per_token);
    EXPECT_EQ(file->vocab_size(), c.format == "trainer" ? c.vocab : 0) << "only ours records its vocabulary";
    EXPECT_EQ(file->token(0), c.vocab - 1);
    EXPECT_EQ(file->token(kShardTokens - 1), tokens.back());
    for (int64_t i : {int64_t{1}, kShardTokens / 2, kShardTokens / 2 + 63, int64_t{1000}, int64_t{1003}})
      EXPECT_EQ(file->token(i), tokens[static_cast<size_t>(i)]) << "token " << i;
    expect_reads_equal(*file, tokens, c.format == "megatron" ? std::vector<int64_t>{1000, 1001, 1003} : std::vector<int64_t>{});
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, FormatRoundTrip, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return info.param.name; });

// OLMo's headerless arrays need --memmap_dtype (their files say nothing of their width): without it
// they are a wrong magic naming the flag; with it a size that is no whole number of ids is refused,
// and a file with a header is still read by its header.
TEST(TokenFileFormats, HeaderlessArraysNeedTheirDtypeAndAHeaderStillDecides) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("format_olmo");
  const std::vector<int64_t> tokens = known_tokens(3001, 1000, 5);
  write_shard("olmo", dir / "olmo.npy", tokens, "--dtype uint16");
  testing::expect_user_error([&] { TokenFile::open((dir / "olmo.npy").string(), 1000); },
                             {(dir / "olmo.npy").string(), "wrong magic", "--memmap_dtype uint16 or uint32"});
  testing::expect_user_error([&] { TokenFile::open((dir / "olmo.npy").string(), 1000, 4); },
                             {(dir / "olmo.npy").string(), "6002 bytes, not a whole number of 4-byte ids"});
  const auto file = TokenFile::open((dir / "olmo.npy").string(), 1000, 2);
  EXPECT_EQ(file->size(), 3001);
  write_shard("npy", dir / "saved.npy", tokens, "--dtype uint32");
  const auto saved = TokenFile::open((dir / "saved.npy").string(), 1000, 2);
  EXPECT_EQ(saved->format(), TokenFormat::numpy);
  EXPECT_EQ(saved->bytes_per_token(), 4);
  EXPECT_EQ(saved->token(3000), tokens.back());
}

// A .npy header is the Python dict literal NumPy reads (data/npy_header.h), not a pattern over its
// text (issue 44: double quotes, a list shape, (N) and Python 2's 10L were refused or misread): the
// headers numpy writes in formats 1.0, 2.0 and 3.0 and hand-written ones read back the ids; a header
// that is not such a dict is refused naming the file and what is wrong.
struct NpyHeaderCase {
  const char* name;
  const char* header;   // --npy_header ({count}: the ids' count), or "" for numpy's own (--npy_version)
  const char* version;  // numpy's header format
  std::vector<std::string> refused;  // fragments of the refusal; empty: read
};

const NpyHeaderCase kNpyHeaders[] = {
    {"numpy_1_0", "", "1.0", {}},
    {"numpy_2_0", "", "2.0", {}},
    {"numpy_3_0", "", "3.0", {}},
    {"double_quoted", R"({"descr": "<u2", "fortran_order": False, "shape": ({count},)})", "", {}},
    {"list_shape_keys_reordered", R"({'shape': [{count}], 'fortran_order': False, 'descr': '<u2'})", "", {}},
    {"no_trailing_comma", R"({"descr":"<u2","fortran_order":False,"shape":({count})})", "", {}},
    {"python2_long", R"({'descr': '<u2', 'fortran_order': False, 'shape': ({count}L,), })", "", {}},
    {"a_key_in_a_value", R"({'descr': '<u2', 'fortran_order': False, 'shape': ({count},), 'x': 'shape: (5,)'})", "",
     {"the key 'x' is none of 'descr', 'fortran_order', 'shape'"}},
    {"two_dimensions_in_a_list", R"({'descr': '<u2', 'fortran_order': False, 'shape': [{count}, 1]})", "",
     {"shape is (", ", 1); token arrays are 1-D"}},
    {"a_scalar", R"({'descr': '<u2', 'fortran_order': False, 'shape': ()})", "", {"shape is (); token arrays are 1-D"}},
    {"missing_key", R"({'descr': '<u2', 'shape': ({count},)})", "", {"the key 'fortran_order' is missing"}},
    {"key_twice", R"({'descr': '<u2', 'descr': '<u4', 'fortran_order': False, 'shape': ({count},)})", "",
     {"the key 'descr' is given twice"}},
    {"unclosed_string", R"({'descr': '<u2, 'fortran_order': False, 'shape': ({count},)})", "",
     {"expected a , or the dict's closing }"}},
    {"not_a_dict", R"(descr=<u2 shape={count})", "", {"expected the dict's opening {"}},
    {"structured_dtype", R"({'descr': [('a', '<u2')], 'fortran_order': False, 'shape': ({count},)})", "",
     {"a structured dtype"}},
};

class NpyHeaders : public ::testing::TestWithParam<NpyHeaderCase> {};

TEST_P(NpyHeaders, AreReadByTheirGrammar) {
  SKIP_WITHOUT_SHARD_WRITER();
  const NpyHeaderCase& c = GetParam();
  ScratchDir dir(std::string("npy_header_") + c.name);
  const std::vector<int64_t> tokens = known_tokens(301, 1000, 9);
  const fs::path path = dir / "tokens.npy";
  std::string quoted = "'";
  for (const char ch : std::string(c.header)) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  write_shard("npy", path, tokens,
              "--dtype uint16 " + (std::string(c.header).empty() ? "--npy_version " + std::string(c.version)
                                                                  : "--npy_header " + quoted + "'"));
  if (c.refused.empty()) {
    const auto file = TokenFile::open(path.string(), 1000);
    EXPECT_EQ(file->format(), TokenFormat::numpy);
    EXPECT_EQ(file->size(), 301);
    expect_reads_equal(*file, tokens);
    return;
  }
  std::vector<std::string> fragments = c.refused;
  fragments.push_back(path.string());
  testing::expect_user_error([&] { TokenFile::open(path.string(), 1000); }, fragments);
}

INSTANTIATE_TEST_SUITE_P(Formats, NpyHeaders, ::testing::ValuesIn(kNpyHeaders),
                         [](const auto& info) { return std::string(info.param.name); });

// The header says the formats are told apart by their first bytes: a file's name does not decide.
TEST(TokenFileFormats, AreToldApartByTheirFirstBytesNotTheirNames) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("format_names");
  const std::vector<int64_t> tokens = known_tokens(301, 1000, 3);
  const struct {
    const char* format;
    const char* file;
    const char* reported;
  } cases[] = {{"trainer", "ours.npy", "trainer"}, {"npy", "olmo.bin", "npy"}, {"llmc", "fineweb.tok", "llm.c"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    write_shard(c.format, dir / c.file, tokens, "--vocab 1000");
    const auto file = TokenFile::open((dir / c.file).string(), 1000);
    EXPECT_STREQ(to_string(file->format()), c.reported);
    expect_reads_equal(*file, tokens);
  }
}

// --- the corpus: shards concatenated --------------------------------------------------------------

struct Shard {
  std::string format;
  fs::path path;
  int64_t count;
  std::string flags = "";  // --dtype, --docs
};

// Writes the shards (ids below `vocab`, each its own seed) and returns their ids, in the order given.
std::vector<std::vector<int64_t>> write_all(const std::vector<Shard>& shards, int64_t vocab) {
  std::vector<std::vector<int64_t>> ids;
  for (const Shard& shard : shards) {
    fs::create_directories(shard.path.parent_path());
    ids.push_back(known_tokens(shard.count, vocab, 100 + ids.size()));
    write_shard(shard.format, shard.path, ids.back(), "--vocab " + std::to_string(vocab) + " " + shard.flags);
  }
  return ids;
}

struct Concatenation {
  std::vector<int64_t> tokens;
  std::vector<int64_t> boundaries;  // the corpus index of each shard's first token after the first
};

// The corpus expected from shards `order` (indices into `ids`), in that order.
Concatenation concatenate(const std::vector<std::vector<int64_t>>& ids, const std::vector<size_t>& order) {
  Concatenation all;
  for (size_t index : order) {
    if (!all.tokens.empty()) all.boundaries.push_back(static_cast<int64_t>(all.tokens.size()));
    all.tokens.insert(all.tokens.end(), ids[index].begin(), ids[index].end());
  }
  return all;
}

void expect_paths(const std::vector<std::string>& expanded, const std::vector<fs::path>& expected) {
  ASSERT_EQ(expanded.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(fs::path(expanded[i]).lexically_normal(), expected[i].lexically_normal()) << "item " << i;
}

TEST(TokenCorpus, AFolderIsItsTokenFilesInNameOrderFormatsMixed) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("corpus_folder");
  const fs::path folder = dir / "corpus";
  // Written out of name order; the 3-token and 1-token shards make one read span four shards.
  const std::vector<Shard> shards = {
      {"llmc", folder / "b_fineweb.bin", 3001},
      {"trainer", folder / "a_ours.tok", 2000},
      {"trainer", folder / "e_ours.tok", 1500, "--dtype uint32"},
      {"npy", folder / "c_olmo.npy", 3, "--dtype uint32"},
      {"npy", folder / "d_tiny.npy", 1},
      {"npy", folder / "nested" / "f_not_direct.npy", 50},  // not directly in the folder
  };
  const auto ids = write_all(shards, kGpt2Vocab);
  expect_paths(expand_data_spec(folder.string()),
               {shards[1].path, shards[0].path, shards[3].path, shards[4].path, shards[2].path});

  const auto corpus = TokenCorpus::open(folder.string(), kGpt2Vocab);
  ASSERT_EQ(corpus->shards().size(), 5u);
  EXPECT_STREQ(to_string(corpus->shards()[0]->format()), "trainer");
  EXPECT_STREQ(to_string(corpus->shards()[1]->format()), "llm.c");
  EXPECT_STREQ(to_string(corpus->shards()[2]->format()), "npy");
  const Concatenation expected = concatenate(ids, {1, 0, 3, 4, 2});
  EXPECT_EQ(corpus->size(), 2000 + 3001 + 3 + 1 + 1500);
  expect_reads_equal(*corpus, expected.tokens, expected.boundaries);
  expect_read_equal(*corpus, expected.tokens, 5000, 6);  // b's last, c's three, d's one, e's first
}

TEST(TokenCorpus, AGlobIsItsMatchesInNameOrderFormatsMixed) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("corpus_glob");
  const std::vector<Shard> shards = {
      {"megatron", dir / "shard_02.bin", 2500, "--docs 500,2000"},  // with shard_02.idx, not matched
      {"llmc", dir / "shard_01.bin", 3001, "--dtype uint32"},
      {"trainer", dir / "shard_00.bin", 1999},  // ours, named .bin: told by its first bytes
      {"llmc", dir / "shard_03.bin", 777},
      {"npy", dir / "shard_04.npy", 100},  // not matched by *.bin
      {"llmc", dir / "other_00.bin", 100},  // not matched by shard_*
  };
  const auto ids = write_all(shards, kGpt2Vocab);
  const std::string glob = (dir / "shard_*.bin").string();
  expect_paths(expand_data_spec(glob), {shards[2].path, shards[1].path, shards[0].path, shards[3].path});

  const auto corpus = TokenCorpus::open(glob, kGpt2Vocab);
  ASSERT_EQ(corpus->shards().size(), 4u);
  EXPECT_STREQ(to_string(corpus->shards()[2]->format()), "megatron");
  const Concatenation expected = concatenate(ids, {2, 1, 0, 3});
  EXPECT_EQ(corpus->size(), 1999 + 3001 + 2500 + 777);
  expect_reads_equal(*corpus, expected.tokens, expected.boundaries);
}

TEST(TokenCorpus, AListKeepsItsOrderAndExpandsEachItem) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("corpus_list");
  const std::vector<Shard> shards = {
      {"npy", dir / "z_first.npy", 1200},
      {"trainer", dir / "folder" / "a.tok", 900},
      {"llmc", dir / "folder" / "b.bin", 1100},
      {"npy", dir / "g_1.npy", 1300, "--dtype uint32"},
      {"npy", dir / "g_0.npy", 1400},
      {"megatron", dir / "web.bin", 1000, "--docs 10,990"},
  };
  const auto ids = write_all(shards, kGpt2Vocab);
  // A file, a folder, a glob, and a Megatron dataset named by its index: listed out of name order.
  const std::string spec = shards[0].path.string() + "," + (dir / "folder").string() + "," +
                           (dir / "g_*.npy").string() + "," + (dir / "web.idx").string();
  const std::vector<std::string> expanded = expand_data_spec(spec);
  ASSERT_EQ(expanded.size(), 6u);
  expect_paths(std::vector<std::string>(expanded.begin(), expanded.begin() + 5),
               {shards[0].path, shards[1].path, shards[2].path, shards[4].path, shards[3].path});
  EXPECT_EQ(fs::path(expanded[5]).replace_extension(), dir / "web") << expanded[5];

  const auto corpus = TokenCorpus::open(spec, kGpt2Vocab);
  ASSERT_EQ(corpus->shards().size(), 6u);
  const Concatenation expected = concatenate(ids, {0, 1, 2, 4, 3, 5});
  expect_reads_equal(*corpus, expected.tokens, expected.boundaries);
}

// A Megatron dataset is two files, one shard: a folder of them (as a Megatron user keeps one) counts
// each .bin/.idx pair once.
TEST(TokenCorpus, AFolderCountsAMegatronPairAsOneShard) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("corpus_megatron_folder");
  const std::vector<Shard> shards = {
      {"npy", dir / "a_olmo.npy", 1234},
      {"megatron", dir / "b_text_document.bin", 2345, "--docs 345,2000"},
      {"megatron", dir / "c_text_document.bin", 345, "--dtype int32"},
  };
  const auto ids = write_all(shards, kGpt2Vocab);
  EXPECT_EQ(expand_data_spec(dir.path().string()).size(), 3u);
  const auto corpus = TokenCorpus::open(dir.path().string(), kGpt2Vocab);
  ASSERT_EQ(corpus->shards().size(), 3u);
  const Concatenation expected = concatenate(ids, {0, 1, 2});
  expect_reads_equal(*corpus, expected.tokens, expected.boundaries);
}

// A single file is a corpus of one shard, named by its path; more shards are named by the spec.
TEST(TokenCorpus, IsNamedByItsOneFileOrByTheSpec) {
  ScratchDir dir("corpus_name");
  const std::vector<int64_t> tokens = known_tokens(500, 128, 5);
  for (const char* name : {"a.tok", "b.tok", "c.tok"}) write_token_file((dir / name).string(), tokens, 128);

  const std::string one = (dir / "a.tok").string();
  const auto single = TokenCorpus::open(one, 128);
  ASSERT_EQ(single->shards().size(), 1u);
  EXPECT_EQ(single->name(), one);
  expect_reads_equal(*single, tokens);

  const std::string glob = (dir / "*.tok").string();
  const auto three = TokenCorpus::open(glob, 128);
  EXPECT_NE(three->name().find("--data " + glob), std::string::npos) << three->name();
  EXPECT_NE(three->name().find("(3 shards)"), std::string::npos) << three->name();
  EXPECT_EQ(three->size(), 1500);
}

// --- what --data may not say ----------------------------------------------------------------------

TEST(DataSpec, AnItemThatNamesNothingIsAUserErrorNamingIt) {
  ScratchDir dir("spec_nothing");
  const std::string present = (dir / "a.tok").string();
  write_token_file(present, known_tokens(100, 128, 1), 128);
  const std::string missing = (dir / "absent.bin").string();
  const std::string empty = (dir / "empty").string();
  fs::create_directories(empty);
  const std::string unmatched = (dir / "*.parquet").string();
  for (const std::string& item : {missing, empty, unmatched}) {
    SCOPED_TRACE(item);
    const std::string spec = present + "," + item;  // the bad item after a good one
    expect_user_error([&] { expand_data_spec(spec); }, {item});
    expect_user_error([&] { TokenCorpus::open(spec, 128); }, {item});
    expect_user_error([&] { TokenCorpus::open(item, 128); }, {item});
  }
}

TEST(DataSpec, AFileNamedTwiceIsAUserErrorNamingIt) {
  ScratchDir dir("spec_twice");
  const fs::path folder = dir / "shards";
  fs::create_directories(folder);
  const std::string a = (folder / "a.tok").string();
  const std::string b = (folder / "b.tok").string();
  write_token_file(a, known_tokens(100, 128, 1), 128);
  write_token_file(b, known_tokens(100, 128, 2), 128);
  const std::string twice[] = {a + "," + a, folder.string() + "," + b, (folder / "*.tok").string() + "," + a};
  for (const std::string& spec : twice) {
    SCOPED_TRACE(spec);
    const std::string& named = spec == twice[1] ? b : a;
    expect_user_error([&] { expand_data_spec(spec); }, {named});
    expect_user_error([&] { TokenCorpus::open(spec, 128); }, {named});
  }
  EXPECT_EQ(expand_data_spec(a + "," + b).size(), 2u);  // both once: fine
}

// The edges of expansion: a file whose name looks like a glob is that file; a glob of a Megatron
// dataset's .idx files names each dataset once; a dataset named by its .bin and its .idx is named
// twice; a folder skips hidden files, and refuses a dangling link naming it.
TEST(DataSpec, NamesWhatItSaysAtTheEdges) {
  SKIP_WITHOUT_SHARD_WRITER();
  ScratchDir dir("spec_edges");
  const fs::path bracketed = dir / "train[v2].tok";
  write_token_file(bracketed.string(), known_tokens(100, 128, 1), 128);
  write_token_file((dir / "trainv.tok").string(), known_tokens(100, 128, 2), 128);  // what [v2] would match
  expect_paths(expand_data_spec(bracketed.string()), {bracketed});

  const fs::path megatron = dir / "megatron";
  write_shard("megatron", megatron / "a_text_document.bin", known_tokens(300, 128, 3));
  write_shard("megatron", megatron / "b_text_document.bin", known_tokens(300, 128, 4));
  EXPECT_EQ(expand_data_spec((megatron / "*.idx").string()).size(), 2u);
  EXPECT_EQ(expand_data_spec((megatron / "*").string()).size(), 2u);  // each .idx dropped beside its .bin
  const std::string pair = (megatron / "a_text_document.bin").string() + "," + (megatron / "a_text_document.idx").string();
  expect_user_error([&] { expand_data_spec(pair); }, {"named twice"});

  const fs::path folder = dir / "folder";
  fs::create_directories(folder);
  write_token_file((folder / "a.tok").string(), known_tokens(100, 128, 5), 128);
  write_token_file((folder / "._a.tok").string(), known_tokens(100, 128, 6), 128);  // a hidden file: skipped
  expect_paths(expand_data_spec(folder.string()), {folder / "a.tok"});
  // A dangling link with a shard's name is said, not skipped (issue 44; input_paths_test.cpp).
  fs::create_symlink(folder / "gone.tok", folder / "z_latest.tok");
  expect_user_error([&] { expand_data_spec(folder.string()); }, {"z_latest.tok is a symbolic link to nothing"});
}

// One reading of a --data item (data/token_corpus.cpp), and messages that say what is wrong with it
// (issue 44: "synthetic" in a list was "not a file ... expected \"synthetic\""; nan and inf weights
// "have no weight"; a mixture file in a list was read as a token file; "part:2" was read as "part"
// with weight 2 and the message said nothing of it). A file whose name has a colon is that file.
TEST(DataSpec, SaysExactlyWhatIsWrongWithAnItem) {
  ScratchDir dir("spec_items");
  const std::string a = (dir / "a.tok").string(), b = (dir / "b.tok").string(), part = (dir / "part:2").string();
  write_token_file(a, known_tokens(100, 128, 1), 128);
  write_token_file(b, known_tokens(100, 128, 2), 128);
  std::ofstream(dir / "mix.json") << R"({"sources": [{"data": "a.tok", "weight": 1}]})";
  std::ofstream(dir / "index.json") << R"({"format": "trainer", "shards": []})";
  std::ofstream(dir / "notes.json") << R"({"note": 1})";
  const std::string mix = (dir / "mix.json").string();
  const struct {
    std::string spec;
    std::vector<std::string> fragments;
  } refused[] = {
      {"synthetic," + a, {"\"synthetic," + a + "\" names \"synthetic\" in a list or a mixture", "given alone as --data synthetic"}},
      {"synthetic:1," + a + ":1", {"names \"synthetic\" in a list or a mixture", "never listed or mixed with token files"}},
      {a + "," + mix, {mix + " is a mixture file, not a token file", "a mixture file is the whole of --data (--data " + mix + ")"}},
      {a + ":1," + mix + ":1", {mix + " is a mixture file, not a token file"}},
      {a + "," + (dir / "index.json").string(), {"is a shard folder's index.json, not a token file: name its folder"}},
      {a + "," + (dir / "notes.json").string(), {"notes.json is a JSON file, not a token file"}},
      {a + ":nan," + b + ":1", {"\"" + a + ":nan\": the weight nan is not a finite number"}},
      {a + ":inf," + b + ":1", {"the weight inf is not a finite number"}},
      {a + ":1," + b + ":-inf", {"the weight -inf is not a finite number"}},
      {part, {"\"" + part + "\" was read as " + (dir / "part").string() + " with the mixture weight 2",
              "a name with a colon is read whole when it exists"}},
  };
  for (const auto& c : refused) {
    SCOPED_TRACE(c.spec);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back("--data");
    expect_user_error([&] { expand_data_spec(c.spec); }, fragments);
  }
  // Once it exists, "part:2" is that file: alone, in a list, and in a mixture with its weight after it.
  write_token_file(part, known_tokens(100, 128, 3), 128);
  expect_paths(expand_data_spec(part), {part});
  expect_paths(expand_data_spec(part + "," + a), {part, a});
  EXPECT_FALSE(is_mixture(part));
  const std::vector<DataSource> sources = data_sources(part + ":0.5," + a + ":0.5");
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0].spec, part);
  EXPECT_DOUBLE_EQ(sources[0].weight, 0.5);
  expect_user_error([&] { data_sources(part + "," + a + ":1"); },
                    {"\"" + part + "\" has no weight", "is an existing file, the colon part of its name: give its weight after it"});
}

}  // namespace
}  // namespace llm::data_formats_test
