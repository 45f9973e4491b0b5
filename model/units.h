// The model's units as data, written once: the embedding, each decoder layer, and the final norm
// with the LM head. A unit's description is its name, its kind (which forward runs it) and its
// parameters: HF names, shapes, how each is initialised, and whether a linear layer multiplies by
// it. It is read by
//   - the model's construction (model/llama.cpp builds the modules a description names,
//     unit by unit, and checks that what it built has exactly the described parameters),
//   - the whole-model forward (a loop over the units' forwards: the same function, unit by unit,
//     that the trainer runs under sharding, so the golden test checks the code that trains),
//   - initialisation (init_unit_weights), and
//   - the memory estimate (memory/estimate_simulation.cpp), which needs shapes without tensors.
// Model knowledge only: sharding/ wraps the units from outside.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/model_config.h"

namespace llm {

enum class UnitKind { embedding, decoder_layer, head };
const char* to_string(UnitKind kind);

enum class ParameterInit {
  normal,  // N(0, initializer_range): matrices and the embedding
  ones,    // RMSNorm gains
};

struct ParameterSpec {
  std::string name;             // HF name, e.g. "model.layers.3.mlp.up_proj.weight"
  std::vector<int64_t> shape;   // (out, in) for a linear weight, (dim) for a norm gain
  ParameterInit init = ParameterInit::normal;
  bool linear = false;          // a linear layer multiplies by it (autocast casts it to bf16)
  int64_t zero_row = -1;        // a row initialised to zero (the embedding's padding row), or -1
  // The module's tensor: `shape` padded with zeros where the compute side pads (--pad_matmul_dims:
  // the MLP's intermediate dimension), else `shape`. Only the modules and the gathered parameters
  // have it; masters, gradient shards, optimizer state, checkpoints and exports have `shape`. Empty:
  // `shape`.
  std::vector<int64_t> compute_shape;

  int64_t rows() const { return shape.front(); }
  int64_t numel() const;
  int64_t cols() const { return numel() / rows(); }
  const std::vector<int64_t>& module_shape() const { return compute_shape.empty() ? shape : compute_shape; }
  int64_t compute_numel() const;
  bool padded() const { return module_shape() != shape; }
};


struct UnitSpec {
  std::string name;   // "embed", "layer.3", "head"
  UnitKind kind = UnitKind::embedding;
  int64_t index = 0;  // position in the model, 0 .. layers + 1: seeds the unit's initialisation
  int64_t layer = -1; // decoder layers: the layer's index
  std::vector<ParameterSpec> parameters;  // in the order the modules register them
};

// The units of LlamaForCausalLM for this config, in forward order.
std::vector<UnitSpec> describe_units(const ModelConfig& config);

// Activation checkpointing (--activation_checkpointing_every K): one flag per unit, whether its
// backward recomputes its forward: decoder layers 0, K, 2K, ...; the embedding and the head never
// (the head's output is the loss's input). every = 0: none. The trainer and the memory estimate
// both ask this, so they recompute the same units.
std::vector<bool> recomputed_units(const std::vector<UnitSpec>& units, int64_t every);

// Per-batch values the layers share (the rotary tables), set by the embedding unit's forward.
struct UnitContext {
  at::Tensor cos, sin;  // (T, head_dim) in the hidden states' dtype
};

}  // namespace llm
