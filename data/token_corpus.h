// The tokens a run reads: --data's shards, in order, as one sequence of ids.
//
// --data is a comma-separated list of items, each a token file in any format data/token_file.h reads,
// a folder (every token file directly in it, in name order), or a glob pattern (its matches, in name
// order). The corpus is the shards concatenated in that order: its token i is token i - offset(s) of
// shard s, where offset(s) is the number of tokens in the shards before s. Windows of the batch
// sampler (data/batches.h) may span two shards, as they span documents. A single file is a corpus
// of one shard, read exactly as before.
//
// Every shard is opened and its header and size checked when the corpus opens (a clear UserError
// naming the file: exit 2); ids are checked as windows are read (an id not below the model's
// vocab_size is a UserError naming the file and the token's offset in it), so opening a corpus of
// 10^12 tokens reads headers only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/token_file.h"

namespace llm {

// --data as weighted sources (a mixture): "web/*.bin:0.7,code/:0.3" gives each item its own source
// with its weight, a positive number after the item's last ':'; without weights the whole spec is one
// source of weight 1. Sources are sampled in proportion to their weights, each through its own window
// order (data/batches.h). Throws UserError naming `flag` for a weight that is not a positive number,
// or weights on some items and not others.
struct DataSource {
  std::string spec;   // a file, folder or glob (the whole list when unweighted)
  double weight = 1;
};
//
// Or --data names a mixture file (one item ending in .json), the same sources written out:
//   {"sources": [{"data": "web/*.bin", "weight": 0.7}, {"data": ["code/a.bin", "code/b/"], "weight": 0.3}]}
// "data" is a file, folder or glob, or a list of them; a relative path is taken from the mixture
// file's folder (the file travels with its shards). Read strictly (common/json_file.h): an unknown
// key, a missing "data" or "weight", a weight that is not a positive number or an entry with a comma
// is a UserError naming the file and the entry ("sources[1].weight").
std::vector<DataSource> data_sources(const std::string& spec, const std::string& flag = "--data");
bool is_mixture(const std::string& spec);  // some item carries a weight, or spec is a mixture file
bool is_mixture_file(const std::string& spec);  // one item ending in .json

// The files --data (or `flag`, e.g. --eval_data) names, in order (weights dropped): each item expanded (a folder to its token files, a glob to its
// matches), without opening them. Throws UserError naming the item for one that names nothing
// (a missing file, an empty folder, a glob without matches) or a file listed twice.
std::vector<std::string> expand_data_spec(const std::string& spec, const std::string& flag = "--data");

// A sharded `trainer prepare` marks its --output folder with this file from its first shard until
// index.json is in place (data/prepare.cpp): a folder that still has it holds the shards of a prepare
// that was killed or ran out of space, which --data refuses to read (some shards are missing) and
// `prepare --overwrite` replaces. The file lists the shards begun, one JSON object {"shards": [...]}.
constexpr const char* kUnfinishedPrepareFile = ".trainer_prepare_unfinished";
// A name a sharded prepare gives its shards (shard_NNNNNN.tok, .bin or .idx): the only names it ever
// removes from a folder, whatever an index.json lists.
bool is_prepared_shard_name(const std::string& name);

// --data with each item made absolute, weights kept (for the checkpoint's record): a single file's
// absolute path.
std::string absolute_data_spec(const std::string& spec);

class TokenCorpus {
 public:
  // Expands `spec` and opens every shard. Throws UserError as expand_data_spec and TokenFile::open.
  // memmap_bytes: TokenFile::open's (--memmap_dtype: 2 or 4; 0: none).
  static std::shared_ptr<TokenCorpus> open(const std::string& spec, int64_t model_vocab_size,
                                           const std::string& flag = "--data", int memmap_bytes = 0);
  // `all` (TokenCorpus::open of the whole `spec`) cut into data_sources(spec)'s sources, in order,
  // over the same open shards: source s holds the shards its item expands to, which follow one
  // another in `all`. One source: `all` itself.
  static std::vector<std::shared_ptr<TokenCorpus>> split_sources(const std::shared_ptr<TokenCorpus>& all,
                                                                 const std::string& spec,
                                                                 const std::string& flag = "--data");
  explicit TokenCorpus(std::vector<std::shared_ptr<TokenFile>> shards, std::string name = "");

  int64_t size() const { return total_; }
  // Copies corpus tokens [start, start + out.size()) into out, across shard boundaries.
  void read(int64_t start, std::span<int64_t> out) const;
  const std::vector<std::shared_ptr<TokenFile>>& shards() const { return shards_; }
  // The documents its shards record (TokenFile::num_documents), in shard order: -1 when a shard
  // records none (the first such: shard_without_documents()). Corpus document i starts at token
  // document_starts(i); a shard's first document starts at the shard's first token.
  int64_t num_documents() const { return without_documents_ == nullptr ? document_offsets_.back() : -1; }
  const TokenFile* shard_without_documents() const { return without_documents_; }
  void document_starts(int64_t first, std::span<int64_t> out) const;
  // For messages: the one shard's path, or "--data <spec> (N shards)".
  const std::string& name() const { return name_; }

 private:
  std::vector<std::shared_ptr<TokenFile>> shards_;
  std::vector<int64_t> offsets_;  // offsets_[s]: the corpus index of shard s's first token; back() = total
  std::vector<int64_t> document_offsets_;  // the same for documents
  const TokenFile* without_documents_ = nullptr;
  int64_t total_ = 0;
  std::string name_;
};

}  // namespace llm
