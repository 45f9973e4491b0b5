#include "common/watchdog.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/collective_log.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/output_files.h"
#include "common/json_file.h"

namespace llm {
namespace {
namespace fs = std::filesystem;

constexpr double kIntervalSeconds = kHeartbeatIntervalSeconds;

fs::path heartbeat_path(const std::string& run_dir, int rank) {
  return fs::path(run_dir) / ("heartbeat.rank" + std::to_string(rank) + ".json");
}

double wall_seconds() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f s", seconds);
  return text;
}

struct Heartbeat {
  bool found = false;
  int64_t step = 0;
  std::string phase;
  int unit = -1;
  double idle_seconds = 0;  // since the rank's last progress, when written
  double written = 0;       // wall clock
  nlohmann::json fields;    // the whole heartbeat (its collectives: common/collective_log.h)
};

Heartbeat read_heartbeat(const std::string& run_dir, int rank) {
  Heartbeat beat;
  std::ifstream in(heartbeat_path(run_dir, rank));
  if (!in.good()) return beat;
  try {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const nlohmann::json fields = parse_json_text(text, heartbeat_path(run_dir, rank).string());
    beat.step = fields.at("step").get<int64_t>();
    beat.phase = fields.at("phase").get<std::string>();
    beat.unit = fields.at("unit").get<int>();
    beat.idle_seconds = fields.at("idle_s").get<double>();
    beat.written = fields.at("written_unix_s").get<double>();
    beat.fields = fields;
    beat.found = true;
  } catch (const std::exception&) {
    // A file being replaced, or not ours: no heartbeat.
  }
  return beat;
}

std::string where(const Heartbeat& beat) {
  std::string text = "step " + std::to_string(beat.step) + " " + beat.phase;
  if (beat.unit >= 0) text += " (unit " + std::to_string(beat.unit) + ")";
  return text;
}

// The watchdog with a timeout that runs in this process, if any (mark, mark_alive).
std::atomic<StallWatchdog*> running{nullptr};

}  // namespace

void StallWatchdog::mark(const char* phase) {
  if (StallWatchdog* watchdog = running.load(std::memory_order_acquire))
    watchdog->progress(phase);
  else
    stop_here_if_asked(process_identity().rank, phase);
}

void StallWatchdog::stop_here_if_asked(int rank, const char* phase) {
  static const std::string asked = [] {
    const char* text = std::getenv("LLM_DEBUG_STOP_AT");
    return text == nullptr ? std::string() : std::string(text);
  }();
  if (asked.empty()) return;
  const size_t colon = asked.find(':');
  if (colon == std::string::npos || asked.substr(0, colon) != std::to_string(rank)) return;
  if (std::string(phase).find(asked.substr(colon + 1)) == std::string::npos) return;
  static std::atomic<bool> stopped_once{false};  // a phase marked per unit stops the first time only
  if (stopped_once.exchange(true)) return;
  log::info("LLM_DEBUG_STOP_AT: rank {} stops itself at \"{}\"", rank, phase);
  std::fflush(nullptr);
  // Long enough for the heartbeat thread to write the new phase, as it would before a real stop.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::raise(SIGSTOP);
}

void StallWatchdog::mark_alive() {
  if (StallWatchdog* watchdog = running.load(std::memory_order_acquire)) watchdog->keep_alive();
}

StallWatchdog::StallWatchdog(std::string run_dir, int rank, int world_size, double timeout_seconds,
                             std::vector<std::string> hosts)
    : run_dir_(std::move(run_dir)),
      rank_(rank),
      world_size_(world_size),
      hosts_(std::move(hosts)),
      timeout_seconds_(timeout_seconds) {
  last_progress_ns_.store(now_ns());
  if (timeout_seconds_ <= 0) return;
  write_heartbeat(0);  // at once: a rank stopped within the first interval still has a file to go stale
  thread_ = std::thread([this] { watch(); });
  running.store(this, std::memory_order_release);
}

StallWatchdog::~StallWatchdog() {
  StallWatchdog* self = this;
  running.compare_exchange_strong(self, nullptr, std::memory_order_acq_rel);
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  std::error_code ignored;
  fs::remove(heartbeat_path(run_dir_, rank_), ignored);
}

void StallWatchdog::write_heartbeat(double idle_seconds) {
  nlohmann::json fields = {{"rank", rank_},
                           {"step", step_.load(std::memory_order_relaxed)},
                           {"phase", phase_.load(std::memory_order_relaxed)},
                           {"unit", unit_.load(std::memory_order_relaxed)},
                           {"idle_s", idle_seconds},
                           {"written_unix_s", wall_seconds()}};
  fields.update(CollectiveLog::heartbeat_fields());  // its last collectives, and the one it is in
  const fs::path path = heartbeat_path(run_dir_, rank_);
  try {
    write_file_atomically(path, fields.dump() + "\n", {.durable = false});
  } catch (const UserError&) {
    // a full disk (or a link left under its name) must not end the run: the heartbeat is only a diagnosis
  }
}

void StallWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  int waiting_for = -1;  // the progressing rank this one said it waits for
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::duration<double>(kIntervalSeconds), [this] { return stopping_; });
    if (stopping_) break;
    const double idle = 1e-9 * static_cast<double>(now_ns() - last_progress_ns_.load(std::memory_order_acquire));
    write_heartbeat(idle);
    if (idle < timeout_seconds_) {
      waiting_for = -1;
      continue;
    }
    // Give the others one interval to write theirs, then diagnose and end this rank.
    wake_.wait_for(lock, std::chrono::duration<double>(kIntervalSeconds), [this] { return stopping_; });
    if (stopping_) break;
    // A live rank rewrites its heartbeat every interval; one older than this is not live. Longer
    // with longer timeouts, so that a loaded host's late writes are not taken for a stopped rank.
    const double stale_seconds = std::max(2.5 * kIntervalSeconds, std::min(30.0, timeout_seconds_ / 4));
    // Another rank still progressing (writing or reading a checkpoint this rank waits for): no stall.
    if (const int moving = progressing_rank(run_dir_, rank_, world_size_, stale_seconds, timeout_seconds_);
        moving >= 0) {
      if (moving != waiting_for)
        log::info("no progress on this rank for {}, but rank {} is progressing ({}): waiting for it "
                  "(--collective_timeout {} counts from the job's last progress)",
                  seconds_text(idle), moving, where(read_heartbeat(run_dir_, moving)), timeout_seconds_);
      waiting_for = moving;
      continue;
    }
    const std::string diagnosis = diagnose(run_dir_, rank_, world_size_, stale_seconds, hosts_);
    Heartbeat here;
    here.step = step_.load(std::memory_order_relaxed);
    here.phase = phase_.load(std::memory_order_relaxed);
    here.unit = unit_.load(std::memory_order_relaxed);
    log::error("stalled: no progress on this rank for {} at {} (--collective_timeout {}). {} Ending the job "
               "(exit status {}); nothing is saved: resume from the newest checkpoint.",
               seconds_text(idle), where(here), timeout_seconds_, diagnosis, kStallExitStatus);
    std::fflush(nullptr);
    ::_exit(kStallExitStatus);
  }
}

int StallWatchdog::progressing_rank(const std::string& run_dir, int rank, int world_size, double stale_seconds,
                                    double timeout_seconds) {
  const double now = wall_seconds();
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    const Heartbeat beat = read_heartbeat(run_dir, r);
    if (beat.found && now - beat.written <= stale_seconds && beat.idle_seconds < timeout_seconds) return r;
  }
  return -1;
}

std::string StallWatchdog::diagnose(const std::string& run_dir, int rank, int world_size, double stale_seconds,
                                    const std::vector<std::string>& hosts) {
  const double now = wall_seconds();
  const bool hosts_known = hosts.size() == static_cast<size_t>(world_size);
  std::vector<Heartbeat> beats;
  for (int r = 0; r < world_size; ++r) beats.push_back(read_heartbeat(run_dir, r));
  std::ostringstream stale, behind, everyone;
  int stale_count = 0, behind_count = 0;
  std::vector<std::pair<std::string, std::vector<int>>> unseen;  // other nodes' ranks without a file, by node
  int64_t latest_step = 0;
  for (const Heartbeat& beat : beats)
    if (beat.found) latest_step = std::max(latest_step, beat.step);
  for (int r = 0; r < world_size; ++r) {
    const Heartbeat& beat = beats[r];
    if (r == rank) {
      everyone << (r ? "; " : "") << "rank " << r << " (this one): " << where(beat);
      continue;
    }
    const bool elsewhere = hosts_known && hosts[r] != hosts[rank];
    if (!beat.found && elsewhere) {
      auto node = std::find_if(unseen.begin(), unseen.end(), [&](const auto& n) { return n.first == hosts[r]; });
      if (node == unseen.end()) node = unseen.insert(unseen.end(), {hosts[r], {}});
      node->second.push_back(r);
    } else if (!beat.found) {
      stale << (stale_count++ ? ", " : "") << "rank " << r << " (no heartbeat file in " << run_dir
            << (hosts_known ? ": stopped before training" : ": stopped before training, or on another node without a shared --run_dir")
            << ")";
    } else if (now - beat.written > stale_seconds) {
      stale << (stale_count++ ? ", " : "") << "rank " << r << " (its heartbeat is " << seconds_text(now - beat.written)
            << " old, last at " << where(beat) << ")";
    } else if (beat.step < latest_step) {
      behind << (behind_count++ ? ", " : "") << "rank " << r << " (at " << where(beat) << ", idle "
             << seconds_text(beat.idle_seconds) << ")";
    }
    everyone << (r ? "; " : "") << "rank " << r << ": "
             << (beat.found ? where(beat) + ", idle " + seconds_text(beat.idle_seconds) : std::string("no heartbeat"));
  }
  // Which collective each rank is in, and which ranks of its communicator never reached it.
  std::vector<nlohmann::json> fields;
  for (const Heartbeat& beat : beats) fields.push_back(beat.found ? beat.fields : nlohmann::json());
  const std::string in_flight = collectives_in_flight(fields, now);
  const std::string collectives = in_flight.empty() ? "" : " In collectives: " + in_flight + ".";
  if (stale_count > 0)
    return "Not responding: " + stale.str() +
           ". Its process is stopped or hung as a whole (SIGSTOP, a debugger, swapping), or its node is gone; the "
           "other ranks wait for it in a collective." + collectives;
  if (behind_count > 0)
    return "Behind the others, which wait for it: " + behind.str() + "." + collectives;
  if (!unseen.empty()) {
    std::ostringstream nodes;
    for (size_t i = 0; i < unseen.size(); ++i) {
      nodes << (i ? "; " : "") << unseen[i].first << ": rank" << (unseen[i].second.size() > 1 ? "s " : " ");
      for (size_t j = 0; j < unseen[i].second.size(); ++j) nodes << (j ? ", " : "") << unseen[i].second[j];
    }
    return "Every rank on this node (" + hosts[rank] + ") that writes a heartbeat here is alive and at the same point, "
           "so the rank holding the job up is on another node: " + nodes.str() + ". Their heartbeats are not "
           "readable from here (--run_dir " + run_dir + " is not shared across nodes): the message from their "
           "own node names the rank (or, if none comes, that node is gone). A --run_dir on a shared file system "
           "lets every node name it.";
  }
  return "Every rank is alive and at the same point (" + everyone.str() +
         "): a collective that does not complete (network, NCCL or MPI), or a rank stuck inside a computation." +
         collectives;
}

}  // namespace llm
