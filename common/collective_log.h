// Which collective each rank is in, and which it did last: a short ring of each rank's last
// collectives (kind, communicator, unit, bytes, sequence number, start and end), for the stall
// watchdog's message (common/watchdog.h) and a person reading a heartbeat.
//
// Why: the reports users of multi-node trainers file most are a collective timeout that names
// nothing and a slow rank nobody can find. The ranks of a communicator issue its collectives in the
// same order, so each communicator numbers them (1, 2, ...): when a job stalls, the rank still in
// collective #812 of "across" and the rank whose last one there was #811 say, together, who never
// reached it. The communicators (sharding/communicator.h) write here; the watchdog's thread reads,
// so one mutex guards the ring (a collective takes microseconds at least; the lock, nanoseconds).
// Lives in common/ because the watchdog does, and sharding/ includes common/, not the reverse.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llm {

struct CollectiveEntry {
  std::string communicator;  // its label: "world", "group", "across", ...
  std::string kind;          // "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"
  int64_t sequence = 0;      // this communicator's collective number, from 1
  int64_t unit = -1;         // the unit being worked on (CollectiveLog::set_unit), -1: none
  int64_t bytes = 0;         // what this rank sends (sharding/communicator.h: LinkTraffic)
  double started_s = 0;      // wall clock (seconds since the epoch)
  double ended_s = 0;        // 0: still in it
};

class CollectiveLog {
 public:
  static constexpr size_t kEntries = 32;
  // A collective begins on the communicator named `communicator` ("across (ranks 1, 3)": its label and
  // its ranks in the world, `ranks`): its entry, numbered per communicator, goes into the ring;
  // returns its slot.
  static size_t begin(const std::string& communicator, const std::vector<int>& ranks, const char* kind, int64_t bytes);
  static void end(size_t slot);
  // The unit the next collectives belong to (the sharded model's current unit; -1: none).
  static void set_unit(int64_t unit);
  // set_unit(unit) for the scope's life, then -1 (also when the work in it throws).
  class UnitScope {
   public:
    explicit UnitScope(int64_t unit) { set_unit(unit); }
    ~UnitScope() { set_unit(-1); }
    UnitScope(const UnitScope&) = delete;
    UnitScope& operator=(const UnitScope&) = delete;
  };
  // The last `count` entries, oldest first, and each communicator's ranks and last begun and last
  // ended sequence numbers, as the heartbeat writes them: {"collectives": [...], "communicators":
  // {NAME: {"ranks": [...], "begun": B, "ended": E}}}.
  static nlohmann::json heartbeat_fields(size_t count = 8);
  static std::vector<CollectiveEntry> last(size_t count);
};

// The entries of a heartbeat's "collectives" (as heartbeat_fields writes them), for the watchdog's
// reader; malformed entries are skipped.
std::vector<CollectiveEntry> collectives_from_json(const nlohmann::json& list);

// What the ranks' heartbeats say of their collectives, for a stall's message: per rank, the collective
// it is in (kind, number, communicator, unit, bytes, for how long) and the ranks of that communicator
// that never reached it (their last begun there is earlier), then the ranks in none with their last
// (the one held back before its next collective is among them); "" when no rank is in one. `fields`:
// each rank's heartbeat_fields (null: no heartbeat), `now`: the wall clock.
std::string collectives_in_flight(const std::vector<nlohmann::json>& fields, double now);

}  // namespace llm
