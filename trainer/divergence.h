// When a run has diverged without a NaN: the rule the train loop stops on (exit 3), so that a run
// that can no longer learn does not go on to its last step, exit 0 and checkpoint a dead model.
//
// Two signs, each for `patience` consecutive steps (--divergence_patience, default 10; 0: never):
//   dead      the global gradient norm is exactly 0. A model that still depends on its weights has a
//             nonzero gradient at a nonzero loss; exactly 0 is what a collapsed model gives (its
//             logits no longer depend on its input: with a huge learning rate and no clipping the
//             norm gains are driven to zero, and the loss sits at ln(vocab), uniform guessing)
//   runaway   after warmup, the loss is at or above ln(vocab) + 1: worse than guessing uniformly
//             among the vocabulary by a factor e in perplexity. A fresh model starts within a few
//             hundredths of ln(vocab), and any run that learns at all goes below it within warmup.
// A NaN or inf loss or norm stops the run at once (train_loop.cpp), before this rule; what the
// weights say about it (describe_weights_at_divergence) goes into that message, since "lower --lr"
// is the wrong advice when the weights were not finite, or out of range, before any update.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

namespace llm {

class Communicator;
class ShardedModel;

class DivergenceWatch {
 public:
  DivergenceWatch(int64_t patience, int64_t warmup_steps, int64_t vocab_size);

  // After step `step`'s loss and gradient norm: why the run has diverged, or nothing. The reason
  // says what was seen, over which steps, and against which threshold.
  std::optional<std::string> observe(int64_t step, double loss, double grad_norm);

  double loss_ceiling() const { return loss_ceiling_; }  // ln(vocab) + 1

 private:
  int64_t patience_, warmup_steps_, vocab_size_;
  double loss_ceiling_;
  int64_t zero_gradient_steps_ = 0, runaway_steps_ = 0;
};

// Where a non-finite loss or gradient norm stops the run, before the step's update: the first
// parameter (in the model's order) holding a NaN or inf, with its count, or when every weight is
// finite the largest |weight| and the parameter holding it. `master_of(u)`: unit u's fp32 master
// shard (the host master with offload), laid out as model.unit(u).layout() says. Collective over
// `communicator` (one all-gather): every rank reaches it, as each sees the same global loss and
// norm, and every rank's message names the same tensor. `first_step`: the run's first step, when the
// weights are the initialization's, --init_from's or the resumed checkpoint's.
std::string describe_weights_at_divergence(const ShardedModel& model, const std::function<at::Tensor(size_t)>& master_of,
                                           Communicator& communicator, bool first_step);

}  // namespace llm
