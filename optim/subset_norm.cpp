#include "optim/subset_norm.h"

#include <cmath>

#include <ATen/ATen.h>

namespace llm {

int64_t subset_size_for(int64_t numel, int64_t k) {
  int64_t target = k > 0 ? k : static_cast<int64_t>(std::sqrt(static_cast<double>(numel)) /
                                                   static_cast<double>(-k));
  target = std::max<int64_t>(1, std::min(target, numel));
  for (int64_t size = target; size > 1; --size)
    if (numel % size == 0) return size;
  return 1;
}

SubsetGeometry make_subset_geometry(const ShardedParameter& parameter, int64_t subset_size_argument,
                                    int world_size) {
  SubsetGeometry geometry;
  const bool matrix = parameter.full_shape.size() == 2;
  if (subset_size_argument == 0 && matrix) {
    if (parameter.rows >= parameter.cols) {
      geometry.kind = SubsetKind::row;
      geometry.subset_size = parameter.cols;
      geometry.total_subsets = parameter.rows;
      geometry.full_state_shape = {parameter.rows, 1};
      geometry.local_state_shape = {parameter.rows_per_rank, 1};
    } else {
      geometry.kind = SubsetKind::column;
      geometry.subset_size = parameter.rows;
      geometry.total_subsets = parameter.cols;
      geometry.spans_ranks = world_size > 1;
      geometry.full_state_shape = {1, parameter.cols};
      geometry.local_state_shape = {1, parameter.cols};
    }
    return geometry;
  }
  const int64_t numel = parameter.rows * parameter.cols;
  const int64_t s = subset_size_for(numel, subset_size_argument == 0 ? -2 : subset_size_argument);
  geometry.kind = SubsetKind::block;
  geometry.subset_size = s;
  geometry.total_subsets = numel / s;
  geometry.local_begin = parameter.first_row * parameter.cols;
  geometry.local_count = parameter.rows_held * parameter.cols;
  if (geometry.local_count > 0) {
    geometry.first_block = geometry.local_begin / s;
    geometry.blocks_held = (geometry.local_begin + geometry.local_count - 1) / s - geometry.first_block + 1;
  } else {
    geometry.first_block = geometry.total_subsets;
  }
  const int64_t shard_elements = parameter.rows_per_rank * parameter.cols;
  for (int r = 1; r < world_size; ++r) {
    const int64_t boundary = r * shard_elements;
    if (boundary < numel && boundary % s != 0) geometry.spans_ranks = true;
  }
  geometry.full_state_shape = {geometry.total_subsets, 1};
  geometry.local_state_shape = {geometry.blocks_held};
  return geometry;
}

namespace {

// The real elements a rank holds, laid into whole blocks: (blocks_held, s), zeros outside its range.
at::Tensor as_blocks(const SubsetGeometry& geometry, const at::Tensor& flat_real) {
  const int64_t s = geometry.subset_size;
  const int64_t offset = geometry.local_begin - geometry.first_block * s;
  if (offset == 0 && geometry.local_count == geometry.blocks_held * s)
    return flat_real.view({geometry.blocks_held, s});
  at::Tensor blocks = at::zeros({geometry.blocks_held * s}, flat_real.options());
  blocks.narrow(0, offset, geometry.local_count).copy_(flat_real);
  return blocks.view({geometry.blocks_held, s});
}

}  // namespace

at::Tensor subset_square_sums(const SubsetGeometry& geometry, const ShardedParameter& parameter,
                              const at::Tensor& grad) {
  switch (geometry.kind) {
    case SubsetKind::row:
      return grad.view({parameter.rows_per_rank, parameter.cols}).square().sum(1, /*keepdim=*/true);
    case SubsetKind::column:
      return grad.view({parameter.rows_per_rank, parameter.cols}).square().sum(0, /*keepdim=*/true);
    case SubsetKind::block:
      if (geometry.blocks_held == 0) return at::zeros({0}, grad.options());
      return as_blocks(geometry, grad.narrow(0, 0, geometry.local_count).square()).sum(1);
  }
  return {};
}

void apply_subset_update(const SubsetGeometry& geometry, const ShardedParameter& parameter,
                         at::Tensor& param, const at::Tensor& numerator, const at::Tensor& denominator,
                         double step_size) {
  if (geometry.kind != SubsetKind::block) {
    // adamw_sn: p.addcdiv_(numerator, denom) with the (m, 1) or (1, n) denominator broadcast.
    param.view({parameter.rows_per_rank, parameter.cols})
        .addcdiv_(numerator.view({parameter.rows_per_rank, parameter.cols}), denominator, -step_size);
    return;
  }
  if (geometry.blocks_held == 0) return;
  // adamw_sng: (m.view(N / s, s) / denom).reshape(p.shape), then p.add_(update, -step_size).
  const int64_t s = geometry.subset_size;
  const int64_t offset = geometry.local_begin - geometry.first_block * s;
  at::Tensor per_element = denominator.view({geometry.blocks_held, 1})
                               .expand({geometry.blocks_held, s})
                               .reshape({-1})
                               .narrow(0, offset, geometry.local_count);
  param.narrow(0, 0, geometry.local_count)
      .add_(numerator.narrow(0, 0, geometry.local_count) / per_element, -step_size);
}

}  // namespace llm
