// A Hugging Face tokenizer.json (LLaMA 3, GPT-2, Qwen) for `trainer prepare`, through the maintained
// `tokenizers` library: a helper process, data/hf_encode.py, run by the project's Python
// (TRAINER_PYTHON in the environment, else the one the build was configured with, else python3),
// encodes batches of text sent over a pipe (its protocol is in the script). No BPE is written here.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace llm {

// Whether `path` is a tokenizer.json (its first non-blank byte is '{') rather than a SentencePiece model.
bool is_hf_tokenizer(const std::string& path);

class HfTokenizer {
 public:
  // Starts the helper and reads its handshake. Throws UserError naming the file and --tokenizer when
  // the helper cannot start, the library is missing, or the file is not a tokenizer it reads.
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer();
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  int64_t vocab_size() const { return vocab_size_; }
  int64_t end_of_document() const { return end_of_document_; }  // -1: none
  // The ids of each text, no special tokens added. Throws UserError if the helper fails.
  std::vector<std::vector<int>> encode(const std::vector<std::string>& texts);

 private:
  void write_all(const void* data, size_t bytes);
  void read_all(void* data, size_t bytes);
  std::string path_;
  pid_t child_ = -1;
  int to_child_ = -1, from_child_ = -1;
  int64_t vocab_size_ = 0, end_of_document_ = -1;
};

}  // namespace llm
