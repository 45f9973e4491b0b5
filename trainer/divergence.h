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
// A NaN or inf loss or norm stops the run at once (train_loop.cpp), before this rule.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace llm {

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

}  // namespace llm
