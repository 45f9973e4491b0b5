// The sharding strategies of --sharding, as FSDP and ZeRO name them.
//   full_shard    (ZeRO-3) parameters, gradients and optimizer state sharded; a unit's parameters are
//                 gathered for its forward, freed, gathered again for its backward, freed.
//   shard_grad_op (ZeRO-2) gradients and optimizer state sharded; parameters stay gathered from a
//                 unit's forward until its backward.
//   no_shard      (DDP) everything replicated; gradients all-reduced.
#pragma once

namespace llm {

enum class ShardingStrategy { full_shard, shard_grad_op, no_shard };
const char* to_string(ShardingStrategy strategy);

}  // namespace llm
