// GaLore's projection on a shard (GaLoreAdamW, shared/reference/optimizers.md §1.1-1.2).
//
// A weight's gradient G (m x n) is projected to a rank-r space where Adam's moments live:
//   right projector P = Vh[:r] (r x n): R = G P^T (m x r), update = (N P) * scale
//   left  projector P = U[:, :r] (m x r): R = P^T G (r x n), update = (P N) * scale
// std picks right for m >= n and left for m < n (the smaller projector), reverse_std the other,
// left / right force one. r is clipped to min(m, n), as the reference's thin SVD does. The
// orientation is stored, never re-inferred from shapes (the reference's reverse_std project_back
// infers it and breaks on square low-rank shapes).
//
// On a shard (rows [first_row, first_row + rows_held) of G):
//   right: R's rows are this rank's rows (R_local = G_local P^T): the moments are row-sharded like
//          the weight and no communication is needed between refreshes. P is held by every rank.
//   left:  R = sum over ranks of P_local^T G_local. The partial sums are reduce-scattered in flat
//          chunks, so each rank keeps 1/world of the moments (r x n); the normalised update is
//          all-gathered back and every rank applies P_local N to its own rows. Each rank keeps only
//          its rows of P.
// The projector is recomputed on the reference's schedule (steps 1, T + 1, 2T + 1, ... from that
// step's gradient): the full gradient of that one matrix is all-gathered (a transient the size of
// one gathered weight, freed before the next matrix), the owner rank (matrix index mod world size,
// so the SVDs of one step spread over the ranks) runs the thin SVD in fp32 as the reference does,
// and broadcasts P. Between refreshes no rank holds another rank's gradient rows.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "optim/optimizer_settings.h"
#include "sharding/flat_layout.h"

namespace llm {

class Communicator;

struct GaLoreGeometry {
  bool right = true;       // projector on the right (R = G P^T) or the left (R = P^T G)
  int64_t rank = 0;        // kept rank: min(galore_rank, rows, cols)
  int64_t lowrank_numel = 0;  // elements of the full low-rank gradient R
  int64_t chunk = 0;       // left: elements of R this rank keeps the moments of
  int owner = 0;           // rank that computes the projector
  int shard_rank = 0;
  int world_size = 1;
  std::vector<int64_t> local_state_shape;   // moments as this rank keeps them
  std::vector<int64_t> full_state_shape;    // moments in full: (rows, r) or (r, cols)
  std::vector<int64_t> local_projector_shape;
  std::vector<int64_t> full_projector_shape;
};

// index: the matrix's position among the GaLore matrices (picks the owner).
GaLoreGeometry make_galore_geometry(const ShardedParameter& parameter, const OptimizerSettings& settings,
                                    int64_t index, int shard_rank, int world_size);

// Recomputes the projector from this step's gradient (collective). projector: local shape.
void refresh_projector(const GaLoreGeometry& geometry, const ShardedParameter& parameter,
                       const at::Tensor& grad, at::Tensor& projector, Communicator* across);

// The same from block power (subspace) iteration on G^T G, without gathering G: every product is a
// local matmul of this rank's rows plus an all-reduce of an (n x r) or (r x r) matrix. The right
// singular vectors V_r come out of a Rayleigh-Ritz step; a left projector is U_r = G V_r / sigma,
// row by row, so each rank computes only its rows. warm: the projector holds the previous basis
// (the start of the iteration, and the reference its new signs are aligned to); else the start is a
// Gaussian matrix seeded by the matrix index (the same at every world size).
void refresh_projector_subspace(const GaLoreGeometry& geometry, const ShardedParameter& parameter,
                                const at::Tensor& grad, at::Tensor& projector, bool warm,
                                int64_t iterations, uint64_t seed, Communicator* across);

// This rank's part of the low-rank gradient (local state shape). Collective for left projectors.
at::Tensor project(const GaLoreGeometry& geometry, const ShardedParameter& parameter, const at::Tensor& grad,
                   const at::Tensor& projector, Communicator* across);

// The full-rank update of this rank's rows, (rows_per_rank * cols), scale included. Collective for
// left projectors.
at::Tensor project_back(const GaLoreGeometry& geometry, const ShardedParameter& parameter,
                        const at::Tensor& normalized, const at::Tensor& projector, double scale,
                        Communicator* across);

}  // namespace llm
