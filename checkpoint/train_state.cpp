#include "checkpoint/train_state.h"

#include "common/errors.h"
#include "common/json_file.h"

namespace llm {

nlohmann::json TrainState::to_json() const {
  return {{"step", step}, {"samples_consumed", samples_consumed}, {"tokens_seen", tokens_seen}, {"seed", seed}};
}

TrainState TrainState::from_json(const nlohmann::json& object, const std::string& source) {
  // Counts from the start of the run: a negative one is a hand edit that no resume could follow.
  auto count = [&](const char* key) {
    LLM_REQUIRE(object.contains(key) && object.at(key).is_number_integer(), source, key, "missing, or not an integer");
    const int64_t value = object.at(key).get<int64_t>();
    LLM_REQUIRE(value >= 0, source, key, "expected an integer >= 0 (got " + std::to_string(value) + ")");
    return value;
  };
  TrainState state;
  state.step = count("step");
  state.samples_consumed = count("samples_consumed");
  state.tokens_seen = count("tokens_seen");
  // Checkpoints written before the seed was part of the state lack it: the run's --seed stands.
  if (object.contains("seed")) {
    LLM_REQUIRE(object.at("seed").is_number_unsigned(), source, "seed",
                "expected an integer >= 0 (got " + json_excerpt(object.at("seed")) + ")");
    state.seed = object.at("seed").get<uint64_t>();
  }
  return state;
}

}  // namespace llm
