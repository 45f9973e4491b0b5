#include "sharding/flat_layout.h"

#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

namespace llm {

FlatShardLayout FlatShardLayout::build(const std::string& unit,
                                       const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                                       int rank, int world_size) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, tensor] : parameters) shapes.emplace_back(name, tensor.sizes().vec());
  return from_shapes(unit, shapes, rank, world_size);
}

FlatShardLayout FlatShardLayout::from_shapes(const std::string& unit,
                                             const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                                             int rank, int world_size) {
  FlatShardLayout layout;
  layout.unit = unit;
  layout.rank = rank;
  layout.world_size = world_size;
  for (const auto& [name, shape] : shapes) {
    ShardedParameter parameter;
    parameter.name = name;
    parameter.full_shape = shape;
    parameter.rows = shape.empty() ? 1 : shape.front();
    int64_t numel = 1;
    for (int64_t size : shape) numel *= size;
    parameter.cols = parameter.rows == 0 ? 1 : numel / parameter.rows;
    parameter.rows_per_rank = (parameter.rows + world_size - 1) / world_size;
    parameter.shard_offset = layout.shard_numel;
    parameter.first_row = std::min<int64_t>(parameter.rows, rank * parameter.rows_per_rank);
    parameter.rows_held =
        std::min<int64_t>(parameter.rows, parameter.first_row + parameter.rows_per_rank) - parameter.first_row;
    parameter.decay = shape.size() >= 2;
    layout.shard_numel += parameter.shard_numel();
    layout.parameters.push_back(parameter);
  }
  return layout;
}

at::Tensor FlatShardLayout::take_rows(const ShardedParameter& parameter, const at::Tensor& full) const {
  at::Tensor rows = at::zeros({parameter.rows_per_rank, parameter.cols}, full.options().dtype(at::kFloat));
  if (parameter.rows_held > 0)
    rows.narrow(0, 0, parameter.rows_held)
        .copy_(full.reshape({parameter.rows, parameter.cols}).narrow(0, parameter.first_row, parameter.rows_held));
  return rows.reshape({-1});
}

at::Tensor FlatShardLayout::full_from_gathered(const ShardedParameter& parameter,
                                               const at::Tensor& gathered) const {
  // (world, shard_numel) -> (world, rows_per_rank * cols) -> (world * rows_per_rank, cols) -> rows
  return gathered.view({world_size, shard_numel})
      .narrow(1, parameter.shard_offset, parameter.shard_numel())
      .reshape({world_size * parameter.rows_per_rank, parameter.cols})
      .narrow(0, 0, parameter.rows)
      .view(parameter.full_shape);
}

namespace {

// A parameter's block of every rank in a rank-major flat buffer: (world, rows_per_rank, cols).
at::Tensor rank_blocks(const FlatShardLayout& layout, const ShardedParameter& parameter, const at::Tensor& flat) {
  return flat.view({layout.world_size, layout.shard_numel})
      .narrow(1, parameter.shard_offset, parameter.shard_numel())
      .view({layout.world_size, parameter.rows_per_rank, parameter.cols});
}

}  // namespace

void FlatShardLayout::copy_full_from_gathered(const ShardedParameter& parameter, const at::Tensor& gathered,
                                              const at::Tensor& destination) const {
  const at::Tensor blocks = rank_blocks(*this, parameter, gathered);
  const at::Tensor rows = destination.view({parameter.rows, parameter.cols});
  const int64_t whole = parameter.rows / parameter.rows_per_rank;  // ranks whose block is all real rows
  const int64_t rest = parameter.rows - whole * parameter.rows_per_rank;
  if (whole > 0)
    rows.narrow(0, 0, whole * parameter.rows_per_rank)
        .view({whole, parameter.rows_per_rank, parameter.cols})
        .copy_(blocks.narrow(0, 0, whole));
  if (rest > 0) rows.narrow(0, whole * parameter.rows_per_rank, rest).copy_(blocks[whole].narrow(0, 0, rest));
}

void FlatShardLayout::scatter_into(const ShardedParameter& parameter, const at::Tensor& full, at::Tensor& flat) const {
  // (world, shard_numel) -> this parameter's block of each rank: (world, rows_per_rank, cols)
  at::Tensor blocks = rank_blocks(*this, parameter, flat);
  const at::Tensor rows = full.reshape({parameter.rows, parameter.cols});
  const int64_t whole = parameter.rows / parameter.rows_per_rank;
  const int64_t rest = parameter.rows - whole * parameter.rows_per_rank;
  if (whole > 0)
    blocks.narrow(0, 0, whole)
        .copy_(rows.narrow(0, 0, whole * parameter.rows_per_rank).view({whole, parameter.rows_per_rank, parameter.cols}));
  int64_t padded_from = whole;  // the first rank block holding padding
  if (rest > 0) {
    blocks[whole].narrow(0, 0, rest).copy_(rows.narrow(0, whole * parameter.rows_per_rank, rest));
    blocks[whole].narrow(0, rest, parameter.rows_per_rank - rest).zero_();
    padded_from = whole + 1;
  }
  if (padded_from < world_size) blocks.narrow(0, padded_from, world_size - padded_from).zero_();
}

nlohmann::json FlatShardLayout::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : parameters)
    rows.push_back({{"name", p.name}, {"shape", p.full_shape}, {"offset", p.shard_offset},
                    {"rows_per_rank", p.rows_per_rank}, {"first_row", p.first_row},
                    {"rows_held", p.rows_held}, {"decay", p.decay}});
  return {{"unit", unit}, {"rank", rank}, {"world_size", world_size}, {"shard_numel", shard_numel},
          {"parameters", rows}};
}

}  // namespace llm
