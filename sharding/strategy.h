// The sharding strategies of --sharding, as FSDP and ZeRO name them.
//   full_shard    (ZeRO-3) parameters, gradients and optimizer state sharded; a unit's parameters are
//                 gathered for its forward, freed, gathered again for its backward, freed.
//   shard_grad_op (ZeRO-2) gradients and optimizer state sharded; parameters stay gathered from a
//                 unit's forward until its backward.
//   no_shard      (DDP) everything replicated; gradients all-reduced.
//   hybrid_shard, hybrid_shard_grad_op (FSDP's HYBRID_SHARD and _HYBRID_SHARD_ZERO2, DeepSpeed's MiCS):
//                 full_shard or shard_grad_op inside each group of --shard_group_size ranks (a node),
//                 replicated across the groups; each rank's gradient shard is all-reduced across the
//                 groups once per optimizer step (sharding/topology.h, docs/sharding.md).
#pragma once

namespace llm {

enum class ShardingStrategy { full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_grad_op };
const char* to_string(ShardingStrategy strategy);

bool is_hybrid(ShardingStrategy strategy);
// What a hybrid strategy does inside its group (full_shard, shard_grad_op); any other, itself.
ShardingStrategy within_group(ShardingStrategy strategy);

}  // namespace llm
