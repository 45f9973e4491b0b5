// Full (unsharded) optimizer-state tensors from the parts ranks hold, and back: what makes a
// checkpoint independent of the world size it was written at (which part a rank owns is its rule's
// StateSpan, optim/update_rules.h).
//
// Assembly is one all-reduce (sum) of a zero tensor of the full shape into which every rank has
// written the part it owns; each element is owned by exactly one rank (a part held by two ranks,
// such as a subset that crosses a shard boundary, is written by the rank holding its first
// element). It moves twice the bytes of an all-gather, but it is one primitive for every layout
// (rows, flat chunks, blocks); checkpoints do not assemble at all (each rank writes its parts).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace llm {

class Communicator;

// local: (rows_per_rank, ...) this rank's rows, padding after rows_held. Returns (rows, ...).
at::Tensor assemble_rows(const at::Tensor& local, int64_t rows, int64_t first_row, int64_t rows_held,
                         Communicator* across);
// full (rows, ...) -> this rank's (rows_per_rank, ...) rows, zero padded.
at::Tensor take_rows(const at::Tensor& full, int64_t rows_per_rank, int64_t first_row, int64_t rows_held);

// full: the tensor with `owned` (a mask or range written by this rank) already in place, zeros
// elsewhere; sums it over ranks in place (no-op without a communicator).
void sum_over_ranks(at::Tensor& full, Communicator* across);

// A full (checkpointed) state tensor: its shape, and what it is, for messages ("the parameter",
// "the low-rank moment", ...).
struct FullStateShape {
  std::vector<int64_t> shape;
  std::string what = "the parameter";
};

// One rank's part of a full tensor, as a sharded checkpoint stores it: `values` (flat, a view of the
// rank's buffer) are the elements [begin, begin + values.numel()) of the full tensor `key`, of shape
// full_shape, flattened.
struct StatePiece {
  std::string key;
  std::vector<int64_t> full_shape;
  int64_t begin = 0;
  at::Tensor values;
};

// The one validator of optimizer state dicts (the sharded optimizer's checkpoints and AdamW's
// state_dict): checks a full state dict against the keys and shapes expected (plus "step", one
// integer >= 0), float32 values and no unknown keys; throws one UserError listing every problem.
// Returns step.
int64_t check_full_state(const std::map<std::string, at::Tensor>& state,
                         const std::map<std::string, FullStateShape>& expected, const std::string& optimizer);

}  // namespace llm
