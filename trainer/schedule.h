// Learning-rate schedules: linear warmup, then cosine, linear or constant down to min_lr_ratio.
//
// Update k (1-based) runs at lr * multiplier(k). Warmup: k / warmup_steps for k <= warmup_steps.
// After it, with progress p = (k - warmup) / (total - warmup) in [0, 1]:
//   cosine:   min + (1 - min) * 0.5 * (1 + cos(pi * p))
//   linear:   min + (1 - min) * (1 - p)
//   constant: 1
// Unlike GaLore's torchrun_main.py (whose scheduler steps after the optimizer, so its first update
// runs at lr 0 and it does num_training_steps + 1 updates), update 1 here already learns and the run
// does exactly num_training_steps updates, the last one at min_lr_ratio.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace llm {

double lr_multiplier(Scheduler scheduler, int64_t step, int64_t warmup_steps, int64_t total_steps,
                     double min_lr_ratio);

}  // namespace llm
