#include "offload/device_step.h"

#include <algorithm>
#include <utility>

#include <ATen/ops/empty.h>

#include "common/errors.h"

#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace llm {
namespace {

int64_t unit_bytes(const ShardOptimizer::UnitBuffers& buffers) {
  return static_cast<int64_t>(buffers.master.nbytes() + buffers.projector.nbytes() + buffers.exp_avg.nbytes() +
                              buffers.exp_avg_sq.nbytes());
}

// One window's bytes: the largest unit's master and state (the estimate's estimate_masters_and_state
// with largest, memory/estimate_optimizer.h).
int64_t window_bytes_for(const std::vector<ShardOptimizer::UnitBuffers>& units) {
  int64_t largest = 0;
  for (const ShardOptimizer::UnitBuffers& unit : units) largest = std::max(largest, unit_bytes(unit));
  return largest;
}

}  // namespace

#ifdef TRAINER_HAVE_CUDA
struct DeviceStep::Streams {
  c10::cuda::CUDAStream to_device, to_host;
  std::vector<c10::cuda::CUDAEvent> window_in, window_free;  // per window
  std::vector<c10::cuda::CUDAEvent> unit_back;               // per unit: its host buffers are final
  Streams(c10::DeviceIndex device, size_t units)
      : to_device(c10::cuda::getStreamFromPool(false, device)),
        to_host(c10::cuda::getStreamFromPool(false, device)),
        window_in(2),
        window_free(2),
        unit_back(units) {}
};
#else
struct DeviceStep::Streams {};
#endif

DeviceStep::DeviceStep(ShardOptimizer& optimizer, std::vector<ShardOptimizer::UnitBuffers> host, c10::Device device)
    : optimizer_(optimizer), host_(std::move(host)), device_(device) {
  LLM_REQUIRE(host_.size() == optimizer_.unit_count(), "offload", "--offload_step device",
              "needs every unit's host buffers");
  const int64_t bytes = std::max<int64_t>(window_bytes_for(host_), 1);
  for (int w = 0; w < 2; ++w)
    windows_.push_back(at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_)));
#ifdef TRAINER_HAVE_CUDA
  if (device_.is_cuda()) streams_ = std::make_unique<Streams>(device_.index(), host_.size());
#endif
}

DeviceStep::~DeviceStep() {
#ifdef TRAINER_HAVE_CUDA
  // The windows go back to the caching allocator and the host buffers with their owner: the copies
  // that read and write them first.
  if (streams_) {
    streams_->to_device.synchronize();
    streams_->to_host.synchronize();
  }
#endif
}

int64_t DeviceStep::window_bytes() const {
  return 2 * static_cast<int64_t>(windows_.front().nbytes());
}

ShardOptimizer::UnitBuffers DeviceStep::window_views(size_t window, size_t unit) const {
  const ShardOptimizer::UnitBuffers& host = host_.at(unit);
  ShardOptimizer::UnitBuffers views;
  int64_t offset = 0;
  // fp32 first (master, projector), then the moments (fp32 or bf16): every part starts at a multiple
  // of its element size.
  for (auto [view, from] : {std::pair{&views.master, &host.master}, std::pair{&views.projector, &host.projector},
                            std::pair{&views.exp_avg, &host.exp_avg}, std::pair{&views.exp_avg_sq, &host.exp_avg_sq}}) {
    const int64_t bytes = static_cast<int64_t>(from->nbytes());
    *view = windows_.at(window).narrow(0, offset, bytes).view(from->scalar_type());
    offset += bytes;
  }
  return views;
}

void DeviceStep::step_unit(size_t unit, double lr, double scale, const at::Tensor& gradient, at::Tensor& compute_out) {
  const size_t window = next_window_;
  next_window_ = 1 - next_window_;
  const ShardOptimizer::UnitBuffers views = window_views(window, unit);
  const ShardOptimizer::UnitBuffers& host = host_.at(unit);
#ifdef TRAINER_HAVE_CUDA
  if (streams_) {
    Streams& s = *streams_;
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    {
      c10::cuda::CUDAStreamGuard on_copy(s.to_device);
      s.window_free.at(window).block(s.to_device);  // (a never-recorded event blocks nothing)
      s.unit_back.at(unit).block(s.to_device);      // the unit's last step is back in its host buffers
      views.copy_from(host, /*non_blocking=*/true);
      s.window_in.at(window).record(s.to_device);
    }
    s.window_in.at(window).block(compute);
  } else
#endif
  {
    views.copy_from(host);
  }
  // The step itself, on the compute stream: the optimizer pointed at the window for the call.
  optimizer_.rebind_unit(unit, views);
  optimizer_.set_unit_gradient(unit, gradient);
  struct PointBack {  // however the step ends, the optimizer holds the host buffers again
    ShardOptimizer& optimizer;
    size_t unit;
    const ShardOptimizer::UnitBuffers& host;
    ~PointBack() {
      optimizer.set_unit_gradient(unit, at::Tensor());
      optimizer.rebind_unit(unit, host);
    }
  } point_back{optimizer_, unit, host};
  optimizer_.step_unit(unit, lr, compute_out, scale);
#ifdef TRAINER_HAVE_CUDA
  if (streams_) {
    Streams& s = *streams_;
    c10::cuda::CUDAEvent stepped;
    stepped.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    stepped.block(s.to_host);
    c10::cuda::CUDAStreamGuard on_copy(s.to_host);
    host.copy_from(views, /*non_blocking=*/true);
    s.window_free.at(window).record(s.to_host);
    s.unit_back.at(unit).record(s.to_host);
    return;
  }
#endif
  host.copy_from(views);
}

void DeviceStep::synchronize() {
#ifdef TRAINER_HAVE_CUDA
  if (streams_) streams_->to_host.synchronize();
#endif
}

}  // namespace llm
