"""Golden file for tests/optim_adamw_test.cpp: ten torch.optim.AdamW steps on CPU.

The reference is Python's torch.optim.AdamW on its single-tensor path (foreach=False, the path it
takes on CPU anyway), the semantics optim/adamw.h promises. Each tensor is its own parameter group
with its own betas and weight decay: decay on and off, the LLaMA betas (0.9, 0.95), and beta1 of
0.3 and 0.0, where torch's lerp switches to its other form (weight 1 - beta1 >= 0.5). The learning
rate changes every step, and the sizes hit SIMD tails (1, 7, 22, 1023) plus a 2-D matrix. The C++
test loads the dict with torch::pickle_load, so every value is a tensor and the layout is flat:

  meta.eps () f64, lrs (steps,) f64
  NAME.betas (2,) f64, NAME.weight_decay () f64
  NAME.initial        the parameter before step 1
  NAME.grads          (steps, *shape) the gradient fed at each step
  NAME.final          the parameter after the last step
  NAME.exp_avg, NAME.exp_avg_sq   the optimizer state after the last step

Run from the repository root with the venv python (launch/setup.sh makes it):
  python tests/golden/make_adamw_golden.py
"""
import pathlib

import torch

STEPS = 10
EPS = 1e-8
# name -> (shape, betas, weight decay)
TENSORS = {
    "one": ((1,), (0.9, 0.95), 0.1),
    "seven": ((7,), (0.9, 0.95), 0.0),
    "twenty_two": ((22,), (0.3, 0.99), 0.1),
    "vector_1023": ((1023,), (0.9, 0.95), 0.1),
    "matrix_33x17": ((33, 17), (0.9, 0.999), 0.1),
    "gain_1023": ((1023,), (0.0, 0.95), 0.0),
}


def main() -> None:
    generator = torch.Generator().manual_seed(20240611)
    lrs = [1e-3 * (0.5 + 0.1 * step) for step in range(STEPS)]  # a warm-up-like ramp

    params, grads = {}, {}
    for name, (shape, _, _) in TENSORS.items():
        params[name] = torch.nn.Parameter(torch.randn(shape, generator=generator))
        # Gradients of varied scale, a few exact zeros (the lerp and sqrt at 0 must agree).
        scale = torch.logspace(-3, 1, STEPS, dtype=torch.float32)
        g = torch.randn((STEPS, *shape), generator=generator) * scale.view(-1, *([1] * len(shape)))
        g.view(STEPS, -1)[:, ::5] = torch.where(torch.arange(STEPS).view(-1, 1) % 3 == 0,
                                                 torch.zeros(()), g.view(STEPS, -1)[:, ::5])
        grads[name] = g

    golden = {
        "meta.eps": torch.tensor(EPS, dtype=torch.float64),
        "lrs": torch.tensor(lrs, dtype=torch.float64),
    }
    for name, (_, betas, weight_decay) in TENSORS.items():
        golden[f"{name}.betas"] = torch.tensor(betas, dtype=torch.float64)
        golden[f"{name}.weight_decay"] = torch.tensor(weight_decay, dtype=torch.float64)
        golden[f"{name}.initial"] = params[name].detach().clone()
        golden[f"{name}.grads"] = grads[name].clone()

    groups = [{"params": [params[name]], "betas": betas, "weight_decay": weight_decay}
              for name, (_, betas, weight_decay) in TENSORS.items()]
    optimizer = torch.optim.AdamW(groups, lr=lrs[0], eps=EPS, foreach=False)
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = lrs[step]
        for name, param in params.items():
            param.grad = grads[name][step].clone()
        optimizer.step()

    for name, param in params.items():
        state = optimizer.state[param]
        assert int(state["step"]) == STEPS
        golden[f"{name}.final"] = param.detach().clone()
        golden[f"{name}.exp_avg"] = state["exp_avg"].clone()
        golden[f"{name}.exp_avg_sq"] = state["exp_avg_sq"].clone()

    out = pathlib.Path(__file__).with_name("adamw_golden.pt")
    torch.save(golden, out)
    print(f"wrote {out} ({out.stat().st_size} bytes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
