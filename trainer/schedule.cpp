#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace llm {

double lr_multiplier(Scheduler scheduler, int64_t step, int64_t warmup_steps, int64_t total_steps,
                     double min_lr_ratio) {
  if (warmup_steps > 0 && step <= warmup_steps)
    return static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (scheduler == Scheduler::constant) return 1.0;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress =
      std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double shape = scheduler == Scheduler::cosine
                           ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                           : 1.0 - progress;
  return min_lr_ratio + (1.0 - min_lr_ratio) * shape;
}

}  // namespace llm
