// `trainer prepare`: text files to a token file with SentencePiece.
//
// With --tokenizer MODEL an existing SentencePiece model (LLaMA's and T5's are such models) encodes
// the text; with --vocab_size N a new model is trained on the text first and saved beside the output
// (OUTPUT.model). Documents are separated by the tokenizer's EOS id (or by nothing when it has none).
// A held-out split needs no separate file: the sampler takes the tail of the token file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llm {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files, one document per line or per file
  std::string output;               // token file path
  std::string tokenizer;            // existing .model, or empty to train one
  int64_t vocab_size = 0;           // when training a tokenizer
  std::string model_type = "bpe";   // sentencepiece model type when training
};

struct PrepareResult {
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  std::string tokenizer_path;
};

PrepareResult prepare_token_file(const PrepareOptions& options);  // throws UserError on bad input

}  // namespace llm
