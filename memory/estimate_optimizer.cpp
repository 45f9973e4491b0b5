#include "memory/estimate_optimizer.h"

#include <algorithm>

#include <c10/util/accumulate.h>

#include "optim/galore.h"
#include "optim/shard_optimizer.h"
#include "optim/subset_norm.h"

namespace llm {

int64_t estimate_optimizer_state(const std::vector<UnitGeometry>& units, const OptimizerSettings& settings, int world) {
  int64_t bytes = 0;
  for (const UnitGeometry& unit : units)
    for (size_t i = 0; i < unit.layout.parameters.size(); ++i)
      bytes += optimizer_state_bytes(settings, unit.layout.parameters[i], unit.rules[i], world);
  return bytes;
}

int64_t estimate_masters_and_state(const std::vector<UnitGeometry>& units, const OptimizerSettings& settings, int world,
                                   bool largest) {
  int64_t bytes = 0;
  for (const UnitGeometry& unit : units) {
    int64_t unit_bytes = 4 * unit.shard_numel;
    for (size_t i = 0; i < unit.layout.parameters.size(); ++i)
      unit_bytes += optimizer_state_bytes(settings, unit.layout.parameters[i], unit.rules[i], world);
    bytes = largest ? std::max(bytes, unit_bytes) : bytes + (unit_step_is_collective(unit, world) ? 0 : unit_bytes);
  }
  return bytes;
}

bool unit_step_is_collective(const UnitGeometry& unit, int world) {
  return world > 1 && std::any_of(unit.rules.begin(), unit.rules.end(), [](UpdateRule rule) {
           return rule == UpdateRule::subset_norm || rule == UpdateRule::galore;
         });
}

int64_t estimate_galore_projectors(const UnitGeometry& unit, const OptimizerSettings& settings, int world, int shard_rank) {
  int64_t bytes = 0, galore_index = unit.first_galore;
  for (size_t i = 0; i < unit.layout.parameters.size(); ++i)
    if (unit.rules[i] == UpdateRule::galore)
      bytes += 4 * c10::multiply_integers(
                       make_galore_geometry(unit.layout.parameters[i], settings, galore_index++, shard_rank, world)
                           .local_projector_shape);
  return bytes;
}

int64_t estimate_optimizer_transient(const UnitGeometry& unit, const OptimizerSettings& settings, int world,
                                     int shard_rank) {
  if (settings.kind == "adamw") return 0;
  int64_t refresh = 0, kept = 0, phase1 = 0, phase2 = 0;
  int64_t galore_index = unit.first_galore;
  // bf16 state: the update steps fp32 copies of the moments (optim/update_rules.cpp).
  const bool bf16 = settings.state_is_bf16();
  const int64_t first_moment = settings.beta1 > 0 ? 1 : 0;
  for (size_t i = 0; i < unit.layout.parameters.size(); ++i) {
    const ShardedParameter& shard = unit.layout.parameters[i];
    const int64_t local = 4 * shard.rows_per_rank * shard.cols;
    switch (unit.rules[i]) {
      case UpdateRule::adam_hf:
        phase2 = std::max(phase2, 2 * local + (bf16 ? (first_moment + 1) * local : 0));  // sqrt(v) + eps, m / denominator
        break;
      case UpdateRule::subset_norm: {
        const SubsetGeometry geometry = make_subset_geometry(shard, settings.subset_size, world);
        const int64_t state = 4 * c10::multiply_integers(geometry.local_state_shape);
        phase1 = std::max(phase1, kept + local);  // grad^2 before its sums
        kept += state;                             // the sums, kept for the update
        phase2 = std::max(phase2, (geometry.kind == SubsetKind::block ? 2 * local : state) +
                                      (bf16 ? first_moment * local + state : 0));
        break;
      }
      case UpdateRule::galore: {
        const GaLoreGeometry geometry = make_galore_geometry(shard, settings, galore_index, shard_rank, world);
        const int64_t lowrank = 4 * c10::multiply_integers(geometry.local_state_shape);
        const int64_t m = shard.rows, cols = shard.cols, r = geometry.rank;
        // Refresh: the gathered gradient of this one matrix, the full projector, and on its owner
        // the thin SVD: LibTorch's copy of the input for LAPACK (m n) and U, S, Vh (m k + k + k n).
        // LAPACK's own workspace is allocated by the LAPACK library, outside LibTorch's allocator
        // (not in the tracked total; in the resident set). "subspace": a few (n x r), (r x r).
        int64_t one = 4 * c10::multiply_integers(geometry.full_projector_shape);
        if (settings.projector_method == "svd") {
          if (world > 1) one += 4 * world * shard.rows_per_rank * cols;
          if (world == 1 || geometry.owner == shard_rank) {
            const int64_t k = std::min(m, cols);
            one += 4 * (m * cols + m * k + k + k * cols);
          }
        } else {
          one += 4 * (4 * cols * r + shard.rows_per_rank * r + 2 * r * r);
        }
        refresh = std::max(refresh, one);
        // The inputs keep the projected gradient; a left projection reduce-scatters (r x n) partials.
        if (!geometry.right) phase1 = std::max(phase1, kept + 4 * (r * cols + world * geometry.chunk));
        kept += lowrank;
        // The update: denominator and normalised update, then the update projected back and scaled;
        // a left projection first all-gathers the normalised update (world x chunk), which is freed
        // before the scaling.
        int64_t back = 2 * lowrank + 2 * local;
        if (!geometry.right && world > 1) back = 2 * lowrank + std::max(4 * world * geometry.chunk + local, 2 * local);
        phase2 = std::max(phase2, back + (bf16 ? (first_moment + 1) * lowrank : 0));
        ++galore_index;
        break;
      }
      case UpdateRule::adamw:
        break;
    }
  }
  return std::max({refresh, phase1, kept + phase2});
}

}  // namespace llm
