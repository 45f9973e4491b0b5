#include "common/collective_log.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <map>
#include <mutex>

namespace llm {
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Numbers {
  std::vector<int> ranks;
  int64_t begun = 0, ended = 0;
};

struct Ring {
  std::mutex mutex;
  std::array<CollectiveEntry, CollectiveLog::kEntries> entries;
  size_t written = 0;  // entries ever begun; slot = index % kEntries
  std::map<std::string, Numbers> numbers;  // by communicator
};

Ring& ring() {
  static Ring* shared = new Ring();  // never destroyed: read by the watchdog's thread until _exit
  return *shared;
}

std::atomic<int64_t> current_unit{-1};

}  // namespace

size_t CollectiveLog::begin(const std::string& communicator, const std::vector<int>& ranks, const char* kind,
                            int64_t bytes) {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mutex);
  const size_t slot = r.written++ % kEntries;
  CollectiveEntry& entry = r.entries[slot];
  entry.communicator = communicator;
  entry.kind = kind;
  Numbers& numbers = r.numbers[communicator];
  if (numbers.ranks.empty()) numbers.ranks = ranks;
  entry.sequence = ++numbers.begun;
  entry.unit = current_unit.load(std::memory_order_relaxed);
  entry.bytes = bytes;
  entry.started_s = wall_seconds();
  entry.ended_s = 0;
  return slot;
}

void CollectiveLog::end(size_t slot) {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mutex);
  CollectiveEntry& entry = r.entries[slot % kEntries];
  entry.ended_s = wall_seconds();
  r.numbers[entry.communicator].ended = entry.sequence;
}

void CollectiveLog::set_unit(int64_t unit) { current_unit.store(unit, std::memory_order_relaxed); }

std::vector<CollectiveEntry> CollectiveLog::last(size_t count) {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mutex);
  const size_t available = std::min({count, r.written, kEntries});
  std::vector<CollectiveEntry> entries;
  for (size_t i = r.written - available; i < r.written; ++i) entries.push_back(r.entries[i % kEntries]);
  return entries;
}

nlohmann::json CollectiveLog::heartbeat_fields(size_t count) {
  nlohmann::json collectives = nlohmann::json::array();
  for (const CollectiveEntry& entry : last(count))
    collectives.push_back({{"communicator", entry.communicator}, {"kind", entry.kind}, {"sequence", entry.sequence},
                           {"unit", entry.unit}, {"bytes", entry.bytes}, {"started_unix_s", entry.started_s},
                           {"ended_unix_s", entry.ended_s}});
  nlohmann::json communicators = nlohmann::json::object();
  {
    Ring& r = ring();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& [label, numbers] : r.numbers)
      communicators[label] = {{"ranks", numbers.ranks}, {"begun", numbers.begun}, {"ended", numbers.ended}};
  }
  return {{"collectives", collectives}, {"communicators", communicators}};
}

std::vector<CollectiveEntry> collectives_from_json(const nlohmann::json& list) {
  std::vector<CollectiveEntry> entries;
  if (!list.is_array()) return entries;
  for (const nlohmann::json& item : list) {
    if (!item.is_object()) continue;
    try {
      CollectiveEntry entry;
      entry.communicator = item.at("communicator").get<std::string>();
      entry.kind = item.at("kind").get<std::string>();
      entry.sequence = item.at("sequence").get<int64_t>();
      entry.unit = item.value("unit", int64_t{-1});
      entry.bytes = item.value("bytes", int64_t{0});
      entry.started_s = item.value("started_unix_s", 0.0);
      entry.ended_s = item.value("ended_unix_s", 0.0);
      entries.push_back(entry);
    } catch (const nlohmann::json::exception&) {
      // a heartbeat written by another build, or cut: that entry is not said
    }
  }
  return entries;
}

namespace {

std::string human(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 20))
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  return text;
}

}  // namespace

std::string collectives_in_flight(const std::vector<nlohmann::json>& fields, double now) {
  std::string said, outside;
  for (size_t r = 0; r < fields.size(); ++r) {
    if (!fields[r].is_object()) continue;
    // The rank's last entry still in flight.
    const std::vector<CollectiveEntry> entries = collectives_from_json(fields[r].value("collectives", nlohmann::json()));
    const auto in = std::find_if(entries.rbegin(), entries.rend(), [](const CollectiveEntry& e) { return e.ended_s == 0; });
    if (in == entries.rend()) {
      // Outside every collective: computing, or held back before its next one (the rank the others wait for).
      if (entries.empty()) continue;
      const CollectiveEntry& last = entries.back();
      char ago[32];
      std::snprintf(ago, sizeof(ago), "%.0f s", now - last.ended_s);
      outside += (outside.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " is in none (its last: " +
                 last.kind + " #" + std::to_string(last.sequence) + " on " + last.communicator + ", ended " + ago + " ago)";
      continue;
    }
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.0f s", now - in->started_s);
    said += (said.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " is in " + in->kind + " #" +
            std::to_string(in->sequence) + " on " + in->communicator +
            (in->unit >= 0 ? " (unit " + std::to_string(in->unit) + ", " : " (") + human(in->bytes) + ", for " + seconds + ")";
    // Its communicator's ranks whose heartbeat says they never began that collective there.
    const nlohmann::json communicators = fields[r].value("communicators", nlohmann::json::object());
    const nlohmann::json ranks = communicators.is_object() && communicators.contains(in->communicator)
                                     ? communicators.at(in->communicator).value("ranks", nlohmann::json::array())
                                     : nlohmann::json::array();
    std::string missing;
    for (const nlohmann::json& member : ranks) {
      if (!member.is_number_integer()) continue;
      const int other = member.get<int>();
      if (other < 0 || static_cast<size_t>(other) >= fields.size() || !fields[other].is_object()) continue;
      const nlohmann::json theirs = fields[other].value("communicators", nlohmann::json::object());
      const int64_t begun = theirs.is_object() && theirs.contains(in->communicator)
                                ? theirs.at(in->communicator).value("begun", int64_t{0})
                                : int64_t{0};
      if (begun < in->sequence)
        missing += (missing.empty() ? "" : ", ") + std::string("rank ") + std::to_string(other) + " (its last there #" +
                   std::to_string(begun) + ")";
    }
    if (!missing.empty()) said += ", which " + missing + " never reached";
  }
  if (said.empty()) return "";  // no rank waits in a collective: nothing to say of who is missing
  return outside.empty() ? said : said + "; " + outside;
}

}  // namespace llm
