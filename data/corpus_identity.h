// What a checkpoint records of the corpus it was trained on, so that a resume can tell the same data
// (also moved to another folder) from other data, and refuse the other by name.
//
// The identity lists every shard in corpus order: its file name (without the folder), format, tokens,
// bytes and the CRC-32C of its first 4 KiB (the header and the first ids; for a Megatron dataset the
// .bin's and then the .idx's). A shard re-made in place (`trainer prepare` again, another tokenizer)
// changes its size or its start; 4 KiB a shard keeps a save cheap at a thousand shards. The folders
// are recorded beside it for messages, not compared: a corpus copied to a new scratch file system
// is the same corpus.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "data/token_corpus.h"

namespace llm {

// {"tokens": T, "shards": [{"file", "format", "tokens", "bytes", "head_crc32c", "sampled_crc32c"}, ...],
// "folders": [...]}: head_crc32c of a shard's first 4 KiB, sampled_crc32c of 16 blocks of 4 KiB spread
// evenly through it (first and last included; the whole file up to 64 KiB). A change to a shard of the
// same size is seen where it touches one of those blocks, not elsewhere.
// Throws UserError naming the shard if one cannot be read.
nlohmann::json corpus_identity(const TokenCorpus& corpus);

// A mixture's sources (--data ITEM:WEIGHT,...) as a checkpoint records them beside the shards, in
// order: [{"weight": w, "shards": n}, ...].
nlohmann::json mixture_identity(const std::string& spec);

// What a run records of its data: corpus_identity(corpus), with "mixture" (mixture_identity) when
// `spec` is a mixture and "window_start": "document" when its windows start at documents
// (--window_start; absent: anywhere, as every checkpoint before the flag).
nlohmann::json run_data_identity(const TokenCorpus& corpus, const std::string& spec, const std::string& window_start);

// "" when `now` is the corpus `then` recorded (its mixture's weights and sources too); else the first difference in words, e.g.
// "shard 3 of 8, web-00003.bin: 1000000 tokens then, 900000 now" or "12 shards then, 13 now (added:
// web-00012.bin)". `then` from an older checkpoint without an identity is never a difference.
std::string identity_difference(const nlohmann::json& then, const nlohmann::json& now);

}  // namespace llm
