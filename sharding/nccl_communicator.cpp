// The NCCL backend: CUDA tensors, one NCCL communicator per rank bound to that rank's GPU.
//
// Bootstrap: rank 0 draws an ncclUniqueId and broadcasts it over MPI_COMM_WORLD; every rank then
// calls ncclCommInitRank (collective, blocking). We link the libnccl.so.2 of the torch wheel, the
// copy libtorch_cuda already loads, so the process holds one NCCL (the CMake file says how).
//
// Collectives are enqueued on a stream and return at once: the current CUDA stream of the
// communicator's device by default, or the stream the caller gives. Nothing here waits on the
// host except barrier(). Average uses ncclAvg (NCCL pre-multiplies floating inputs by 1/n, so
// no divide kernel and no second pass).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <mpi.h>

#include <exception>

#include "common/errors.h"
#include "common/log.h"
#include "sharding/communicator.h"
#include "sharding/nccl_check.h"

namespace llm {
namespace {

ncclDataType_t nccl_datatype(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kBFloat16: return ncclBfloat16;
    default: return ncclInt64;  // Communicator::check_tensor admits nothing else
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclAvg; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const World& world, c10::Device device)
      : Communicator(world.rank, world.world_size, device) {
    c10::cuda::CUDAGuard device_guard(device.index());
    if (world.rank == 0) log_version();

    ncclUniqueId id{};
    if (world.rank == 0) LLM_CHECK_NCCL(ncclGetUniqueId(&id));
    LLM_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    LLM_CHECK_NCCL(ncclCommInitRank(&comm_, world.world_size, id, world.rank));
    barrier_flag_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  }

  // Takes `comm` (a split's), `members` ranks of it.
  NcclCommunicator(ncclComm_t comm, int rank, int size, c10::Device device) : Communicator(rank, size, device), comm_(comm) {
    barrier_flag_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  }

  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    // Never throws: a destructor may run while another error unwinds the stack.
    c10::cuda::CUDAGuard device_guard(device().index());
    if (std::uncaught_exceptions() > 0) {
      // An error is on its way out (maybe a peer died): ncclCommFinalize would wait for the work
      // queued with that peer, forever, before main() could end the job. Abort drops it at once.
      const ncclResult_t aborted = ncclCommAbort(comm_);
      if (aborted != ncclSuccess)
        log::warn("rank " + std::to_string(rank()) + ": aborting the NCCL communicator failed: " +
                  nccl_error_detail(aborted));
      return;
    }
    const ncclResult_t finalized = ncclCommFinalize(comm_);
    const ncclResult_t destroyed = ncclCommDestroy(comm_);
    if (finalized != ncclSuccess || destroyed != ncclSuccess)
      log::warn("rank " + std::to_string(rank()) + ": releasing the NCCL communicator failed: " +
                nccl_error_detail(finalized != ncclSuccess ? finalized : destroyed));
  }

  std::string backend_name() const override { return "nccl"; }

 protected:
  void run_all_gather(const at::Tensor& input, const at::Tensor& output, bool,
                      CollectiveStream stream) override {
    // In place needs nothing special: NCCL accepts sendbuff == recvbuff + rank * count.
    c10::cuda::CUDAGuard device_guard(device().index());
    LLM_CHECK_NCCL(ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                                 nccl_datatype(input), comm_, cuda_stream(stream)));
  }

  void run_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                          CollectiveStream stream) override {
    c10::cuda::CUDAGuard device_guard(device().index());
    LLM_CHECK_NCCL(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                     nccl_datatype(input), nccl_op(op), comm_,
                                     cuda_stream(stream)));
  }

  void run_all_reduce(const at::Tensor& tensor, ReduceOp op, CollectiveStream stream) override {
    c10::cuda::CUDAGuard device_guard(device().index());
    LLM_CHECK_NCCL(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                 nccl_datatype(tensor), nccl_op(op), comm_, cuda_stream(stream)));
  }

  void run_broadcast(const at::Tensor& tensor, int root, CollectiveStream stream) override {
    c10::cuda::CUDAGuard device_guard(device().index());
    LLM_CHECK_NCCL(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                 nccl_datatype(tensor), root, comm_, cuda_stream(stream)));
  }

  // ncclCommSplit, collective over this communicator; no shared resources (splitShare 0): the
  // split's collectives run beside this one's on other streams (the reduce and gather streams).
  std::unique_ptr<Communicator> run_split(int color, int key, const std::vector<int>& members) override {
    c10::cuda::CUDAGuard device_guard(device().index());
    ncclComm_t part = nullptr;
    LLM_CHECK_NCCL(ncclCommSplit(comm_, members.size() == 1 ? NCCL_SPLIT_NOCOLOR : color, key, &part, nullptr));
    if (members.size() == 1) return nullptr;
    int rank = 0, size = 0;
    LLM_CHECK_NCCL(ncclCommUserRank(part, &rank));
    LLM_CHECK_NCCL(ncclCommCount(part, &size));
    return std::make_unique<NcclCommunicator>(part, rank, size, device());
  }

  // NCCL has no barrier: a one-element all-reduce proves every rank got here, and waiting for
  // the stream proves the work queued before it finished.
  void run_barrier() override {
    c10::cuda::CUDAGuard device_guard(device().index());
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device().index());
    LLM_CHECK_NCCL(ncclAllReduce(barrier_flag_.data_ptr(), barrier_flag_.data_ptr(), 1,
                                 ncclFloat32, ncclSum, comm_, stream.stream()));
    LLM_CHECK_CUDA(cudaStreamSynchronize(stream.stream()));
  }

 private:
  cudaStream_t cuda_stream(const CollectiveStream& stream) const {
    if (stream) return c10::cuda::CUDAStream(*stream).stream();
    return c10::cuda::getCurrentCUDAStream(device().index()).stream();
  }

  static void log_version() {
    int version = 0;
    LLM_CHECK_NCCL(ncclGetVersion(&version));
    // NCCL_VERSION_CODE encodes major * 10000 + minor * 100 + patch since 2.9.
    const auto dotted = [](int major, int minor, int patch) {
      return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    };
    log::info("NCCL " + dotted(version / 10000, version / 100 % 100, version % 100) +
              " (built against " + dotted(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) + ")");
  }

  ncclComm_t comm_ = nullptr;
  at::Tensor barrier_flag_;  // (1) fp32 on the device, the barrier's all-reduce buffer
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const World& world, c10::Device device) {
  LLM_REQUIRE(device.is_cuda() && device.has_index(), "make_communicator", "device",
              "the NCCL backend needs a GPU with its index, e.g. cuda:0; got '" + device.str() +
                  "'");
  const int gpus = c10::cuda::device_count();
  LLM_REQUIRE(device.index() < gpus, "make_communicator", "device",
              device.str() + " does not exist: this host has " + std::to_string(gpus) +
                  " visible GPU(s) (check CUDA_VISIBLE_DEVICES and the ranks per host)");
  return std::make_unique<NcclCommunicator>(world, device);
}

}  // namespace llm
