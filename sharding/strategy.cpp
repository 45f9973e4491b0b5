#include "sharding/strategy.h"

namespace llm {

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::full_shard: return "full_shard";
    case ShardingStrategy::shard_grad_op: return "shard_grad_op";
    case ShardingStrategy::no_shard: return "no_shard";
    case ShardingStrategy::hybrid_shard: return "hybrid_shard";
    case ShardingStrategy::hybrid_shard_grad_op: return "hybrid_shard_grad_op";
  }
  return "?";
}

bool is_hybrid(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::hybrid_shard || strategy == ShardingStrategy::hybrid_shard_grad_op;
}

ShardingStrategy within_group(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::hybrid_shard: return ShardingStrategy::full_shard;
    case ShardingStrategy::hybrid_shard_grad_op: return ShardingStrategy::shard_grad_op;
    default: return strategy;
  }
}

}  // namespace llm
