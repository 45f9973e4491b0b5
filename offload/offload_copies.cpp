// What crosses the bus for OptimizerOffload, and when (offload/optimizer_offload.h has the schedule):
// a unit's gradient to its landing buffer, GaLore's low-rank gradients, the updated rows back.
#include <ATen/core/grad_mode.h>

#include "offload/lowrank_gradients.h"
#include "offload/offload_copies.h"
#include "sharding/sharded_model.h"

namespace llm {

void OptimizerOffload::land_gradient(size_t unit) {
  // The unit gives its shard up: when this reference goes, the device memory is free again.
  ShardedUnit& sharded = model_.unit(unit);
  at::Tensor shard = sharded.take_gradient_shard();
#ifdef TRAINER_HAVE_CUDA
  // The shard is final once the compute stream reaches here (a resident unit's reduction ran there;
  // copy_to_host orders after it) and the reduce stream is past its reduce-scatter (a sharded unit's).
  if (on_cuda_) sharded.order_after_reduce(copies_->to_host.unwrap());
#endif
  copy_to_host(unit, {{gradients_.at(unit), shard}});
}

// Each (host, device) pair's device tensor into its host one, after everything queued on the compute
// stream so far; the unit's landing event marks them done (CUDA: on the copy stream; CPU: in line).
void OptimizerOffload::copy_to_host(size_t unit, const std::vector<std::pair<at::Tensor, at::Tensor>>& copies) {
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_) {
    c10::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(copies_->device));
    ready.block(copies_->to_host);
    c10::cuda::CUDAStreamGuard on_copy_stream(copies_->to_host);
    for (const auto& [host, device] : copies) {
      host.copy_(device, /*non_blocking=*/true);
      // The block was allocated on the compute stream and is read by the copy stream: the caching
      // allocator must not hand it out again before the copy is done. recordStream defers its reuse
      // to that point (an event it queries at later allocations), as FSDP does for its reduce-scatter
      // outputs handed across streams.
      device.record_stream(copies_->to_host.unwrap());
    }
    copies_->gradient_landed.at(unit).record(copies_->to_host);
    return;
  }
#endif
  for (const auto& [host, device] : copies) host.copy_(device);
}

at::Tensor& OptimizerOffload::staged_rows(size_t unit) {
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_ && !model_.unit(unit).parameters_offloaded())
    copies_->update_landed.at(unit).synchronize();  // the staging buffer's last H2D copy is done
#endif
  return staging_.at(unit);
}

// The staged rows where the unit's next read finds them: over the host compute shard (a CPU rank, or
// parameter offload once the last gather has read it) or across the bus (send_to_device).
void OptimizerOffload::deliver_staged(size_t unit) {
  ShardedUnit& sharded = model_.unit(unit);
  if (sharded.parameters_offloaded()) {
    sharded.wait_host_reads();
    sharded.stepped_rows().copy_(staging_.at(unit));
  } else if (!on_cuda_) {
    sharded.stepped_rows().copy_(staging_.at(unit));
  }
  send_to_device(unit);
}

at::Tensor& OptimizerOffload::rounded_destination(size_t unit) {
  ShardedUnit& sharded = model_.unit(unit);
  if (sharded.parameters_offloaded()) {
    sharded.wait_host_reads();  // every gather issued so far has copied the shard to the device
    return sharded.stepped_rows();
  }
  if (on_cuda_) return staged_rows(unit);
  // Delayed, the forward and backward read the compute shard while the step runs: staged instead.
  return delayed_ ? staging_.at(unit) : sharded.stepped_rows();
}

void OptimizerOffload::send_to_device(size_t unit) {
  ShardedUnit& sharded = model_.unit(unit);
#ifdef TRAINER_HAVE_CUDA
  // A host compute shard (parameter offload) crosses at its next gather instead.
  if (on_cuda_ && !sharded.parameters_offloaded()) {
    copies_->backward_done.block(copies_->to_device);
    c10::cuda::CUDAStreamGuard on_copy_stream(copies_->to_device);
    sharded.stepped_rows().copy_(staging_.at(unit), /*non_blocking=*/true);
    sharded.publish_shard();  // no_shard's parameters from the compute shard
    copies_->update_landed.at(unit).record(copies_->to_device);
    return;
  }
#endif
  sharded.publish_shard();
}

void OptimizerOffload::order_after_update(size_t unit) {
#ifdef TRAINER_HAVE_CUDA
  if (on_cuda_) copies_->update_landed.at(unit).block(c10::cuda::getCurrentCUDAStream(copies_->device));
#else
  (void)unit;
#endif
}

void OptimizerOffload::land_lowrank(size_t unit, double gradient_scale) {
  at::NoGradGuard no_grad;
  ShardedUnit& sharded = model_.unit(unit);
  sharded.wait_reduced();  // the device half reads the shard on the compute stream
  const std::vector<std::pair<at::Tensor, at::Tensor>> copies =
      lowrank_->prepare(unit, sharded.gradient_shard(), gradient_scale);
  int64_t bytes = 0;
  for (const auto& copy : copies) bytes += static_cast<int64_t>(copy.second.nbytes());
  record("lowrank", static_cast<int64_t>(unit), steps_, bytes);
  copy_to_host(unit, copies);
}

}  // namespace llm
