// One FSDP unit at run time: its fp32 master shard, its compute shard, its gradient shard, and the
// module parameters it materialises around forward and backward (docs/sharding.md has the order of
// collectives).
//
// The master shard (fp32) is what the optimizer updates; the gather sends this rank's rows in the
// dtype the parameters compute in. For fp32 and for bf16 "mixed" (autocast over fp32 parameters)
// that dtype is fp32 and the master itself is sent; for bf16 "pure" each gather rounds the master
// into a transient bf16 send buffer (as FSDP2 does), so the all-gather moves half the bytes and no
// second copy of the shard is kept between gathers. (Rounding to bf16 before the gather or after it
// gives the same bits.) The "compute shard" is that rows-in-compute-dtype buffer where it persists:
// the master in fp32, a bf16 copy for a resident bf16 unit (its parameters are views of it).
//
//   gather()            all-gather this rank's rows (compute dtype) into the parameters (allocating their storage)
//   gather_async(s)     the same, enqueued on the gather stream s (CUDA) so that it overlaps compute
//   wait_gathered()     orders the current (compute) stream after that gather: an event, no host wait
//                       (without a gather stream, on CPU or in a build without CUDA, gather_async is
//                       gather() and wait_gathered has nothing to do)
//   release()           free the gathered parameters' storage (no_shard: nothing; when each strategy
//                       releases is sharding/gather_schedule.h's decision)
//   publish_shard()     after the optimizer: master -> compute shard (resident bf16) or -> parameters (no_shard)
//
// Resident units. When a unit's shard is the whole unit (one rank, or no_shard) there is nothing to
// gather: its parameters are views of the compute shard (fp32: of the master itself), so they exist
// once, gather() and release() do nothing, and an optimizer update reaches them in place. With fp32
// parameters the gradients are views of the gradient shard too: autograd accumulates into it in
// place (its += on a defined .grad), so "reducing" is an all-reduce in place across no_shard's ranks
// and nothing at all at one rank. prepare_gradients() zeroes the shard before the first backward
// of a step. (FSDP at one rank still frees and re-gathers: a copy of every weight twice a step.)
//   reduce_gradients()  full gradients -> this rank's gradient shard: reduce-scatter (average) for the
//                       sharded strategies, all-reduce (average) for no_shard; frees the full gradients
//
// Parameter offload (--offload parameters): the compute shard lives in host memory (page-locked
// on CUDA, exactly its size) instead of the device, and every gather first copies it to the device
// on the gather's stream, so a prefetch copies it as far ahead as it gathers. Such a unit is never
// resident (it gathers and releases even where its shard is the whole unit: one rank, or no_shard,
// whose "gather" is then the copy alone), so between steps the device holds none of its rows but
// the fp32 master, and not that either once the optimizer is offloaded too. publish_shard() copies
// the master into the host shard (device to host, on the compute stream); with the optimizer
// offloaded the host step writes the rounded rows into it directly, after wait_host_reads().
//
// Storage is freed and re-allocated in place (StorageImpl reset / new DataPtr) and refilled through
// variable_data(), which does not bump the version counter: autograd's saved references to a weight
// stay valid across release() and gather(), as with FSDP's storage resize_(0).
//
// Streams and the caching allocator (CUDA, gather_async): the gather stream first waits on an event
// recorded on the compute stream, then allocates the compute storage and the gathered buffer and
// runs the all-gather and the copies, then records a "gathered" event that wait_gathered() makes
// the compute stream wait on. We do not call recordStream. Storage allocated under the gather
// stream belongs to that stream's pool, and the caching allocator hands a freed block out again
// only to an allocation on the same stream; every allocation on the gather stream comes after its
// wait on the compute stream's event, which was recorded after the last kernel reading the block
// had been queued (release() runs after the unit's forward or backward is queued). So a block is
// never refilled while compute still reads it, and it returns to the pool at release(), at a known
// point, instead of at some later event query as recordStream would make it (FSDP2's reasoning).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/owned_bytes.h"
#include "sharding/communicator.h"
#include "sharding/flat_layout.h"
#include "sharding/strategy.h"

namespace llm {

class ShardedUnit {
 public:
  // parameters: the unit's module parameters (fp32); only this rank's rows (layout_for) are read, so
  // they must agree across ranks there and nowhere else. This rank's rows are copied into the fp32 master shard (and a resident bf16 unit's compute shard); then the parameters
  // become compute_dtype, and for the sharded strategies their storage is freed until gather().
  // resident_when_whole: a unit whose shard is the whole unit keeps its parameters as views of its
  // shards (above); false gathers and releases it like any other (tests of the gather path).
  // logical_shapes: where the compute side pads (--pad_matmul_dims, model/units.h), each
  // parameter's shape without the pads, a leading part of its tensor's: the shards, the layout and
  // the checkpoints hold that part only, a gather writes it and zeroes the pads, and a reduction
  // reads it. Empty: the tensors' own shapes. A padded unit is never resident (its parameters
  // cannot be views of a shard laid out without the pads).
  // replicas: hybrid sharding's ranks holding this rank's shard in the other groups (communicator is
  // then this rank's group): the reduced gradient shard is summed over them and divided by every
  // rank's count once (sum, sum, divide: one rounding of the mean, as full_shard's MPI average), once
  // per optimizer step, on the reduce stream.
  // state_across_replicas (hybrid, --shard_optimizer_across_groups): the layout is the world's (N = S G
  // ranks), this rank being rank k G + g of it (k its place in its group, g its group), and the unit
  // keeps a "block", the G consecutive world shards k G .. k G + G - 1, as the fp32 rows it gathers
  // over its group (S blocks in group order are the N shards in world order). master_shard() is its
  // own world shard, a view of the block: the optimizer steps it (laid out as full_shard's at N ranks,
  // over a communicator in that order). The reduction reduce-scatters the full gradients over the
  // group (summing the block's rows) and then over the replicas (each its shard), and divides by N;
  // publish_shard() all-gathers the updated shards across the replicas back into the block. Offloaded
  // (offload_master), the block is the compute shard, in the compute dtype: the host step writes this
  // rank's world shard of it (stepped_rows), and the next gather first all-gathers the replicas' rows
  // into it, on the calling thread (publish_shard may run on offload's worker, which must not
  // communicate: MPI is FUNNELED), once per update.
  ShardedUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> parameters,
              Communicator& communicator, ShardingStrategy strategy, at::ScalarType compute_dtype,
              bool resident_when_whole = false, bool offload_parameters = false,
              std::vector<std::vector<int64_t>> logical_shapes = {}, Communicator* replicas = nullptr,
              bool state_across_replicas = false);

  ~ShardedUnit();

  // The layout of this rank's shard of a unit with these parameters under `strategy` (no_shard: the
  // whole unit, as rank 0 of a world of one): which rows of each parameter it holds.
  static FlatShardLayout layout_for(const std::string& name,
                                    const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                                    const Communicator& communicator, ShardingStrategy strategy,
                                    const std::vector<std::vector<int64_t>>& logical_shapes = {},
                                    int rank = -1, int world = 0);  // world > 0: that rank of that world

  void gather();  // also waits for a prefetch in flight
  // Starts the gather on gather_stream (a CUDA stream of the communicator's device) and returns at
  // once; std::nullopt or a CPU unit gathers in line. Does nothing when already gathered.
  void gather_async(const CollectiveStream& gather_stream);
  // Makes the current stream wait for the gather started by gather_async (cudaStreamWaitEvent);
  // nothing to do after a synchronous gather.
  void wait_gathered();
  bool gather_in_flight() const { return gather_in_flight_; }
  void release();
  // --backward_gather_size (ZeRO++ hpZ, FSDP2's reshard_after_forward=int): `group` is this rank's node
  // (a split of the communicator's ranks into groups of R). After the unit's training forward, before
  // its release, keep_backward_copy() copies this rank's rows of the gathered parameters under a
  // layout over the group (1/R of the unit, in the compute dtype); the next gather (the backward's)
  // all-gathers those over the group instead of the shards over every rank, and frees the copy. The
  // parameters are the same bits either way. Nothing to keep for a unit not gathered.
  void gather_backward_within(Communicator& group);
  // A host compute block's all-gather across the replicas (--offload parameters with the state across
  // replicas) goes over this communicator of host tensors (a GPU rank's; on a CPU rank the replicas').
  void set_host_replicas(Communicator& host_replicas) { host_replicas_ = &host_replicas; }
  void keep_backward_copy();
  int64_t backward_copy_bytes() const { return backward_copy_.defined() ? static_cast<int64_t>(backward_copy_.nbytes()) : 0; }
  // Before this unit's backward: a resident fp32 unit zeroes its gradient shard if the last step
  // consumed it (the first micro-batch of a step then accumulates into zeros).
  void prepare_gradients();
  // The full gradients into the shard, reduced over ranks. With a reduce stream (a CUDA stream of
  // the communicator's device, set_reduce_stream) a sharded unit's reduce-scatter and its squared
  // norm run there, after the compute stream's work so far, and the call returns at once: the next
  // unit's backward overlaps the reduction, as in FSDP2. Whoever reads the shard on the compute
  // stream calls wait_reduced() first (ShardedModel at the end of backward; the fused step); a copy
  // on another stream orders that stream with order_after_reduce(). The flat input of the reduction
  // is kept until wait_reduced(), which ShardedModel calls for a unit before it reduces the next
  // one: one reduction in flight, one flat buffer beyond the unit being reduced. Resident units and
  // CPU units reduce in line, as before.
  void reduce_gradients();
  void set_reduce_stream(const CollectiveStream& stream) { reduce_stream_ = stream; }
  void wait_reduced();                                  // the current stream waits for the reduction
  void order_after_reduce(const c10::Stream& stream);  // `stream` waits for it (no host wait)
  bool reduce_in_flight() const { return reduce_in_flight_; }
  // After the optimizer updated the master shard: refreshes the compute shard from it (when they are
  // two buffers), and for no_shard the parameters (the sharded strategies refresh them at the next
  // gather()).
  void publish_shard();
  // A resident unit whose compute shard is a rounded copy of the master (bf16): the optimizer may
  // write it in the same pass as the master (step_unit's compute_out) instead of publish_shard's
  // second pass over the shard; then publish_shard skips that copy once (written_by_step).
  bool compute_shard_rounds_master() const {
    return resident_ && master_.defined() && compute_.defined() && !compute_.is_same(master_);
  }
  void compute_shard_written_by_step() { compute_written_by_step_ = true; }
  // CPU offload (offload/optimizer_offload.h): the fp32 master moves to host memory, which the caller
  // has copied it to. This unit keeps its rows in the compute dtype on the device instead (the
  // compute shard: the old master itself in fp32 and mixed, a rounded copy in pure bf16), and
  // whoever steps the host master writes the updated rows into compute_shard() before the next
  // gather. master_shard() is undefined afterwards; publish_shard() has nothing to do but no_shard's
  // parameters.
  void offload_master();
  bool master_offloaded() const { return !master_.defined(); }
  // Once offloaded: the rows of the compute shard the host step writes (this rank's shard: all of it,
  // or with the state across replicas its world shard of the block).
  at::Tensor& stepped_rows() { return stepped_; }
  // --offload parameters: compute_shard() is in host memory (above).
  bool parameters_offloaded() const { return parameters_offloaded_; }
  // Blocks until the device has read the host compute shard for every gather issued so far, so that
  // the host may overwrite it (CUDA; nothing to wait for on a CPU rank or without parameter offload).
  void wait_host_reads();
  // CPU offload: the gradient shard stops being a persistent buffer. It exists from this step's
  // reduce_gradients() (a resident fp32 unit: from the first prepare_gradients() of the step, since
  // its parameters' gradients are views of it) until take_gradient_shard() hands it over, and the
  // caller frees it once it has copied it to host memory. Between steps the device holds no gradient.
  void make_gradient_transient();
  // A bf16 unit at one rank: its gradient shard in bf16, which the AdamW kernel reads: no fp32 copy
  // of a bf16 gradient (4 bytes a parameter, and a pass). A resident unit's .grad are views of it
  // (autograd accumulates into it); a gathered (padded) one's are copied into it at the reduction,
  // with no fp32 flat buffer. The norm upcasts one unit at a time.
  void keep_bf16_gradient();
  at::ScalarType gradient_dtype() const { return gradient_dtype_; }  // the gradient shard's: fp32 or bf16
  bool gradient_transient() const { return gradient_transient_; }
  // The reduced shard, given up by this unit (a transient gradient only): its parameters' gradients
  // that view it are dropped too, so the caller's reference is the last one.
  at::Tensor take_gradient_shard();
  // This step's squared L2 norm of the reduced gradient shard, a one-element fp32 tensor on the
  // device, taken as reduce_gradients() ends (so it exists after the shard itself is handed over);
  // the global gradient norm sums it over units.
  const at::Tensor& gradient_squares() const { return gradient_squares_; }
  bool gathered() const { return gathered_; }
  bool resident() const { return resident_; }  // parameters are views of the shards (above)

  const FlatShardLayout& layout() const { return layout_; }
  const std::string& name() const { return name_; }
  at::Tensor& master_shard() { return master_; }             // (shard_numel) fp32; undefined once offloaded
  // The fp32 rows the gathers send: the block (state across replicas, a view of which is the master)
  // or the master itself.
  const at::Tensor& gathered_rows() const { return block_.defined() ? block_ : master_; }
  // (shard_numel; with the state across replicas the block's G shard_numel) compute dtype: the master
  // (the block) itself in fp32, a rounded copy for a resident bf16 unit, undefined for a gathered bf16
  // unit (each gather rounds the master into a transient buffer); with parameter offload a host
  // buffer of its own in any dtype; once the master is offloaded, its rows in the compute dtype.
  at::Tensor& compute_shard() { return compute_; }
  const at::Tensor& compute_shard() const { return compute_; }
  // (shard_numel) fp32; undefined between steps once the gradient is transient.
  at::Tensor& gradient_shard() { return gradient_; }
  const at::Tensor& master_shard() const { return master_; }
  const at::Tensor& gradient_shard() const { return gradient_; }
  // Views of one parameter's rows inside a flat buffer laid out like the shard.
  at::Tensor slice(const at::Tensor& flat, const ShardedParameter& parameter) const {
    return flat.narrow(0, parameter.shard_offset, parameter.shard_numel());
  }

  // Checkpoints: a flat buffer laid out like the shard -> full tensors (all ranks call; collective),
  // and full tensors -> this rank's rows of such a buffer.
  std::vector<std::pair<std::string, at::Tensor>> gather_full(const at::Tensor& flat);
  void load_full(const std::vector<at::Tensor>& full_tensors, at::Tensor& flat) const;

  // Bytes of gathered parameters right now (0 for a resident unit: its parameters are its shard).
  int64_t compute_parameter_bytes() const;
  // Bytes of the parameters' gradients not yet reduced, beyond the gradient shard.
  int64_t full_gradient_bytes() const;
  // What this unit holds now: parameters (master and compute shards, each storage once, and the
  // gathered parameters) and gradients (the shard and full gradients not yet reduced).
  OwnedBytes owned_bytes() const;

 private:
  std::string name_;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;
  std::vector<std::vector<int64_t>> logical_shapes_;  // each parameter's shape without the pads
  bool padded_ = false;                               // some parameter has pads
  // The part of a tensor shaped like parameter i's that the layout holds (the tensor when unpadded).
  at::Tensor logical(size_t i, const at::Tensor& tensor) const;
  // Each parameter's rows under `layout` (this rank's, or another's of the same world) into `shard`,
  // laid out as the layout says (the caller holds a NoGradGuard).
  void copy_rows_into(const FlatShardLayout& layout, const at::Tensor& shard) const;
  Communicator& communicator_;
  Communicator* replicas_ = nullptr;  // hybrid: across the groups (the constructor)
  Communicator* host_replicas_ = nullptr;  // the same ranks for host tensors (set_host_replicas)
  bool blocks_ = false;  // the state across replicas: the gathered rows are a block of G world shards
  int64_t block_numel() const;  // G shard_numel with blocks, else shard_numel
  // Offloaded with blocks: the host step wrote stepped_rows() since the replicas' rows were gathered.
  bool replicas_stale_ = false;
  void gather_replicas();  // their rows into the compute block, once stale (gather and gather_async)
  Communicator* backward_group_ = nullptr;  // gather_backward_within
  FlatShardLayout backward_layout_;         // the unit over backward_group_'s ranks
  at::Tensor backward_copy_;                // keep_backward_copy: this rank's rows under backward_layout_
  ShardingStrategy strategy_;
  FlatShardLayout layout_;
  // Hybrid: the full gradients `flat` reduce-scattered over the group (summed), then over the replicas:
  // summed across them (all-reduce), or with the state across replicas reduce-scattered into this
  // rank's world shard; then divided by every rank's count once (on `stream`, a CUDA side stream, or
  // in line).
  void reduce_over_groups(const at::Tensor& flat, const CollectiveStream& stream);
  // The resident path's (and reduce_over_groups's without the state across replicas): `summed`, this
  // rank's shard summed over its group, summed over the replicas, then divided by every rank's count.
  void average_over_replicas(const at::Tensor& summed, const CollectiveStream& stream);

  // All-gathers the shard into freshly allocated compute storage on the current stream (the
  // collective on `stream`: the same stream, passed for NCCL).
  void fill_compute_parameters(const CollectiveStream& stream);
  void allocate_compute_parameters();  // the parameters' storages as parts of compute_block_
  // reduce_gradients() without the norm: the full gradients into the shard.
  void reduce_into_shard();
  // A resident fp32 unit: its parameters' .grad become views of the gradient shard, or nothing.
  void point_gradients_at_shard();
  void drop_parameter_gradients();

  at::Tensor master_, compute_, gradient_;
  at::Tensor block_;  // state across replicas: the G world shards this rank gathers (master_ views one)
  at::Tensor stepped_;  // stepped_rows(): compute_ or its world shard (offload_master)
  at::DataPtr compute_block_;  // a gathered unit's parameters, one allocation (allocate_compute_parameters)
  at::Tensor gradient_squares_;        // (1) fp32, see gradient_squares()
  at::TensorOptions gradient_options_;  // fp32 on the unit's device
  at::ScalarType compute_dtype_ = at::kFloat;
  at::ScalarType gradient_dtype_ = at::kFloat;  // keep_bf16_gradient: bf16
  bool resident_ = false;
  bool parameters_offloaded_ = false;  // --offload parameters: compute_ in host memory
  bool gathers_ = false;  // gathered and released (sharded strategies, or parameter offload), not resident
  bool gradients_in_shard_ = false;  // resident with fp32 parameters: .grad views the gradient shard
  bool gradient_consumed_ = false;   // reduced since the last prepare_gradients()
  bool compute_written_by_step_ = false;  // the optimizer wrote the compute shard: publish skips it once
  bool gradient_transient_ = false;  // make_gradient_transient()
  bool gathered_ = true;
  bool gather_in_flight_ = false;  // gathered on the gather stream, not yet waited for
  CollectiveStream reduce_stream_;
  bool reduce_in_flight_ = false;  // reduced on the reduce stream, the compute stream not yet waiting
  at::Tensor reduce_input_;        // (world * shard_numel) fp32: the flat gradients being reduced
  struct GatherEvents;             // CUDA events (fsdp_unit.cpp; CUDA builds only)
  std::unique_ptr<GatherEvents> events_;
};

// A side stream for prefetching all-gathers (or for reduce-scatters) on `device`: a CUDA stream from
// LibTorch's pool, or std::nullopt where collectives are in line (a CPU device, or a build without
// CUDA).
CollectiveStream make_gather_stream(c10::Device device);

}  // namespace llm
