// --offload_step device: the optimizer's step on the device, over master and state kept in host
// memory (LLMQ's and Megatron-Core's way): per unit, in the optimizer's order, the unit's master and
// state cross to one of two device windows, the same step as without offload runs there (the device
// AdamW kernel, its clip folded in, writing the unit's compute rows in the same pass), and the
// results cross back. Two windows, so unit u + 1's state crosses while u steps and u - 1's returns.
//
// On CUDA the host buffers are page-locked and every copy is asynchronous:
//   to_device stream   window w free (its last copy back done) and unit u's own last copy back
//                      done, then u's master and state into window w, then an event
//   compute stream     waits for that event; ShardOptimizer::step_unit on the window's views (the
//                      optimizer is pointed at them for the call, ShardOptimizer::rebind_unit, and
//                      back), reading the unit's gradient shard on the device
//   to_host stream     after the step (an event), the window back into u's host buffers; events
//                      mark the window and the unit free
// The next forward reads the compute rows on the compute stream, after the step: nothing waits on
// the host. synchronize() waits for every copy back (a checkpoint reads the host buffers).
// On a CPU rank the "device" is the host: the same schedule with in-line copies (what the CPU tests
// check). Each step reads and writes exactly what the step without offload does, so the results are
// its bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "optim/shard_optimizer.h"

namespace llm {

class DeviceStep {
 public:
  // host: per unit, the buffers the optimizer is bound to between steps (page-locked on CUDA).
  // Allocates two windows on `device`, each the largest unit's master and state.
  DeviceStep(ShardOptimizer& optimizer, std::vector<ShardOptimizer::UnitBuffers> host, c10::Device device);
  ~DeviceStep();
  DeviceStep(const DeviceStep&) = delete;
  DeviceStep& operator=(const DeviceStep&) = delete;

  // One unit's step (after begin_step(); scale: the clip coefficient), reading `gradient` (the
  // unit's shard on the device) and writing compute_out (the unit's compute shard on the device).
  void step_unit(size_t unit, double lr, double scale, const at::Tensor& gradient, at::Tensor& compute_out);
  // Every copy back is done: the host buffers hold the last step.
  void synchronize();
  // The two windows' bytes (device memory the optimizer holds).
  int64_t window_bytes() const;

 private:
  struct Streams;  // CUDA streams and events (device_step.cpp)

  ShardOptimizer::UnitBuffers window_views(size_t window, size_t unit) const;

  ShardOptimizer& optimizer_;
  std::vector<ShardOptimizer::UnitBuffers> host_;
  c10::Device device_;
  std::vector<at::Tensor> windows_;  // two byte buffers, each the largest unit's four buffers
  size_t next_window_ = 0;
  std::unique_ptr<Streams> streams_;
};

}  // namespace llm
