// The training loop: data -> model -> loss -> backward -> clip -> AdamW, with gradient accumulation,
// the learning-rate schedule, periodic evaluation on the held-out split, checkpoints, and the logs of
// trainer/metrics.h. Mixed precision has two forms for --dtype bfloat16: "mixed" (fp32 weights,
// forward under bf16 autocast) and "pure" (bf16 weights as GaLore's --dtype bfloat16, but with fp32
// master weights and fp32 optimizer state kept beside them, so small updates are not rounded away).
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

#include "trainer/config.h"

namespace llm {

class Communicator;

struct RuntimeContext {
  int rank = 0;
  int world_size = 1;
  c10::Device device = c10::Device(c10::kCPU);
  Communicator* communicator = nullptr;  // over all ranks, for this device
};

struct TrainingOutcome {
  int64_t steps = 0;
  double final_loss = 0;
  double final_eval_loss = 0;
  double corpus_unigram_entropy = 0;  // synthetic data only, else 0
  double corpus_entropy_rate = 0;     // synthetic data only, else 0
};

// Picks the device from --device: cuda:<local_rank> when asked for (or auto and one is present).
c10::Device select_device(DeviceChoice choice, int local_rank);

// Runs the whole training job. Throws UserError for bad data or checkpoints and TrainingError when
// the loss stops being finite.
TrainingOutcome train(const ModelConfig& model_config, const RunConfig& run,
                      const RuntimeContext& context);

}  // namespace llm
