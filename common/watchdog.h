// The stall watchdog (--collective_timeout SECONDS): a rank that makes no progress for that long ends
// the job with a message naming the rank that holds it up, instead of every rank waiting forever in
// a collective for a peer that was stopped, hung, or lost its host.
//
// It runs from start-up, not from the first step (trainer/main.cpp starts it once the run folder is
// locked): a rank stopped while the model is built, a checkpoint or --init_from is read, or NCCL
// starts, ends the job like one stopped mid-step, and the message names the start-up phase.
//
// Progress is what the trainer reports (progress(), or mark() from code that does not hold the
// watchdog): every start-up phase and unit built, every tensor read from a checkpoint or --init_from,
// every unit's forward and backward, the optimizer, evaluation, and every tensor a save writes (from
// its writer thread too: keep_alive()); a few atomics, no lock, no I/O. The timeout applies to the
// absence of progress in the whole job, not to the length of one phase: a rank idle for the timeout
// first reads the heartbeats, and while another rank is still progressing (a slow save or read the
// others wait for at the next collective) it waits on, saying once which rank it waits for. A thread per rank wakes every second
// and writes RUN_DIR/heartbeat.rank<R>.json (rank, step, phase, unit, seconds since the last progress,
// wall-clock time), by rename, so a reader never sees half a file. When its own rank has made no
// progress for the timeout, it reads every rank's heartbeat and names the culprit:
//   - a rank whose heartbeat is stale (older than max(2.5 s, min(30 s, timeout / 4)); a live rank
//     rewrites it every second, and writes the first as training starts): its process is stopped (SIGSTOP,
//     a debugger), hung as a whole, or on a node that is gone or does not share RUN_DIR;
//   - else a rank at an earlier step or phase than the others: the one the others wait for;
//   - else every rank waits at the same point: a communication hang (network, NCCL, MPI).
// Ranks on other nodes (`hosts`, every rank's host name) whose heartbeats this node cannot read
// (RUN_DIR not shared) are not called stale: when every rank it can see is alive, the message says the
// rank holding the job up is among them, by node, and that their own node's message names it.
// Then it logs the diagnosis and ends its process with exit status 4 (mpirun then ends the others).
// Nothing is saved: the state of a rank waiting in a collective may be mid-update.
//
// Heartbeat files are removed when training ends normally. 0 turns the watchdog off; the trainer
// passes 0 for a single process, which has no collective to wait in.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace llm {

// The exit status of a rank that ended the job for a stall.
constexpr int kStallExitStatus = 4;
// Heartbeats are written every second and one older than 2.5 intervals is stale: a shorter
// --collective_timeout would end a healthy job before any heartbeat could tell it apart.
constexpr double kHeartbeatIntervalSeconds = 1.0;
constexpr double kShortestCollectiveTimeout = 2.5 * kHeartbeatIntervalSeconds;

class StallWatchdog {
 public:
  // Starts the thread unless timeout_seconds is 0.
  // hosts: every rank's host name (empty: unknown, every rank's heartbeat is expected in run_dir).
  StallWatchdog(std::string run_dir, int rank, int world_size, double timeout_seconds,
                std::vector<std::string> hosts = {});
  ~StallWatchdog();  // stops the thread and removes this rank's heartbeat file
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

  // `phase` must be a string literal (kept by pointer); unit -1 for none.
  void progress(int64_t step, const char* phase, int unit = -1) {
    step_.store(step, std::memory_order_relaxed);
    phase_.store(phase, std::memory_order_relaxed);
    unit_.store(unit, std::memory_order_relaxed);
    last_progress_ns_.store(now_ns(), std::memory_order_release);
  }

  // Progress without moving where the rank is (its step, phase and unit): a background save's writer.
  void keep_alive() { last_progress_ns_.store(now_ns(), std::memory_order_release); }
  // The phase only, at the rank's current step (start-up, a save's steps).
  void progress(const char* phase) {
    progress(step_.load(std::memory_order_relaxed), phase);
    stop_here_if_asked(rank_, phase);
  }

  // The process's running watchdog (the one with a timeout, made last), for code that does not hold
  // it; these do nothing when none runs.
  static void mark(const char* phase);
  static void mark_alive();

  // A debugging knob for the tests: with LLM_DEBUG_STOP_AT=R:TEXT in the environment, rank R stops
  // itself (SIGSTOP, as a debugger or a frozen host would) on reaching a phase whose name holds TEXT,
  // e.g. LLM_DEBUG_STOP_AT="1:building the model". Only phases given by name (progress(phase), mark).
  static void stop_here_if_asked(int rank, const char* phase);

  // What the stalled rank concludes from the heartbeats in run_dir (exposed for tests).
  static std::string diagnose(const std::string& run_dir, int rank, int world_size, double stale_seconds,
                              const std::vector<std::string>& hosts = {});
  // Another rank whose heartbeat is fresh and whose last progress is under timeout_seconds old: the job
  // is moving and this rank waits for it. -1 when none (exposed for tests).
  static int progressing_rank(const std::string& run_dir, int rank, int world_size, double stale_seconds,
                              double timeout_seconds);

 private:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void watch();
  void write_heartbeat(double idle_seconds);

  std::string run_dir_;
  int rank_, world_size_;
  std::vector<std::string> hosts_;
  double timeout_seconds_;
  std::atomic<int64_t> step_{0};
  std::atomic<const char*> phase_{"start-up"};
  std::atomic<int> unit_{-1};
  std::atomic<int64_t> last_progress_ns_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace llm
