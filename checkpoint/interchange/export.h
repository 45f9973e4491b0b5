// `trainer export --from CHECKPOINT --to DIR`: a checkpoint as a transformers save_pretrained folder,
// which LlamaForCausalLM.from_pretrained(DIR) loads without a flag:
//   config.json             today's transformers format (checkpoint/interchange/hf_config.h)
//   generation_config.json  the token ids, as save_pretrained writes them
//   model.safetensors       every parameter by HF name, in --dtype; above --max_shard_size instead
//                           model-0000K-of-0000N.safetensors and model.safetensors.index.json
//                           (metadata.total_size, weight_map), split as transformers splits
//   tokenizer.model         when the run trained on a token file whose SentencePiece model `trainer
//                           prepare` trained beside it (DATA.model), or the one --tokenizer names;
//   tokenizer.json,         instead, when --tokenizer names a Hugging Face tokenizer.json (prepare
//   tokenizer_config.json   encodes with either kind): the file, and PreTrainedTokenizerFast as its class;
//                           otherwise the output says that none is exported and why
// CHECKPOINT is a checkpoint folder or a --save_dir (its newest intact step_<N>, as --continue_from).
// The tensors are written unit by unit, each converted to --dtype only as it is written. Every file
// is written as NAME.tmp and renamed when complete.
//
// Refused, exit 2 before anything is written: a missing or damaged checkpoint (the loader's message),
// a --tokenizer that is neither kind or larger than the model's vocabulary, a --to that exists and is
// not a folder (a file, a device such as /dev/null: never replaced, even with --overwrite), or a
// folder that is not empty (unless --overwrite, which replaces the files an export writes and leaves
// any other file alone), a --max_shard_size that is not a size. A write that
// fails (disk full, quota) is exit 2 naming the file (WriteError).
#pragma once

#include <cstdint>
#include <string>

namespace llm {

struct ExportOptions {
  std::string from;                            // a checkpoint folder or a --save_dir
  std::string to;                              // the folder to write
  std::string dtype = "float32";               // float32 | bfloat16
  uint64_t max_shard_size = 5'000'000'000ULL;  // bytes per safetensors file (transformers' "5GB")
  std::string tokenizer;                       // a SentencePiece model or tokenizer.json; "" = the run's own
  bool overwrite = false;
};

// "5GB" (10^9), "500MB", "2GiB" (2^30), "1000000" (bytes): transformers' spellings. 0 when `text` is
// not a size.
uint64_t parse_byte_size(const std::string& text);

// Writes the folder; returns its total size in bytes. Throws UserError (see above).
uint64_t export_checkpoint(const ExportOptions& options);

}  // namespace llm
