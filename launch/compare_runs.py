#!/usr/bin/env python3
"""Compares two recordings of launch/record_runs.sh, run by run: the training losses, gradient norms and
evaluation losses of metrics.jsonl, and every tensor of the final checkpoint, its ranks' parts put
together (parameters; moments, subset-norm state, GaLore projectors; the optimizer's step). A checkpoint
of the earlier full-tensor format (model.pt, optimizer.pt) is read too, so recordings from before the
sharded format compare with ones after it.

    python launch/compare_runs.py BEFORE AFTER [--markdown FILE]

fp32 runs must be bitwise identical unless --fp32_loss_rtol / --fp32_tensor_scale state a bound (a
change that alters rounding on purpose). bf16 runs (mixed and pure) must be identical or within the
bound given by --bf16_loss_rtol (relative, per loss and gradient norm) and --bf16_tensor_scale
(largest difference over the tensor's largest element: 2^-7 is one bf16 ulp at that element).
--galore_up_to_sign compares GaLore's projectors and first moments up to sign: an SVD's singular
vectors are defined up to sign, and a rounding change can flip one at a refresh (the update, which
the parameters show, does not depend on it). Every run of BEFORE must be in AFTER. Exit status 0
when every run passes, 1 otherwise.
"""
import argparse
import json
import math
import pathlib
import sys

import torch


def read_metrics(run_dir):
    records = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").read_text().splitlines() if line]
    train = [(r["loss"], r["grad_norm"]) for r in records if r.get("event") == "train"]
    evals = [r["eval_loss"] for r in records if r.get("event") == "eval"]
    return train, evals


def read_sharded(folder):
    """{"model:NAME" | "optimizer:KEY": full tensor} of a sharded checkpoint (checkpoint/checkpoint.h)."""
    from safetensors.torch import load_file

    manifest = json.loads((folder / "manifest.json").read_text())
    flat, shapes = {}, {}
    for rank in range(manifest["world_size"]):
        index = json.loads((folder / f"rank{rank}.json").read_text())["tensors"]
        parts = load_file(folder / f"rank{rank}.safetensors")
        for key, entry in index.items():
            shapes[key] = entry["shape"]
            flat.setdefault(key, torch.empty(math.prod(entry["shape"])))
            flat[key][entry["begin"]:entry["begin"] + entry["count"]] = parts[key]
    state = (".exp_avg", ".exp_avg_sq", ".projector")
    tensors = {("optimizer:" if key.endswith(state) else "model:") + key: flat[key].view(shapes[key]) for key in flat}
    tensors["optimizer:step"] = torch.tensor(manifest["optimizer_step"])
    return tensors


def read_checkpoint(run_dir):
    steps = sorted((run_dir / "ckpt").glob("step_*"), key=lambda p: int(p.name[5:]))
    if not steps:
        raise SystemExit(f"{run_dir}: no checkpoint")
    if (steps[-1] / "manifest.json").exists():
        return read_sharded(steps[-1])
    tensors = {}
    for file in ("model.pt", "optimizer.pt"):
        for name, tensor in torch.load(steps[-1] / file, weights_only=False).items():
            tensors[f"{file[:-3]}:{name}"] = tensor
    return tensors


def relative(a, b):
    return abs(a - b) / max(abs(a), 1e-30)


def compare(before, after, bf16, args):
    """Returns (identical, worst loss difference, worst tensor difference, problems)."""
    problems = []
    train_b, eval_b = read_metrics(before)
    train_a, eval_a = read_metrics(after)
    if len(train_b) != len(train_a) or len(eval_b) != len(eval_a):
        return False, math.inf, math.inf, [f"record counts differ: {len(train_b)}/{len(eval_b)} vs {len(train_a)}/{len(eval_a)}"]
    scalars_b = [v for pair in train_b for v in pair] + eval_b
    scalars_a = [v for pair in train_a for v in pair] + eval_a
    identical = scalars_b == scalars_a
    worst_scalar = max((relative(b, a) for b, a in zip(scalars_b, scalars_a)), default=0.0)
    tensors_b, tensors_a = read_checkpoint(before), read_checkpoint(after)
    if tensors_b.keys() != tensors_a.keys():
        missing = sorted(tensors_b.keys() ^ tensors_a.keys())
        return False, worst_scalar, math.inf, [f"checkpoint keys differ: {missing[:4]}"]
    worst_tensor = 0.0
    for name, tb in tensors_b.items():
        ta = tensors_a[name]
        if args.galore_up_to_sign and "galore" in before.name and name.endswith((".projector", ".exp_avg")):
            tb, ta = tb.abs(), ta.abs()
        if tb.shape != ta.shape or tb.dtype != ta.dtype:
            problems.append(f"{name}: {tuple(tb.shape)} {tb.dtype} vs {tuple(ta.shape)} {ta.dtype}")
            identical = False
            continue
        if torch.equal(tb, ta):
            continue
        identical = False
        if tb.is_floating_point():
            scale = tb.abs().max().item() or 1.0
            worst_tensor = max(worst_tensor, (tb.double() - ta.double()).abs().max().item() / scale)
        else:
            problems.append(f"{name}: integer tensor differs")
    if not bf16 and not identical:
        if args.fp32_loss_rtol == 0 and args.fp32_tensor_scale == 0:
            problems.append("fp32 run is not bitwise identical")
        elif worst_scalar > args.fp32_loss_rtol or worst_tensor > args.fp32_tensor_scale:
            problems.append(f"fp32 differences {worst_scalar:.3g} (loss) / {worst_tensor:.3g} (tensors) above the bound")
    if bf16 and worst_scalar > args.bf16_loss_rtol:
        problems.append(f"loss/grad-norm difference {worst_scalar:.3g} > {args.bf16_loss_rtol}")
    if bf16 and worst_tensor > args.bf16_tensor_scale:
        problems.append(f"tensor difference {worst_tensor:.3g} of max > {args.bf16_tensor_scale}")
    return identical, worst_scalar, worst_tensor, problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=pathlib.Path)
    parser.add_argument("after", type=pathlib.Path)
    parser.add_argument("--fp32_loss_rtol", type=float, default=0.0)
    parser.add_argument("--fp32_tensor_scale", type=float, default=0.0)
    parser.add_argument("--galore_up_to_sign", action="store_true")
    parser.add_argument("--bf16_loss_rtol", type=float, default=1e-2)
    parser.add_argument("--bf16_tensor_scale", type=float, default=2.0 ** -7)
    parser.add_argument("--markdown", type=pathlib.Path, help="also write the table here")
    args = parser.parse_args()

    runs = sorted(p.name for p in args.before.iterdir() if (p / "run" / "metrics.jsonl").exists())
    if not runs:
        raise SystemExit(f"{args.before}: no recorded runs")
    lines = ["| run | identical | max loss / grad-norm difference (relative) | max tensor difference (of max) | problems |",
             "|---|---|---:|---:|---|"]
    failed = 0
    identical_count = 0
    for name in runs:
        after = args.after / name
        if not (after / "run" / "metrics.jsonl").exists():
            lines.append(f"| {name} | no | | | missing in {args.after} |")
            failed += 1
            continue
        identical, scalar, tensor, problems = compare(args.before / name, after, "bfloat16" in name, args)
        identical_count += identical
        failed += bool(problems)
        lines.append(f"| {name} | {'yes' if identical else 'no'} | {scalar:.3g} | {tensor:.3g} | {'; '.join(problems)} |")
    summary = f"{len(runs)} runs: {identical_count} bitwise identical, {len(runs) - failed} within their bound, {failed} failed"
    text = "\n".join(lines) + "\n\n" + summary + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
