#include "data/token_corpus.h"

#include <glob.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "common/errors.h"
#include "common/input_paths.h"
#include "common/json_file.h"
#include "common/split.h"
#include "data/token_formats.h"

namespace llm {
namespace fs = std::filesystem;
namespace {

// Where --data comes from, for messages: "command line: --data: ITEM ...".
constexpr char kSource[] = "command line";

bool has_extension(const fs::path& path, std::initializer_list<const char*> extensions) {
  const std::string extension = path.extension().string();
  return std::any_of(extensions.begin(), extensions.end(), [&](const char* e) { return extension == e; });
}


std::vector<std::string> folder_shards(const std::string& folder, const std::string& flag) {
  std::vector<std::string> files;
  std::error_code error;
  LLM_REQUIRE(!fs::exists(fs::path(folder) / kUnfinishedPrepareFile, error), kSource, flag,
              folder + " holds the shards of a `trainer prepare` that did not finish (killed, or out of space: " +
                  kUnfinishedPrepareFile + " is there, index.json is not), so some of its text is missing: run the "
                  "prepare again with --overwrite");
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, error)) {
    std::error_code entry_error;
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".") || !has_extension(entry.path(), {".tok", ".bin", ".npy"}) ||
        entry.is_directory(entry_error))
      continue;
    // A token file's name that is a fifo, a device, a link to nothing or a loop: said, not skipped
    // (a shard silently left out trains on other data).
    require_regular_file(entry.path(), kSource, flag, "a token file's name in the folder " + folder);
    files.push_back(entry.path().string());
  }
  LLM_REQUIRE(!error, kSource, flag, folder + ": cannot list the folder (" + error.message() + ")");
  std::sort(files.begin(), files.end());
  LLM_REQUIRE(!files.empty(), kSource, flag,
              folder + ": the folder holds no token file (*.tok, *.bin, *.npy directly in it); name the files, or a glob");
  return files;
}

std::vector<std::string> glob_matches(const std::string& pattern, const std::string& flag) {
  glob_t found{};
  const int status = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &found);
  std::vector<std::string> matches;
  for (size_t i = 0; status == 0 && i < found.gl_pathc; ++i) matches.push_back(found.gl_pathv[i]);
  ::globfree(&found);
  // A Megatron dataset is named once: its .idx is dropped where its .bin matched too.
  const std::set<std::string> matched(matches.begin(), matches.end());
  std::vector<std::string> files;
  for (const std::string& match : matches) {
    std::error_code error;
    const fs::path path = match;
    const bool index_of_a_match = path.extension() == ".idx" && matched.contains(fs::path(path).replace_extension(".bin").string());
    if (index_of_a_match || fs::is_directory(path, error)) continue;
    require_regular_file(path, kSource, flag, "a match of " + pattern);
    files.push_back(match);
  }
  LLM_REQUIRE(!files.empty(), kSource, flag, pattern + ": the pattern matches no file");
  return files;  // glob(3) sorts its matches
}

}  // namespace

namespace {

// One reading of a --data item, used by every reader of one (issue 44: the readers disagreed and
// their messages with them). ITEM:WEIGHT -> (ITEM, WEIGHT) when what follows the last ':' reads as a
// number (nan and inf too, so that they are refused as such, not taken for a file name) and ITEM is
// not empty; the syntax alone (weight_suffix), then the item as the user means it (weighted_item):
// an item that names an existing file or folder is that path, a colon in its name ("part:2") and all.
std::optional<std::pair<std::string, std::string>> weight_suffix(const std::string& item) {
  const size_t colon = item.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == item.size()) return std::nullopt;
  const std::string weight = item.substr(colon + 1);
  char* end = nullptr;
  std::strtod(weight.c_str(), &end);
  if (end == weight.c_str() || *end != '\0' || std::isspace(static_cast<unsigned char>(weight.front())))
    return std::nullopt;
  return std::pair{item.substr(0, colon), weight};
}

bool names_a_path(const std::string& path) {
  std::error_code error;
  return fs::exists(fs::symlink_status(path, error));
}

std::optional<std::pair<std::string, std::string>> weighted_item(const std::string& item) {
  return names_a_path(item) ? std::nullopt : weight_suffix(item);
}

// Why `item` of --data's list is none of the things it may be, when it is a thing of another kind
// (nullopt otherwise): the synthetic corpus (a source of its own) or a JSON file (a mixture file is
// the whole of --data, and no JSON file is token data).
std::optional<std::string> misplaced_item(const std::string& item, const std::string& spec, const std::string& flag) {
  if (item == "synthetic" && spec != item && !names_a_path(item))
    return "\"" + spec + "\" names \"synthetic\" in a list or a mixture: the synthetic corpus (random ids, no file) is a "
           "source of its own, given alone as " + flag + " synthetic; it is never listed or mixed with token files. "
           "Train on synthetic alone, or on files alone";
  std::error_code error;
  if (!item.ends_with(".json") || !fs::is_regular_file(item, error)) return std::nullopt;
  const std::string whole = " a mixture file is the whole of " + flag + " (" + flag + " " + item +
                            "), never an item of a list or of a mixture: add the other items to its \"sources\"";
  std::ifstream in(item);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json json = parse_json_text(text, item, /*allow_exceptions=*/false);
  if (json.is_object() && json.contains("sources")) return item + " is a mixture file, not a token file, in \"" + spec + "\":" + whole;
  if (json.is_object() && json.contains("shards"))
    return item + " is a shard folder's index.json, not a token file: name its folder (" +
           fs::path(item).parent_path().string() + ") instead";
  return item + " is a JSON file, not a token file (token files are .tok, .bin, .npy);" + whole;
}

}  // namespace

bool is_mixture_file(const std::string& spec) {
  return spec.ends_with(".json") && spec.find(',') == std::string::npos;
}

namespace {

constexpr char kMixtureExample[] =
    "a mixture file is {\"sources\": [{\"data\": \"web/*.bin\", \"weight\": 0.7}, {\"data\": [\"code/a.bin\", "
    "\"code/b/\"], \"weight\": 0.3}]}";

// One source's "data": a file, folder or glob, or a list of them; relative paths are the mixture
// file's folder's.
std::string mixture_source_spec(const nlohmann::json& data, const std::string& path, const std::string& where) {
  std::vector<std::string> items;
  if (data.is_string()) items.push_back(data.get<std::string>());
  if (data.is_array())
    for (const nlohmann::json& item : data) {
      LLM_REQUIRE(item.is_string(), path, where + ".data", "lists " + json_excerpt(item) + ", not a path; " + kMixtureExample);
      items.push_back(item.get<std::string>());
    }
  LLM_REQUIRE(data.is_string() || data.is_array(), path, where + ".data",
              "is " + json_excerpt(data) + ": give a file, folder or glob, or a list of them; " + kMixtureExample);
  LLM_REQUIRE(!items.empty(), path, where + ".data", "is an empty list; name the source's shards");
  std::string spec;
  for (const std::string& item : items) {
    LLM_REQUIRE(!is_mixture_file(item), path, where + ".data", "\"" + item + "\" is a JSON file: a mixture names shards, not other mixtures");
    const fs::path file = item;
    const std::string resolved = file.is_absolute() ? item : (fs::path(path).parent_path() / file).string();
    LLM_REQUIRE(!item.empty() && item.find(',') == std::string::npos && (!weight_suffix(item) || names_a_path(resolved)),
                path, where + ".data",
                "\"" + item + "\": give one file, folder or glob per entry (no commas, no :WEIGHT suffix: the "
                "source's weight is its \"weight\"; a file whose name has a colon is named as it is once it exists)");
    spec += (spec.empty() ? "" : ",") + resolved;
  }
  return spec;
}

std::vector<DataSource> read_mixture_file(const std::string& path, const std::string& flag) {
  const nlohmann::json mixture = read_json_file(path, std::string("give ") + flag + " shards, or " + kMixtureExample);
  LLM_REQUIRE(mixture.is_object() && mixture.contains("sources") && mixture.at("sources").is_array(), path, "sources",
              std::string("the file has no \"sources\" list; ") + kMixtureExample);
  for (const auto& [key, value] : mixture.items())
    LLM_REQUIRE(key == "sources", path, key, std::string("is not a mixture file's key (it has \"sources\" only); ") + kMixtureExample);
  LLM_REQUIRE(!mixture.at("sources").empty(), path, "sources", std::string("is empty; ") + kMixtureExample);
  std::vector<DataSource> sources;
  for (const nlohmann::json& entry : mixture.at("sources")) {
    const std::string where = "sources[" + std::to_string(sources.size()) + "]";
    LLM_REQUIRE(entry.is_object() && entry.contains("data") && entry.contains("weight"), path, where,
                "is " + json_excerpt(entry) + ": each source is {\"data\": ..., \"weight\": ...}; " + kMixtureExample);
    for (const auto& [key, value] : entry.items())
      LLM_REQUIRE(key == "data" || key == "weight", path, where + "." + key,
                  "is not a source's key (it has \"data\" and \"weight\")");
    const nlohmann::json& weight = entry.at("weight");
    LLM_REQUIRE(weight.is_number() && std::isfinite(weight.get<double>()) && weight.get<double>() > 0, path,
                where + ".weight", "is " + json_excerpt(weight) + ", not a positive number");
    sources.push_back({mixture_source_spec(entry.at("data"), path, where), weight.get<double>()});
  }
  return sources;
}

}  // namespace

bool is_mixture(const std::string& spec) {
  if (is_mixture_file(spec)) return true;
  for (const std::string& item : split_list(spec))
    if (weighted_item(item)) return true;
  return false;
}

std::vector<DataSource> data_sources(const std::string& spec, const std::string& flag) {
  if (is_mixture_file(spec)) return read_mixture_file(spec, flag);
  if (!is_mixture(spec)) return {{spec, 1.0}};
  std::vector<DataSource> sources;
  for (const std::string& item : split_list(spec)) {
    const auto weighted = weighted_item(item);
    LLM_REQUIRE(weighted.has_value(), kSource, flag,
                "\"" + item + "\" has no weight while other items have one: give every item a weight (a mixture, "
                "e.g. --data web/*.bin:0.7,code/:0.3) or none (one corpus)" +
                    (weight_suffix(item) ? std::string(" (") + item + " is an existing file, the colon part of its "
                                           "name: give its weight after it, " + item + ":0.5)"
                                         : std::string()));
    const double weight = std::strtod(weighted->second.c_str(), nullptr);  // weight_suffix read it whole
    LLM_REQUIRE(std::isfinite(weight), kSource, flag,
                "\"" + item + "\": the weight " + weighted->second + " is not a finite number; give each item a "
                "positive, finite weight (its share is its weight over their sum)");
    LLM_REQUIRE(weight > 0, kSource, flag, "\"" + item + "\": the weight " + weighted->second + " is not a positive number");
    sources.push_back({weighted->first, weight});
  }
  return sources;
}

namespace {

// For a path that is not there: how --data read the item it came from, when that had a colon.
std::string read_as_weighted(const std::string& path, const std::string& spec, const std::string& flag) {
  for (const std::string& given : split_list(spec)) {
    const auto weighted = weight_suffix(given);
    if (!weighted || weighted->first != path) continue;
    return ". \"" + given + "\" was read as " + path + " with the mixture weight " + weighted->second + " (" + flag +
           " ITEM:WEIGHT,...), as no file or folder " + given + " exists either; a name with a colon is read whole " +
           "when it exists (check the path), and in a mixture takes its weight after it (" + given + ":0.5)";
  }
  return "";
}

}  // namespace

std::vector<std::string> expand_data_spec(const std::string& spec, const std::string& flag) {
  std::vector<std::string> files;
  std::vector<std::string> items;
  for (const DataSource& source : data_sources(spec, flag))
    for (const std::string& item : split_list(source.spec)) items.push_back(item);
  for (const std::string& item : items) {
    LLM_REQUIRE(!item.empty(), kSource, flag,
                "\"" + spec + "\" has an empty item in its comma-separated list; give files, folders or glob patterns, e.g. "
                "--data shards/train_*.bin,extra.npy");
    if (const std::optional<std::string> why = misplaced_item(item, spec, flag)) fail_user(kSource, flag, *why);
    std::error_code error;
    std::vector<std::string> expanded;
    if (fs::is_directory(item, error))
      expanded = folder_shards(item, flag);
    else if (fs::exists(item, error) || fs::is_symlink(item, error)) {
      require_regular_file(item, kSource, flag, "a token file");  // a fifo would block the reader
      expanded = {item};  // a file, even one whose name has * ? or [ in it
    }
    else if (item.find_first_of("*?[") != std::string::npos)
      expanded = glob_matches(item, flag);
    else
      fail_user(kSource, flag,
                "\"" + item + "\" is not a file, a folder or a glob pattern's match; expected token files (made by "
                "`trainer prepare`, llm.c .bin, Megatron .bin/.idx, NumPy .npy), folders of them or glob patterns (or "
                "synthetic, alone)" + read_as_weighted(item, spec, flag));
    files.insert(files.end(), expanded.begin(), expanded.end());
  }
  std::set<std::string> seen;
  for (const std::string& file : files) {
    std::error_code error;
    const std::string dataset = megatron_pair(file).first.empty() ? file : megatron_pair(file).first;  // .bin or .idx: one
    const std::string canonical = fs::weakly_canonical(dataset, error).string();
    LLM_REQUIRE(seen.insert(error ? dataset : canonical).second, kSource, flag,
                file + " is named twice (each shard is read once per epoch): drop the repeated item");
  }
  return files;
}

bool is_prepared_shard_name(const std::string& name) {
  return name.size() == 16 && name.starts_with("shard_") &&
         std::all_of(name.begin() + 6, name.begin() + 12, [](unsigned char c) { return std::isdigit(c) != 0; }) &&
         (name.ends_with(".tok") || name.ends_with(".bin") || name.ends_with(".idx"));
}

std::string absolute_data_spec(const std::string& spec) {
  std::string absolute;
  for (const std::string& item : split_list(spec)) {
    const auto weighted = weighted_item(item);
    const std::string path = weighted ? weighted->first : item;
    absolute += (absolute.empty() ? "" : ",") + (path.empty() ? path : fs::absolute(path).string()) +
                (weighted ? ":" + weighted->second : "");
  }
  return absolute;
}

namespace {

// Each shard keeps its descriptor open for the run's reads: 1,000 shards pass the usual soft limit of
// 1,024 open files, which is raised toward the hard limit as far as the shards need, beside the files
// the process has open already (--data's shards when --eval_data is opened: 12,000 of each once met
// "Too many open files" on a shard of --eval_data, with advice about --data).
void allow_open_files(size_t shards, const std::string& flag) {
  constexpr rlim_t kSpare = 256;   // what is raised for the process's other files: logs, sockets, checkpoints
  constexpr rlim_t kAtLeast = 32;  // what they need at the least
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  std::error_code error;
  rlim_t open_now = 0;
  for (auto entry = fs::directory_iterator("/proc/self/fd", error); !error && entry != fs::directory_iterator();
       entry.increment(error))
    ++open_now;
  const rlim_t wanted = open_now + static_cast<rlim_t>(shards) + kSpare;
  if (wanted > limit.rlim_cur) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, limit.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  LLM_REQUIRE(open_now + static_cast<rlim_t>(shards) + kAtLeast <= limit.rlim_cur, kSource, flag,
              "names " + std::to_string(shards) + " shards, each read through a file kept open, beside the " +
                  std::to_string(open_now) + " files this process has open already (--data's shards among them "
                  "when this is --eval_data), but it may open at most " + std::to_string(limit.rlim_cur) +
                  " files (ulimit -n; its hard limit, ulimit -Hn, is " +
                  (limit.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(limit.rlim_max)) +
                  "): raise the hard limit (ulimit -Hn as root, or the job's limits) to at least " +
                  std::to_string(open_now + shards + kSpare) + ", or join shards (trainer prepare --shard_tokens)");
}

// For messages: the one shard's path, or "--data SPEC (N shards)".
std::string corpus_name(const std::vector<std::shared_ptr<TokenFile>>& shards, const std::string& spec,
                        const std::string& flag) {
  return shards.size() == 1 ? shards.front()->path() : flag + " " + spec + " (" + std::to_string(shards.size()) + " shards)";
}

}  // namespace

std::shared_ptr<TokenCorpus> TokenCorpus::open(const std::string& spec, int64_t model_vocab_size,
                                               const std::string& flag, int memmap_bytes) {
  const std::vector<std::string> files = expand_data_spec(spec, flag);
  allow_open_files(files.size(), flag);
  std::vector<std::shared_ptr<TokenFile>> shards;
  for (const std::string& file : files) shards.push_back(TokenFile::open(file, model_vocab_size, memmap_bytes, flag));
  const std::string name = corpus_name(shards, spec, flag);
  return std::make_shared<TokenCorpus>(std::move(shards), name);
}

std::vector<std::shared_ptr<TokenCorpus>> TokenCorpus::split_sources(const std::shared_ptr<TokenCorpus>& all,
                                                                     const std::string& spec, const std::string& flag) {
  const std::vector<DataSource> sources = data_sources(spec, flag);
  if (sources.size() == 1) return {all};
  std::vector<std::shared_ptr<TokenCorpus>> corpora;
  auto next = all->shards().begin();
  for (const DataSource& source : sources) {
    const auto count = static_cast<std::ptrdiff_t>(expand_data_spec(source.spec, flag).size());
    LLM_REQUIRE(count <= all->shards().end() - next, kSource, flag, "the sources name more shards than " + spec);
    std::vector<std::shared_ptr<TokenFile>> shards(next, next + count);
    next += count;
    const std::string name = corpus_name(shards, source.spec, flag);
    corpora.push_back(std::make_shared<TokenCorpus>(std::move(shards), name));
  }
  return corpora;
}

TokenCorpus::TokenCorpus(std::vector<std::shared_ptr<TokenFile>> shards, std::string name)
    : shards_(std::move(shards)), name_(std::move(name)) {
  offsets_.reserve(shards_.size() + 1);
  offsets_.push_back(0);
  for (const std::shared_ptr<TokenFile>& shard : shards_) {
    int64_t next = 0;
    LLM_REQUIRE(!__builtin_add_overflow(offsets_.back(), shard->size(), &next), shard->path(), "size",
                "the shards' tokens add up past 2^63: the headers are damaged");
    offsets_.push_back(next);
  }
  total_ = offsets_.back();
  if (name_.empty() && shards_.size() == 1) name_ = shards_.front()->path();
  document_offsets_.push_back(0);
  for (const std::shared_ptr<TokenFile>& shard : shards_) {
    if (shard->num_documents() < 0 && without_documents_ == nullptr) without_documents_ = shard.get();
    document_offsets_.push_back(document_offsets_.back() + std::max<int64_t>(0, shard->num_documents()));
  }
}

void TokenCorpus::document_starts(int64_t first, std::span<int64_t> out) const {
  const auto count = static_cast<int64_t>(out.size());
  const int64_t documents = std::max<int64_t>(0, num_documents());
  if (first < 0 || count > documents || first > documents - count)
    throw std::out_of_range(name_ + ": documents [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") outside [0, " + std::to_string(documents) + ")");
  size_t shard = static_cast<size_t>(std::upper_bound(document_offsets_.begin(), document_offsets_.end(), first) -
                                     document_offsets_.begin()) - 1;
  int64_t done = 0;
  while (done < count) {
    const int64_t at = first + done - document_offsets_[shard];
    const int64_t take = std::max<int64_t>(0, std::min(count - done, shards_[shard]->num_documents() - at));
    if (take > 0) {
      const std::span<int64_t> piece = out.subspan(static_cast<size_t>(done), static_cast<size_t>(take));
      shards_[shard]->document_starts(at, piece);
      for (int64_t& start : piece) start += offsets_[shard];
    }
    done += take;
    ++shard;
  }
}

void TokenCorpus::read(int64_t start, std::span<int64_t> out) const {
  const int64_t count = static_cast<int64_t>(out.size());
  if (start < 0 || count > total_ || start > total_ - count)
    throw std::out_of_range(name_ + ": tokens [" + std::to_string(start) + ", " + std::to_string(start + count) +
                            ") outside [0, " + std::to_string(total_) + ")");
  // The shard holding `start`: the last whose first token is at or before it.
  size_t shard = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), start) - offsets_.begin()) - 1;
  int64_t done = 0;
  while (done < count) {
    const int64_t at = start + done - offsets_[shard];
    const int64_t take = std::max<int64_t>(0, std::min(count - done, shards_[shard]->size() - at));
    if (take > 0) shards_[shard]->read(at, out.subspan(static_cast<size_t>(done), static_cast<size_t>(take)));
    done += take;
    ++shard;
  }
}

}  // namespace llm
