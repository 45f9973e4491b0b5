// The "mpi" backend for device tensors: each collective copies its input into page-locked host
// buffers, runs on the MPI communicator there, and copies the result back. It exists so that a
// machine with one GPU can run the whole sharded step with CUDA tensors, streams, prefetch and
// offload at 2 or 4 ranks (NCCL refuses two ranks on one GPU), and so that a GPU node without
// working NCCL still trains. It is slow by design: every collective waits for its stream on the
// host, twice. Results equal the MPI backend's on the same values (the same MPI reductions), which
// the CPU tests check by running it over CPU tensors too (the copies then go host to host).
//
// Stream semantics follow the NCCL backend's contract from the caller's side: the collective is
// ordered after the work queued on its stream (or the device's current stream) and the work queued
// after it sees its result. Here that holds because the call returns only when the result is back
// in the output tensor (the stream is synchronised after the copy back).
//
// The staging buffers are made at the first collective that needs them, grown to the largest one
// seen, kept, and counted by the ledger (exact_pinned_bytes: page-locked with cudaHostAlloc).
#include <ATen/ATen.h>

#include "common/errors.h"
#include "common/memory_stats.h"
#include "sharding/communicator.h"

#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace llm {
namespace {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(const World& world, c10::Device device) : StagedCommunicator(make_mpi_communicator(world), device) {}
  // Over `host`, an MPI communicator of CPU tensors (a split of another staged one's).
  StagedCommunicator(std::unique_ptr<Communicator> host, c10::Device device)
      : Communicator(host->rank(), host->world_size(), device), host_(std::move(host)) {}

  std::string backend_name() const override { return "mpi (staged through host memory)"; }

 protected:
  void run_all_gather(const at::Tensor& input, const at::Tensor& output, bool /*in_place*/,
                      CollectiveStream stream) override {
    const Guard on(*this, stream);
    at::Tensor staged_output = staging(receive_, output);
    at::Tensor own_slice = staged_output.narrow(0, rank() * input.numel(), input.numel());
    own_slice.copy_(input.reshape({-1}), /*non_blocking=*/true);
    on.synchronize();
    // On the host the input is always staged as its own slice of the output (MPI_IN_PLACE): one
    // buffer, whether or not the caller's input was its slice of the output on the device.
    host_->all_gather(own_slice, staged_output);
    output.view({-1}).copy_(staged_output, /*non_blocking=*/true);
    on.synchronize();
  }

  void run_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                          CollectiveStream stream) override {
    const Guard on(*this, stream);
    at::Tensor staged_input = staging(send_, input), staged_output = staging(receive_, output);
    staged_input.copy_(input.reshape({-1}), /*non_blocking=*/true);
    on.synchronize();
    host_->reduce_scatter(staged_input, staged_output, op);
    output.view({-1}).copy_(staged_output, /*non_blocking=*/true);
    on.synchronize();
  }

  void run_all_reduce(const at::Tensor& tensor, ReduceOp op, CollectiveStream stream) override {
    in_place_through_host(tensor, stream, [&](const at::Tensor& staged) { host_->all_reduce(staged, op); });
  }

  void run_broadcast(const at::Tensor& tensor, int root, CollectiveStream stream) override {
    in_place_through_host(tensor, stream, [&](const at::Tensor& staged) { host_->broadcast(staged, root); });
  }

  // As NCCL's barrier: also the work queued on the current stream is done.
  void run_barrier() override {
    const Guard on(*this, std::nullopt);
    on.synchronize();
    host_->barrier();
  }

  // The host communicator split alike (collective over it), staged to this device.
  std::unique_ptr<Communicator> run_split(int color, int key, const std::vector<int>& members) override {
    std::unique_ptr<Communicator> host = host_->split(color, key);
    if (members.size() == 1) return nullptr;
    return std::make_unique<StagedCommunicator>(std::move(host), device());
  }

 private:
  // The collective's stream made current (CUDA), and the host wait for it.
  class Guard {
   public:
    Guard(const StagedCommunicator& communicator, const CollectiveStream& stream) {
#ifdef TRAINER_HAVE_CUDA
      if (communicator.device().is_cuda()) {
        stream_.emplace(stream ? c10::cuda::CUDAStream(*stream)
                               : c10::cuda::getCurrentCUDAStream(communicator.device().index()));
        guard_.emplace(*stream_);
      }
#else
      (void)communicator;
      (void)stream;
#endif
    }
    void synchronize() const {
#ifdef TRAINER_HAVE_CUDA
      if (stream_) stream_->synchronize();
#endif
    }

   private:
#ifdef TRAINER_HAVE_CUDA
    std::optional<c10::cuda::CUDAStream> stream_;
    std::optional<c10::cuda::CUDAStreamGuard> guard_;
#endif
  };

  // The in-place collectives: tensor -> a host buffer, `collective` there, -> tensor.
  template <typename Collective>
  void in_place_through_host(const at::Tensor& tensor, const CollectiveStream& stream, Collective collective) {
    const Guard on(*this, stream);
    at::Tensor staged = staging(send_, tensor);
    staged.copy_(tensor.reshape({-1}), /*non_blocking=*/true);
    on.synchronize();
    collective(staged);
    tensor.view({-1}).copy_(staged, /*non_blocking=*/true);
    on.synchronize();
  }

  // `like`'s elements in `buffer`, grown (page-locked for a CUDA device) when too small: a flat
  // host tensor of like's dtype and element count.
  at::Tensor staging(at::Tensor& buffer, const at::Tensor& like) {
    const int64_t bytes = like.numel() * static_cast<int64_t>(like.element_size());
    if (!buffer.defined() || buffer.numel() < bytes) {
      buffer = at::Tensor();  // the smaller one goes first
      buffer = exact_host_buffer(bytes, at::kByte, device());
    }
    return buffer.narrow(0, 0, bytes).view(like.scalar_type());
  }

  std::unique_ptr<Communicator> host_;  // MPI over CPU tensors
  at::Tensor send_, receive_;           // (bytes) uint8 host, page-locked for a CUDA device
};

}  // namespace

std::unique_ptr<Communicator> make_staged_mpi_communicator(const World& world, c10::Device device) {
  LLM_REQUIRE(device.is_cpu() || (device.is_cuda() && device.has_index()), "make_communicator", "device",
              "the staged MPI backend needs cpu or a GPU with its index, e.g. cuda:0; got '" + device.str() + "'");
  return std::make_unique<StagedCommunicator>(world, device);
}

}  // namespace llm
