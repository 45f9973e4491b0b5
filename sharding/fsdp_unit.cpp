#include "sharding/fsdp_unit.h"
#include "common/host_memory.h"

#include <stdexcept>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/dot.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/StorageImpl.h>

#include "common/memory_stats.h"
#include "common/padded_tensor.h"
#include "sharding/topology.h"
#ifdef TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace llm {

// The two events of an asynchronous gather, made on first use (CUDA builds only; an incomplete
// type elsewhere, never created).
struct ShardedUnit::GatherEvents {
#ifdef TRAINER_HAVE_CUDA
  c10::cuda::CUDAEvent compute_ready;  // recorded on the compute stream before the gather starts
  c10::cuda::CUDAEvent gathered;       // recorded on the gather stream after the last copy
  c10::cuda::CUDAEvent gradients_ready;  // on the compute stream: the flat gradient buffer is written
  c10::cuda::CUDAEvent reduced;          // on the reduce stream: the shard and its norm are final
  c10::cuda::CUDAEvent host_read;        // parameter offload: the last copy of the host shard is done
#endif
};

namespace {

size_t storage_bytes(const at::Tensor& tensor) {
  return static_cast<size_t>(tensor.numel()) * tensor.element_size();
}

void free_storage(const at::Tensor& tensor) {
  tensor.storage().unsafeGetStorageImpl()->reset();
}

// The shard's squared L2 norm in fp32: a bf16 shard (keep_bf16_gradient) upcast first, exactly, so
// the sum is the one an fp32 shard of the same values gives.
at::Tensor squared_norm(const at::Tensor& shard) {
  const at::Tensor values = shard.scalar_type() == at::kFloat ? shard : shard.to(at::kFloat);
  return at::dot(values, values);
}

}  // namespace

// One allocation for the whole unit, each parameter's storage pointing into it in registration
// order: a layer's q, k and v (and gate and up) are adjacent, so the model can run each group as one
// GEMM (model/grouped_linear.h). The storages stay the parameters' own objects (what
// autograd's saved weights refer to), so a release and the next gather swap their pointers as
// before; they own nothing, the block owns the memory.
void ShardedUnit::allocate_compute_parameters() {
  size_t total = 0;
  for (const auto& [name, parameter] : parameters_) total += storage_bytes(parameter);
  c10::Allocator* allocator = parameters_.front().second.storage().unsafeGetStorageImpl()->allocator();
  compute_block_ = allocator->allocate(total);
  char* base = static_cast<char*>(compute_block_.get());
  size_t offset = 0;
  for (const auto& [name, parameter] : parameters_) {
    c10::StorageImpl* storage = parameter.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(c10::DataPtr(base + offset, compute_block_.device()));
    storage->set_nbytes(storage_bytes(parameter));
    offset += storage_bytes(parameter);
  }
}

ShardedUnit::ShardedUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> parameters,
                         Communicator& communicator, ShardingStrategy strategy,
                         at::ScalarType compute_dtype, bool resident_when_whole, bool offload_parameters,
                         std::vector<std::vector<int64_t>> logical_shapes, Communicator* replicas,
                         bool state_across_replicas)
    : name_(std::move(name)),
      parameters_(std::move(parameters)),
      logical_shapes_(std::move(logical_shapes)),
      communicator_(communicator),
      replicas_(replicas),
      host_replicas_(replicas),
      strategy_(strategy) {
  const bool sharded = strategy_ != ShardingStrategy::no_shard;
  if (logical_shapes_.empty())
    for (const auto& [parameter_name, parameter] : parameters_) logical_shapes_.push_back(parameter.sizes().vec());
  if (logical_shapes_.size() != parameters_.size())
    throw std::logic_error("ShardedUnit " + name_ + ": a logical shape for each parameter, or none");
  for (size_t i = 0; i < parameters_.size(); ++i) padded_ = padded_ || parameters_[i].second.sizes().vec() != logical_shapes_[i];
  layout_ = layout_for(name_, parameters_, communicator_, strategy_, logical_shapes_);
  const bool blocks = state_across_replicas && replicas_ != nullptr && sharded;
  const int groups = blocks ? replicas_->world_size() : 1;
  const auto world_layout = [&](int index) {  // rank `index` of the world's N = S G layout
    return layout_for(name_, parameters_, communicator_, strategy_, logical_shapes_, index,
                      communicator_.world_size() * groups);
  };
  blocks_ = blocks;
  if (blocks) layout_ = world_layout(world_shard_index(communicator_.rank(), replicas_->rank(), groups));
  {
    // Without autograd: copying from parameters that require grad would make the shard a non-leaf
    // with a CopySlices history, and every in-place optimizer update would then extend that graph
    // (and keep the tensors its nodes save) for the rest of the run.
    at::NoGradGuard no_grad;
    const at::TensorOptions fp32 = parameters_.front().second.options().dtype(at::kFloat);
    // Each world shard of the block (one: this rank's shard) from the parameters' rows.
    // The optimizer streams the master and the gradient shard every step (common/host_memory.h).
    at::Tensor rows = empty_streamed({groups * layout_.shard_numel}, fp32);
    for (int j = 0; j < groups; ++j) {
      const FlatShardLayout layout = blocks ? world_layout(world_shard_index(communicator_.rank(), j, groups)) : layout_;
      copy_rows_into(layout, rows.narrow(0, j * layout_.shard_numel, layout_.shard_numel));
    }
    if (blocks) block_ = rows;
    master_ = blocks ? rows.narrow(0, replicas_->rank() * layout_.shard_numel, layout_.shard_numel) : rows;
    gradient_ = empty_streamed({layout_.shard_numel}, fp32);
    gradient_.zero_();
    gradient_options_ = gradient_.options();
  }
  compute_dtype_ = compute_dtype;
  parameters_offloaded_ = offload_parameters;
  resident_ = resident_when_whole && layout_.world_size == 1 && !offload_parameters && !padded_;
  gathers_ = !resident_ && (sharded || offload_parameters);
  // The compute shard persists only where something reads it between steps: fp32 (it is the master)
  // and a resident unit (its parameters are views of it). A gathered bf16 unit rounds its master rows
  // into a transient send buffer at each gather instead, as FSDP2 does: 2 bytes per shard element
  // for the gather's duration rather than for the whole run. With parameter offload it is a host
  // buffer of its own (the header).
  if (offload_parameters) {
    at::NoGradGuard no_grad;
    compute_ = exact_host_buffer(block_numel(), compute_dtype, master_.device());
    compute_.copy_(gathered_rows());  // rounds to the compute dtype
  } else if (compute_dtype == at::kFloat)
    compute_ = gathered_rows();
  else if (resident_) {
    at::NoGradGuard no_grad;
    compute_ = master_.to(compute_dtype);
  }
  if (resident_) {
    // The parameters become views of the compute shard (leaves still: set_data keeps their autograd
    // identity), and with fp32 parameters their gradients views of the gradient shard.
    at::NoGradGuard no_grad;
    gradients_in_shard_ = compute_dtype == at::kFloat;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const ShardedParameter& row = layout_.parameters[i];
      parameters_[i].second.set_data(slice(compute_, row).view(row.full_shape));
    }
    if (gradients_in_shard_) point_gradients_at_shard();
    return;
  }
  if (compute_dtype != at::kFloat) {
    at::NoGradGuard no_grad;
    for (auto& [parameter_name, parameter] : parameters_) parameter.set_data(parameter.to(compute_dtype));
  }
  if (gathers_) release();
}

FlatShardLayout ShardedUnit::layout_for(const std::string& name,
                                        const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                                        const Communicator& communicator, ShardingStrategy strategy,
                                        const std::vector<std::vector<int64_t>>& logical_shapes, int rank_of,
                                        int world_of) {
  // no_shard: every rank holds the whole unit, laid out as rank 0 of a world of one.
  const bool sharded = strategy != ShardingStrategy::no_shard;
  const int rank = world_of > 0 ? rank_of : sharded ? communicator.rank() : 0;
  const int world = world_of > 0 ? world_of : sharded ? communicator.world_size() : 1;
  if (logical_shapes.empty()) return FlatShardLayout::build(name, parameters, rank, world);
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (size_t i = 0; i < parameters.size(); ++i) shapes.emplace_back(parameters[i].first, logical_shapes.at(i));
  return FlatShardLayout::from_shapes(name, shapes, rank, world);
}

at::Tensor ShardedUnit::logical(size_t i, const at::Tensor& tensor) const {
  return padded_ ? logical_view(logical_shapes_[i], tensor) : tensor;
}

void ShardedUnit::publish_shard() {
  at::NoGradGuard no_grad;
  if (blocks_) {
    if (!master_.defined()) {  // offloaded: the next gather brings the replicas' rows (the header)
      replicas_stale_ = true;
      return;
    }
    // Every replica's updated shard into the block, in place (its own is already), and a host copy
    // of it (parameter offload) from there, as below.
    if (replicas_->world_size() > 1) replicas_->all_gather(master_, block_);
    if (parameters_offloaded_) compute_.copy_(block_, /*non_blocking=*/block_.is_cuda());
    return;
  }
  const at::Tensor& source = master_.defined() ? master_ : compute_;
  const bool written = std::exchange(compute_written_by_step_, false);
  if (master_.defined() && compute_.defined() && !compute_.is_same(master_) && !written)
    // resident: its parameters see it; parameter offload: device to host, ordered on the compute
    // stream before the next gather's copy back (which waits on the compute stream)
    compute_.copy_(master_, /*non_blocking=*/parameters_offloaded_ && master_.is_cuda());
  if (resident_ || gathers_) return;
  for (size_t i = 0; i < parameters_.size(); ++i)  // copy_ rounds to the parameters' dtype
    logical(i, parameters_[i].second.variable_data()).copy_(layout_.full_from_gathered(layout_.parameters[i], source));
}

void ShardedUnit::offload_master() {
  if (!master_.defined()) return;
  at::NoGradGuard no_grad;
  if (!compute_.defined()) compute_ = gathered_rows().to(compute_dtype_);
  stepped_ = blocks_ ? compute_.narrow(0, replicas_->rank() * layout_.shard_numel, layout_.shard_numel) : compute_;
  master_ = at::Tensor();  // fp32: compute_ still holds the storage (the device copy of the rows)
  block_ = at::Tensor();
}

int64_t ShardedUnit::block_numel() const {
  return blocks_ ? replicas_->world_size() * layout_.shard_numel : layout_.shard_numel;
}

void ShardedUnit::gather_replicas() {
  if (!std::exchange(replicas_stale_, false)) return;
  at::NoGradGuard no_grad;
  Communicator& over = parameters_offloaded_ ? *host_replicas_ : *replicas_;
  if (over.world_size() > 1) over.all_gather(stepped_, compute_);  // in place: its own rows are there
}

ShardedUnit::~ShardedUnit() {
  // Never throws: the shard must outlive a gather still reading it, so the compute stream waits.
  try {
    wait_gathered();
  } catch (...) {
  }
}

void ShardedUnit::fill_compute_parameters(const CollectiveStream& stream) {
  at::NoGradGuard no_grad;
  // Allocated on the current stream (the gather stream for a prefetch), so the caching allocator
  // reuses the send buffer only after the collective that reads it.
  at::Tensor send;
  if (parameters_offloaded_) {
    // The host shard to the device first (page-locked: an asynchronous copy on this stream; on a
    // CPU rank the shard itself, no copy).
    send = compute_.to(gradient_options_.device(), /*non_blocking=*/true);
#ifdef TRAINER_HAVE_CUDA
    if (send.is_cuda()) {
      if (!events_) events_ = std::make_unique<GatherEvents>();
      events_->host_read.record(c10::cuda::getCurrentCUDAStream(send.device().index()));
    }
#endif
  } else {
    send = compute_.defined() ? compute_ : gathered_rows().to(compute_dtype_);
  }
  // The backward of a unit that kept its node's copy (hpZ): that copy, gathered over the node.
  const bool from_copy = backward_copy_.defined();
  if (from_copy) send = std::exchange(backward_copy_, at::Tensor());
  const FlatShardLayout& layout = from_copy ? backward_layout_ : layout_;
  Communicator& over = from_copy ? *backward_group_ : communicator_;
  // A whole-unit layout (one rank, or no_shard with parameter offload) has nothing to gather: the
  // parameters are filled from the send buffer itself.
  at::Tensor gathered = send;
  if (layout.world_size > 1) {
    gathered = at::empty({layout.world_size * layout.shard_numel}, send.options());
    over.all_gather(send, gathered, stream);
  }
  send = at::Tensor();
  allocate_compute_parameters();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor& parameter = parameters_[i].second;
    // Fresh storage may hold anything (a NaN times a zero weight is NaN): the pads are zeroed each time.
    if (padded_) zero_padding(logical_shapes_[i], parameter.variable_data());
    layout.copy_full_from_gathered(layout.parameters[i], gathered, logical(i, parameter.variable_data()));
  }
}

void ShardedUnit::gather_backward_within(Communicator& group) {
  backward_group_ = &group;
  backward_layout_ = layout_for(name_, parameters_, group, ShardingStrategy::full_shard, logical_shapes_);
}

void ShardedUnit::keep_backward_copy() {
  if (backward_group_ == nullptr || !gathers_ || !gathered_) return;
  at::NoGradGuard no_grad;
  wait_gathered();
  const at::Tensor& first = parameters_.front().second;
  backward_copy_ = at::empty({backward_layout_.shard_numel}, first.options());
  copy_rows_into(backward_layout_, backward_copy_);
}

void ShardedUnit::copy_rows_into(const FlatShardLayout& layout, const at::Tensor& shard) const {
  for (size_t i = 0; i < parameters_.size(); ++i)
    slice(shard, layout.parameters[i])
        .copy_(layout.take_rows(layout.parameters[i], logical(i, parameters_[i].second.variable_data())));
}

void ShardedUnit::gather() {
  if (resident_) return;
  if (gathered_) {
    wait_gathered();
    return;
  }
  gather_replicas();
  fill_compute_parameters(std::nullopt);
  gathered_ = true;
}

void ShardedUnit::gather_async(const CollectiveStream& gather_stream) {
  if (gathered_ || resident_) return;
  gather_replicas();  // on the compute stream, which the gather stream waits for below
#ifdef TRAINER_HAVE_CUDA
  // gradient_options_, not the gradient shard: a transient shard (offload, the fused step) does not
  // exist between steps, when the next forward's prefetches are issued.
  if (gather_stream && gradient_options_.device().is_cuda()) {
    const c10::DeviceIndex device = gradient_options_.device().index();
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device);
    const c10::cuda::CUDAStream side(*gather_stream);
    if (!events_) events_ = std::make_unique<GatherEvents>();
    // Everything queued on the compute stream so far happens first: the optimizer's last write to
    // the shard, and the last reads of blocks that release() returned to the gather stream's pool
    // and that the allocations below may hand out again (see the header on recordStream).
    events_->compute_ready.record(compute);
    events_->compute_ready.block(side);
    {
      c10::cuda::CUDAStreamGuard on_gather_stream(side);
      fill_compute_parameters(gather_stream);
    }
    events_->gathered.record(side);
    gathered_ = true;
    gather_in_flight_ = true;
    return;
  }
#endif
  gather();  // no gather stream here: correctness is the same, only the overlap is lost
}

void ShardedUnit::wait_gathered() {
  if (!gather_in_flight_) return;
#ifdef TRAINER_HAVE_CUDA
  events_->gathered.block(c10::cuda::getCurrentCUDAStream(gradient_options_.device().index()));
#endif
  gather_in_flight_ = false;
}

void ShardedUnit::wait_host_reads() {
#ifdef TRAINER_HAVE_CUDA
  if (parameters_offloaded_ && events_) events_->host_read.synchronize();
#endif
}

void ShardedUnit::release() {
  if (!gathers_ || !gathered_) return;
  // A prefetch released unused still reads the shard: the compute stream (the optimizer) must not
  // overwrite it before that gather is done. The schedule never does this; it costs nothing then.
  wait_gathered();
  for (auto& [name, parameter] : parameters_) free_storage(parameter);
  compute_block_.clear();
  gathered_ = false;
}

void ShardedUnit::make_gradient_transient() {
  if (gradient_transient_) return;
  gradient_transient_ = true;
  gradient_ = at::Tensor();
  if (gradients_in_shard_) drop_parameter_gradients();
}

void ShardedUnit::keep_bf16_gradient() {
  if (compute_dtype_ != at::kBFloat16 || layout_.world_size != 1 || communicator_.world_size() != 1 ||
      gradient_transient_ || parameters_offloaded_)
    throw std::logic_error("ShardedUnit " + name_ + ": a bf16 gradient shard needs a bf16 unit at one rank");
  at::NoGradGuard no_grad;
  gradient_dtype_ = at::kBFloat16;
  gradient_ = at::zeros({layout_.shard_numel}, gradient_options_.dtype(gradient_dtype_));
  if (!resident_) return;  // a gathered (padded) unit's gradients are copied in at its reduction
  gradients_in_shard_ = true;
  point_gradients_at_shard();
}

at::Tensor ShardedUnit::take_gradient_shard() {
  if (!gradient_transient_ || !gradient_.defined() || !gradient_consumed_)
    throw std::logic_error("ShardedUnit " + name_ + ": take_gradient_shard needs a transient gradient, reduced");
  if (gradients_in_shard_) drop_parameter_gradients();
  return std::exchange(gradient_, at::Tensor());
}

void ShardedUnit::point_gradients_at_shard() {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const ShardedParameter& row = layout_.parameters[i];
    parameters_[i].second.mutable_grad() = slice(gradient_, row).view(row.full_shape);
  }
}

void ShardedUnit::drop_parameter_gradients() {
  for (auto& [parameter_name, parameter] : parameters_) parameter.mutable_grad() = at::Tensor();
}

void ShardedUnit::prepare_gradients() {
  if (!gradients_in_shard_) return;
  at::NoGradGuard no_grad;
  if (gradient_transient_ && !gradient_.defined()) {
    // The step's first backward of this unit: its parameters' gradients become views of a new
    // shard, into which autograd accumulates every micro-batch.
    gradient_ = at::zeros({layout_.shard_numel}, gradient_options_.dtype(gradient_dtype_));
    point_gradients_at_shard();
    gradient_consumed_ = false;
    return;
  }
  if (!gradient_consumed_) return;
  gradient_.zero_();
  gradient_consumed_ = false;
}

void ShardedUnit::reduce_gradients() {
  reduce_into_shard();
  // Each unit's share of the global norm, while the shard is here (clipping: train_loop.cpp): on
  // the stream that wrote the shard.
  at::NoGradGuard no_grad;
#ifdef TRAINER_HAVE_CUDA
  if (reduce_in_flight_) {
    const c10::cuda::CUDAStream side(*reduce_stream_);
    {
      c10::cuda::CUDAStreamGuard on_reduce_stream(side);
      gradient_squares_ = squared_norm(gradient_);
    }
    events_->reduced.record(side);
    return;
  }
#endif
  gradient_squares_ = squared_norm(gradient_);
}

void ShardedUnit::wait_reduced() {
  if (!reduce_in_flight_) return;
#ifdef TRAINER_HAVE_CUDA
  events_->reduced.block(c10::cuda::getCurrentCUDAStream(gradient_options_.device().index()));
#endif
  reduce_in_flight_ = false;
  reduce_input_ = at::Tensor();  // the compute stream's later allocations come after the reduction
}

void ShardedUnit::order_after_reduce(const c10::Stream& stream) {
  if (!reduce_in_flight_) return;
#ifdef TRAINER_HAVE_CUDA
  events_->reduced.block(c10::cuda::CUDAStream(stream));
#else
  (void)stream;
#endif
}

void ShardedUnit::reduce_into_shard() {
  at::NoGradGuard no_grad;
  gradient_consumed_ = true;
  if (resident_) {
    // The whole unit on this rank: the gradients go straight into the shard (already there for
    // fp32), then an average over no_shard's ranks in place.
    if (!gradients_in_shard_) {
      // A transient shard is new each step; its padding rows, which no parameter writes, are zero.
      if (gradient_transient_) gradient_ = at::zeros({layout_.shard_numel}, gradient_options_);
      for (size_t i = 0; i < parameters_.size(); ++i) {
        const at::Tensor& grad = parameters_[i].second.grad();
        at::Tensor target = slice(gradient_, layout_.parameters[i]);
        if (grad.defined())
          target.copy_(grad.reshape({-1}));  // (a padded unit is never resident: its full gradients are whole)
        else
          target.zero_();
        parameters_[i].second.mutable_grad() = at::Tensor();
      }
    }
    if (replicas_ != nullptr)
      average_over_replicas(gradient_, std::nullopt);
    else if (communicator_.world_size() > 1)
      communicator_.all_reduce(gradient_, ReduceOp::average);
    return;
  }
  // keep_bf16_gradient on a gathered unit (one rank, its compute copies padded): the shard is laid out
  // as a world of one's flat buffer, so the gradients are copied straight into it (made first), with
  // no fp32 buffer and nothing to reduce.
  const bool into_shard = gradient_dtype_ != at::kFloat;
  if (into_shard && gradient_transient_)
    gradient_ = at::empty({layout_.shard_numel}, gradient_options_.dtype(gradient_dtype_));
  at::Tensor flat = into_shard ? gradient_ : at::empty({layout_.world_size * layout_.shard_numel}, gradient_options_);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor& grad = parameters_[i].second.grad();
    if (grad.defined())
      layout_.scatter_into(layout_.parameters[i], logical(i, grad), flat);  // bf16 converts in the copy; pads left out
    else
      layout_.scatter_into(layout_.parameters[i], at::zeros(layout_.parameters[i].full_shape, gradient_options_), flat);
    parameters_[i].second.mutable_grad() = at::Tensor();
  }
  if (into_shard) return;
  // Every row of the shard is written below, so a transient one needs no zeroing.
  if (gradient_transient_) gradient_ = at::empty({layout_.shard_numel}, gradient_options_);
#ifdef TRAINER_HAVE_CUDA
  if (reduce_stream_ && flat.is_cuda()) {
    // The reduction on the reduce stream, after the compute stream wrote `flat` (and, for a
    // persistent shard, after its last readers: the optimizer and the last step's norm).
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(flat.device().index());
    const c10::cuda::CUDAStream side(*reduce_stream_);
    if (!events_) events_ = std::make_unique<GatherEvents>();
    events_->gradients_ready.record(compute);
    events_->gradients_ready.block(side);
    {
      c10::cuda::CUDAStreamGuard on_reduce_stream(side);
      if (strategy_ == ShardingStrategy::no_shard) {
        communicator_.all_reduce(flat, ReduceOp::average, reduce_stream_);
        gradient_.copy_(flat);
      } else if (replicas_ != nullptr) {
        reduce_over_groups(flat, reduce_stream_);
      } else {
        communicator_.reduce_scatter(flat, gradient_, ReduceOp::average, reduce_stream_);
      }
    }
    // `flat` came from the compute stream's pool: it is kept until the compute stream waits for the
    // reduction (wait_reduced), so its block is never handed out again while the reduce stream reads
    // it, and at a known point (FSDP2 keeps its reduce-scatter input so, rather than recordStream,
    // whose free time the allocator decides). The shard is read on the compute stream only after
    // wait_reduced(), or on a copy stream after order_after_reduce().
    reduce_input_ = std::move(flat);
    reduce_in_flight_ = true;
    return;
  }
#endif
  if (strategy_ == ShardingStrategy::no_shard) {
    communicator_.all_reduce(flat, ReduceOp::average);
    gradient_.copy_(flat);
  } else if (replicas_ != nullptr) {
    reduce_over_groups(flat, std::nullopt);
  } else {
    communicator_.reduce_scatter(flat, gradient_, ReduceOp::average);
  }
}

void ShardedUnit::reduce_over_groups(const at::Tensor& flat, const CollectiveStream& stream) {
  if (!blocks_) {
    communicator_.reduce_scatter(flat, gradient_, ReduceOp::sum, stream);
    average_over_replicas(gradient_, stream);
    return;
  }
  // The block's rows summed over the group, then each replica's world shard of it summed over the
  // replicas: every rank's sum, as full_shard's reduce-scatter at N ranks (another order of the adds).
  const at::Tensor summed = at::empty({block_numel()}, gradient_options_);
  communicator_.reduce_scatter(flat, summed, ReduceOp::sum, stream);
  replicas_->reduce_scatter(summed, gradient_, ReduceOp::sum, stream);
  gradient_.div_(communicator_.world_size() * replicas_->world_size());  // on the current stream: the caller's
}

void ShardedUnit::average_over_replicas(const at::Tensor& summed, const CollectiveStream& stream) {
  if (replicas_->world_size() > 1) replicas_->all_reduce(summed, ReduceOp::sum, stream);
  summed.div_(communicator_.world_size() * replicas_->world_size());  // on the current stream: the caller's
}

std::vector<std::pair<std::string, at::Tensor>> ShardedUnit::gather_full(const at::Tensor& flat) {
  at::Tensor gathered = flat;
  if (layout_.world_size > 1) {
    gathered = at::empty({layout_.world_size * layout_.shard_numel}, flat.options());
    communicator_.all_gather(flat.contiguous(), gathered);
  }
  std::vector<std::pair<std::string, at::Tensor>> full;
  for (const auto& parameter : layout_.parameters)
    full.emplace_back(parameter.name, layout_.full_from_gathered(parameter, gathered).clone());
  return full;
}

void ShardedUnit::load_full(const std::vector<at::Tensor>& full_tensors, at::Tensor& flat) const {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < layout_.parameters.size(); ++i)
    slice(flat, layout_.parameters[i]).copy_(layout_.take_rows(layout_.parameters[i], full_tensors[i]));
}

CollectiveStream make_gather_stream(c10::Device device) {
#ifdef TRAINER_HAVE_CUDA
  if (device.is_cuda())
    return c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()).unwrap();
#endif
  return std::nullopt;
}

int64_t ShardedUnit::compute_parameter_bytes() const {
  if (resident_) return 0;
  int64_t bytes = 0;
  for (const auto& [name, parameter] : parameters_)
    bytes += static_cast<int64_t>(parameter.storage().nbytes());
  return bytes;
}

OwnedBytes ShardedUnit::owned_bytes() const {
  OwnedBytes owned;
  // A host compute shard (parameter offload) is offloaded memory, counted with the optimizer's.
  owned.parameters = distinct_storage_bytes({master_, parameters_offloaded_ ? at::Tensor() : compute_}) +
                     compute_parameter_bytes() + backward_copy_bytes();
  if (parameters_offloaded_) owned.optimizer_host += static_cast<int64_t>(compute_.nbytes());
  owned.gradients = (gradient_.defined() ? static_cast<int64_t>(gradient_.nbytes()) : 0) + full_gradient_bytes();
  return owned;
}

int64_t ShardedUnit::full_gradient_bytes() const {
  if (gradients_in_shard_) return 0;
  int64_t bytes = 0;
  for (const auto& [name, parameter] : parameters_)
    if (parameter.grad().defined()) bytes += static_cast<int64_t>(parameter.grad().storage().nbytes());
  return bytes;
}

}  // namespace llm
