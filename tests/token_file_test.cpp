// Token files (data/token_file.h): written and read back exactly at both widths (uint16 up to a
// vocabulary of 65536, uint32 above), and every way a file can be wrong (magic, version, width,
// length, trailing bytes, a missing file) is a UserError naming the file on open; an id outside the
// vocabulary is one on the read that touches it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>

#include "data/token_file.h"
#include "tests/data_test_util.h"
#include "tests/test_util.h"

namespace llm::token_file_test {
namespace {

using testing::expect_user_error;
using testing::ScratchDir;

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

// Ids are checked as windows are read, not on open (data/token_file.h: a corpus of 10^12 tokens opens
// by its headers): the open passes, the read that touches the bad id fails naming it.
TEST(TokenFile, IdAtOrAboveVocabFailsTheReadThatTouchesItNotTheOpen) {
  ScratchDir scratch("token_bad_id");
  const std::string path = scratch / "raw.bin";
  RawTokenFile raw = valid_raw_file();
  raw.ids[4] = 100;  // == vocab: the first bad one
  raw.ids[5] = 4000;
  raw.write(path);
  std::shared_ptr<TokenFile> file;
  ASSERT_NO_THROW(file = TokenFile::open(path, 100));
  std::vector<int64_t> good(4);
  EXPECT_NO_THROW(file->read(0, good));
  std::vector<int64_t> all(6);
  expect_user_error([&] { file->read(0, all); }, {path, "token 4 (byte 72)", "id 100", "vocab_size 100"});

  // The same in a uint32 file, with the bad id deep in the file.
  const std::string wide = scratch / "wide.bin";
  RawTokenFile wide_raw;
  wide_raw.bytes_per_token = 4;
  wide_raw.ids.assign(200000, 1);
  wide_raw.ids[123457] = 70000;
  wide_raw.num_tokens = wide_raw.ids.size();
  wide_raw.vocab_size = 70000;
  wide_raw.write(wide);
  std::shared_ptr<TokenFile> wide_file;
  ASSERT_NO_THROW(wide_file = TokenFile::open(wide, 70000));
  std::vector<int64_t> before(123457);
  EXPECT_NO_THROW(wide_file->read(0, before));
  std::vector<int64_t> window(100);
  expect_user_error([&] { wide_file->read(123400, window); }, {wide, "token 123457", "id 70000"});
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

}  // namespace
}  // namespace llm::token_file_test
