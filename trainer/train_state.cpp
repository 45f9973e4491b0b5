#include "trainer/train_state.h"

#include "common/errors.h"

namespace llm {

nlohmann::json TrainState::to_json() const {
  return {{"step", step}, {"samples_consumed", samples_consumed}, {"tokens_seen", tokens_seen}, {"seed", seed}};
}

TrainState TrainState::from_json(const nlohmann::json& object, const std::string& source) {
  auto count = [&](const char* key) {
    LLM_REQUIRE(object.contains(key) && object.at(key).is_number_integer(), source, key, "missing, or not an integer");
    return object.at(key).get<int64_t>();
  };
  TrainState state;
  state.step = count("step");
  state.samples_consumed = count("samples_consumed");
  state.tokens_seen = count("tokens_seen");
  // Checkpoints written before the seed was part of the state lack it: the run's --seed stands.
  if (object.contains("seed") && object.at("seed").is_number_unsigned()) state.seed = object.at("seed").get<uint64_t>();
  return state;
}

}  // namespace llm
