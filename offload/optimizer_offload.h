// CPU offload of the optimizer (--offload optimizer): every unit's fp32 master shard and optimizer
// state live in host memory, and the optimizer steps there, unit by unit, on a worker thread, while
// the device keeps only each unit's rows in the compute dtype (what is gathered) and, for a moment
// each step, its gradient shard: the shard exists from the unit's reduce-scatter until its copy to
// host memory is done, then it is freed (ShardedUnit::make_gradient_transient), so between steps the
// device holds no gradient at all. ZeRO-Offload's division of labour, per unit of our own runtime
// (docs/offload.md draws the timeline of one step).
//
// One owner for everything offload holds, per unit:
//   master      (shard_numel) fp32, host: what the optimizer updates and checkpoints save
//   gradient    (shard_numel) fp32, host (pinned on CUDA): where the device's gradient shard lands
//   staging     (shard_numel) compute dtype, host (pinned on CUDA): the updated rows, rounded, on
//               their way to the device (CUDA only; on a CPU rank the worker writes the unit's
//               compute shard directly; with --offload parameters, none: the unit's compute shard
//               is in host memory already, and the step writes it once the last gather has read it)
//   optimizer state: the ShardOptimizer's flat buffers, built over the host masters and gradients
// and, on CUDA, a device-to-host and a host-to-device copy stream and an event per unit and way.
//
// The order, for unit u of step t:
//   gradient_ready(u)   (ShardedModel's gradient_shard_ready, during backward) the unit hands its
//                       shard over (take_gradient_shard; its squared norm was taken as it was
//                       reduced) and it is copied to u's host gradient buffer: on the D2H stream
//                       after an event on the compute stream, the shard's block kept from reuse until
//                       the copy is done (recordStream) (CUDA), or in line (CPU); then the shard is freed
//   step(lr, scale)     (after the last backward, once the global norm is known: clipping is exact)
//                       queues every unit in the optimizer pass's order (embed first); the worker, per
//                       unit: waits for u's D2H copy, step_unit(u) with the clip coefficient (AdamW's
//                       host kernel multiplies the gradient by it as it reads it, and writes the
//                       updated rows rounded into u's staging buffer in the same pass: one pass over
//                       the unit's bytes), copies that into u's compute shard (H2D stream, then an event),
//                       and marks u done
//   wait_unit(u)        (ShardedModel's before_shard_read: before u's gather or forward in step t+1,
//                       or in an evaluation) blocks until the worker marked u done, then orders the
//                       compute stream after u's H2D copy (an event, no host wait)
// So the next step's forward of the embedding starts as soon as the embedding's host step is done,
// while the worker steps the later units.
//
// --offload_step speculative (SuperOffload's rule, exact): gradient_ready(u) also queues a speculative
// step of u for the worker, at the step's lr (begin_step) and as if no clipping were needed: the
// worker points u's optimizer at u's second set of buffers (ShardOptimizer::rebind_unit) and steps
// from the originals into it (out of place for AdamW, whose kernel reads one set and writes the
// other in its one pass; other rules copy first), rounding the rows into u's staging buffer, while
// backward goes on and the originals stay as they were. step(lr, scale) then queues u's resolution: with scale 1 (the norm says no
// clipping) the second set is adopted (the originals become the next step's spare) and the rows go
// to the device; otherwise u is pointed back at its kept originals and stepped again with the real
// coefficient, the exact step's own path. A non-finite gradient stops the run before step(): the
// masters that message reads and the state are the originals. Collective units step after the norm,
// as above, and so do the units whose speculative step the worker had not begun when the norm came
// (their step is then the exact one, in the optimizer's order). Costs a second master and state in
// host memory; for AdamW no more bytes than the exact step.
//
// GaLore in the default mode (offload/lowrank_gradients.h): a unit with GaLore matrices keeps its
// gradient shard on the device until step(), which projects each matrix's gradient there (its
// collectives over the device's communicator) and sends only the low-rank gradient (and the
// projector) to the host.
//
// Units whose step is collective (subset-norm or GaLore sums across ranks: ShardOptimizer::
// unit_needs_collectives) are stepped by the calling thread inside step(), in the same order on every
// rank: MPI is initialised FUNNELED (sharding/world.h), so only that thread may communicate. Each
// unit's state is its own, so which thread steps a unit changes no result: offload on equals offload
// off bitwise (tests/offload_test.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "common/owned_bytes.h"
#include "optim/optimizer_settings.h"
#include "optim/shard_optimizer.h"
#include "optim/update_rules.h"

namespace llm {

class Communicator;
class DeviceStep;
class LowRankGradients;
class ShardedModel;

// Where offload's host time goes, summed since the last take_times(): the host step itself (the
// worker's and the main thread's: waiting for a gradient to land, the update, the rounded copy), and
// the main thread blocked in wait_unit() for an update that was not ready (the part of the host step
// the step's time shows). On CUDA neither is on the compute stream, so the stream's phases miss them.
struct OffloadTimes {
  double host_step_seconds = 0;
  double wait_seconds = 0;
};

// One moment of the schedule (--offload_trace, offload_trace.rank<R>.jsonl): what happened to which
// unit, on which thread, in the order it happened (`sequence`, one counter for both threads), and
// when (seconds since the offload was built). The tests assert the schedule from these.
struct OffloadEvent {
  int64_t sequence = 0;
  int64_t step = 0;  // the optimizer step the event belongs to (1-based)
  std::string what;  // docs/offload.md, "The schedule, recorded", lists every kind
  int64_t unit = -1;  // -1: the step as a whole
  bool worker = false;
  double seconds = 0;
  int64_t bytes = 0;  // gradient, lowrank: the bytes that crossed to the host
};

// The host step's threads for a rank of `rank_threads` (LibTorch's count on the main thread): all of
// them on a CPU rank, whose main thread waits for the step (wait_unit); one less on a GPU, where the
// main thread launches the next forward's kernels while the worker steps and must not queue behind
// the worker's OpenMP team for a core. `requested` > 0 (--offload_threads) wins.
int offload_worker_threads(int rank_threads, bool on_cuda, int requested);

// When and where the offloaded step runs (--offload_step; docs/offload.md, "Which mode to pick").
enum class OffloadStepMode { host, speculative, device };

struct OffloadOptions {
  int worker_threads = 0;          // the host step's threads (--offload_threads); 0: offload_worker_threads' default
  int64_t delayed_after = -1;      // --offload_delayed_update's exact warm-up steps, after which each step's
                                   // update reaches the device one step late (-1: never); needs the units' rows
                                   // on the device
  OffloadStepMode mode = OffloadStepMode::host;
  bool trace = false;              // keep the schedule's events (take_trace)
  // The model's communicator over the ranks that shard the units, for device tensors (nullptr: the
  // units are whole on each rank): GaLore's device half sums and gathers over it.
  Communicator* device_across = nullptr;
};

class OptimizerOffload {
 public:
  // Copies every unit's master to host memory, moves the unit's own master off the device
  // (ShardedUnit::offload_master) and builds the optimizer over the host masters and gradients.
  // rules: per unit, one update rule per parameter. Device mode (offload/device_step.h): master and
  // state page-locked on CUDA, the gradient shards kept on the device, no collective units.
  OptimizerOffload(ShardedModel& model, const OptimizerSettings& settings,
                   std::vector<std::vector<UpdateRule>> rules, Communicator* across, const OffloadOptions& options);
  ~OptimizerOffload();  // waits for the worker, then stops it
  OptimizerOffload(const OptimizerOffload&) = delete;
  OptimizerOffload& operator=(const OptimizerOffload&) = delete;

  // Before the step's first backward: its lr (what a speculative step uses; step() must get the same).
  void begin_step(double lr);
  // Delayed (after the warm-up): first waits until the worker's last step of the unit has read its
  // landing buffer. Speculative: queues the unit's speculative step.
  void gradient_ready(size_t unit);
  // One optimizer step with the gradients scaled by gradient_scale (1: no clipping). Delayed: the
  // last step's updates reach the device here (wait_all), and this step's are computed while the
  // next forward and backward run on the weights before them.
  void step(double lr, double gradient_scale);
  // Before the unit's next read: its update is on the device (delayed: the one wait_all applied).
  void wait_unit(size_t unit);
  // Every unit's step done and on the device, a delayed update applied now (checkpoints, the end).
  void wait_all();
  // Delayed only: wait_all() (an evaluation sees the latest weights); exact steps need nothing.
  void settle();

  // The host master of a unit (wait_all() first where it matters; device mode waits for the copies
  // back here, so the masters hold the last step).
  at::Tensor& master(size_t unit);
  // After a checkpoint's rows and state were loaded into master(unit) and the optimizer: refresh the
  // device's compute shard (and GaLore's device projectors), and count steps on from the loaded
  // optimizer's (the delayed update's warm-up, the trace's step numbers).
  void publish(size_t unit);
  ShardOptimizer& optimizer() { return *optimizer_; }
  // Everything offload holds in host memory (masters, gradients, staging, state): optimizer_host.
  OwnedBytes owned_bytes() const;
  OffloadTimes take_times();
  // The events recorded since the last call (none without trace).
  std::vector<OffloadEvent> take_trace();
  int worker_threads() const { return intra_op_threads_; }

 private:
  struct CudaCopies;  // streams and events (optimizer_offload.cpp; CUDA builds only)

  enum class Job { step, speculate, resolve };
  struct Task {
    size_t unit = 0;
    Job job = Job::step;
    int64_t step = 0;  // the optimizer step it belongs to (the trace's)
    double lr = 0;     // a speculative step's (begin_step's when it was queued)
  };
  void land_gradient(size_t unit);  // the unit's gradient shard to its host landing buffer, then freed
  // GaLore's device half of the unit's step and its low-rank gradients to the landing buffer.
  void land_lowrank(size_t unit, double gradient_scale);
  void copy_to_host(size_t unit, const std::vector<std::pair<at::Tensor, at::Tensor>>& copies);
  void run(const Task& task);  // either thread
  void step_on_device(double lr, double gradient_scale);  // device mode's step()
  // Scale, step, publish to the device (delayed: stage only); either thread.
  void step_on_host(size_t unit, int64_t step);
  void speculate(size_t unit, int64_t step, double lr);  // the step on the spare buffers, unclipped, rows to staging
  void resolve(size_t unit, int64_t step);    // adopt the speculative step, or step again from the originals
  // step_unit (from: step_unit_from those buffers), timed.
  void host_update(size_t unit, double lr, double scale, at::Tensor& destination,
                   const ShardOptimizer::UnitBuffers* from = nullptr);
  void deliver_staged(size_t unit);  // the staged rows to the compute shard / device
  at::Tensor& staged_rows(size_t unit);  // the staging buffer, once its last copy to the device is done (CUDA)
  void record(const char* what, int64_t unit, int64_t step, int64_t bytes = 0);
  void wait_done(size_t unit);     // until the worker has stepped the unit
  void order_after_update(size_t unit);  // the compute stream after the unit's last H2D copy (CUDA)
  void apply_delayed(size_t unit);  // the staged update to the device
  // Where unit's updated rows go in the compute dtype (the staging buffer, once free, on CUDA; the
  // compute shard on a CPU rank), and from there to the device.
  at::Tensor& rounded_destination(size_t unit);
  void send_to_device(size_t unit);
  void worker_loop();
  void mark_done(size_t unit);

  ShardedModel& model_;
  bool on_cuda_ = false;
  std::vector<at::Tensor> masters_, gradients_, staging_;
  std::unique_ptr<ShardOptimizer> optimizer_;
  std::unique_ptr<CudaCopies> copies_;
  int intra_op_threads_ = 1;  // the worker's (worker_threads)
  int64_t host_bytes_ = 0;    // owned_bytes().optimizer_host
  int lag_ms_ = 0;            // LLM_DEBUG_OFFLOAD_LAG_MS (the constructor)

  double lr_ = 0, gradient_scale_ = 1;
  double speculative_lr_ = 0;  // begin_step's (the main thread's)
  int64_t steps_ = 0, delayed_after_ = -1;
  bool delayed_ = false;       // this step's updates are applied one step late
  std::vector<bool> pending_;  // a unit's update staged, not yet on the device (guarded by mutex_)
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> queue_;
  bool working_ = false;  // the worker is running queue_.front() (under mutex_)
  // Speculative: per unit, the buffers the optimizer is not bound to (the second set) and, while a
  // speculative step awaits the norm, the originals it kept; which units await; the norm's verdict.
  bool speculative_ = false, begun_ = false, adopt_ = false;
  std::unique_ptr<DeviceStep> device_step_;  // --offload_step device
  std::unique_ptr<LowRankGradients> lowrank_;  // GaLore's units in host mode (offload/lowrank_gradients.h)
  std::vector<ShardOptimizer::UnitBuffers> spare_, kept_;
  std::vector<bool> speculated_;
  bool trace_ = false;
  std::vector<OffloadEvent> events_;  // under mutex_
  int64_t sequence_ = 0;
  std::chrono::steady_clock::time_point built_ = std::chrono::steady_clock::now();
  std::vector<bool> done_;
  bool stopping_ = false;
  std::exception_ptr failure_;  // the worker's, rethrown by the next wait
  OffloadTimes times_;          // under mutex_
  std::thread worker_;
};

}  // namespace llm
