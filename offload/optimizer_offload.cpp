#include "offload/optimizer_offload.h"

#include <algorithm>

#include <omp.h>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <utility>

#include "common/errors.h"
#include "common/memory_stats.h"
#include "offload/device_step.h"
#include "offload/offload_copies.h"
#include "offload/lowrank_gradients.h"
#include "sharding/sharded_model.h"

#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace llm {

int offload_worker_threads(int rank_threads, bool on_cuda, int requested) {
  if (requested > 0) return requested;
  return on_cuda ? std::max(1, rank_threads - 1) : std::max(1, rank_threads);
}

OptimizerOffload::OptimizerOffload(ShardedModel& model, const OptimizerSettings& settings,
                                   std::vector<std::vector<UpdateRule>> rules, Communicator* across,
                                   const OffloadOptions& options)
    : model_(model),
      delayed_after_(options.delayed_after),
      speculative_(options.mode == OffloadStepMode::speculative),
      trace_(options.trace) {
  const bool on_device = options.mode == OffloadStepMode::device;
  // LLM_DEBUG_OFFLOAD_LAG_MS=N: the worker sleeps N ms before each task, so the tests see the main
  // thread run ahead of it (the next step's begin_step, forward and backward before this step's
  // host steps are done) whatever the machine's speed.
  if (const char* lag = std::getenv("LLM_DEBUG_OFFLOAD_LAG_MS")) lag_ms_ = std::atoi(lag);
  LLM_REQUIRE(!(speculative_ && delayed_after_ >= 0), "offload", "--offload_step speculative",
              "applies each update before the next forward; --offload_delayed_update applies it a step late");
  LLM_REQUIRE(rules.size() == model.unit_count(), "offload", "rules", "needs the update rules of every unit");
  at::NoGradGuard no_grad;
  const size_t units = model.unit_count();
  const c10::Device device = units > 0 ? model.unit(0).gradient_shard().device() : c10::Device(c10::kCPU);
  on_cuda_ = device.is_cuda();
  intra_op_threads_ = offload_worker_threads(at::get_num_threads(), on_cuda_, options.worker_threads);
  LLM_REQUIRE(!on_device || delayed_after_ < 0, "offload", "--offload_step device",
              "steps on the device before the next forward; --offload_delayed_update applies it a step late");
  // GaLore's units that project on the device (offload/lowrank_gradients.h): the default mode.
  LLM_REQUIRE(across == nullptr || options.device_across != nullptr, "offload", "device_across",
              "sharded units need the device's communicator for GaLore's device half");
  const auto projects_on_device = [&](size_t u) {
    return options.mode == OffloadStepMode::host && delayed_after_ < 0 &&
           std::count(rules[u].begin(), rules[u].end(), UpdateRule::galore) > 0;
  };
  std::vector<bool> keeps_gradient(units);
  for (size_t u = 0; u < units; ++u) keeps_gradient[u] = on_device || projects_on_device(u);
  std::vector<UnitShard> shards;
  for (size_t u = 0; u < units; ++u) {
    ShardedUnit& unit = model.unit(u);
    LLM_REQUIRE(!unit.master_offloaded(), "offload", unit.name(), "the master is offloaded already");
    const int64_t numel = unit.layout().shard_numel;
    // Master and state in pageable host memory: they never cross the bus. The buffers the copies
    // read or write are page-locked on CUDA, so the copies are DMA and asynchronous.
    // Device mode: the master crosses every step, so it is page-locked (on CUDA) too.
    masters_.push_back(exact_host_buffer(numel, at::kFloat, on_device ? device : c10::Device(c10::kCPU)));
    masters_.back().copy_(unit.master_shard());
    // Exact sizes (common/memory_stats.h): the caching host allocator would round each up to a
    // power of two, up to twice the pinned memory the estimate counts.
    // bf16 where the unit's shard is (pure bf16 AdamW at one rank): half the bytes across the bus and
    // into the host step, which reads bf16 gradients.
    // Device mode: none; the step reads the unit's own shard on the device.
    gradients_.push_back(on_device ? at::Tensor() : exact_host_buffer(numel, unit.gradient_dtype(), device));
    // With parameter offload the unit's compute shard is in host memory already: the step writes it.
    LLM_REQUIRE(delayed_after_ < 0 || !unit.parameters_offloaded(), "offload", "--offload_delayed_update",
                "needs the units' rows on the device (not --offload parameters)");
    // A delayed update waits here, also on a CPU rank, until the step after the one that made it; a
    // speculative one until the norm decides (with parameter offload too: host rows, no bus).
    if ((((on_cuda_ || delayed_after_ >= 0) && !unit.parameters_offloaded()) || speculative_) && !on_device) {
      staging_.push_back(exact_host_buffer(numel, model.options().compute_dtype,
                                           unit.parameters_offloaded() ? c10::Device(c10::kCPU) : device));
      staging_.back().copy_(masters_.back());  // the padding rows, which no step writes
    } else {
      staging_.emplace_back();
    }
    LLM_REQUIRE(!on_device || !unit.parameters_offloaded(), "offload", "--offload_step device",
                "writes each unit's rows on the device: not with --offload parameters");
    unit.offload_master();
    // Each step's shard is handed to gradient_ready(), then freed; the device step and GaLore's
    // projection on the device read it at step() instead.
    if (!keeps_gradient[u]) unit.make_gradient_transient();
    shards.push_back({unit.layout(), masters_.back(), on_device ? unit.gradient_shard() : gradients_.back(), std::move(rules[u])});
  }
  optimizer_ = std::make_unique<ShardOptimizer>(settings, std::move(shards), across);
  if (on_device) {
    // The state page-locked too (the optimizer made it pageable), and two device windows to step in.
    std::vector<ShardOptimizer::UnitBuffers> host_buffers;
    for (size_t u = 0; u < units; ++u) {
      LLM_REQUIRE(!optimizer_->unit_needs_collectives(u), "offload", "--offload_step device",
                  "steps AdamW, or any optimizer on one rank or no_shard: " + model.unit(u).name() +
                      "'s step sums across ranks");
      const ShardOptimizer::UnitBuffers pageable = optimizer_->unit_buffers(u);
      const ShardOptimizer::UnitBuffers pinned{pageable.master, exact_host_copy(pageable.exp_avg, device),
                                               exact_host_copy(pageable.exp_avg_sq, device),
                                               exact_host_copy(pageable.projector, device)};
      optimizer_->rebind_unit(u, pinned);
      optimizer_->set_unit_gradient(u, at::Tensor());  // the shard the step is handed, each step
      host_buffers.push_back(pinned);
    }
    device_step_ = std::make_unique<DeviceStep>(*optimizer_, std::move(host_buffers), device);
  }
  if (std::any_of(keeps_gradient.begin(), keeps_gradient.end(), [](bool keeps) { return keeps; }) && !on_device)
    lowrank_ = std::make_unique<LowRankGradients>(*optimizer_, gradients_, device, across ? options.device_across : nullptr);
  done_.assign(units, true);
  pending_.assign(units, false);
  speculated_.assign(units, false);
  kept_.resize(units);
  spare_.resize(units);
  // The second set of buffers, for the units a speculative step may run on (collective units step
  // after the norm, on the calling thread, as without speculation).
  if (speculative_)
    for (size_t u = 0; u < units; ++u)
      if (!optimizer_->unit_needs_collectives(u)) {
        const ShardOptimizer::UnitBuffers own = optimizer_->unit_buffers(u);
        // Copies, not empty: elements no step writes (padding) hold the same values in both sets.
        spare_[u] = {own.master.clone(), own.exp_avg.clone(), own.exp_avg_sq.clone(), own.projector.clone()};
      }
  // What offload holds in host memory, counted once: the buffers stay until the end (and the worker
  // swaps a speculative unit's two sets while the ledger reads this).
  host_bytes_ = optimizer_->state_bytes();
  for (const std::vector<at::Tensor>* buffers : {&masters_, &gradients_, &staging_})
    for (const at::Tensor& buffer : *buffers)
      if (buffer.defined()) host_bytes_ += static_cast<int64_t>(buffer.nbytes());
  for (const ShardOptimizer::UnitBuffers& spare : spare_)
    for (const at::Tensor* buffer : {&spare.master, &spare.exp_avg, &spare.exp_avg_sq, &spare.projector})
      if (buffer->defined()) host_bytes_ += static_cast<int64_t>(buffer->nbytes());
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_) copies_ = std::make_unique<CudaCopies>(device.index(), units);
#endif
  worker_ = std::thread([this] { worker_loop(); });
}

OptimizerOffload::~OptimizerOffload() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return queue_.empty() || failure_ != nullptr; });
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
#ifdef TRAINER_HAVE_CUDA
  // The last copies from and into the page-locked buffers, which go with this object.
  if (copies_) {
    copies_->to_device.synchronize();
    copies_->to_host.synchronize();
  }
#endif
}

void OptimizerOffload::begin_step(double lr) {
  speculative_lr_ = lr;  // not lr_: the worker may still be on the last step's units
  begun_ = false;
}

void OptimizerOffload::gradient_ready(size_t unit) {
  at::NoGradGuard no_grad;
  if (delayed_) wait_done(unit);  // the last step's host update of the unit has read its landing buffer
  if (device_step_ || (lowrank_ && lowrank_->covers(unit))) {  // the shard stays on the device for the step
    record("gradient", static_cast<int64_t>(unit), steps_ + 1);
    return;
  }
  land_gradient(unit);
  record("gradient", static_cast<int64_t>(unit), steps_ + 1, static_cast<int64_t>(gradients_.at(unit).nbytes()));
  if (!speculative_ || optimizer_->unit_needs_collectives(unit)) return;
  if (!begun_) {  // the step's first unit: the last step is done (this step's forward read every unit)
    for (size_t u = 0; u < done_.size(); ++u) wait_done(u);
    optimizer_->begin_step();
    begun_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_[unit] = false;
    speculated_[unit] = true;
    // The lr goes with the task: the next step's begin_step() may come before the worker gets to it.
    queue_.push_back({unit, Job::speculate, steps_ + 1, speculative_lr_});
  }
  record("speculate_queued", static_cast<int64_t>(unit), steps_ + 1);
  changed_.notify_all();
}

void OptimizerOffload::step(double lr, double gradient_scale) {
#ifdef TRAINER_HAVE_CUDA
  // The H2D copies below (and a delayed update's, applied by wait_all) overwrite compute shards that
  // this step's kernels read (a resident unit's parameters are views of its shard): they go after
  // everything queued so far.
  if (on_cuda_) copies_->backward_done.record(c10::cuda::getCurrentCUDAStream(copies_->device));
#endif
  if (device_step_) {
    step_on_device(lr, gradient_scale);
    return;
  }
  // The last step's updates are all on the device (and the worker is idle); speculative: the worker
  // is on this step's speculative steps, and the last step was done before the first of them.
  if (!speculative_) wait_all();
  ++steps_;
  delayed_ = delayed_after_ >= 0 && steps_ > delayed_after_;
  if (!begun_) {  // (speculative: no unit was speculated)
    if (speculative_) wait_all();
    optimizer_->begin_step();
  }
  begun_ = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LLM_REQUIRE(!speculative_ || lr == speculative_lr_, "offload", "lr", "step() needs begin_step()'s lr");
    lr_ = lr;
    gradient_scale_ = gradient_scale;
    adopt_ = gradient_scale == 1.0;  // the norm says no clipping: the speculative steps were this step's
  }
  record(!speculative_ ? "norm" : adopt_ ? "norm_adopt" : "norm_restep", -1, steps_);
  if (speculative_) {
    // The speculative steps the worker has not begun are the norm's to make now: they are dropped,
    // and their units stepped below as without speculation (no copy, one pass), in the optimizer's
    // order like the rest, so the embedding, whose gradient came last, goes first.
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto task = queue_.begin() + (working_ ? 1 : 0); task != queue_.end();) {
      if (task->job != Job::speculate) {
        ++task;
        continue;
      }
      speculated_[task->unit] = false;
      task = queue_.erase(task);
    }
  }
  // GaLore's device half, in the optimizer's order, before the worker may step a unit.
  if (lowrank_)
    for (const UnitAction& action : model_.plan().optimizer_pass())
      if (lowrank_->covers(static_cast<size_t>(action.unit))) land_lowrank(static_cast<size_t>(action.unit), gradient_scale);
  std::vector<size_t> collective;
  for (const UnitAction& action : model_.plan().optimizer_pass()) {
    const size_t u = static_cast<size_t>(action.unit);
    std::lock_guard<std::mutex> lock(mutex_);
    done_[u] = false;
    if (optimizer_->unit_needs_collectives(u))
      collective.push_back(u);
    else
      queue_.push_back({u, speculated_[u] ? Job::resolve : Job::step, steps_});
  }
  changed_.notify_all();
  // The collective units on this thread, in the plan's order on every rank (see the header).
  for (size_t u : collective) {
    step_on_host(u, steps_);
    mark_done(u);
  }
}

// Device mode: every unit, in the optimizer's order, through DeviceStep on the compute stream (its
// state crossing on the copy streams); the next forward's reads come after on the same stream.
void OptimizerOffload::step_on_device(double lr, double gradient_scale) {
  ++steps_;
  optimizer_->begin_step();
  record("norm", -1, steps_);
  for (const UnitAction& action : model_.plan().optimizer_pass()) {
    const size_t u = static_cast<size_t>(action.unit);
    ShardedUnit& sharded = model_.unit(u);
    record("step_begin", static_cast<int64_t>(u), steps_);
    sharded.wait_reduced();  // the step reads the shard on the compute stream
    device_step_->step_unit(u, lr, gradient_scale, sharded.gradient_shard(), sharded.stepped_rows());
    sharded.publish_shard();  // no_shard's parameters from the compute shard
    record("step_end", static_cast<int64_t>(u), steps_);
    record("sent", static_cast<int64_t>(u), steps_);
  }
}

void OptimizerOffload::run(const Task& task) {
  switch (task.job) {
    case Job::step: step_on_host(task.unit, task.step); return;
    case Job::speculate: speculate(task.unit, task.step, task.lr); return;
    case Job::resolve: resolve(task.unit, task.step); return;
  }
}

// step_unit into `destination`, timed as the host step's.
void OptimizerOffload::host_update(size_t unit, double lr, double scale, at::Tensor& destination,
                                   const ShardOptimizer::UnitBuffers* from) {
  at::NoGradGuard no_grad;
  const auto started = std::chrono::steady_clock::now();
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_) copies_->gradient_landed.at(unit).synchronize();
#endif
  if (from != nullptr)
    optimizer_->step_unit_from(unit, *from, lr, destination, scale);
  else
    optimizer_->step_unit(unit, lr, destination, scale);
  std::lock_guard<std::mutex> lock(mutex_);
  times_.host_step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void OptimizerOffload::step_on_host(size_t unit, int64_t step) {
  record("step_begin", static_cast<int64_t>(unit), step);
  // The step scales the gradient by the clip coefficient as it reads it and writes the updated rows,
  // rounded, straight into what goes to the device (AdamW's host kernel, one pass): the staging
  // buffer on CUDA, the unit's compute shard on a CPU rank.
  host_update(unit, lr_, gradient_scale_, rounded_destination(unit));
  record("step_end", static_cast<int64_t>(unit), step);
  if (delayed_) {  // staged: wait_all() at the next step (or a checkpoint, an evaluation) applies it
    std::lock_guard<std::mutex> lock(mutex_);
    pending_[unit] = true;
    return;
  }
  send_to_device(unit);
  record("sent", static_cast<int64_t>(unit), step);
}

void OptimizerOffload::speculate(size_t unit, int64_t step, double lr) {
  at::NoGradGuard no_grad;
  record("speculate_begin", static_cast<int64_t>(unit), step);
  // The unit's optimizer now writes its second set; the originals are kept, and read by the step
  // (out of place for AdamW: no copy; optim/shard_optimizer.h).
  kept_.at(unit) = optimizer_->rebind_unit(unit, std::exchange(spare_.at(unit), {}));
  host_update(unit, lr, 1.0, staged_rows(unit), &kept_.at(unit));  // as if no clipping were needed
  record("speculate_end", static_cast<int64_t>(unit), step);
}

void OptimizerOffload::resolve(size_t unit, int64_t step) {
  at::NoGradGuard no_grad;
  bool adopt = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    adopt = adopt_;
    speculated_[unit] = false;
  }
  if (adopt) {  // the speculative step was the step: its buffers are the unit's, the originals the spare
    {
      std::lock_guard<std::mutex> lock(mutex_);  // master(u)'s readers wait for the unit first
      masters_.at(unit) = optimizer_->unit_buffers(unit).master;
      spare_.at(unit) = std::exchange(kept_.at(unit), {});
    }
    record("adopt", static_cast<int64_t>(unit), step);
  } else {  // back to the originals, and the exact step's own path with the real coefficient
    spare_.at(unit) = optimizer_->rebind_unit(unit, std::exchange(kept_.at(unit), {}));
    record("restep_begin", static_cast<int64_t>(unit), step);
    host_update(unit, lr_, gradient_scale_, staged_rows(unit));
    record("restep_end", static_cast<int64_t>(unit), step);
  }
  deliver_staged(unit);
  record("sent", static_cast<int64_t>(unit), step);
}

void OptimizerOffload::apply_delayed(size_t unit) {
  at::NoGradGuard no_grad;
  if (!on_cuda_) model_.unit(unit).stepped_rows().copy_(staging_.at(unit));  // CUDA: send_to_device's copy
  send_to_device(unit);
}

at::Tensor& OptimizerOffload::master(size_t unit) {
  if (device_step_) device_step_->synchronize();
  return masters_.at(unit);
}

void OptimizerOffload::publish(size_t unit) {
  at::NoGradGuard no_grad;
  // The loaded optimizer's step count is where this run counts on from: a resumed run's delayed
  // update stays past its warm-up (the warm-up is the run's first steps, not each process's), and its
  // trace numbers its steps as the uninterrupted run's.
  steps_ = optimizer_->steps_taken();
  if (device_step_) {  // the rows live on the device only
    model_.unit(unit).stepped_rows().copy_(masters_.at(unit));  // rounds to the compute dtype
    model_.unit(unit).publish_shard();
    return;
  }
  rounded_destination(unit).copy_(masters_.at(unit));  // rounds to the compute dtype
#ifdef TRAINER_HAVE_CUDA
  // The copy overwrites rows the compute stream may still be writing or reading (the units' first
  // rounding at start-up, a forward): after everything queued there so far.
  if (on_cuda_) copies_->backward_done.record(c10::cuda::getCurrentCUDAStream(copies_->device));
#endif
  send_to_device(unit);
  if (lowrank_ && lowrank_->covers(unit)) lowrank_->publish(unit);  // the device projectors from the host state
}

void OptimizerOffload::worker_loop() {
  // The worker's own OpenMP thread count (a per-thread setting: its parallel regions, and ATen's
  // parallel_for on it, take it). Not at::set_num_threads, which also sets MKL's process-wide count:
  // the main thread's matmuls and norms would then split (and round) by the worker's count.
  omp_set_num_threads(intra_op_threads_);
#ifdef TRAINER_HAVE_CUDA
  // Its events, copies and page-locked buffers belong to the rank's GPU, not to GPU 0.
  std::optional<c10::cuda::CUDAGuard> on_device;
  if (on_cuda_) on_device.emplace(copies_->device);
#endif
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = queue_.front();  // popped once done: wait_all and the destructor wait for an empty queue
      working_ = true;
    }
    if (lag_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(lag_ms_));
    try {
      run(task);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.pop_front();
      working_ = false;
      if (task.job != Job::speculate) done_[task.unit] = true;  // a speculative step is done once resolved
    }
    changed_.notify_all();
  }
}

void OptimizerOffload::mark_done(size_t unit) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_[unit] = true;
  }
  changed_.notify_all();
}

void OptimizerOffload::wait_unit(size_t unit) {
  record("read_wait", static_cast<int64_t>(unit), steps_);
  if (!delayed_) wait_done(unit);
  order_after_update(unit);
  record("read", static_cast<int64_t>(unit), steps_);
}

void OptimizerOffload::wait_done(size_t unit) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_.at(unit) && failure_ == nullptr) {
      const auto started = std::chrono::steady_clock::now();
      changed_.wait(lock, [&] { return done_.at(unit) || failure_ != nullptr; });
      times_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    }
    if (failure_) std::rethrow_exception(failure_);
  }
}

void OptimizerOffload::record(const char* what, int64_t unit, int64_t step, int64_t bytes) {
  if (!trace_) return;
  const bool on_worker = std::this_thread::get_id() == worker_.get_id();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - built_).count();
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({sequence_++, step, what, unit, on_worker, seconds, bytes});
}

std::vector<OffloadEvent> OptimizerOffload::take_trace() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(events_, {});
}

OffloadTimes OptimizerOffload::take_times() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(times_, OffloadTimes{});
}

void OptimizerOffload::wait_all() {
  if (device_step_) device_step_->synchronize();  // the host buffers hold the last step
  for (size_t u = 0; u < done_.size(); ++u) wait_done(u);
  for (size_t u = 0; u < done_.size(); ++u) {
    bool pending = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending = pending_[u];
      pending_[u] = false;
    }
    if (pending) apply_delayed(u);
    order_after_update(u);  // the compute stream after the unit's copy
  }
}

void OptimizerOffload::settle() {
  if (delayed_) wait_all();
}

OwnedBytes OptimizerOffload::owned_bytes() const {
  OwnedBytes owned;
  owned.optimizer_host = host_bytes_;
  if (device_step_) owned.optimizer_device = device_step_->window_bytes();
  if (lowrank_) owned.optimizer_device = lowrank_->device_bytes();  // the projectors' device copies
  return owned;
}

}  // namespace llm
