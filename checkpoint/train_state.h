// Where a run stands: the optimizer steps taken, the samples and tokens consumed, and the seed. It is
// what a checkpoint saves beside the weights and the optimizer state, and what resuming restores.
// The data order is a pure function of (seed, samples consumed) (data/batches.h: epoch e
// permutes the windows with a bijection keyed from (seed, e)), and no step draws other random
// numbers (no dropout; GaLore's subspace start is seeded per matrix), so the seed is the whole of the
// run's random state.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace llm {

struct TrainState {
  int64_t step = 0;              // optimizer steps done
  int64_t samples_consumed = 0;  // sequences drawn from the training split, over all ranks
  int64_t tokens_seen = 0;       // samples_consumed x max_length
  uint64_t seed = 0;             // --seed: initialisation and data order

  // {"step", "samples_consumed", "tokens_seen", "seed"}: what a checkpoint's manifest.json holds of them.
  nlohmann::json to_json() const;
  // Throws UserError naming `source` and the key when a field is missing, not an integer, or negative.
  static TrainState from_json(const nlohmann::json& object, const std::string& source);
};

}  // namespace llm
