// One FSDP unit at run time: its fp32 master shard, gradient shard, and the module parameters it
// materialises around forward and backward (docs/sharding.md has the order of collectives).
//
//   gather()            all-gather the shard into the compute parameters (allocating their storage)
//   release()           free the compute parameters' storage (full_shard after forward and backward;
//                       shard_grad_op only after backward; no_shard never)
//   reduce_gradients()  full gradients -> this rank's gradient shard: reduce-scatter (average) for the
//                       sharded strategies, all-reduce (average) for no_shard; frees the full gradients
//
// Storage is freed and re-allocated in place (StorageImpl reset / new DataPtr) and refilled through
// variable_data(), which does not bump the version counter: autograd's saved references to a weight
// stay valid across release() and gather(), as with FSDP's storage resize_(0).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "sharding/communicator.h"
#include "sharding/flat_layout.h"
#include "sharding/strategy.h"

namespace llm {

class ShardedUnit {
 public:
  // parameters: the unit's module parameters (fp32), initialised identically on every rank. This
  // rank's rows are copied into the fp32 shard; then the parameters become compute copies of
  // compute_dtype, and for the sharded strategies their storage is freed until gather().
  ShardedUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> parameters,
              Communicator& communicator, ShardingStrategy strategy, at::ScalarType compute_dtype);

  void gather();
  void release();
  void release_after_forward();   // release() for full_shard, nothing otherwise
  void reduce_gradients();
  // After the optimizer updated the shard: no_shard copies it into the compute parameters (the
  // sharded strategies refresh them at the next gather()).
  void publish_shard();
  bool gathered() const { return gathered_; }

  const FlatShardLayout& layout() const { return layout_; }
  const std::string& name() const { return name_; }
  at::Tensor& shard() { return shard_; }            // (shard_numel) fp32 master
  at::Tensor& shard_grad() { return shard_grad_; }  // (shard_numel) fp32
  // Views of one parameter's rows inside a flat buffer laid out like the shard.
  at::Tensor slice(const at::Tensor& flat, const ShardedParameter& parameter) const {
    return flat.narrow(0, parameter.shard_offset, parameter.shard_numel());
  }

  // Checkpoints: a flat buffer laid out like the shard -> full tensors (all ranks call; collective),
  // and full tensors -> this rank's rows of such a buffer.
  std::vector<std::pair<std::string, at::Tensor>> gather_full(const at::Tensor& flat);
  void load_full(const std::vector<at::Tensor>& full_tensors, at::Tensor& flat) const;

  int64_t compute_parameter_bytes() const;  // bytes of the materialised parameters right now
  int64_t full_gradient_bytes() const;      // bytes of the parameters' gradients not yet reduced

 private:
  std::string name_;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;
  Communicator& communicator_;
  ShardingStrategy strategy_;
  FlatShardLayout layout_;
  at::Tensor shard_, shard_grad_;
  bool gathered_ = true;
};

}  // namespace llm
