// The measured collectives' table (memory/collective_table.h states the lookup).
#include "memory/collective_table.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace llm {
namespace {

// The bus factor's rank-dependent part (nccl-tests): the same for the three collectives up to the
// all-reduce's constant 2, which cancels in a ratio.
double bus_share(int ranks) { return ranks <= 1 ? 0.0 : static_cast<double>(ranks - 1) / ranks; }

bool known_collective(const std::string& name) {
  return name == "all_gather" || name == "reduce_scatter" || name == "all_reduce";
}

}  // namespace

std::optional<double> CollectiveTable::seconds(const std::string& collective, double bytes, int n) const {
  const auto found = rows.find(collective);
  if (found == rows.end() || found->second.empty()) return std::nullopt;
  if (n <= 1 || bytes <= 0) return 0.0;
  const std::vector<Row>& measured = found->second;
  double time = 0;
  if (bytes <= measured.front().bytes) {
    time = measured.front().seconds;
  } else if (bytes >= measured.back().bytes) {
    time = measured.back().seconds * bytes / measured.back().bytes;
  } else {
    const auto above = std::upper_bound(measured.begin(), measured.end(), bytes,
                                        [](double b, const Row& row) { return b < row.bytes; });
    const Row& hi = *above;
    const Row& lo = *(above - 1);
    const double t = std::log(bytes / lo.bytes) / std::log(hi.bytes / lo.bytes);
    time = std::exp(std::log(lo.seconds) + t * (std::log(hi.seconds) - std::log(lo.seconds)));
  }
  return time * bus_share(n) / bus_share(ranks);
}

CollectiveTable parse_collective_table(const std::string& text, const std::string& path) {
  CollectiveTable table;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  for (; std::getline(lines, line); ) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + " line " + std::to_string(number);
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {
      fail_user(where, "json", std::string("is not a JSON object (") + error.what() +
                                   "); the table is what `build/bench/communicator_bench --jsonl FILE` writes");
    }
    LLM_REQUIRE(row.is_object(), where, "json", "is not a JSON object");
    const auto field = [&](const char* key) -> const nlohmann::json& {
      LLM_REQUIRE(row.contains(key), where, key, "missing (each row needs collective, bytes, ranks and seconds)");
      return row.at(key);
    };
    const nlohmann::json& collective = field("collective");
    LLM_REQUIRE(collective.is_string() && known_collective(collective.get<std::string>()), where, "collective",
                "must be \"all_gather\", \"reduce_scatter\" or \"all_reduce\" (got " + collective.dump() + ")");
    const nlohmann::json& bytes = field("bytes");
    LLM_REQUIRE(bytes.is_number_integer() && bytes.get<int64_t>() > 0, where, "bytes",
                "must be a whole number of bytes above 0 (got " + bytes.dump() + ")");
    const nlohmann::json& ranks = field("ranks");
    LLM_REQUIRE(ranks.is_number_integer() && ranks.get<int64_t>() >= 2 && ranks.get<int64_t>() <= (1 << 20), where,
                "ranks", "must be a rank count in [2, 1048576]: a world of one moves nothing (got " + ranks.dump() + ")");
    const nlohmann::json& seconds = field("seconds");
    LLM_REQUIRE(seconds.is_number() && std::isfinite(seconds.get<double>()) && seconds.get<double>() > 0, where,
                "seconds", "must be a time above 0 (got " + seconds.dump() + ")");
    if (row.contains("wrong"))
      LLM_REQUIRE(row.at("wrong").is_number_integer() && row.at("wrong").get<int64_t>() == 0, where, "wrong",
                  "the probe counted wrong elements in this row (got " + row.at("wrong").dump() +
                      "): its time is not a collective's; mend the communicator and probe again");
    const int row_ranks = static_cast<int>(ranks.get<int64_t>());
    LLM_REQUIRE(table.ranks == 0 || table.ranks == row_ranks, where, "ranks",
                "is " + std::to_string(row_ranks) + " where the rows above are " + std::to_string(table.ranks) +
                    ": one probe (one rank count) a table");
    table.ranks = row_ranks;
    std::vector<CollectiveTable::Row>& rows = table.rows[collective.get<std::string>()];
    const double size = static_cast<double>(bytes.get<int64_t>());
    for (const CollectiveTable::Row& earlier : rows)
      LLM_REQUIRE(earlier.bytes != size, where, "bytes",
                  collective.get<std::string>() + " of " + bytes.dump() + " bytes is in the table twice");
    rows.push_back({size, seconds.get<double>()});
  }
  LLM_REQUIRE(table.ranks > 0, path, "rows", "has none: the table is what `build/bench/communicator_bench --jsonl FILE` writes");
  std::ostringstream source;
  source << path << " (" << table.ranks << " ranks:";
  for (auto& [name, rows] : table.rows) {
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
    source << " " << name << " " << static_cast<int64_t>(rows.front().bytes) << "-"
           << static_cast<int64_t>(rows.back().bytes) << " B";
  }
  source << ")";
  table.source = source.str();
  return table;
}

const CollectiveTable& load_collective_table(const std::string& path, const std::string& flag) {
  static std::mutex mutex;
  static std::map<std::string, CollectiveTable> loaded;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = loaded.find(path);
  if (found != loaded.end()) return found->second;
  std::error_code error;
  std::ifstream in(path, std::ios::binary);
  LLM_REQUIRE(std::filesystem::is_regular_file(path, error) && in.good(), kCommandLine, flag, "cannot read '" + path + "' (no such file, or not readable)");
  std::ostringstream text;
  text << in.rdbuf();
  return loaded.emplace(path, parse_collective_table(text.str(), path)).first->second;
}

}  // namespace llm
