#include "offload/optimizer_offload.h"

#include <algorithm>

#include <omp.h>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include <chrono>
#include <optional>
#include <utility>

#include "common/errors.h"
#include "common/memory_stats.h"
#include "sharding/sharded_model.h"

#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace llm {

#ifdef TRAINER_HAVE_CUDA
struct OptimizerOffload::CudaCopies {
  c10::DeviceIndex device;
  c10::cuda::CUDAStream to_host, to_device;
  // Per unit: the gradient left the device (D2H) / the compute shard holds the update (H2D) / the
  // compute stream is past its last read of the unit before the H2D copy overwrites it.
  std::vector<c10::cuda::CUDAEvent> gradient_landed, update_landed;
  c10::cuda::CUDAEvent backward_done;
  explicit CudaCopies(c10::DeviceIndex index, size_t units)
      : device(index),
        to_host(c10::cuda::getStreamFromPool(false, index)),
        to_device(c10::cuda::getStreamFromPool(false, index)),
        gradient_landed(units),
        update_landed(units) {}
};
#else
struct OptimizerOffload::CudaCopies {};
#endif

int offload_worker_threads(int rank_threads, bool on_cuda, int requested) {
  if (requested > 0) return requested;
  return on_cuda ? std::max(1, rank_threads - 1) : std::max(1, rank_threads);
}

OptimizerOffload::OptimizerOffload(ShardedModel& model, const OptimizerSettings& settings,
                                   std::vector<std::vector<UpdateRule>> rules, Communicator* across, int worker_threads,
                                   int64_t delayed_after)
    : model_(model), delayed_after_(delayed_after) {
  LLM_REQUIRE(rules.size() == model.unit_count(), "offload", "rules", "needs the update rules of every unit");
  at::NoGradGuard no_grad;
  const size_t units = model.unit_count();
  const c10::Device device = units > 0 ? model.unit(0).gradient_shard().device() : c10::Device(c10::kCPU);
  on_cuda_ = device.is_cuda();
  intra_op_threads_ = offload_worker_threads(at::get_num_threads(), on_cuda_, worker_threads);
  std::vector<UnitShard> shards;
  for (size_t u = 0; u < units; ++u) {
    ShardedUnit& unit = model.unit(u);
    LLM_REQUIRE(!unit.master_offloaded(), "offload", unit.name(), "the master is offloaded already");
    const int64_t numel = unit.layout().shard_numel;
    const at::TensorOptions host = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
    // Master and state in pageable host memory: they never cross the bus. The buffers the copies
    // read or write are page-locked on CUDA, so the copies are DMA and asynchronous.
    masters_.push_back(at::empty({numel}, host));
    masters_.back().copy_(unit.master_shard());
    // Exact sizes (common/memory_stats.h): the caching host allocator would round each up to a
    // power of two, up to twice the pinned memory the estimate counts.
    // bf16 where the unit's shard is (pure bf16 AdamW at one rank): half the bytes across the bus and
    // into the host step, which reads bf16 gradients.
    gradients_.push_back(exact_host_buffer(numel, unit.gradient_dtype(), device));
    // With parameter offload the unit's compute shard is in host memory already: the step writes it.
    LLM_REQUIRE(delayed_after_ < 0 || !unit.parameters_offloaded(), "offload", "--offload_delayed_update",
                "needs the units' rows on the device (not --offload parameters)");
    // A delayed update waits here, also on a CPU rank, until the step after the one that made it.
    if ((on_cuda_ || delayed_after_ >= 0) && !unit.parameters_offloaded()) {
      staging_.push_back(exact_host_buffer(numel, model.options().compute_dtype, device));
      staging_.back().copy_(masters_.back());  // the padding rows, which no step writes
    } else {
      staging_.emplace_back();
    }
    unit.offload_master();
    unit.make_gradient_transient();  // each step's shard is handed to gradient_ready(), then freed
    shards.push_back({unit.layout(), masters_.back(), gradients_.back(), std::move(rules[u])});
  }
  optimizer_ = std::make_unique<ShardOptimizer>(settings, std::move(shards), across);
  done_.assign(units, true);
  pending_.assign(units, false);
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
}

void OptimizerOffload::gradient_ready(size_t unit) {
  at::NoGradGuard no_grad;
  if (delayed_) wait_done(unit);  // the last step's host update of the unit has read its landing buffer
  // The unit gives its shard up: when this reference goes, the device memory is free again.
  ShardedUnit& sharded = model_.unit(unit);
  at::Tensor shard = sharded.take_gradient_shard();
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_) {
    // The shard is final once the compute stream reaches here (a resident unit's reduction ran
    // there) and the reduce stream is past its reduce-scatter (a sharded unit's).
    c10::cuda::CUDAEvent reduced;
    reduced.record(c10::cuda::getCurrentCUDAStream(copies_->device));
    reduced.block(copies_->to_host);
    sharded.order_after_reduce(copies_->to_host.unwrap());
    c10::cuda::CUDAStreamGuard on_copy_stream(copies_->to_host);
    gradients_.at(unit).copy_(shard, /*non_blocking=*/true);
    copies_->gradient_landed.at(unit).record(copies_->to_host);
    // The block was allocated on the compute stream and is read by the copy stream: the caching
    // allocator must not hand it out again before the copy is done. recordStream defers its reuse
    // to that point (an event it queries at later allocations), as FSDP does for its reduce-scatter
    // outputs handed across streams.
    shard.record_stream(copies_->to_host.unwrap());
    return;
  }
#endif
  gradients_.at(unit).copy_(shard);
}

void OptimizerOffload::step(double lr, double gradient_scale) {
#ifdef TRAINER_HAVE_CUDA
  // The H2D copies below (and a delayed update's, applied by wait_all) overwrite compute shards that
  // this step's kernels read (a resident unit's parameters are views of its shard): they go after
  // everything queued so far.
  if (on_cuda_) copies_->backward_done.record(c10::cuda::getCurrentCUDAStream(copies_->device));
#endif
  wait_all();  // the last step's updates are all on the device (and the worker is idle)
  ++steps_;
  delayed_ = delayed_after_ >= 0 && steps_ > delayed_after_;
  optimizer_->begin_step();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lr_ = lr;
    gradient_scale_ = gradient_scale;
  }
  std::vector<size_t> collective;
  for (const UnitAction& action : model_.plan().optimizer_pass()) {
    const size_t u = static_cast<size_t>(action.unit);
    std::lock_guard<std::mutex> lock(mutex_);
    done_[u] = false;
    if (optimizer_->unit_needs_collectives(u))
      collective.push_back(u);
    else
      queue_.push_back(u);
  }
  changed_.notify_all();
  // The collective units on this thread, in the plan's order on every rank (see the header).
  for (size_t u : collective) {
    step_on_host(u);
    mark_done(u);
  }
}

void OptimizerOffload::step_on_host(size_t unit) {
  at::NoGradGuard no_grad;
  const auto started = std::chrono::steady_clock::now();
  struct AddTime {
    OptimizerOffload& offload;
    std::chrono::steady_clock::time_point started;
    ~AddTime() {
      std::lock_guard<std::mutex> lock(offload.mutex_);
      offload.times_.host_step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    }
  } add_time{*this, started};
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_) copies_->gradient_landed.at(unit).synchronize();
#endif
  // The step scales the gradient by the clip coefficient as it reads it and writes the updated rows,
  // rounded, straight into what goes to the device (AdamW's host kernel, one pass): the staging
  // buffer on CUDA, the unit's compute shard on a CPU rank.
  optimizer_->step_unit(unit, lr_, rounded_destination(unit), gradient_scale_);
  if (delayed_) {  // staged: wait_all() at the next step (or a checkpoint, an evaluation) applies it
    std::lock_guard<std::mutex> lock(mutex_);
    pending_[unit] = true;
    return;
  }
  send_to_device(unit);
}

void OptimizerOffload::apply_delayed(size_t unit) {
  at::NoGradGuard no_grad;
  if (!on_cuda_) model_.unit(unit).compute_shard().copy_(staging_.at(unit));  // CUDA: send_to_device's copy
  send_to_device(unit);
}

at::Tensor& OptimizerOffload::rounded_destination(size_t unit) {
  ShardedUnit& sharded = model_.unit(unit);
  if (sharded.parameters_offloaded()) {
    sharded.wait_host_reads();  // every gather issued so far has copied the shard to the device
    return sharded.compute_shard();
  }
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_) {
    copies_->update_landed.at(unit).synchronize();  // the staging buffer's last H2D copy is done
    return staging_.at(unit);
  }
#endif
  // Delayed, the forward and backward read the compute shard while the step runs: staged instead.
  return delayed_ ? staging_.at(unit) : sharded.compute_shard();
}

void OptimizerOffload::publish(size_t unit) {
  at::NoGradGuard no_grad;
  rounded_destination(unit).copy_(masters_.at(unit));  // rounds to the compute dtype
  send_to_device(unit);
}

void OptimizerOffload::send_to_device(size_t unit) {
  ShardedUnit& sharded = model_.unit(unit);
#ifdef TRAINER_HAVE_CUDA
  // A host compute shard (parameter offload) crosses at its next gather instead.
  if (on_cuda_ && !sharded.parameters_offloaded()) {
    copies_->backward_done.block(copies_->to_device);
    c10::cuda::CUDAStreamGuard on_copy_stream(copies_->to_device);
    sharded.compute_shard().copy_(staging_.at(unit), /*non_blocking=*/true);
    sharded.publish_shard();  // no_shard's parameters from the compute shard
    copies_->update_landed.at(unit).record(copies_->to_device);
    return;
  }
#endif
  sharded.publish_shard();
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
    size_t unit = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      unit = queue_.front();
    }
    try {
      step_on_host(unit);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.pop_front();
      done_[unit] = true;
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
  if (!delayed_) wait_done(unit);
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_) copies_->update_landed.at(unit).block(c10::cuda::getCurrentCUDAStream(copies_->device));
#endif
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

OffloadTimes OptimizerOffload::take_times() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(times_, OffloadTimes{});
}

void OptimizerOffload::wait_all() {
  for (size_t u = 0; u < done_.size(); ++u) wait_done(u);
  for (size_t u = 0; u < done_.size(); ++u) {
    bool pending = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending = pending_[u];
      pending_[u] = false;
    }
    if (pending) apply_delayed(u);
    wait_unit(u);  // (delayed: no wait for the worker) the compute stream after the unit's copy
  }
}

void OptimizerOffload::settle() {
  if (delayed_) wait_all();
}

OwnedBytes OptimizerOffload::owned_bytes() const {
  OwnedBytes owned;
  owned.optimizer_host = optimizer_->state_bytes();
  for (const std::vector<at::Tensor>* buffers : {&masters_, &gradients_, &staging_})
    for (const at::Tensor& buffer : *buffers)
      if (buffer.defined()) owned.optimizer_host += static_cast<int64_t>(buffer.nbytes());
  return owned;
}

}  // namespace llm
