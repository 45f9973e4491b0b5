#include "trainer/divergence.h"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "sharding/communicator.h"
#include "sharding/sharded_model.h"

namespace llm {

DivergenceWatch::DivergenceWatch(int64_t patience, int64_t warmup_steps, int64_t vocab_size)
    : patience_(patience),
      warmup_steps_(warmup_steps),
      vocab_size_(vocab_size),
      loss_ceiling_(std::log(static_cast<double>(vocab_size)) + 1.0) {}

std::optional<std::string> DivergenceWatch::observe(int64_t step, double loss, double grad_norm) {
  if (patience_ <= 0) return std::nullopt;
  zero_gradient_steps_ = grad_norm == 0.0 ? zero_gradient_steps_ + 1 : 0;
  runaway_steps_ = step > warmup_steps_ && loss >= loss_ceiling_ ? runaway_steps_ + 1 : 0;
  const double uniform = std::log(static_cast<double>(vocab_size_));
  std::ostringstream reason;
  if (zero_gradient_steps_ >= patience_) {
    reason << "the gradient norm has been exactly 0 for the last " << zero_gradient_steps_ << " steps ("
           << step - zero_gradient_steps_ + 1 << " to " << step << "; loss now " << loss
           << ", uniform guessing among " << vocab_size_ << " tokens is ln(" << vocab_size_ << ") = " << uniform
           << "): the model has collapsed and no step can change it";
    return reason.str();
  }
  if (runaway_steps_ >= patience_) {
    reason << "the loss has been at or above ln(" << vocab_size_ << ") + 1 = " << loss_ceiling_
           << " (worse than guessing uniformly among the vocabulary) for the last " << runaway_steps_
           << " steps after warmup (" << step - runaway_steps_ + 1 << " to " << step << "; now " << loss << ")";
    return reason.str();
  }
  return std::nullopt;
}

// Weights above this make the forward's products overflow float32 (3.4e38) in a model of any width:
// no learning rate gives them, so at the first step they are the initialization's (a typo'd
// initializer_range) or the loaded weights'.
constexpr double kOutOfRangeWeight = 1e6;

std::string describe_weights_at_divergence(const ShardedModel& model, const std::function<at::Tensor(size_t)>& master_of,
                                           Communicator& communicator, bool first_step) {
  at::NoGradGuard no_grad;
  // Per parameter, this rank's rows: {non-finite count, largest finite |value|}.
  std::vector<std::string> names;
  std::vector<float> mine;
  for (size_t u = 0; u < model.unit_count(); ++u) {
    const at::Tensor master = master_of(u);
    for (const ShardedParameter& p : model.unit(u).layout().parameters) {
      names.push_back(p.name);
      if (p.rows_held == 0 || !master.defined()) {
        mine.insert(mine.end(), {0.0f, 0.0f});
        continue;
      }
      const at::Tensor rows = master.narrow(0, p.shard_offset, p.rows_held * p.cols);
      const at::Tensor finite = rows.isfinite();
      mine.push_back(static_cast<float>(rows.numel() - finite.sum().item<int64_t>()));
      mine.push_back(rows.abs().masked_fill(finite.logical_not(), 0).max().item<float>());
    }
  }
  const int64_t n = static_cast<int64_t>(mine.size());
  const at::Tensor local = at::tensor(mine, at::TensorOptions().dtype(at::kFloat)).to(communicator.device());
  at::Tensor every = at::empty({communicator.world_size() * n}, local.options());
  communicator.all_gather(local, every);
  const at::Tensor stats = every.view({communicator.world_size(), n / 2, 2}).cpu();
  const at::Tensor non_finite = stats.select(2, 0).sum(0);   // (parameters)
  const at::Tensor largest = std::get<0>(stats.select(2, 1).max(0));
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto count = static_cast<int64_t>(non_finite[static_cast<int64_t>(i)].item<float>());
    if (count == 0) continue;
    out << "The weights were not finite before this step's update: " << names[i] << " holds " << count
        << " NaN or inf value(s) (the first parameter that does); "
        << (first_step ? "at the run's first step they are the initialization's (check initializer_range in --config), "
                         "--init_from's or the resumed checkpoint's, which the flags named next cannot fix. Once they are finite: "
                       : "an earlier update made them so. ");
    return out.str();
  }
  if (names.empty()) return "";
  const int64_t at_most = largest.argmax().item<int64_t>();
  const double value = largest[at_most].item<float>();
  if (value > kOutOfRangeWeight && first_step)
    out << "Every weight is finite, but the largest |weight| is " << value << ", in " << names[static_cast<size_t>(at_most)]
        << ": weights this large overflow float32 in the forward whatever the learning rate; at the run's first step "
           "they are the initialization's (check initializer_range in --config, typically 0.02), --init_from's or the "
           "resumed checkpoint's, which the flags named next cannot fix. Once they are in range: ";
  else
    out << "Every weight is finite (the largest |weight| is " << value << ", in " << names[static_cast<size_t>(at_most)]
        << "). ";
  return out.str();
}

}  // namespace llm
