"""Golden file for the GaLoreAdamW optimizer test: twelve steps of the galore-torch package on CPU.

The reference is the installed PyPI galore-torch 1.0 (`from galore_torch import GaLoreAdamW`), run in
float32. One optimizer, one param group per case: groups with "rank", "update_proj_gap", "scale" and
"proj_type" are GaLore groups, the two without are the package's plain HF AdamW path. Defaults
betas (0.9, 0.999) and eps 1e-6; update_proj_gap 5 and scale 0.25 in every GaLore group; the lr of
every group is set from "lrs" before each step. The projector is recomputed (an SVD of that step's
gradient) at steps 1, 6 and 11; the moments carry over each change untouched.

GaLore gradients are U diag(sigma) V^T + 0.005 noise with fresh random orthonormal U, V at every
step and sigma_i = c_t * 3 * 0.75^i (i < 10): singular values 1..9 are ~25% apart and well above
the noise, so the rank-8 basis (and each vector up to sign) is well defined, and an SVD computed by
another but equivalent method gives the same subspace. Plain cases use randn gradients of varied
scale with some exact zeros, as make_adamw_golden.py. The SVD's SIGN convention still matters: the
moments carry over a projector change, so from step 6 on the result depends on the signs LAPACK's
gesdd (torch.linalg.svd) picks; steps 1-5 alone are sign-invariant (check projector_step1 up to sign).
Measured: flipping the signs of half the vectors at one refresh only moves NAME.final by 20-70% of
its whole 12-step change; an eigh(G^T G) basis matches projector_step1 to 1.3e-6 after sign alignment.

A self-check re-implements the GaLore step from shared/reference/optimizers.md 1.1-1.2 (independent
code, explicit orientation instead of the shape test) and asserts it matches the package.

The C++ test loads the dict with torch::pickle_load, so every value is a tensor, the layout flat:

  lrs (steps,) f64, meta.update_proj_gap () int64, meta.scale () f64, meta.eps () f64,
  meta.betas (2,) f64
  NAME.proj_type () int64    -1 plain (no GaLore), 0 std, 1 reverse_std, 2 left, 3 right
  NAME.rank () int64         the requested rank (0 for plain; std_tall_40x6 asks 8 and keeps 6)
  NAME.weight_decay () f64
  NAME.initial, NAME.grads (steps, *shape), NAME.final               f32
  NAME.exp_avg, NAME.exp_avg_sq   moments after the last step, f32, in the LOW-RANK shape for
                                  GaLore cases (e.g. 48x24 std rank 8 -> (48, 8))
  NAME.projector                  GaLore only: the final state["projector"].ortho_matrix
                                  (computed at step 11), f32, (r, n) right or (m, r) left
  NAME.projector_step1            GaLore only: the ortho_matrix after the first step

Regenerate from the repository root:
  ~/.cache/llama-trainer/venv-torch-2.11.0/bin/python tests/golden/make_galore_golden.py
"""
import math
import pathlib
import warnings

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    from galore_torch import GaLoreAdamW

STEPS = 12
GAP = 5
SCALE = 0.25
EPS = 1e-6
BETAS = (0.9, 0.999)
PROJ_CODE = {None: -1, "std": 0, "reverse_std": 1, "left": 2, "right": 3}
# name -> (shape, proj_type (None: plain group), rank, weight decay)
CASES = {
    "std_tall_48x24": ((48, 24), "std", 8, 0.1),
    "std_wide_24x48": ((24, 48), "std", 8, 0.0),
    "std_square_32x32": ((32, 32), "std", 8, 0.1),
    "std_tall_40x6": ((40, 6), "std", 8, 0.1),
    "reverse_std_tall_48x24": ((48, 24), "reverse_std", 8, 0.1),
    "reverse_std_wide_24x48": ((24, 48), "reverse_std", 8, 0.0),
    "left_tall_48x24": ((48, 24), "left", 8, 0.1),
    "right_wide_24x48": ((24, 48), "right", 8, 0.1),
    "plain_vec_37": ((37,), None, 0, 0.0),
    "plain_embed_50x16": ((50, 16), None, 0, 0.1),
}


def low_rank_grads(shape, generator):
    m, n = shape
    k = min(m, n, 10)
    out = []
    for step in range(STEPS):
        u, _ = torch.linalg.qr(torch.randn(m, k, generator=generator))
        v, _ = torch.linalg.qr(torch.randn(n, k, generator=generator))
        c = 0.5 + 0.15 * ((7 * step) % STEPS)  # a different overall scale each step
        sigma = c * 3.0 * 0.75 ** torch.arange(k, dtype=torch.float32)
        out.append(u @ torch.diag(sigma) @ v.t() + 0.005 * torch.randn(m, n, generator=generator))
    return torch.stack(out)


def plain_grads(shape, generator):
    scale = torch.logspace(-3, 1, STEPS, dtype=torch.float32)
    g = torch.randn((STEPS, *shape), generator=generator) * scale.view(-1, *([1] * len(shape)))
    flat = g.view(STEPS, -1)
    flat[:, ::5] = torch.where(torch.arange(STEPS).view(-1, 1) % 3 == 0, torch.zeros(()),
                               flat[:, ::5])
    return g


def check_separation(name, grads, rank):
    """Relative gap between consecutive singular values 1..rank+1 at each projector step."""
    worst = math.inf
    for step in range(0, STEPS, GAP):
        s = torch.linalg.svdvals(grads[step].double())
        kept = min(rank, s.numel())
        top = s[: kept + 1] if kept < s.numel() else s
        gaps = (top[:-1] - top[1:]) / top[:-1]
        worst = min(worst, gaps.min().item())
    assert worst > 0.15, (name, worst)
    return worst


def independent_galore(initial, grads, lrs, proj_type, rank, wd):
    """GaLore AdamW written from optimizers.md 1.1-1.2, orientation stored explicitly."""
    p = initial.clone()
    m_, n_ = p.shape
    right = {"std": m_ >= n_, "reverse_std": m_ < n_, "right": True, "left": False}[proj_type]
    exp_avg = exp_avg_sq = proj = None
    b1, b2 = BETAS
    for t in range(1, STEPS + 1):
        g = grads[t - 1]
        if (t - 1) % GAP == 0:
            u, _, vh = torch.linalg.svd(g, full_matrices=False)
            proj = vh[:rank] if right else u[:, :rank]
        r = g @ proj.t() if right else proj.t() @ g
        if exp_avg is None:
            exp_avg, exp_avg_sq = torch.zeros_like(r), torch.zeros_like(r)
        exp_avg.mul_(b1).add_(r, alpha=1 - b1)
        exp_avg_sq.mul_(b2).addcmul_(r, r, value=1 - b2)
        normed = exp_avg / (exp_avg_sq.sqrt() + EPS)
        back = (normed @ proj if right else proj @ normed) * SCALE
        p.add_(back, alpha=-lrs[t - 1] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t))
        if wd > 0:
            p.add_(p, alpha=-lrs[t - 1] * wd)
    return p, exp_avg, exp_avg_sq, proj


def main() -> None:
    generator = torch.Generator().manual_seed(20240613)
    lrs = [1e-2 * (0.5 + 0.1 * step) for step in range(STEPS)]

    params, grads = {}, {}
    for name, (shape, proj_type, rank, _) in CASES.items():
        params[name] = torch.nn.Parameter(torch.randn(shape, generator=generator))
        grads[name] = (low_rank_grads(shape, generator) if proj_type
                       else plain_grads(shape, generator))
        if proj_type:
            worst = check_separation(name, grads[name], rank)
            print(f"  {name}: worst relative singular-value gap (top {rank}+1, steps 1/6/11) "
                  f"{worst:.3f}")

    golden = {
        "lrs": torch.tensor(lrs, dtype=torch.float64),
        "meta.update_proj_gap": torch.tensor(GAP, dtype=torch.int64),
        "meta.scale": torch.tensor(SCALE, dtype=torch.float64),
        "meta.eps": torch.tensor(EPS, dtype=torch.float64),
        "meta.betas": torch.tensor(BETAS, dtype=torch.float64),
    }
    groups = []
    for name, (shape, proj_type, rank, weight_decay) in CASES.items():
        group = {"params": [params[name]], "weight_decay": weight_decay}
        if proj_type:
            group.update(rank=rank, update_proj_gap=GAP, scale=SCALE, proj_type=proj_type)
        groups.append(group)
        golden[f"{name}.initial"] = params[name].detach().clone()
        golden[f"{name}.grads"] = grads[name].clone()
        golden[f"{name}.proj_type"] = torch.tensor(PROJ_CODE[proj_type], dtype=torch.int64)
        golden[f"{name}.rank"] = torch.tensor(rank, dtype=torch.int64)
        golden[f"{name}.weight_decay"] = torch.tensor(weight_decay, dtype=torch.float64)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        optimizer = GaLoreAdamW(groups, lr=lrs[0])
    for group in optimizer.param_groups:
        assert group["eps"] == EPS and tuple(group["betas"]) == BETAS and group["correct_bias"]
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = lrs[step]
        for name, param in params.items():
            param.grad = grads[name][step].clone()
        optimizer.step()
        if step == 0:
            for name, (_, proj_type, _, _) in CASES.items():
                if proj_type:
                    golden[f"{name}.projector_step1"] = (
                        optimizer.state[params[name]]["projector"].ortho_matrix.clone())

    for name, (shape, proj_type, rank, weight_decay) in CASES.items():
        param = params[name]
        state = optimizer.state[param]
        assert state["step"] == STEPS
        golden[f"{name}.final"] = param.detach().clone()
        golden[f"{name}.exp_avg"] = state["exp_avg"].clone()
        golden[f"{name}.exp_avg_sq"] = state["exp_avg_sq"].clone()
        line = f"  {name}: exp_avg {tuple(state['exp_avg'].shape)}"
        if proj_type:
            golden[f"{name}.projector"] = state["projector"].ortho_matrix.clone()
            line += (f", projector {tuple(golden[name + '.projector'].shape)}"
                     f" (step1 {tuple(golden[name + '.projector_step1'].shape)})")
            # The package must match an independent implementation of the documented maths.
            ref_p, ref_m, ref_v, ref_proj = independent_galore(
                golden[f"{name}.initial"], grads[name], lrs, proj_type, rank, weight_decay)
            torch.testing.assert_close(golden[f"{name}.projector"], ref_proj, rtol=0, atol=0)
            torch.testing.assert_close(golden[f"{name}.exp_avg"], ref_m, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(golden[f"{name}.exp_avg_sq"], ref_v, rtol=1e-5, atol=1e-9)
            torch.testing.assert_close(golden[f"{name}.final"], ref_p, rtol=1e-5, atol=1e-7)
            # The first projector is orthonormal and spans the step-1 gradient's top subspace.
            p1 = golden[f"{name}.projector_step1"]
            gram = p1 @ p1.t() if p1.shape[0] < p1.shape[1] else p1.t() @ p1
            torch.testing.assert_close(gram, torch.eye(gram.shape[0]), rtol=0, atol=1e-5)
        line += f", max |final - initial| {(param.detach() - golden[name + '.initial']).abs().max():.3e}"
        print(line)

    for key, value in golden.items():
        assert isinstance(value, torch.Tensor), key
    out = pathlib.Path(__file__).with_name("galore_golden.pt")
    torch.save(golden, out)
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(golden)} keys, torch {torch.__version__})")


if __name__ == "__main__":
    main()
