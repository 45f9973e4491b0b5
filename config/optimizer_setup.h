// Which update rule each LLaMA parameter gets under --optimizer, and the optimizer built on the
// rank's shards. The rules follow the references' parameter groups (shared/reference/optimizers.md):
//   adamw         every parameter: torch.optim.AdamW
//   galore_adamw  the attention and MLP linear weights (names with "self_attn." or "mlp.", 2-D) are
//                 projected; the embedding, lm_head and the norm gains take the same HF-style Adam
//                 without projection (GaLore's torchrun_main)
//   adamw_sn      --subset_norm_params linear: every linear weight, lm_head included, is subset-normed,
//                 the rest takes element-wise HF-style Adam (sn-sm's *_sn runs); all: every parameter
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "optim/shard_optimizer.h"
#include "config/config.h"

namespace llm {

class ShardedModel;

OptimizerSettings optimizer_settings(const RunConfig& run);
UpdateRule update_rule_for(const std::string& name, size_t dims, const RunConfig& run);
// The rule of each parameter of a layout, in order.
std::vector<UpdateRule> update_rules_for(const FlatShardLayout& layout, const RunConfig& run);
// Of the matrices GaLore projects in this model, the one with the largest smaller dimension. GaLore
// keeps a matrix at rank min(--rank, rows, cols), so a --rank at or above that dimension leaves every
// projected matrix at full rank, where its moments and projector take more memory than AdamW's.
// Empty name when the model has no such matrix.
struct GaloreWidestMatrix {
  std::string name;
  int64_t rows = 0, cols = 0;
  int64_t full_rank() const { return std::min(rows, cols); }
};
GaloreWidestMatrix galore_widest_matrix(const ModelConfig& model, const RunConfig& run);

// Every unit's rules, in unit order: what the optimizer is built with, on the device or offloaded.
std::vector<std::vector<UpdateRule>> unit_update_rules(const ShardedModel& model, const RunConfig& run);

// The optimizer over every unit of the sharded model (the units' master and gradient shards, used in
// place). across: the communicator when the units are sharded (more than one rank, not no_shard).
std::unique_ptr<ShardOptimizer> build_optimizer(const RunConfig& run, ShardedModel& model, Communicator* across);

}  // namespace llm
