#include "data/corpus_identity.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "common/crc32c.h"
#include "common/errors.h"
#include "data/token_formats.h"
#include "common/json_file.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

constexpr size_t kHeadBytes = 4096;

// The CRC-32C of a file's first kHeadBytes bytes, continuing `crc`; adds the file's size to `bytes`.
uint32_t head_crc(const std::string& path, uint32_t crc, uint64_t* bytes) {
  std::error_code error;
  const uint64_t size = fs::file_size(path, error);
  LLM_REQUIRE(!error, path, "", "cannot read the file's size (" + error.message() + ")");
  std::ifstream in(path, std::ios::binary);
  std::string head(static_cast<size_t>(std::min<uint64_t>(size, kHeadBytes)), '\0');
  LLM_REQUIRE(in.read(head.data(), static_cast<std::streamsize>(head.size())), path, "",
              "cannot read the file's first bytes");
  *bytes += size;
  return crc32c(head.data(), head.size(), crc);
}

// The CRC-32C of kSampledBlocks blocks of kHeadBytes spread evenly through the file, the first and the
// last among them (the whole file when it is no longer than that), continuing `crc`: a same-size
// change past the first 4 KiB (a shard made again in place, an edit) is seen where it touches one.
// 64 KiB read a shard, whatever its size, so a resume over 12,000 shards reads under a GB.
constexpr uint64_t kSampledBlocks = 16;
uint32_t sampled_crc(const std::string& path, uint32_t crc) {
  std::error_code error;
  const uint64_t size = fs::file_size(path, error);
  LLM_REQUIRE(!error, path, "", "cannot read the file's size (" + error.message() + ")");
  std::ifstream in(path, std::ios::binary);
  std::string block;
  const uint64_t whole = kSampledBlocks * kHeadBytes;
  for (uint64_t k = 0; k < (size <= whole ? 1 : kSampledBlocks); ++k) {
    const uint64_t offset = size <= whole ? 0 : k * (size - kHeadBytes) / (kSampledBlocks - 1);
    block.resize(static_cast<size_t>(size <= whole ? size : kHeadBytes));
    LLM_REQUIRE(in.seekg(static_cast<std::streamoff>(offset)) &&
                    in.read(block.data(), static_cast<std::streamsize>(block.size())),
                path, "", "cannot read the file's bytes at offset " + std::to_string(offset));
    crc = crc32c(block.data(), block.size(), crc);
  }
  return crc;
}

std::vector<std::string> files_of(const nlohmann::json& identity) {
  std::vector<std::string> files;
  for (const nlohmann::json& shard : identity.value("shards", nlohmann::json::array()))
    files.push_back(shard.value("file", std::string()));
  return files;
}

// Up to three names in `a` not in `b`, "" when none.
std::string missing_from(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  const std::set<std::string> in_b(b.begin(), b.end());
  std::string names;
  int listed = 0, more = 0;
  for (const std::string& name : a) {
    if (in_b.count(name)) continue;
    if (listed < 3)
      names += (listed++ ? ", " : "") + name;
    else
      ++more;
  }
  return more ? names + " and " + std::to_string(more) + " more" : names;
}

}  // namespace

nlohmann::json corpus_identity(const TokenCorpus& corpus) {
  nlohmann::json shards = nlohmann::json::array();
  std::set<std::string> folders;
  for (const std::shared_ptr<TokenFile>& shard : corpus.shards()) {
    uint64_t bytes = 0;
    uint32_t crc = 0, sampled = 0;
    const auto [bin, idx] = megatron_pair(shard->path());
    if (shard->format() == TokenFormat::megatron && !bin.empty()) {
      crc = head_crc(idx, head_crc(bin, 0, &bytes), &bytes);
      sampled = sampled_crc(idx, sampled_crc(bin, 0));
    } else {
      crc = head_crc(shard->path(), 0, &bytes);
      sampled = sampled_crc(shard->path(), 0);
    }
    const fs::path path = fs::absolute(bin.empty() ? shard->path() : bin);
    folders.insert(path.parent_path().string());
    shards.push_back({{"file", path.filename().string()},
                      {"format", to_string(shard->format())},
                      {"tokens", shard->size()},
                      {"bytes", bytes},
                      {"head_crc32c", crc_text(crc)},
                      {"sampled_crc32c", crc_text(sampled)}});
  }
  return {{"tokens", corpus.size()}, {"shards", shards}, {"folders", folders}};
}

nlohmann::json mixture_identity(const std::string& spec) {
  nlohmann::json sources = nlohmann::json::array();
  for (const DataSource& source : data_sources(spec))
    sources.push_back({{"weight", source.weight}, {"shards", expand_data_spec(source.spec).size()}});
  return sources;
}

nlohmann::json run_data_identity(const TokenCorpus& corpus, const std::string& spec, const std::string& window_start) {
  nlohmann::json identity = corpus_identity(corpus);
  if (is_mixture(spec)) identity["mixture"] = mixture_identity(spec);
  if (window_start != "anywhere") identity["window_start"] = window_start;
  return identity;
}

std::string identity_difference(const nlohmann::json& then, const nlohmann::json& now) {
  if (!then.is_object() || !then.contains("shards")) return "";
  const std::string windows_then = then.value("window_start", "anywhere"), windows_now = now.value("window_start", "anywhere");
  if (windows_then != windows_now)
    return "its windows started " + std::string(windows_then == "document" ? "at documents" : "anywhere") + ", now " +
           (windows_now == "document" ? "at documents" : "anywhere") + " (--window_start: another set of windows)";
  const nlohmann::json no_mixture = nlohmann::json::array();
  const nlohmann::json mixture_then = then.value("mixture", no_mixture), mixture_now = now.value("mixture", no_mixture);
  if (mixture_then != mixture_now) {
    auto words = [](const nlohmann::json& mixture) {
      if (mixture.empty()) return std::string("one corpus");
      std::string text;
      for (const nlohmann::json& source : mixture)
        text += (text.empty() ? "" : ", ") + json_excerpt(source.value("shards", nlohmann::json())) + " shard(s) at weight " +
                json_excerpt(source.value("weight", nlohmann::json()));
      return text;
    };
    return "its sources were " + words(mixture_then) + "; now " + words(mixture_now);
  }
  const nlohmann::json& a = then.at("shards");
  const nlohmann::json& b = now.value("shards", nlohmann::json::array());
  if (a.size() != b.size()) {
    const std::string added = missing_from(files_of(now), files_of(then));
    const std::string removed = missing_from(files_of(then), files_of(now));
    return std::to_string(a.size()) + " shard(s) then, " + std::to_string(b.size()) + " now" +
           (added.empty() && removed.empty()
                ? std::string()
                : " (" + (added.empty() ? std::string() : "added: " + added) +
                      (!added.empty() && !removed.empty() ? "; " : "") +
                      (removed.empty() ? std::string() : "missing: " + removed) + ")");
  }
  for (size_t s = 0; s < a.size(); ++s) {
    const std::string where = "shard " + std::to_string(s + 1) + " of " + std::to_string(a.size()) + ", ";
    const std::string file = a[s].value("file", std::string());
    if (file != b[s].value("file", std::string()))
      return where + file + " then, " + b[s].value("file", std::string()) + " now (another file, or another order)";
    for (const char* key : {"format", "tokens", "bytes"})
      if (a[s].value(key, nlohmann::json()) != b[s].value(key, nlohmann::json()))
        return where + file + ": " + json_excerpt(a[s].value(key, nlohmann::json())) + " " + (std::string(key) == "format" ? "format" : key) +
               " then, " + json_excerpt(b[s].value(key, nlohmann::json())) + " now";
    if (a[s].value("head_crc32c", std::string()) != b[s].value("head_crc32c", std::string()))
      return where + file + ": the same size, but its first 4 KiB differ (made again?)";
    // (a checkpoint saved before the sampled blocks were recorded has no such key: not compared)
    if (a[s].contains("sampled_crc32c") && b[s].contains("sampled_crc32c") &&
        a[s].at("sampled_crc32c") != b[s].at("sampled_crc32c"))
      return where + file + ": the same size and first 4 KiB, but bytes further in differ (16 blocks of 4 KiB spread "
             "through it are compared: made again, or edited?)";
  }
  return "";
}

}  // namespace llm
