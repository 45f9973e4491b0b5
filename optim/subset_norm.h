// Subset-norm (AdamwSN) geometry on a shard: which subset each element belongs to, the partial sums
// of g^2 per subset this rank can form from its rows, and the per-subset denominator applied back.
//
// Two reference forms (shared/reference/optimizers.md §2.1, §2.2):
//   per matrix (adamw_sn): an m x n weight with m >= n has one subset per row (state (m, 1)),
//     a wide one (m < n) one per column (state (1, n)): each subset runs along the smaller dimension.
//   general (adamw_sng): contiguous row-major blocks of s elements of the flattened parameter,
//     s = the largest divisor of numel <= k (k > 0) or <= floor(sqrt(numel) / |k|) (k < 0); state
//     (numel / s, 1).
// Subsets are defined on the full parameter, never on a shard, so the partition does not depend on the
// world size (the reference's FSDP runs do depend on it). On a shard:
//   row     local: a rank holds whole rows. State (rows_per_rank, 1), no communication.
//   column  every rank holds a part of every column: partial column sums are summed over ranks.
//           State (1, cols), the same on every rank.
//   block   a rank holds blocks [first_block, first_block + blocks_held); a block that crosses a
//           shard boundary is held by both ranks, its partial sums are summed over ranks (only
//           when some boundary is not a multiple of s). State (blocks_held).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/optimizer_settings.h"
#include "sharding/flat_layout.h"

namespace llm {

enum class SubsetKind { row, column, block };

struct SubsetGeometry {
  SubsetKind kind = SubsetKind::row;
  int64_t subset_size = 1;        // elements per subset
  int64_t total_subsets = 0;      // over the full parameter
  int64_t first_block = 0;        // block: first subset this rank touches
  int64_t blocks_held = 0;        // block: subsets this rank touches
  int64_t local_begin = 0;        // block: global flat index of this rank's first real element
  int64_t local_count = 0;        // block: real elements this rank holds
  bool spans_ranks = false;       // partial sums need a sum over ranks
  std::vector<int64_t> full_state_shape;   // the reference's state shape
  std::vector<int64_t> local_state_shape;  // what this rank keeps
};

// adamw_sng's subset size for a tensor of `numel` elements and argument k (k != 0). The reference
// divides by zero when floor(sqrt(numel) / |k|) is 0 (numel < 4 at k = -2); that case gives 1 here.
int64_t subset_size_for(int64_t numel, int64_t k);

// subset_size_argument: 0 = per matrix (1-D tensors: general with -2), else the general form's k.
SubsetGeometry make_subset_geometry(const ShardedParameter& parameter, int64_t subset_size_argument,
                                    int world_size);

// Sum of grad^2 over the part of each subset this rank holds, in the local state shape.
at::Tensor subset_square_sums(const SubsetGeometry& geometry, const ShardedParameter& parameter,
                              const at::Tensor& grad);

// param -= step_size * numerator / denominator[subset of the element]. numerator: like param.
void apply_subset_update(const SubsetGeometry& geometry, const ShardedParameter& parameter,
                         at::Tensor& param, const at::Tensor& numerator, const at::Tensor& denominator,
                         double step_size);

}  // namespace llm
