#include "trainer/divergence.h"

#include <cmath>
#include <sstream>

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

}  // namespace llm
