#include "trainer/optimizer_setup.h"

#include "sharding/fsdp_unit.h"

namespace llm {
namespace {

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

bool is_block_linear(const std::string& name, size_t dims) {
  return dims == 2 && (contains(name, ".self_attn.") || contains(name, ".mlp."));
}

}  // namespace

OptimizerSettings optimizer_settings(const RunConfig& run) {
  OptimizerSettings settings;
  settings.kind = run.optimizer;
  settings.beta1 = run.adam_beta1;
  settings.beta2 = run.adam_beta2;
  settings.eps = run.adam_eps;
  settings.weight_decay = run.weight_decay;
  settings.subset_size = run.subset_size;
  settings.galore_rank = run.galore_rank;
  settings.update_proj_gap = run.update_proj_gap;
  settings.galore_scale = run.galore_scale;
  settings.proj_type = run.proj_type;
  settings.stagger_projectors = run.galore_stagger;
  settings.projector_method = run.galore_projector;
  settings.subspace_iterations = run.subspace_iterations;
  return settings;
}

UpdateRule update_rule_for(const std::string& name, size_t dims, const RunConfig& run) {
  if (run.optimizer == "galore_adamw")
    return is_block_linear(name, dims) ? UpdateRule::galore : UpdateRule::adam_hf;
  if (run.optimizer == "adamw_sn") {
    const bool linear = is_block_linear(name, dims) || name == "lm_head.weight";
    return linear || run.subset_norm_params == "all" ? UpdateRule::subset_norm : UpdateRule::adam_hf;
  }
  return UpdateRule::adamw;
}

std::vector<ParameterShard> parameter_shards(std::vector<std::unique_ptr<ShardedUnit>>& units,
                                             const RunConfig& run) {
  std::vector<ParameterShard> shards;
  for (auto& unit : units) {
    for (const ShardedParameter& parameter : unit->layout().parameters) {
      ParameterShard shard;
      shard.name = parameter.name;
      shard.param = unit->slice(unit->shard(), parameter);
      shard.grad = unit->slice(unit->shard_grad(), parameter);
      shard.full_shape = parameter.full_shape;
      shard.rows = parameter.rows;
      shard.cols = parameter.cols;
      shard.first_row = parameter.first_row;
      shard.rows_held = parameter.rows_held;
      shard.rows_per_rank = parameter.rows_per_rank;
      shard.decay = parameter.decay;
      shard.rule = update_rule_for(parameter.name, parameter.full_shape.size(), run);
      shards.push_back(std::move(shard));
    }
  }
  return shards;
}

std::unique_ptr<ShardOptimizer> build_optimizer(const RunConfig& run,
                                                std::vector<std::unique_ptr<ShardedUnit>>& units,
                                                Communicator* across) {
  return make_shard_optimizer(optimizer_settings(run), parameter_shards(units, run), across);
}

}  // namespace llm
