#include "optim/shard_optimizer.h"

#include <ATen/ATen.h>

#include "common/errors.h"
#include "optim/adamw.h"
#include "optim/galore.h"
#include "optim/hf_adamw.h"
#include "optim/shard_state.h"
#include "optim/subset_norm.h"
#include "sharding/communicator.h"

namespace llm {
namespace {

// torch.optim.AdamW on shards: the fused kernel of optim/adamw.h, one view per parameter.
class AdamWShards final : public ShardOptimizer {
 public:
  AdamWShards(const OptimizerSettings& settings, std::vector<ParameterShard> parameters, Communicator* across)
      : parameters_(std::move(parameters)),
        across_(across),
        adamw_(optimized_tensors(parameters_),
               AdamWOptions{settings.beta1, settings.beta2, settings.eps, settings.weight_decay}) {
    adamw_.allocate_state();
  }

  void step(double lr) override { adamw_.step(lr); }
  int64_t steps_taken() const override { return adamw_.steps_taken(); }
  int64_t state_bytes() const override { return adamw_.state_bytes(); }

  std::map<std::string, at::Tensor> full_state_dict() override {
    std::map<std::string, at::Tensor> local = adamw_.state_dict(), full;
    for (const ParameterShard& parameter : parameters_)
      for (const std::string suffix : {".exp_avg", ".exp_avg_sq"})
        full[parameter.name + suffix] =
            assemble_rows(local.at(parameter.name + suffix).view({parameter.rows_per_rank, parameter.cols}),
                          parameter.rows, parameter.first_row, parameter.rows_held, across_)
                .reshape(parameter.full_shape);
    full["step"] = local.at("step");
    return full;
  }

  void load_full_state_dict(const std::map<std::string, at::Tensor>& state) override {
    std::map<std::string, std::vector<int64_t>> expected;
    for (const ParameterShard& parameter : parameters_)
      for (const std::string suffix : {".exp_avg", ".exp_avg_sq"})
        expected[parameter.name + suffix] = parameter.full_shape;
    check_full_state(state, expected, "adamw");
    std::map<std::string, at::Tensor> local;
    for (const ParameterShard& parameter : parameters_)
      for (const std::string suffix : {".exp_avg", ".exp_avg_sq"})
        local[parameter.name + suffix] =
            take_rows(state.at(parameter.name + suffix).to(parameter.param.device()).reshape({parameter.rows, parameter.cols}),
                      parameter.rows_per_rank, parameter.first_row, parameter.rows_held)
                .reshape({-1});
    local["step"] = state.at("step");
    adamw_.load_state_dict(local);
  }

 private:
  static std::vector<OptimizedTensor> optimized_tensors(const std::vector<ParameterShard>& parameters) {
    std::vector<OptimizedTensor> tensors;
    for (const ParameterShard& parameter : parameters)
      tensors.push_back({parameter.name, parameter.param, parameter.decay, parameter.grad});
    return tensors;
  }

  std::vector<ParameterShard> parameters_;
  Communicator* across_;
  AdamW adamw_;
};

}  // namespace

const char* to_string(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::adamw: return "adamw";
    case UpdateRule::adam_hf: return "adam_hf";
    case UpdateRule::subset_norm: return "subset_norm";
    case UpdateRule::galore: return "galore";
  }
  return "?";
}

ParameterShard ParameterShard::whole(std::string name, at::Tensor param, at::Tensor grad, bool decay,
                                     UpdateRule rule) {
  ParameterShard shard;
  shard.name = std::move(name);
  shard.full_shape = param.sizes().vec();
  shard.rows = param.dim() == 0 ? 1 : param.size(0);
  shard.cols = shard.rows == 0 ? 1 : param.numel() / shard.rows;
  shard.first_row = 0;
  shard.rows_held = shard.rows;
  shard.rows_per_rank = shard.rows;
  shard.param = param.view({-1});
  shard.grad = grad.defined() ? grad.view({-1}) : grad;
  shard.decay = decay;
  shard.rule = rule;
  return shard;
}

std::unique_ptr<ShardOptimizer> make_shard_optimizer(const OptimizerSettings& settings,
                                                     std::vector<ParameterShard> parameters,
                                                     Communicator* across) {
  LLM_REQUIRE(settings.kind == "adamw" || settings.kind == "adamw_sn" || settings.kind == "galore_adamw",
              "command line", "--optimizer",
              "expected adamw, adamw_sn or galore_adamw (got \"" + settings.kind + "\")");
  for (const ParameterShard& parameter : parameters) {
    LLM_REQUIRE(parameter.param.defined() && parameter.param.scalar_type() == at::kFloat &&
                    parameter.param.is_contiguous() &&
                    parameter.param.numel() == parameter.rows_per_rank * parameter.cols,
                "optimizer", parameter.name,
                "the master parameter must be a contiguous float32 tensor of rows_per_rank * cols elements");
    const bool adamw_rule = parameter.rule == UpdateRule::adamw;
    LLM_REQUIRE(adamw_rule == (settings.kind == "adamw"), "optimizer", parameter.name,
                std::string("rule ") + to_string(parameter.rule) + " does not belong to --optimizer " +
                    settings.kind);
  }
  if (settings.kind == "adamw") return std::make_unique<AdamWShards>(settings, std::move(parameters), across);
  return std::make_unique<HfAdamW>(settings, std::move(parameters), across);
}

int64_t optimizer_state_bytes(const OptimizerSettings& settings, const ParameterShard& parameter,
                              int world_size) {
  auto numel = [](const std::vector<int64_t>& shape) {
    int64_t count = 1;
    for (int64_t size : shape) count *= size;
    return count;
  };
  const int64_t shard_numel = parameter.rows_per_rank * parameter.cols;
  const int64_t first_moment = settings.beta1 > 0 ? 1 : 0;
  switch (parameter.rule) {
    case UpdateRule::adamw:
      return 8 * shard_numel;
    case UpdateRule::adam_hf:
      return 4 * (first_moment + 1) * shard_numel;
    case UpdateRule::subset_norm:
      return 4 * (first_moment * shard_numel +
                  numel(make_subset_geometry(parameter, settings.subset_size, world_size).local_state_shape));
    case UpdateRule::galore: {
      // The geometry of rank 0 (the chunk of a left projection is the same on every rank).
      const GaLoreGeometry geometry = make_galore_geometry(parameter, settings, 0, 0, world_size);
      return 4 * ((first_moment + 1) * numel(geometry.local_state_shape) + numel(geometry.local_projector_shape));
    }
  }
  return 0;
}

}  // namespace llm
