// How the model splits into FSDP units, as data: the embedding, each decoder layer, and the final
// norm with the LM head. Each unit has its HF-named parameters and a forward from the previous
// unit's output to its own. This is model knowledge only: sharding/ wraps the units from outside.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/model/llama.h"

namespace llm {

// Per-batch values the layers share (rotary tables), set by the embedding unit's forward.
struct UnitContext {
  at::Tensor cos, sin;  // (T, head_dim) in the hidden states' dtype
};

struct ModelUnit {
  std::string name;                                           // "embed", "layer.3", "head"
  std::vector<std::pair<std::string, at::Tensor>> parameters; // HF names
  std::function<at::Tensor(const at::Tensor&)> forward;       // ids -> hidden -> ... -> logits
};

// The returned forwards hold references to model and context: both must outlive the units.
std::vector<ModelUnit> split_into_units(LlamaForCausalLM& model, UnitContext& context);

}  // namespace llm
