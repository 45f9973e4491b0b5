#include "optim/hf_adamw.h"

#include <chrono>
#include <cmath>

#include <ATen/ATen.h>

#include "common/errors.h"
#include "optim/shard_state.h"
#include "sharding/communicator.h"

namespace llm {
namespace {

constexpr const char* kSource = "optimizer";

at::Tensor rows_view(const ParameterShard& parameter, const at::Tensor& flat) {
  return flat.view({parameter.rows_per_rank, parameter.cols});
}

}  // namespace

HfAdamW::HfAdamW(const OptimizerSettings& settings, std::vector<ParameterShard> parameters,
                 Communicator* across)
    : settings_(settings), across_(across) {
  const int world = across != nullptr ? across->world_size() : 1;
  const int rank = across != nullptr ? across->rank() : 0;
  LLM_REQUIRE(settings.galore_rank >= 1, kSource, "--rank", "must be >= 1");
  LLM_REQUIRE(settings.update_proj_gap >= 1, kSource, "--update_proj_gap", "must be >= 1");
  LLM_REQUIRE(settings.projector_method == "svd" || settings.projector_method == "subspace", kSource,
              "--galore_projector", "expected svd or subspace (got \"" + settings.projector_method + "\")");
  LLM_REQUIRE(settings.subspace_iterations >= 1, kSource, "--subspace_iterations", "must be >= 1");
  int64_t galore_index = 0, galore_count = 0;
  for (const ParameterShard& parameter : parameters) galore_count += parameter.rule == UpdateRule::galore;
  for (ParameterShard& parameter : parameters) {
    Entry entry;
    const at::TensorOptions options = parameter.param.options();
    switch (parameter.rule) {
      case UpdateRule::adam_hf:
        entry.exp_avg_sq = at::zeros({parameter.param.numel()}, options);
        break;
      case UpdateRule::subset_norm:
        entry.subsets = make_subset_geometry(parameter, settings.subset_size, world);
        entry.exp_avg_sq = at::zeros(entry.subsets.local_state_shape, options);
        break;
      case UpdateRule::galore:
        entry.galore = make_galore_geometry(parameter, settings, galore_index++, rank, world);
        entry.exp_avg_sq = at::zeros(entry.galore.local_state_shape, options);
        entry.projector = at::zeros(entry.galore.local_projector_shape, options);
        entry.projector_seed = 0x9a10e + static_cast<uint64_t>(galore_index);
        if (settings.stagger_projectors)
          entry.refresh_offset = (galore_index - 1) * settings.update_proj_gap / galore_count;
        break;
      case UpdateRule::adamw:
        fail_user(kSource, parameter.name,
                  "the torch-style adamw rule cannot be mixed with " + settings.kind + "'s rules");
    }
    entry.parameter = std::move(parameter);
    if (settings.beta1 > 0) entry.exp_avg = at::zeros(moment_shape(entry), options);
    entries_.push_back(std::move(entry));
  }
}

std::vector<int64_t> HfAdamW::moment_shape(const Entry& entry) const {
  if (entry.parameter.rule == UpdateRule::galore) return entry.galore.local_state_shape;
  return {entry.parameter.param.numel()};
}

void HfAdamW::step(double lr) {
  for (const Entry& entry : entries_) {
    const at::Tensor& grad = entry.parameter.grad;
    LLM_REQUIRE(grad.defined() && grad.numel() == entry.parameter.param.numel() &&
                    grad.scalar_type() == at::kFloat && grad.is_contiguous(),
                kSource, entry.parameter.name,
                "needs a contiguous float32 gradient with the parameter's number of elements");
  }
  LLM_REQUIRE(std::isfinite(lr) && lr >= 0, kSource, "lr", "must be finite and >= 0");
  const int64_t t = step_ + 1;
  const double beta1 = settings_.beta1, beta2 = settings_.beta2;
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  const double step_size = lr * std::sqrt(bias_correction2) / bias_correction1;

  // GaLore's schedule: a new projector at steps 1, T + 1, 2T + 1, ... from that step's gradient
  // (shifted per matrix by refresh_offset when staggered; every matrix gets one at step 1).
  // Every projector exists after step 1 (a checkpoint of a later step carries them).
  projector_seconds_ = 0;
  const auto started = std::chrono::steady_clock::now();
  const bool have_projectors = t > 1;
  for (Entry& entry : entries_) {
    if (entry.parameter.rule != UpdateRule::galore) continue;
    const int64_t phase = t - 1 - entry.refresh_offset;
    if (have_projectors && !(phase >= 0 && phase % settings_.update_proj_gap == 0)) continue;
    if (settings_.projector_method == "subspace")
      refresh_projector_subspace(entry.galore, entry.parameter, entry.parameter.grad, entry.projector,
                                 have_projectors,
                                 have_projectors ? settings_.subspace_iterations
                                                 : 3 * settings_.subspace_iterations,
                                 entry.projector_seed, across_);
    else
      refresh_projector(entry.galore, entry.parameter, entry.parameter.grad, entry.projector, across_);
  }
  projector_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  // Phase 1: what each moment is fed. x: the (projected) gradient; u: the second-moment input.
  std::vector<at::Tensor> inputs(entries_.size()), second(entries_.size());
  std::vector<size_t> summed_over_ranks;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& entry = entries_[i];
    const at::Tensor& grad = entry.parameter.grad;
    switch (entry.parameter.rule) {
      case UpdateRule::adam_hf:
        inputs[i] = grad;
        break;
      case UpdateRule::subset_norm:
        inputs[i] = grad;
        second[i] = subset_square_sums(entry.subsets, entry.parameter, grad);
        if (entry.subsets.spans_ranks && across_ != nullptr) summed_over_ranks.push_back(i);
        break;
      case UpdateRule::galore:
        inputs[i] = project(entry.galore, entry.parameter, grad, entry.projector, across_);
        break;
      case UpdateRule::adamw:
        break;
    }
  }
  if (!summed_over_ranks.empty()) {
    // One all-reduce for every subset sum of this step that spans ranks. Each parameter takes a
    // segment of all its subsets (the same layout on every rank); a rank's partial sums sit at
    // their global subset index, so a subset shared by two ranks adds up.
    int64_t total = 0;
    for (size_t i : summed_over_ranks) total += entries_[i].subsets.total_subsets;
    at::Tensor joined = at::zeros({total}, second[summed_over_ranks.front()].options());
    int64_t offset = 0;
    for (size_t i : summed_over_ranks) {
      const SubsetGeometry& subsets = entries_[i].subsets;
      const int64_t first = subsets.kind == SubsetKind::block ? subsets.first_block : 0;
      joined.narrow(0, offset + first, second[i].numel()).copy_(second[i].reshape({-1}));
      offset += subsets.total_subsets;
    }
    across_->all_reduce(joined, ReduceOp::sum);
    offset = 0;
    for (size_t i : summed_over_ranks) {
      const SubsetGeometry& subsets = entries_[i].subsets;
      const int64_t first = subsets.kind == SubsetKind::block ? subsets.first_block : 0;
      second[i] = joined.narrow(0, offset + first, second[i].numel()).view(second[i].sizes());
      offset += subsets.total_subsets;
    }
  }

  // Phase 2: moments and the update.
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& entry = entries_[i];
    ParameterShard& parameter = entry.parameter;
    const at::Tensor& x = inputs[i];
    at::Tensor numerator = x;
    if (beta1 > 0) {
      entry.exp_avg.mul_(beta1).add_(x, 1.0 - beta1);
      numerator = entry.exp_avg;
    }
    if (parameter.rule == UpdateRule::subset_norm)
      entry.exp_avg_sq.mul_(beta2).add_(second[i], 1.0 - beta2);
    else
      entry.exp_avg_sq.mul_(beta2).addcmul_(x, x, 1.0 - beta2);
    const at::Tensor denominator = entry.exp_avg_sq.sqrt().add_(settings_.eps);
    switch (parameter.rule) {
      case UpdateRule::adam_hf:
        parameter.param.add_(numerator / denominator, -step_size);
        break;
      case UpdateRule::subset_norm:
        apply_subset_update(entry.subsets, parameter, parameter.param, numerator, denominator, step_size);
        break;
      case UpdateRule::galore:
        parameter.param.add_(project_back(entry.galore, parameter, numerator / denominator, entry.projector,
                                          settings_.galore_scale, across_),
                             -step_size);
        break;
      case UpdateRule::adamw:
        break;
    }
    if (parameter.decay && settings_.weight_decay > 0)
      parameter.param.add_(parameter.param, -lr * settings_.weight_decay);
  }
  step_ = t;
}

int64_t HfAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const Entry& entry : entries_)
    for (const at::Tensor* tensor : {&entry.exp_avg, &entry.exp_avg_sq, &entry.projector})
      if (tensor->defined()) bytes += static_cast<int64_t>(tensor->nbytes());
  return bytes;
}

std::map<std::string, at::Tensor> HfAdamW::full_state_dict() {
  std::map<std::string, at::Tensor> state;
  for (const Entry& entry : entries_) {
    const ParameterShard& parameter = entry.parameter;
    auto full_like_param = [&](const at::Tensor& local) {
      return assemble_rows(rows_view(parameter, local), parameter.rows, parameter.first_row,
                           parameter.rows_held, across_)
          .reshape(parameter.full_shape);
    };
    const std::string& name = parameter.name;
    switch (parameter.rule) {
      case UpdateRule::adam_hf:
        if (entry.exp_avg.defined()) state[name + ".exp_avg"] = full_like_param(entry.exp_avg);
        state[name + ".exp_avg_sq"] = full_like_param(entry.exp_avg_sq);
        break;
      case UpdateRule::subset_norm:
        if (entry.exp_avg.defined()) state[name + ".exp_avg"] = full_like_param(entry.exp_avg);
        state[name + ".exp_avg_sq"] = assemble_subset_state(entry.subsets, parameter, entry.exp_avg_sq, across_);
        break;
      case UpdateRule::galore:
        if (entry.exp_avg.defined())
          state[name + ".exp_avg"] = assemble_galore_moment(entry.galore, parameter, entry.exp_avg, across_);
        state[name + ".exp_avg_sq"] = assemble_galore_moment(entry.galore, parameter, entry.exp_avg_sq, across_);
        state[name + ".projector"] = assemble_galore_projector(entry.galore, parameter, entry.projector, across_);
        break;
      case UpdateRule::adamw:
        break;
    }
  }
  state["step"] = at::scalar_tensor(step_, at::kLong);
  return state;
}

void HfAdamW::load_full_state_dict(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, std::vector<int64_t>> expected;
  for (const Entry& entry : entries_) {
    const ParameterShard& parameter = entry.parameter;
    const std::string& name = parameter.name;
    switch (parameter.rule) {
      case UpdateRule::adam_hf:
        expected[name + ".exp_avg_sq"] = parameter.full_shape;
        break;
      case UpdateRule::subset_norm:
        expected[name + ".exp_avg_sq"] = entry.subsets.full_state_shape;
        break;
      case UpdateRule::galore:
        expected[name + ".exp_avg_sq"] = entry.galore.full_state_shape;
        expected[name + ".projector"] = entry.galore.full_projector_shape;
        break;
      case UpdateRule::adamw:
        break;
    }
    if (entry.exp_avg.defined())
      expected[name + ".exp_avg"] = parameter.rule == UpdateRule::galore ? entry.galore.full_state_shape
                                                                          : parameter.full_shape;
  }
  const int64_t step = check_full_state(state, expected, settings_.kind);

  std::vector<std::vector<at::Tensor>> loaded(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& entry = entries_[i];
    const ParameterShard& parameter = entry.parameter;
    const std::string& name = parameter.name;
    auto at_device = [&](const std::string& key) { return state.at(key).to(parameter.param.device()); };
    auto local_like_param = [&](const std::string& key) {
      return take_rows(at_device(key).reshape({parameter.rows, parameter.cols}), parameter.rows_per_rank,
                       parameter.first_row, parameter.rows_held)
          .reshape({-1});
    };
    at::Tensor exp_avg, exp_avg_sq, projector;
    switch (parameter.rule) {
      case UpdateRule::adam_hf:
        if (entry.exp_avg.defined()) exp_avg = local_like_param(name + ".exp_avg");
        exp_avg_sq = local_like_param(name + ".exp_avg_sq");
        break;
      case UpdateRule::subset_norm:
        if (entry.exp_avg.defined()) exp_avg = local_like_param(name + ".exp_avg");
        exp_avg_sq = take_subset_state(entry.subsets, parameter, at_device(name + ".exp_avg_sq"))
                         .view(entry.subsets.local_state_shape);
        break;
      case UpdateRule::galore:
        if (entry.exp_avg.defined()) exp_avg = take_galore_moment(entry.galore, parameter, at_device(name + ".exp_avg"));
        exp_avg_sq = take_galore_moment(entry.galore, parameter, at_device(name + ".exp_avg_sq"));
        projector = take_galore_projector(entry.galore, parameter, at_device(name + ".projector"));
        break;
      case UpdateRule::adamw:
        break;
    }
    loaded[i] = {exp_avg, exp_avg_sq, projector};
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& entry = entries_[i];
    if (entry.exp_avg.defined()) entry.exp_avg.copy_(loaded[i][0].view(entry.exp_avg.sizes()));
    entry.exp_avg_sq.copy_(loaded[i][1].view(entry.exp_avg_sq.sizes()));
    if (entry.projector.defined()) entry.projector.copy_(loaded[i][2]);
  }
  step_ = step;
}

}  // namespace llm
