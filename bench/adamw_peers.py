"""The Python side of build/bench/adamw_bench: the optimizer steps a PyTorch user would run instead of ours.

    torch_fused    torch.optim.AdamW(fused=True): ATen's fused CPU kernel (one vectorised pass per
                   tensor, at::parallel_for over the elements), fp32 params, grads and state
    deepspeed      deepspeed.ops.adam.DeepSpeedCPUAdam(adamw_mode=True): DeepSpeed's C++ CPU Adam
                   (AVX2/AVX-512 intrinsics with FMA, `omp parallel for`), fp32 params and state,
                   built for DS_ACCELERATOR=cpu (bench/install_peers.sh)
    adamw_sn       the AdamwSN reference of tests/golden/reference_adamw_sn.py, form "per_matrix"
    galore         galore_torch.GaLoreAdamW (rank, update_proj_gap, scale, proj_type "std")

Every side runs on torch.set_num_threads(--threads); the bench also sets OMP_NUM_THREADS, which is
what DeepSpeed's `omp parallel for` follows (its op resolves GOMP from the libgomp that torch loads,
so both use one OpenMP runtime and one thread count).

Data are made from the element index alone (index_values below, exact in fp32), so the C++ bench
builds the same parameters and gradients without exchanging them, and the sides are compared at a
few thousand sampled elements after the same number of steps.

Two ways to run it:
  --serve        the bench's mode: one JSON command per line on stdin, one JSON answer per line on
                 the original stdout (everything libraries print goes to stderr), so the bench can
                 interleave one step of each side with its own steps:
                   {"cmd": "setup", "kind": "adamw", "n": N, "lr": .., "weight_decay": ..}
                   {"cmd": "setup", "kind": "rules", "shapes": [[m, n], ..], "lr": .., ...}
                   {"cmd": "step", "side": "torch_fused"}  -> {"seconds": s}
                   {"cmd": "samples", "side": .., "indices": [..]} -> {"values": [..]} (flattened
                                  params, concatenated in shape order for "rules")
                   {"cmd": "quit"}
  otherwise      stand-alone: --sizes 2^22,2^24 --reps 5 prints one JSON object per size with the
                 median seconds of each AdamW side (interleaved over the reps).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ADAMW_SIDES = ("torch_fused", "deepspeed")
RULE_SIDES = ("adamw_sn", "galore")


def index_values(n, multiplier, offset, scale, dtype=torch.float32):
    """scale * (((i * multiplier + offset) mod 2^32) / 2^31 - 1) for i in [0, n): uniform in
    [-scale, scale), computed exactly in float64 (the C++ bench uses the same formula); scale is a
    power of two so the fp32 rounding is the only rounding."""
    i = torch.arange(n, dtype=torch.int64)
    hashed = (i * multiplier + offset) % (1 << 32)
    return (hashed.to(torch.float64) / float(1 << 31) - 1.0).mul_(scale).to(dtype)


def load_deepspeed():
    """DeepSpeedCPUAdam, or (None, why)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: F401
        import deepspeed
        return DeepSpeedCPUAdam, deepspeed.__version__, None
    except Exception as error:  # not installed, or its op does not build
        return None, None, f"{type(error).__name__}: {error}"


class AdamWSides:
    """One fp32 parameter of n elements per side, the same data and gradient on each."""

    def __init__(self, n, lr, weight_decay, deepspeed_class):
        self.params, self.optimizers = {}, {}
        for side in ADAMW_SIDES:
            if side == "deepspeed" and deepspeed_class is None:
                continue
            param = torch.nn.Parameter(index_values(n, 2654435761, 12345, 1.0))
            param.grad = index_values(n, 2246822519, 777, 0.0625)
            if side == "torch_fused":
                optimizer = torch.optim.AdamW([param], lr=lr, betas=(0.9, 0.999), eps=1e-8,
                                              weight_decay=weight_decay, fused=True)
            else:
                optimizer = deepspeed_class([param], lr=lr, betas=(0.9, 0.999), eps=1e-8,
                                            weight_decay=weight_decay, adamw_mode=True)
            self.params[side] = [param]
            self.optimizers[side] = optimizer


class RuleSides:
    """The matrices of one bench row per side (AdamwSN reference, GaLoreAdamW)."""

    def __init__(self, shapes, lr, weight_decay, galore):
        sys.path.insert(0, os.path.join(HERE, "..", "tests", "golden"))
        from reference_adamw_sn import AdamWSNReference
        from galore_torch import GaLoreAdamW
        self.params, self.optimizers = {}, {}
        for side in RULE_SIDES:
            params = []
            for index, (rows, cols) in enumerate(shapes):
                param = torch.nn.Parameter(
                    index_values(rows * cols, 2654435761, 12345 + index, 0.03125).view(rows, cols))
                param.grad = index_values(rows * cols, 2246822519, 777 + index, 0.0625).view(rows, cols)
                params.append(param)
            if side == "adamw_sn":
                optimizer = AdamWSNReference(params, lr=lr, betas=(0.9, 0.999), eps=1e-6,
                                             weight_decay=weight_decay, form="per_matrix")
            else:
                optimizer = GaLoreAdamW(
                    [{"params": params, "rank": galore["rank"], "update_proj_gap": galore["gap"],
                      "scale": galore["scale"], "proj_type": "std"}],
                    lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=weight_decay,
                    no_deprecation_warning=True)
            self.params[side] = params
            self.optimizers[side] = optimizer


def timed_step(optimizer):
    start = time.perf_counter()
    optimizer.step()
    return time.perf_counter() - start


def serve(args):
    # The answers go to the original stdout; anything a library prints goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    torch.set_num_threads(args.threads)
    deepspeed_class, deepspeed_version, deepspeed_error = load_deepspeed()
    hello = {"torch": torch.__version__, "threads": torch.get_num_threads(),
             "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
             "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "deepspeed": deepspeed_version, "deepspeed_error": deepspeed_error}
    answers.write(json.dumps(hello) + "\n")
    sides = None
    with torch.no_grad():
        for line in sys.stdin:
            command = json.loads(line)
            cmd = command["cmd"]
            if cmd == "quit":
                break
            try:
                if cmd == "setup":
                    sides = None  # free the previous size first
                    if command["kind"] == "adamw":
                        sides = AdamWSides(command["n"], command["lr"], command["weight_decay"],
                                           deepspeed_class)
                    else:
                        sides = RuleSides(command["shapes"], command["lr"], command["weight_decay"],
                                          command["galore"])
                    answer = {"sides": sorted(sides.optimizers)}
                elif cmd == "step":
                    answer = {"seconds": timed_step(sides.optimizers[command["side"]])}
                elif cmd == "samples":
                    flat = torch.cat([p.detach().reshape(-1) for p in sides.params[command["side"]]])
                    picked = flat[torch.tensor(command["indices"], dtype=torch.int64)]
                    answer = {"values": [float(x) for x in picked.tolist()]}
                else:
                    answer = {"error": f"unknown command {cmd!r}"}
            except Exception as error:
                answer = {"error": f"{type(error).__name__}: {error}"}
            answers.write(json.dumps(answer) + "\n")


def parse_size(text):
    base, _, exponent = text.partition("^")
    return int(base) ** int(exponent) if exponent else int(base)


def standalone(args):
    torch.set_num_threads(args.threads)
    deepspeed_class, deepspeed_version, deepspeed_error = load_deepspeed()
    if deepspeed_error:
        print(f"deepspeed unavailable ({deepspeed_error}); run bash bench/install_peers.sh",
              file=sys.stderr)
    with torch.no_grad():
        for n in (parse_size(s) for s in args.sizes.split(",")):
            sides = AdamWSides(n, 1e-3, 0.1, deepspeed_class)
            times = {side: [] for side in sides.optimizers}
            for side in sides.optimizers:
                timed_step(sides.optimizers[side])  # warm-up: allocates the state
            for _ in range(args.reps):
                for side in sides.optimizers:
                    times[side].append(timed_step(sides.optimizers[side]))
            row = {"n": n, "threads": torch.get_num_threads(), "deepspeed": deepspeed_version}
            for side in ADAMW_SIDES:
                row[f"{side}_ms"] = 1e3 * statistics.median(times[side]) if side in times else None
            print(json.dumps(row), flush=True)
            del sides


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--sizes", default="2^22,2^24,2^26")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.serve:
        serve(args)
    else:
        standalone(args)


if __name__ == "__main__":
    main()
