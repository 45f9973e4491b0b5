// `trainer prepare`: text files to a token file with SentencePiece.
//
// Inputs are read as data/text_input.h says: plain, gzip or zstd (told by their first bytes), text
// with a document a line or JSON Lines (*.jsonl, *.json, before any .gz/.zst) with the document in
// each record's --text_key. A progress line every 5 s gives MB/s and tokens/s.
//
// With --tokenizer MODEL an existing SentencePiece model (LLaMA's and T5's are such models) encodes
// the text; with --vocab_size N a new model is trained on the text first and saved beside the output
// (OUTPUT.model). Documents are separated by the tokenizer's EOS id (or by nothing when it has none).
// A held-out split needs no separate file: the sampler takes the tail of the token file.
//
// Nothing is overwritten by surprise: an existing --output (or OUTPUT.model) is replaced only with
// --overwrite, and an output that is one of the inputs or the --tokenizer is refused always (it
// would be destroyed while it is still being read). Inputs must be text: every byte of each is
// checked for NUL bytes and invalid UTF-8 as it is read (Utf8Check, data/text_input.h), the first
// kTextProbeBytes before anything is trained or written, the rest as the text is encoded (a bad byte
// then stops the run naming the file, the byte and its line, and no output is renamed into place). SentencePiece's own
// failures come back as our errors, naming the flag and the files and saying what to change.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llm {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text (a document a line) or JSON Lines files, plain, gzip or zstd (data/text_input.h)
  std::string text_key = "text";    // JSON Lines: the key holding each record's document
  std::string output;               // token file path
  std::string tokenizer;            // existing .model, or empty to train one
  int64_t vocab_size = 0;           // when training a tokenizer
  std::string model_type = "bpe";   // sentencepiece model type when training
  bool overwrite = false;           // replace an existing output (and OUTPUT.model)
  // 0: one token file at `output`. N: `output` is a folder of shards of N tokens each (the last
  // shorter), shard_000000.tok (or .bin), ..., with index.json listing them; written one at a time,
  // each atomically, and the index last. A trained tokenizer goes to FOLDER/tokenizer.model.
  // Megatron's shards hold whole documents: each ends at the first document end at or past N.
  int64_t shard_tokens = 0;
  // "trainer" (ours, .tok), "llmc" (llm.c's .bin) or "megatron" (PREFIX.bin and PREFIX.idx, a
  // sequence per document: the format that records documents, for --window_start document).
  std::string format = "trainer";
};

// --shard_tokens: at least this many (a shard is a few windows at least), at most llm.c's int32 count.
constexpr int64_t kMinShardTokens = 1024;
constexpr int64_t kMaxShardTokens = 2147483647;

// --vocab_size when training: SentencePiece reserves 3 pieces (<unk>, <s>, </s>) and counts in int32.
constexpr int64_t kMinVocabSize = 4;
constexpr int64_t kMaxVocabSize = 2147483647;
// Bytes at the start of each input checked to be UTF-8 text before anything else (the rest is checked as it is read).
constexpr size_t kTextProbeBytes = 64 * 1024;

struct PrepareResult {
  int64_t num_tokens = 0;
  std::vector<std::string> shards;  // the files written, in order (one: `output` itself)
  int64_t vocab_size = 0;
  std::string tokenizer_path;
};

PrepareResult prepare_token_file(const PrepareOptions& options);  // throws UserError on bad input

}  // namespace llm
