// Which update rule each LLaMA parameter gets under --optimizer, and the optimizer built on the
// rank's shards. The rules follow the references' parameter groups (shared/reference/optimizers.md):
//   adamw         every parameter: torch.optim.AdamW
//   galore_adamw  the attention and MLP linear weights (names with "self_attn." or "mlp.", 2-D) are
//                 projected; the embedding, lm_head and the norm gains take the same HF-style Adam
//                 without projection (GaLore's torchrun_main)
//   adamw_sn      --subset_norm_params linear: every linear weight, lm_head included, is subset-normed,
//                 the rest takes element-wise HF-style Adam (sn-sm's *_sn runs); all: every parameter
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "optim/shard_optimizer.h"
#include "trainer/config.h"

namespace llm {

class ShardedUnit;

OptimizerSettings optimizer_settings(const RunConfig& run);
UpdateRule update_rule_for(const std::string& name, size_t dims, const RunConfig& run);

// One ParameterShard per parameter of every unit (views into the units' shard and gradient shard).
std::vector<ParameterShard> parameter_shards(std::vector<std::unique_ptr<ShardedUnit>>& units,
                                             const RunConfig& run);

// across: the communicator when the units are sharded (more than one rank, not no_shard).
std::unique_ptr<ShardOptimizer> build_optimizer(const RunConfig& run,
                                                std::vector<std::unique_ptr<ShardedUnit>>& units,
                                                Communicator* across);

}  // namespace llm
