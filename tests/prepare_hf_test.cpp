// `trainer prepare --tokenizer tokenizer.json` (issue 27): a Hugging Face tokenizer through the
// `tokenizers` library (data/hf_tokenizer.h). A small BPE tokenizer is trained in the test with the
// library itself; the ids prepare writes for JSON Lines, .json.gz and .jsonl.zst are the library's
// own encode of each document with its </s> after it. A file that is not a tokenizer is exit 2
// naming it. Skipped where the project's Python has no `tokenizers`.
#include <gtest/gtest.h>

#include <zlib.h>
#include <zstd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/prepare.h"
#include "data/token_file.h"
#include "tests/data_test_util.h"
#include "tests/test_util.h"

namespace llm::prepare_hf_test {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;
using testing::ScratchDir;

std::string python_with_tokenizers() {
#ifdef TRAINER_PYTHON
  const std::string python = testing::python().string();
  if (!python.empty() && testing::run_command(python + " -c 'import tokenizers'").exit_code == 0) return python;
#endif
  return "";
}

#define SKIP_WITHOUT_TOKENIZERS()                                                        \
  if (python_with_tokenizers().empty()) GTEST_SKIP() << "the project's Python has no tokenizers library"

std::vector<std::string> documents() {
  static const std::vector<std::string> words = {"the", "river", "walked", "old", "man", "bread", "night", "über",
                                                 "naïve", "stars", "and", "to", "a"};
  std::vector<std::string> docs;
  uint64_t state = 7;
  for (int d = 0; d < 120; ++d) {
    std::string doc;
    const int length = 3 + static_cast<int>(d % 17);
    for (int w = 0; w < length; ++w) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      doc += (w ? " " : "") + words[(state >> 33) % words.size()];
    }
    docs.push_back(doc + (d % 5 == 0 ? ".\nA second line." : "."));
  }
  return docs;
}

void write_bytes(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

TEST(PrepareHuggingFace, EncodesAsTheTokenizersLibraryWithItsEndOfDocument) {
  SKIP_WITHOUT_TOKENIZERS();
  ScratchDir scratch("prepare_hf");
  const std::vector<std::string> docs = documents();
  std::string lines, text;
  for (const std::string& doc : docs) {
    lines += nlohmann::json{{"text", doc}}.dump() + "\n";
    text += doc + "\n";
  }
  write_bytes(scratch / "docs.jsonl", lines);
  write_bytes(scratch / "train.txt", text);
  {
    gzFile file = gzopen((scratch / "docs.json.gz").c_str(), "wb");
    gzwrite(file, lines.data(), static_cast<unsigned>(lines.size()));
    gzclose(file);
    std::string zst(ZSTD_compressBound(lines.size()), '\0');
    zst.resize(ZSTD_compress(zst.data(), zst.size(), lines.data(), lines.size(), 3));
    write_bytes(scratch / "docs.jsonl.zst", zst);
  }
  // The tokenizer, and the reference ids, from the library itself.
  write_bytes(scratch / "make.py", R"(
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
folder = sys.argv[1]
tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.train([folder + "/train.txt"], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"],
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tokenizer.save(folder + "/tokenizer.json")
eos = tokenizer.token_to_id("</s>")
ids = []
for line in open(folder + "/docs.jsonl", encoding="utf-8"):
    ids += tokenizer.encode(json.loads(line)["text"], add_special_tokens=False).ids + [eos]
print(tokenizer.get_vocab_size(with_added_tokens=True))
print(" ".join(map(str, ids)))
)");
  const auto made = testing::run_command(python_with_tokenizers() + " " + (scratch / "make.py").string() + " " +
                                         scratch.path().string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  int64_t vocab = 0;
  std::vector<int64_t> expected;
  {
    std::istringstream in(made.output);
    std::string line, last, before;
    while (std::getline(in, line)) {
      before = last;
      last = line;
    }
    vocab = std::stoll(before);
    std::istringstream ids(last);
    for (int64_t id; ids >> id;) expected.push_back(id);
  }
  ASSERT_GT(expected.size(), docs.size());
  for (const char* input : {"docs.jsonl", "docs.json.gz", "docs.jsonl.zst"}) {
    SCOPED_TRACE(input);
    PrepareOptions options;
    options.inputs = {scratch / input};
    options.output = scratch / (std::string(input) + ".tok");
    options.tokenizer = scratch / "tokenizer.json";
    const PrepareResult result = prepare_token_file(options);
    EXPECT_EQ(result.vocab_size, vocab);
    const auto file = TokenFile::open(options.output, vocab);
    std::vector<int64_t> ids(static_cast<size_t>(file->size()));
    file->read(0, ids);
    EXPECT_EQ(ids, expected);
  }
}

TEST(PrepareHuggingFace, AJsonFileThatIsNoTokenizerIsNamed) {
  SKIP_WITHOUT_TOKENIZERS();
  ScratchDir scratch("prepare_hf_bad");
  write_bytes(scratch / "docs.txt", "the river.\n");
  write_bytes(scratch / "config.json", R"({"hidden_size": 32})");
  PrepareOptions options;
  options.inputs = {scratch / "docs.txt"};
  options.output = scratch / "out.tok";
  options.tokenizer = scratch / "config.json";
  expect_user_error([&] { prepare_token_file(options); },
                    {(scratch / "config.json").string(), "--tokenizer",
                     "is not a Hugging Face tokenizer.json the tokenizers library reads"});
  EXPECT_FALSE(fs::exists(scratch / "out.tok"));
}

}  // namespace
}  // namespace llm::prepare_hf_test
