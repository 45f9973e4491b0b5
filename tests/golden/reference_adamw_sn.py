"""Reference AdamwSN (AdamW with Subset-Norm), written from docs (shared/reference/optimizers.md 2.1-2.2).

This is the published algorithm of timmytonga/sn-sm (adamw_sn.py and adamw_sng.py), re-written step
by step from the pseudocode, for make_adamw_sn_golden.py. It is not the project's optimizer; it is
what the project's C++ AdamwSN is tested against.

One optimizer, three forms chosen per param group with the "form" key:

  "elementwise"  HF-style Adam, no subset norm: u = g*g, exp_avg_sq has the param's shape.
                 (The non-"sn" path of both reference files.)
  "per_matrix"   adamw_sn.py's heuristic for a 2-D m x n gradient: if m >= n, sum g*g over dim 1,
                 state (m, 1), one accumulator per row; else sum over dim 0, state (1, n), one per
                 column. Each subset runs along the smaller dimension.
  "general"      adamw_sng.py: subset size s from the group's "subset_size" k (default -2):
                 k > 0 -> closest_smaller_divisor(N, k); k < 0 -> closest_smaller_divisor(N,
                 int(sqrt(N) / |k|)). The flattened (row-major) tensor is cut into N/s contiguous
                 blocks of s elements; state (N/s, 1) holds the EMA of each block's SUM of squares.
                 s is decided on the first step and cached in the state.

Common to all forms (HF AdamW numerics, as GaLoreAdamW):
  step_size = lr * sqrt(1 - b2^t) / (1 - b1^t)     (bias correction folded into the step size)
  denom     = sqrt(exp_avg_sq) + eps                (eps not bias corrected; default 1e-6)
  p        -= step_size * numerator / denom         (denominator broadcast over each subset)
  p        -= lr * wd * p                           (decoupled, AFTER the update, plain lr; wd > 0)
  beta1 == 0 is RMSPropSN: no exp_avg state at all, the numerator is the raw gradient.

Operation order follows the reference: exp_avg.mul_(b1).add_(g, alpha=1-b1);
exp_avg_sq.mul_(b2).add_(u, alpha=1-b2); denom = exp_avg_sq.sqrt().add_(eps); then p.addcdiv_
(elementwise, per_matrix) or p.add_((m.view(N/s, s) / denom).reshape(p.shape)) (general);
then p.add_(p, alpha=-lr*wd).

Run this file directly to execute its self-checks:
  ~/.cache/llama-trainer/venv-torch-2.11.0/bin/python tests/golden/reference_adamw_sn.py
"""
import math

import torch

FORMS = ("elementwise", "per_matrix", "general")


def closest_smaller_divisor(n: int, k: int) -> int:
    """The largest divisor of n that is <= k (adamw_sng.py's closest_smaller_divisor_of_n_to_k).

    The reference never rounds up; 1 divides everything, so a prime n gives 1. k < 1 is an error
    (the reference divides by zero for k == 0, e.g. N < 4 with the default k = -2).
    """
    if k < 1:
        raise ValueError(f"subset size target {k} < 1 for numel {n} (reference: ZeroDivisionError)")
    if n % k == 0:
        return k
    for i in range(int(k), 0, -1):
        if n % i == 0:
            return i
    raise AssertionError("unreachable: 1 divides every n")


def resolve_subset_size(numel: int, subset_size: int) -> int:
    """adamw_sng.py's rule: k > 0 asks for k, k < 0 asks for int(sqrt(N) / |k|)."""
    if subset_size > 0:
        return closest_smaller_divisor(numel, subset_size)
    if subset_size < 0:
        return closest_smaller_divisor(numel, int(math.sqrt(numel) / abs(subset_size)))
    raise ValueError("subset_size 0 is not defined by the reference")


class AdamWSNReference(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 form="general", subset_size=-2):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, form=form,
                        subset_size=subset_size)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["form"] not in FORMS:
                raise ValueError(f"unknown form {group['form']!r}")
            if not 0.0 <= group["betas"][0] < 1.0 or not 0.0 <= group["betas"][1] < 1.0:
                raise ValueError(f"bad betas {group['betas']}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            form = group["form"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "step" not in state:
                    state["step"] = 0

                # The second-moment input u, shaped like the state it feeds.
                if form == "per_matrix":
                    if g.dim() != 2:
                        raise ValueError("per_matrix form needs a 2-D gradient")
                    if "reduce_dim" not in state:
                        state["reduce_dim"] = 0 if g.shape[0] >= g.shape[1] else 1
                    u = torch.sum(g * g, dim=1 - state["reduce_dim"], keepdim=True)
                elif form == "general":
                    numel = g.numel()
                    if "subset_size" not in state:
                        state["subset_size"] = resolve_subset_size(numel, group["subset_size"])
                    s = state["subset_size"]
                    u = torch.sum(g.reshape(numel // s, s) ** 2, dim=1, keepdim=True)
                else:
                    u = g * g

                if "exp_avg_sq" not in state:  # keyed on exp_avg_sq so beta1 == 0 works
                    if beta1 > 0:
                        state["exp_avg"] = torch.zeros_like(g)
                    state["exp_avg_sq"] = torch.zeros_like(u)
                state["step"] += 1
                t = state["step"]

                if beta1 > 0:
                    numerator = state["exp_avg"]
                    numerator.mul_(beta1).add_(g, alpha=1.0 - beta1)
                else:
                    numerator = g
                exp_avg_sq = state["exp_avg_sq"]
                exp_avg_sq.mul_(beta2).add_(u, alpha=1.0 - beta2)
                denom = exp_avg_sq.sqrt().add_(group["eps"])

                step_size = group["lr"] * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)

                if form == "general":
                    s = state["subset_size"]
                    update = (numerator.reshape(numerator.numel() // s, s) / denom).reshape(p.shape)
                    p.add_(update, alpha=-step_size)
                else:
                    p.addcdiv_(numerator, denom, value=-step_size)

                if group["weight_decay"] > 0.0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return loss


def run(initial, grads, lrs, **group):
    """Run the reference on one tensor: returns (final param, optimizer state)."""
    p = torch.nn.Parameter(initial.detach().clone())
    opt = AdamWSNReference([dict(params=[p], **group)])
    for step, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        p.grad = grads[step].clone()
        opt.step()
    return p.detach().clone(), opt.state[p]


def self_check() -> None:
    """The forms' equivalences, which hold by construction up to float32 rounding.

    Not bitwise: elementwise/per_matrix update through p.addcdiv_(m, denom) and general through
    p.add_(m / denom), which round differently (seen: 1e-10 absolute on an element that weight
    decay and the update nearly cancel), hence atol 1e-8 next to rtol 1e-6.
    """
    gen = torch.Generator().manual_seed(7)
    steps = 6
    lrs = [1e-2 * (0.5 + 0.1 * s) for s in range(steps)]
    assert resolve_subset_size(960, -2) == 15 and resolve_subset_size(1073, -2) == 1
    assert resolve_subset_size(1200, 64) == 60 and resolve_subset_size(1200, -1) == 30
    assert resolve_subset_size(1023, -2) == 11 and resolve_subset_size(7, 100) == 7
    for betas, wd in (((0.9, 0.999), 0.1), ((0.0, 0.95), 0.0)):
        # per_matrix on a tall m x n == general with s = n (each row is a block).
        m, n = 33, 14
        x0 = torch.randn(m, n, generator=gen)
        gs = torch.randn(steps, m, n, generator=gen)
        a, sa = run(x0, gs, lrs, form="per_matrix", betas=betas, weight_decay=wd)
        b, sb = run(x0, gs, lrs, form="general", subset_size=n, betas=betas, weight_decay=wd)
        assert sb["subset_size"] == n and sa["exp_avg_sq"].shape == (m, 1) == sb["exp_avg_sq"].shape
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=1e-6, atol=1e-8)
        # per_matrix on a wide m x n == general (s = m) on the transpose (columns are blocks).
        xw = torch.randn(n, m, generator=gen)
        gw = torch.randn(steps, n, m, generator=gen)
        a, sa = run(xw, gw, lrs, form="per_matrix", betas=betas, weight_decay=wd)
        b, sb = run(xw.t().contiguous(), gw.transpose(1, 2).contiguous(), lrs, form="general",
                    subset_size=n, betas=betas, weight_decay=wd)
        assert sa["exp_avg_sq"].shape == (1, m)
        torch.testing.assert_close(a, b.t(), rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(sa["exp_avg_sq"].view(-1), sb["exp_avg_sq"].view(-1),
                                   rtol=1e-6, atol=1e-8)
        # general with subset size 1 == elementwise (a prime numel resolves to 1 at k = -2, too).
        for shape, k in (((37, 29), 1), ((37, 29), -2), ((101,), -2)):
            x0 = torch.randn(shape, generator=gen)
            gs = torch.randn(steps, *shape, generator=gen)
            a, sa = run(x0, gs, lrs, form="elementwise", betas=betas, weight_decay=wd)
            b, sb = run(x0, gs, lrs, form="general", subset_size=k, betas=betas, weight_decay=wd)
            assert sb["subset_size"] == 1
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
            torch.testing.assert_close(sa["exp_avg_sq"].view(-1), sb["exp_avg_sq"].view(-1),
                                       rtol=1e-6, atol=1e-8)
            if betas[0] > 0:
                torch.testing.assert_close(sa["exp_avg"], sb["exp_avg"], rtol=0, atol=0)
            else:
                assert "exp_avg" not in sa and "exp_avg" not in sb
    # Elementwise form == a hand-written HF AdamW loop in float64 (a loose check of the formulas).
    x0 = torch.randn(50, generator=gen)
    gs = torch.randn(steps, 50, generator=gen)
    a, _ = run(x0, gs, lrs, form="elementwise", betas=(0.9, 0.99), weight_decay=0.1)
    x, m, v = x0.double(), torch.zeros(50, dtype=torch.float64), torch.zeros(50, dtype=torch.float64)
    for t, lr in enumerate(lrs, start=1):
        g = gs[t - 1].double()
        m = 0.9 * m + 0.1 * g
        v = 0.99 * v + 0.01 * g * g
        x = x - lr * math.sqrt(1 - 0.99 ** t) / (1 - 0.9 ** t) * m / (v.sqrt() + 1e-6)
        x = x - lr * 0.1 * x
    torch.testing.assert_close(a.double(), x, rtol=1e-5, atol=1e-6)
    print("reference_adamw_sn self-check passed")


if __name__ == "__main__":
    self_check()
