"""Golden file for the AdamwSN (subset-norm Adam) optimizer test: ten steps on CPU, float32.

The reference is reference_adamw_sn.py beside this file (the published adamw_sn.py / adamw_sng.py
algorithm, re-written from shared/reference/optimizers.md; its self-checks run first). Each case is
one tensor in its own param group with its own form, betas and weight decay. The learning rate
changes every step; gradients change scale by four orders of magnitude over the steps, with a few
exact zeros, and the first 20 flattened elements are all zero at step 1 (a whole zero subset: its
second moment stays 0, the denominator is exactly eps). Forms:
  elementwise  HF-style Adam (no subset norm), eps 1e-6
  per_matrix   adamw_sn.py: m >= n -> row sums, state (m, 1); m < n -> column sums, state (1, n)
  general      adamw_sng.py: contiguous row-major blocks of s elements, state (N/s, 1), s from the
               subset_size argument k (k > 0: largest divisor of N <= k; k < 0: largest divisor of
               N <= int(sqrt(N)/|k|)). general_48x20_default has s = 15, so blocks straddle rows.
beta1 == 0 is RMSPropSN: there is no exp_avg state and no NAME.exp_avg key.

The C++ test loads the dict with torch::pickle_load, so every value is a tensor, the layout flat:

  lrs (steps,) f64, meta.eps () f64
  NAME.form () int64              0 elementwise, 1 per_matrix, 2 general
  NAME.subset_size_arg () int64   the k given to the general form (0 otherwise)
  NAME.subset_size () int64       the resolved subset size s (0 when not general)
  NAME.betas (2,) f64, NAME.weight_decay () f64
  NAME.initial        the parameter before step 1 (f32)
  NAME.grads          (steps, *shape) the gradient fed at each step (f32)
  NAME.final          the parameter after the last step (f32)
  NAME.exp_avg_sq     the second moment after the last step, in the reference's state shape:
                      the param's shape (elementwise), (m, 1) or (1, n) (per_matrix), (N/s, 1) (general)
  NAME.exp_avg        the first moment (param's shape), only when beta1 > 0

Regenerate from the repository root:
  ~/.cache/llama-trainer/venv-torch-2.11.0/bin/python tests/golden/make_adamw_sn_golden.py
"""
import pathlib

import torch

from reference_adamw_sn import AdamWSNReference, resolve_subset_size, self_check

STEPS = 10
EPS = 1e-6
FORM_CODE = {"elementwise": 0, "per_matrix": 1, "general": 2}
# name -> (shape, form, subset_size arg (general only), betas, weight decay)
CASES = {
    "tall_48x20": ((48, 20), "per_matrix", 0, (0.9, 0.999), 0.1),
    "wide_20x48": ((20, 48), "per_matrix", 0, (0.9, 0.999), 0.0),
    "square_24x24": ((24, 24), "per_matrix", 0, (0.9, 0.95), 0.1),
    "rmsprop_tall_40x12": ((40, 12), "per_matrix", 0, (0.0, 0.999), 0.0),
    "general_48x20_default": ((48, 20), "general", -2, (0.9, 0.999), 0.1),
    "general_37x29_default": ((37, 29), "general", -2, (0.9, 0.999), 0.1),
    "general_40x30_k64": ((40, 30), "general", 64, (0.9, 0.95), 0.1),
    "general_30x40_k_minus1": ((30, 40), "general", -1, (0.9, 0.999), 0.0),
    "general_vec_1023": ((1023,), "general", -2, (0.9, 0.999), 0.1),
    "general_wide_rmsprop_24x60": ((24, 60), "general", -2, (0.0, 0.999), 0.1),
    "elementwise_vec_1023": ((1023,), "elementwise", 0, (0.9, 0.999), 0.0),
    "elementwise_7": ((7,), "elementwise", 0, (0.9, 0.95), 0.1),
}
EXPECTED_SUBSET = {"general_48x20_default": 15, "general_37x29_default": 1,
                   "general_40x30_k64": 60, "general_30x40_k_minus1": 30,
                   "general_vec_1023": 11, "general_wide_rmsprop_24x60": 18}


def main() -> None:
    self_check()
    generator = torch.Generator().manual_seed(20240612)
    lrs = [1e-2 * (0.5 + 0.1 * step) for step in range(STEPS)]

    params, grads = {}, {}
    for name, (shape, *_rest) in CASES.items():
        params[name] = torch.nn.Parameter(torch.randn(shape, generator=generator))
        scale = torch.logspace(-3, 1, STEPS, dtype=torch.float32)
        g = torch.randn((STEPS, *shape), generator=generator) * scale.view(-1, *([1] * len(shape)))
        flat = g.view(STEPS, -1)
        flat[:, ::5] = torch.where(torch.arange(STEPS).view(-1, 1) % 3 == 0, torch.zeros(()),
                                   flat[:, ::5])
        flat[0, :20] = 0.0  # a whole zero subset at step 1 (every form's first block or row)
        grads[name] = g

    golden = {
        "lrs": torch.tensor(lrs, dtype=torch.float64),
        "meta.eps": torch.tensor(EPS, dtype=torch.float64),
    }
    groups = []
    for name, (shape, form, k, betas, weight_decay) in CASES.items():
        groups.append({"params": [params[name]], "form": form, "subset_size": k, "betas": betas,
                       "weight_decay": weight_decay})
        golden[f"{name}.initial"] = params[name].detach().clone()
        golden[f"{name}.grads"] = grads[name].clone()
        golden[f"{name}.form"] = torch.tensor(FORM_CODE[form], dtype=torch.int64)
        golden[f"{name}.subset_size_arg"] = torch.tensor(k, dtype=torch.int64)
        golden[f"{name}.betas"] = torch.tensor(betas, dtype=torch.float64)
        golden[f"{name}.weight_decay"] = torch.tensor(weight_decay, dtype=torch.float64)

    optimizer = AdamWSNReference(groups, lr=lrs[0], eps=EPS)
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = lrs[step]
        for name, param in params.items():
            param.grad = grads[name][step].clone()
        optimizer.step()

    for name, (shape, form, k, betas, _) in CASES.items():
        param = params[name]
        state = optimizer.state[param]
        assert state["step"] == STEPS
        numel = param.numel()
        s = state.get("subset_size", 0)
        if form == "general":
            assert s == resolve_subset_size(numel, k) == EXPECTED_SUBSET[name], (name, s)
            assert state["exp_avg_sq"].shape == (numel // s, 1)
        elif form == "per_matrix":
            m, n = shape
            assert state["exp_avg_sq"].shape == ((m, 1) if m >= n else (1, n))
        else:
            assert state["exp_avg_sq"].shape == param.shape
        assert ("exp_avg" in state) == (betas[0] > 0)
        assert torch.isfinite(param).all() and not torch.equal(param.detach(), golden[f"{name}.initial"])
        golden[f"{name}.subset_size"] = torch.tensor(s, dtype=torch.int64)
        golden[f"{name}.final"] = param.detach().clone()
        golden[f"{name}.exp_avg_sq"] = state["exp_avg_sq"].clone()
        if "exp_avg" in state:
            golden[f"{name}.exp_avg"] = state["exp_avg"].clone()
        print(f"  {name}: shape {tuple(shape)} form {form} k {k} -> s {s}, "
              f"exp_avg_sq {tuple(state['exp_avg_sq'].shape)}, "
              f"max |final - initial| {(param.detach() - golden[name + '.initial']).abs().max():.3e}")

    for key, value in golden.items():
        assert isinstance(value, torch.Tensor), key
        if value.is_floating_point() and key not in ("lrs", "meta.eps") and not key.endswith(
                (".betas", ".weight_decay")):
            assert value.dtype == torch.float32, key
    out = pathlib.Path(__file__).with_name("adamw_sn_golden.pt")
    torch.save(golden, out)
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(golden)} keys, torch {torch.__version__})")


if __name__ == "__main__":
    main()
