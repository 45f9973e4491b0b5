// `trainer prepare` (data/prepare.h): a SentencePiece tokenizer trained on text files and the token
// file encoded with it (read back with SentencePiece itself), an existing tokenizer reused, a long
// line kept whole, and every bad input (missing, empty, blank or non-UTF-8 text, a bad tokenizer or
// --vocab_size, an --output that exists or is one of the inputs) refused with a UserError naming the
// flag, leaving no file behind; through the trainer binary too (exit status 2).
#include <gtest/gtest.h>

#include <sentencepiece_processor.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>

#include <unistd.h>

#include <memory>

#include "common/errors.h"
#include "common/folder_lock.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "tests/data_test_util.h"
#include "tests/test_util.h"

namespace llm::prepare_test {
namespace {

using testing::expect_user_error;
using testing::ScratchDir;

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
  // The probe before training checks the first 64 KiB, and a character cut by its end is not held
  // against the file (the whole file is checked as it is read): 65535 bytes of text, then a 2-byte
  // character across the boundary.
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

// Every byte is checked, not only the probe's first 64 KiB (issue 44: a Latin-1 byte or a NUL after
// them passed silently into the token file): a bad byte anywhere is a UserError naming the file, the
// byte's offset and its line, in the encoding pass and in the tokenizer's training; characters cut by
// the reader's 1 MiB chunks are whole characters.
TEST_F(PrepareWithTokenizer, EveryByteIsCheckedNotOnlyTheFirst) {
  const std::string line = "the old man walked to the river and the dog ran with him. ";
  const auto text_of = [&](size_t bytes) {
    std::string text;
    while (text.size() + line.size() + 1 < bytes) text += line + "\n";
    return text;
  };
  const auto lines_in = [](const std::string& text) { return std::count(text.begin(), text.end(), '\n') + 1; };
  struct Case {
    const char* name;
    std::string head;   // good text before the bad byte
    std::string bad;    // "" : the file is good
    const char* what;
  };
  const std::string after_probe = text_of(70000), after_chunk = text_of((size_t{1} << 20) + 5000);
  // A 2-byte and a 4-byte character across the first 1 MiB chunk's end.
  std::string across_two = text_of((size_t{1} << 20) - 200);
  across_two.append((size_t{1} << 20) - 1 - across_two.size(), 'a');
  std::string across_four = across_two.substr(0, across_two.size() - 2);
  const std::vector<Case> cases = {
      {"latin1_after_probe.txt", after_probe, "caf\xE9\n", "invalid UTF-8"},
      {"nul_after_probe.txt", after_probe, std::string("a\0b\n", 4), "a NUL byte"},
      {"latin1_after_a_chunk.txt", after_chunk, "caf\xE9\n", "invalid UTF-8"},
      {"cut_at_the_end.txt", after_chunk, "\xE6\x97", "invalid UTF-8"},
      {"two_bytes_across_a_chunk.txt", across_two + "\xC3\xA9 end\n", "", nullptr},
      {"four_bytes_across_a_chunk.txt", across_four + "\xF0\x9F\x98\x80 end\n", "", nullptr},
  };
  for (const Case& bad_case : cases) {
    SCOPED_TRACE(bad_case.name);
    const std::string path = scratch_ / bad_case.name;
    std::ofstream(path, std::ios::binary) << bad_case.head << bad_case.bad;
    const size_t offset = bad_case.head.size() + (bad_case.bad.starts_with("caf") ? 3 : bad_case.bad.starts_with("a") ? 1 : 0);
    const std::string where = " at byte " + std::to_string(offset) + " (line " + std::to_string(lines_in(bad_case.head)) + ")";
    PrepareOptions options = encode(path, scratch_ / (std::string(bad_case.name) + ".tok"));
    if (bad_case.what == nullptr) {
      EXPECT_NO_THROW(prepare_token_file(options));
      continue;
    }
    expect_user_error([&] { prepare_token_file(options); }, {path, "--input", "is not UTF-8 text", bad_case.what + where});
    EXPECT_FALSE(std::filesystem::exists(options.output));
    EXPECT_FALSE(std::filesystem::exists(options.output + ".tmp"));
    // Training a tokenizer reads every byte too: the same error, and no tokenizer written.
    options.tokenizer.clear();
    options.vocab_size = 40;
    expect_user_error([&] { prepare_token_file(options); }, {path, "is not UTF-8 text", bad_case.what + where});
    EXPECT_FALSE(std::filesystem::exists(options.output + ".model"));
  }
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
  // Several inputs are named in short (four files: one file given twice is refused, issue 44).
  options.inputs = {blank};
  for (const char* name : {"blank2.txt", "blank3.txt", "blank4.txt"}) {
    std::filesystem::copy_file(blank, scratch / name);
    options.inputs.push_back(scratch / name);
  }
  expect_user_error([&] { prepare_token_file(options); }, {blank + ", " + (scratch / "blank2.txt").string() + " and 2 more"});
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

// Two writers of one --output (issue 44: both reported success, one's file replaced): while another
// process holds the output's lock (here this one, through the same mechanism), prepare is refused
// naming it and writes nothing; once released, it runs and leaves no lock file behind.
TEST(PrepareCommand, ASecondWriterOfOneOutputIsRefusedNamingTheFirst) {
  ScratchDir scratch("prepare_lock");
  const std::string text = scratch / "text.txt";
  write_english_like_text(text, 50, 7);
  const std::string output = (scratch / "tokens.bin").string();
  const std::string command =
      testing::trainer_binary().string() + " prepare --input " + text + " --vocab_size 64 --output " + output;
  {
    const std::unique_ptr<FolderLock> held = FolderLock::output(output, "--output");
    const auto refused = testing::run_command(command);
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("--output " + output + " is in use by another job (host "), std::string::npos)
        << refused.output;
    EXPECT_NE(refused.output.find("process " + std::to_string(::getpid())), std::string::npos) << refused.output;
    EXPECT_FALSE(std::filesystem::exists(output));
  }
  const auto ran = testing::run_command(command);
  EXPECT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_TRUE(std::filesystem::exists(output));
  EXPECT_FALSE(std::filesystem::exists(scratch / ".tokens.bin.trainer.lock")) << "the lock file goes with the lock";
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
  // --format megatron with a .tok --output: exit 2 naming both flags, nothing written.
  const auto megatron_tok = testing::run_command(command.substr(0, command.rfind(" --output ")) + " --format megatron --output " +
                                                 (scratch / "m.tok").string());
  EXPECT_EQ(megatron_tok.exit_code, 2) << megatron_tok.output;
  EXPECT_NE(megatron_tok.output.find("m.tok: --format megatron/--output: --format megatron writes a Megatron dataset"),
            std::string::npos)
      << megatron_tok.output;
  EXPECT_FALSE(std::filesystem::exists(scratch / "m.tok"));
}

}  // namespace
}  // namespace llm::prepare_test
