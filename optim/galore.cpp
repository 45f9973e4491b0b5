#include "optim/galore.h"

#include <tuple>

#include <ATen/CPUGeneratorImpl.h>

#include <ATen/ATen.h>

#include "common/errors.h"
#include "optim/shard_state.h"
#include "sharding/communicator.h"

namespace llm {

GaLoreGeometry make_galore_geometry(const ShardedParameter& parameter, const OptimizerSettings& settings,
                                    int64_t index, int shard_rank, int world_size) {
  LLM_REQUIRE(parameter.full_shape.size() == 2, "galore_adamw", parameter.name,
              "GaLore projects 2-D weights only; this parameter has " +
                  std::to_string(parameter.full_shape.size()) + " dimensions");
  GaLoreGeometry geometry;
  const int64_t m = parameter.rows, n = parameter.cols;
  const std::string& type = settings.proj_type;
  if (type == "std") geometry.right = m >= n;
  else if (type == "reverse_std") geometry.right = m < n;
  else if (type == "right") geometry.right = true;
  else if (type == "left") geometry.right = false;
  else fail_user("galore_adamw", "--proj_type", "expected std, reverse_std, left or right (got \"" + type + "\")");
  geometry.rank = std::min({settings.galore_rank, m, n});
  geometry.world_size = world_size;
  geometry.shard_rank = shard_rank;
  geometry.owner = static_cast<int>(index % geometry.world_size);
  const int64_t r = geometry.rank;
  if (geometry.right) {
    geometry.lowrank_numel = m * r;
    geometry.local_state_shape = {parameter.rows_per_rank, r};
    geometry.full_state_shape = {m, r};
    geometry.local_projector_shape = {r, n};
    geometry.full_projector_shape = {r, n};
  } else {
    geometry.lowrank_numel = r * n;
    geometry.chunk = (geometry.lowrank_numel + geometry.world_size - 1) / geometry.world_size;
    geometry.local_state_shape = {geometry.chunk};
    geometry.full_state_shape = {r, n};
    geometry.local_projector_shape = {parameter.rows_per_rank, r};
    geometry.full_projector_shape = {m, r};
  }
  return geometry;
}

void refresh_projector(const GaLoreGeometry& geometry, const ShardedParameter& parameter,
                       const at::Tensor& grad, at::Tensor& projector, Communicator* across) {
  const int64_t m = parameter.rows, n = parameter.cols, r = geometry.rank;
  const bool sharded = across != nullptr && geometry.world_size > 1;
  at::Tensor full_projector;
  {
    // The full gradient of this one matrix, only for the refresh, on every rank (all-gather) and
    // freed at the end of this scope; only the owner decomposes it.
    at::Tensor full_grad;
    if (sharded) {
      at::Tensor gathered = at::empty({geometry.world_size * parameter.rows_per_rank * n}, grad.options());
      across->all_gather(grad, gathered);
      full_grad = gathered.view({geometry.world_size * parameter.rows_per_rank, n}).narrow(0, 0, m);
    } else {
      full_grad = grad.view({parameter.rows_per_rank, n}).narrow(0, 0, m);
    }
    full_projector = at::empty(geometry.full_projector_shape, grad.options());
    if (!sharded || across->rank() == geometry.owner) {
      // As the reference: thin SVD in fp32 (full_matrices=False), U[:, :r] or Vh[:r].
      auto [u, s, vh] = at::linalg_svd(full_grad.to(at::kFloat), /*full_matrices=*/false);
      full_projector.copy_(geometry.right ? vh.narrow(0, 0, r) : u.narrow(1, 0, r));
    }
  }
  if (sharded) across->broadcast(full_projector, geometry.owner);
  if (geometry.right) {
    projector.copy_(full_projector);
  } else {
    projector.copy_(take_rows(full_projector, parameter.rows_per_rank, parameter.first_row, parameter.rows_held));
  }
}

void refresh_projector_subspace(const GaLoreGeometry& geometry, const ShardedParameter& parameter,
                                const at::Tensor& grad, at::Tensor& projector, bool warm,
                                int64_t iterations, uint64_t seed, Communicator* across) {
  const int64_t n = parameter.cols, r = geometry.rank;
  const at::Tensor rows = grad.view({parameter.rows_per_rank, n});  // padding rows are zero
  // Start: (n x r). Warm: the previous right basis (P^T), or G^T U_prev for a left projector.
  at::Tensor basis;
  if (warm && geometry.right) {
    basis = projector.t().contiguous();
  } else if (warm) {
    basis = at::matmul(rows.t(), projector).contiguous();
    sum_over_ranks(basis, across);
  } else {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    basis = at::randn({n, r}, generator, at::TensorOptions().dtype(at::kFloat)).to(grad.device());
  }
  basis = std::get<0>(at::linalg_qr(basis));
  for (int64_t i = 0; i < iterations; ++i) {
    at::Tensor next = at::matmul(rows.t(), at::matmul(rows, basis)).contiguous();  // G^T G Q
    sum_over_ranks(next, across);
    basis = std::get<0>(at::linalg_qr(next));
  }
  // Rayleigh-Ritz: the r x r Gram of G Q gives the singular values and the rotation within span(Q).
  const at::Tensor projected = at::matmul(rows, basis);  // (rows_per_rank, r)
  at::Tensor gram = at::matmul(projected.t(), projected).contiguous();
  sum_over_ranks(gram, across);
  auto [eigenvalues, eigenvectors] = at::linalg_eigh(gram);  // ascending
  const at::Tensor order = at::arange(r - 1, -1, -1, at::TensorOptions().dtype(at::kLong).device(grad.device()));
  const at::Tensor right_vectors = at::matmul(basis, eigenvectors.index_select(1, order));  // (n, r) V_r
  const at::Tensor sigma = eigenvalues.index_select(0, order).clamp_min(0).sqrt();
  at::Tensor fresh;  // the new projector, local shape
  if (geometry.right) {
    fresh = right_vectors.t().contiguous();  // (r, n)
  } else {
    // U_r = G V_r / sigma; a (numerically) zero singular value leaves its column zero.
    const at::Tensor inverse = at::where(sigma > sigma.max() * 1e-6, sigma.reciprocal(), at::zeros_like(sigma));
    fresh = (at::matmul(rows, right_vectors) * inverse).contiguous();  // (rows_per_rank, r)
  }
  // Signs: aligned with the previous basis when there is one (the moments carried over a refresh
  // then keep their orientation), else the largest entry of each right vector is positive.
  at::Tensor agreement;
  if (warm) {
    agreement = geometry.right ? (fresh * projector).sum(1) : (fresh * projector).sum(0).contiguous();
    if (!geometry.right) sum_over_ranks(agreement, across);
  } else {
    const at::Tensor largest = right_vectors.abs().argmax(0);
    agreement = right_vectors.gather(0, largest.unsqueeze(0)).squeeze(0);
  }
  const at::Tensor signs = at::where(agreement < 0, -at::ones_like(agreement), at::ones_like(agreement));
  projector.copy_(geometry.right ? fresh * signs.unsqueeze(1) : fresh * signs.unsqueeze(0));
}

at::Tensor project(const GaLoreGeometry& geometry, const ShardedParameter& parameter, const at::Tensor& grad,
                   const at::Tensor& projector, Communicator* across) {
  const at::Tensor rows = grad.view({parameter.rows_per_rank, parameter.cols});
  if (geometry.right) return at::matmul(rows, projector.t());  // (rows_per_rank, r)
  at::Tensor partial = at::matmul(projector.t(), rows);          // (r, cols): this rank's rows only
  if (across == nullptr || geometry.world_size == 1) return partial.reshape({-1});
  at::Tensor padded = at::zeros({geometry.world_size * geometry.chunk}, partial.options());
  padded.narrow(0, 0, geometry.lowrank_numel).copy_(partial.reshape({-1}));
  at::Tensor mine = at::empty({geometry.chunk}, partial.options());
  across->reduce_scatter(padded, mine, ReduceOp::sum);
  return mine;
}

at::Tensor project_back(const GaLoreGeometry& geometry, const ShardedParameter& parameter,
                        const at::Tensor& normalized, const at::Tensor& projector, double scale,
                        Communicator* across) {
  at::Tensor update;
  if (geometry.right) {
    update = at::matmul(normalized, projector);  // (rows_per_rank, cols)
  } else {
    at::Tensor full = normalized;
    if (across != nullptr && geometry.world_size > 1) {
      full = at::empty({geometry.world_size * geometry.chunk}, normalized.options());
      across->all_gather(normalized.contiguous(), full);
    }
    update = at::matmul(projector, full.narrow(0, 0, geometry.lowrank_numel).view({geometry.rank, parameter.cols}));
  }
  return (update * scale).reshape({-1});
}

}  // namespace llm
