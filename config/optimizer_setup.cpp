#include "config/optimizer_setup.h"

#include "sharding/sharded_model.h"
#include "model/units.h"

namespace llm {
namespace {

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

bool is_block_linear(const std::string& name, size_t dims) {
  return dims == 2 && (contains(name, ".self_attn.") || contains(name, ".mlp."));
}

}  // namespace

OptimizerSettings optimizer_settings(const RunConfig& run) {
  OptimizerSettings settings;
  settings.kind = run.optimizer.name;
  settings.beta1 = run.optimizer.adam_beta1;
  settings.beta2 = run.optimizer.adam_beta2;
  settings.eps = run.optimizer.adam_eps;
  settings.weight_decay = run.optimizer.weight_decay;
  settings.subset_size = run.optimizer.subset_size;
  settings.galore_rank = run.optimizer.galore_rank;
  settings.update_proj_gap = run.optimizer.update_proj_gap;
  settings.galore_scale = run.optimizer.galore_scale;
  settings.proj_type = run.optimizer.proj_type;
  settings.stagger_projectors = run.optimizer.galore_stagger;
  settings.projector_method = run.optimizer.galore_projector;
  settings.subspace_iterations = run.optimizer.subspace_iterations;
  settings.state_dtype = run.optimizer.state_dtype;
  settings.state_rounding_seed = static_cast<uint64_t>(run.seed);
  return settings;
}

UpdateRule update_rule_for(const std::string& name, size_t dims, const RunConfig& run) {
  if (run.optimizer.name == "galore_adamw")
    return is_block_linear(name, dims) ? UpdateRule::galore : UpdateRule::adam_hf;
  if (run.optimizer.name == "adamw_sn") {
    const bool linear = is_block_linear(name, dims) || name == "lm_head.weight";
    return linear || run.optimizer.subset_norm_params == "all" ? UpdateRule::subset_norm : UpdateRule::adam_hf;
  }
  return UpdateRule::adamw;
}

std::vector<UpdateRule> update_rules_for(const FlatShardLayout& layout, const RunConfig& run) {
  std::vector<UpdateRule> rules;
  for (const ShardedParameter& parameter : layout.parameters)
    rules.push_back(update_rule_for(parameter.name, parameter.full_shape.size(), run));
  return rules;
}

GaloreWidestMatrix galore_widest_matrix(const ModelConfig& model, const RunConfig& run) {
  GaloreWidestMatrix widest;
  for (const UnitSpec& unit : describe_units(model))
    for (const ParameterSpec& parameter : unit.parameters) {
      if (update_rule_for(parameter.name, parameter.shape.size(), run) != UpdateRule::galore) continue;
      const int64_t rows = parameter.shape[0], cols = parameter.shape[1];
      if (std::min(rows, cols) > widest.full_rank()) widest = {parameter.name, rows, cols};
    }
  return widest;
}

std::vector<std::vector<UpdateRule>> unit_update_rules(const ShardedModel& model, const RunConfig& run) {
  std::vector<std::vector<UpdateRule>> rules;
  for (size_t u = 0; u < model.unit_count(); ++u) rules.push_back(update_rules_for(model.unit(u).layout(), run));
  return rules;
}

std::unique_ptr<ShardOptimizer> build_optimizer(const RunConfig& run, ShardedModel& model, Communicator* across) {
  std::vector<std::vector<UpdateRule>> rules = unit_update_rules(model, run);
  std::vector<UnitShard> units;
  for (size_t u = 0; u < model.unit_count(); ++u) {
    ShardedUnit& unit = model.unit(u);
    units.push_back({unit.layout(), unit.master_shard(), unit.gradient_shard(), std::move(rules[u])});
  }
  return std::make_unique<ShardOptimizer>(optimizer_settings(run), std::move(units), across);
}

}  // namespace llm
