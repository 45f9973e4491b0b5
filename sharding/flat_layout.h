// The flat shard layout: the one table every part agrees on (docs/sharding.md draws it).
//
// A unit (the embedding, one decoder layer, the final norm with the head) owns one flat fp32 buffer
// per rank. Every parameter is sharded along dim 0 in whole rows: its rows are padded up to a multiple
// of the world size and rank r holds rows [r * rows_per_rank, (r + 1) * rows_per_rank), so no row is
// ever split across ranks (what lets row-wise optimizer statistics run on a shard and still equal the
// unsharded result). In the flat shard the parameters follow one another in registration order:
//   shard = [ p0 rows held (rows_per_rank0 x cols0) | p1 rows held | ... ]
// Padding rows are zero and stay zero (their gradient is zero).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace llm {

struct ShardedParameter {
  std::string name;                 // HF name, e.g. "model.layers.3.mlp.up_proj.weight"
  std::vector<int64_t> full_shape;  // unsharded shape
  int64_t rows = 0;                 // full_shape[0]
  int64_t cols = 1;                 // product of the other dims
  int64_t rows_per_rank = 0;        // ceil(rows / world_size)
  int64_t shard_offset = 0;         // first element in the flat shard
  int64_t first_row = 0;            // global index of the first row this rank holds
  int64_t rows_held = 0;            // real (non-padding) rows this rank holds
  bool decay = true;                // weight decay applies (matrices yes, norm gains no)

  int64_t shard_numel() const { return rows_per_rank * cols; }
};

struct FlatShardLayout {
  std::string unit;
  int rank = 0;
  int world_size = 1;
  std::vector<ShardedParameter> parameters;
  int64_t shard_numel = 0;  // elements in this unit's flat shard (same on every rank)

  // The layout of parameters of these names and full shapes, in this order, as rank `rank` of
  // `world_size` holds them. world_size = 1 gives the unsharded layout (no_shard keeps the whole unit
  // on every rank). Decay: matrices yes, vectors (norm gains) no.
  static FlatShardLayout from_shapes(const std::string& unit,
                                     const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                                     int rank, int world_size);
  // The same for the tensors' shapes.
  static FlatShardLayout build(const std::string& unit,
                               const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                               int rank, int world_size);

  // Full tensor (rows x ...) -> this rank's rows, padded with zeros: (rows_per_rank * cols).
  at::Tensor take_rows(const ShardedParameter& parameter, const at::Tensor& full) const;
  // Gathered flat buffer (world_size * shard_numel, rank-major) -> the full tensor of a parameter.
  at::Tensor full_from_gathered(const ShardedParameter& parameter, const at::Tensor& gathered) const;
  // The same written into `destination` (the parameter's shape, contiguous) in one strided copy per
  // run of whole rank blocks, without the intermediate copy full_from_gathered's reshape makes.
  void copy_full_from_gathered(const ShardedParameter& parameter, const at::Tensor& gathered,
                               const at::Tensor& destination) const;
  // Full gradients (any float dtype; converted by the copy) -> rank-major flat buffer
  // (world_size * shard_numel) for reduce-scatter; padding rows written as zeros.
  void scatter_into(const ShardedParameter& parameter, const at::Tensor& full, at::Tensor& flat) const;

  nlohmann::json to_json() const;
};

}  // namespace llm
