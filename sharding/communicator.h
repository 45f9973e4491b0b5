// Collectives for flat shards, behind one interface with three backends.
//
// FSDP needs four collectives (all-gather a unit's shard before use, reduce-scatter its gradient
// after backward, all-reduce a few norms and counters, broadcast at start-up) and a barrier. Which
// library carries them depends on where the tensors live, so the choice is made once, by
// make_communicator(), and nothing above this file names MPI or NCCL:
//   * "single": a world of one. all_gather and reduce_scatter are copies, everything else does
//     nothing; no MPI call in the hot path. Takes tensors on its device (CPU or CUDA).
//   * "mpi":    CPU tensors over MPI, on a duplicate of MPI_COMM_WORLD so that our traffic never
//     matches anybody else's. Blocking: when a call returns the result is in place.
//   * "nccl":   CUDA tensors over NCCL, one communicator per rank bound to its GPU. Calls enqueue
//     on a stream and return at once (no host synchronisation, except barrier()).
//   * "mpi (staged through host memory)": tensors of any device over MPI, through page-locked host
//     buffers (staged_communicator.cpp): several ranks on one GPU, or GPUs without NCCL. Blocking,
//     like the MPI backend; slow by design. LLM_DEBUG_STAGE_MPI=1 makes make_communicator pick it
//     for CPU ranks too, so the CPU tests run the trainer through its staging.
//
// Layout conventions (NCCL's, which the flat shard layout relies on):
//   all_gather:     input (n) -> output (world_size * n), rank-major: rank r's input lands at
//                   output[r * n : (r + 1) * n].
//   reduce_scatter: input (world_size * n) -> output (n): rank r receives the reduction of
//                   every rank's input[r * n : (r + 1) * n].
// Tensors must be contiguous, on the communicator's device, of one dtype: float32, bfloat16 or
// int64 (int64 for step counters and token counts; average needs a floating dtype). Shapes are
// free, only element counts matter. Input and output must not overlap, except the in-place
// all_gather where input is exactly this rank's slice of output. Violations throw llm::UserError
// naming the collective, the backend and the argument, before any communication. The other ranks
// may by then be waiting in that collective: the caller ends the job with abort_world()
// (sharding/world.h), as trainer's main() does.
//
// Every rank must call the same collectives in the same order with the same sizes; constructing a
// communicator is itself collective.
//
// Streams (NCCL): by default a collective runs on the current CUDA stream of the communicator's
// device (c10::cuda::getCurrentCUDAStream), so it is ordered after the kernels that produced its
// input. Pass a stream to run it elsewhere, e.g. a communication stream for all-gather prefetch.
// The caller then orders the streams with events, and keeps the tensors alive until the stream
// has used them: we do not call recordStream, which would hand the caching allocator a
// non-deterministic free time (FSDP2 dropped it for the same reason).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sharding/world.h"

namespace llm {

enum class ReduceOp { sum, average };
std::string reduce_op_name(ReduceOp op);

// Where a GPU collective runs; std::nullopt means the current stream of the communicator's device.
// CPU backends accept only std::nullopt.
using CollectiveStream = std::optional<c10::Stream>;

// What a communicator's collectives carried since the last take_traffic(): the bytes this rank sent,
// counted as the bandwidth-optimal (ring) algorithms send them on W ranks (all_gather: (W - 1) times
// the input; reduce_scatter: (W - 1) times the output; all_reduce: 2 (W - 1) / W of the tensor;
// broadcast: (W - 1) / W of it, on average over the ranks), the seconds its calls took on the host
// (NCCL: to enqueue), and how many there were. Per communicator, so hybrid sharding's step record
// says what crossed inside a group and what across groups (docs/multinode.md has the formulas and
// the interfaces' own counts beside them).
struct LinkTraffic {
  int64_t bytes_sent = 0;
  double seconds = 0;
  int64_t collectives = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  c10::Device device() const { return device_; }
  virtual std::string backend_name() const = 0;  // "single", "mpi" or "nccl"

  // input (n) -> output (world_size * n), rank-major.
  void all_gather(const at::Tensor& input, const at::Tensor& output,
                  CollectiveStream stream = std::nullopt);
  // input (world_size * n) -> output (n): this rank's slice of the reduction over ranks.
  void reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                      CollectiveStream stream = std::nullopt);
  // In place: every rank ends with the reduction over ranks.
  void all_reduce(const at::Tensor& tensor, ReduceOp op, CollectiveStream stream = std::nullopt);
  // In place: every rank ends with root's tensor.
  void broadcast(const at::Tensor& tensor, int root, CollectiveStream stream = std::nullopt);
  // Returns when every rank has called it. NCCL: also waits for the work queued on the current
  // stream (the one host synchronisation of that backend).
  void barrier();

  // The ranks of this communicator that pass the same `color` (>= 0), ordered by `key` (then by their
  // rank here), as a communicator of the same backend on the same device; a rank alone in its group
  // gets the "single" backend. Collective over this communicator: every rank calls it. (Hybrid
  // sharding's groups and the replicas across them: sharding/topology.h.)
  std::unique_ptr<Communicator> split(int color, int key);
  // This communicator's ranks as ranks of the world, in its own rank order.
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  // A name for the collective log and the stall message ("world", "group", "across"); a communicator
  // without one (a backend's inner one) is not logged.
  void set_label(std::string label);
  const std::string& label() const { return label_; }
  // The traffic since the last call (LinkTraffic above), and from now on counted anew.
  LinkTraffic take_traffic();

 protected:
  Communicator(int rank, int world_size, c10::Device device)
      : rank_(rank), world_size_(world_size), device_(device), world_ranks_(static_cast<size_t>(world_size)) {
    for (int r = 0; r < world_size; ++r) world_ranks_[static_cast<size_t>(r)] = r;
  }
  // The backend's split: every rank of this communicator calls it (it is collective), with its group's
  // `members` (its ranks here, in the new communicator's order). A rank alone in its group takes part
  // without a group (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR) and may return nullptr: split() gives it a
  // "single" communicator.
  virtual std::unique_ptr<Communicator> run_split(int color, int key, const std::vector<int>& members) = 0;
  void set_world_ranks(std::vector<int> world_ranks) { world_ranks_ = std::move(world_ranks); }

  // Called with validated arguments only. in_place means input is output's slice for this rank.
  virtual void run_all_gather(const at::Tensor& input, const at::Tensor& output, bool in_place,
                              CollectiveStream stream) = 0;
  virtual void run_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                                  CollectiveStream stream) = 0;
  virtual void run_all_reduce(const at::Tensor& tensor, ReduceOp op, CollectiveStream stream) = 0;
  virtual void run_broadcast(const at::Tensor& tensor, int root, CollectiveStream stream) = 0;
  virtual void run_barrier() = 0;

 private:
  void check_tensor(const char* collective, const char* argument, const at::Tensor& tensor) const;
  void check_stream(const char* collective, const CollectiveStream& stream) const;
  void check_reduce_op(const char* collective, const at::Tensor& tensor, ReduceOp op) const;

  // Counts a collective (traffic, the collective log) from construction to destruction.
  class Record;

  int rank_;
  int world_size_;
  c10::Device device_;
  std::vector<int> world_ranks_;
  std::string label_;
  std::string log_name_;  // "across (ranks 1, 3)": the label and the ranks, for the collective log
  int64_t collectives_begun_ = 0;  // (labelled ones: the collective log's numbers)
  LinkTraffic traffic_;
};

// The backend for this world and device: "single" when world_size == 1, "nccl" for a CUDA device,
// "mpi" otherwise; with prefer_mpi, the staged MPI backend for a CUDA device (and for a CPU one under
// LLM_DEBUG_STAGE_MPI=1). Collective over the world (every rank calls it with its own device).
std::unique_ptr<Communicator> make_communicator(const World& world, c10::Device device, bool prefer_mpi = false);

// Backends by name, for tests and benchmarks that want one regardless of the world size (a
// one-rank NCCL communicator exercises the NCCL path on a single GPU).
std::unique_ptr<Communicator> make_single_rank_communicator(c10::Device device);
std::unique_ptr<Communicator> make_mpi_communicator(const World& world);
// Throws UserError in a build without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(const World& world, c10::Device device);
// MPI through page-locked host staging buffers, for tensors on `device` (cpu, or a GPU with index).
std::unique_ptr<Communicator> make_staged_mpi_communicator(const World& world, c10::Device device);

// Every rank's `row` of int64 figures (the same length on every rank), as a (world x row.size())
// table on the CPU, row r rank r's: a table of zeros but this rank's row, summed by one all-reduce on
// the communicator's device (a collective; no communication at one rank).
at::Tensor gather_rows(Communicator& communicator, const std::vector<int64_t>& row);

}  // namespace llm
