"""What a checkpoint costs the training loop, ours against torch.distributed.checkpoint, in one run.

Both sides train the same model (--config, fp32, AdamW, one process, --threads threads, random or
synthetic tokens of --batch x --length) for --steps steps, in three modes each:
    end     one save, after the last step (the baseline: every mode has it)
    sync    also a save every --every steps, the loop waiting for it
    async   the same saves in the background: ours --async_save (host copy, written on a thread,
            completed at a later step boundary); theirs dcp.async_save, as torchtitan's async mode
The last step's save is synchronous on both sides. A run's loop time is the sum of its steps'
step_time_s and of every save's blocked_s (the seconds the loop waited on that save, start and any
later wait together), so start-up (Python's imports, our binary's) is left out. The figure per mode is
(loop time - that side's `end` loop time) / periodic saves: the step time one save costs, the writer
thread's competition for the cores included (it slows the steps it overlaps). Modes alternate within
each of --rounds rounds; each figure is the median over rounds, min-max beside it.

Ours: build/trainer, RUN_DIR/metrics.jsonl ("train" step_time_s, "checkpoint" blocked_s). Theirs:
bench/pytorch_peers.py eager with --save_dir (DcpSaver): transformers' LlamaForCausalLM, fused AdamW,
dcp.save / dcp.async_save of the model's and optimizer's state dicts. Checkpoints go to --scratch and
are removed after each run (a llama_20m save is about 0.25 GB on each side). The bound for a
synchronous save: the bytes of one of our step folders written to one file in --scratch and fsynced,
the best of 3 (no save that persists them can take less; DCP fsyncs too).

    ~/.cache/llama-trainer/venv-torch-2.11.0/bin/python bench/save_cost.py [--json]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from pytorch_peers import read_jsonl

MODES = ("end", "sync", "async")


def loop_seconds(records):
    steps = [r["step_time_s"] for r in records if r.get("event") == "train"]
    saves = [r for r in records if r.get("event") == "checkpoint"]
    return sum(steps) + sum(r["blocked_s"] for r in saves), saves


def run(command, env=None):
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"save_cost: {' '.join(command)} failed ({done.returncode}):\n{done.stdout[-4000:]}")


def mode_flags(args, mode):
    """The flags both sides take for a mode (the peer's --save_every and --async_save mirror ours)."""
    return ([] if mode == "end" else ["--save_every", str(args.every)]) + (["--async_save"] if mode == "async" else [])


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def write_bound_seconds(nbytes, folder, tries=3):
    """The bound: writing `nbytes` to a file in `folder` and fsyncing it, the best of `tries` (what any
    synchronous save of that many bytes must at least take on this disk)."""
    chunk = b"\x5a" * (64 << 20)
    best = float("inf")
    path = os.path.join(folder, "bound.bin")
    for _ in range(tries):
        started = time.perf_counter()
        with open(path, "wb") as out:
            left = nbytes
            while left > 0:
                left -= out.write(chunk[: min(left, len(chunk))])
            out.flush()
            os.fsync(out.fileno())
        best = min(best, time.perf_counter() - started)
        os.remove(path)
    return best


def ours(args, mode, round_index):
    run_dir = os.path.join(args.scratch, f"ours_{mode}_{round_index}")
    save_dir = os.path.join(args.scratch, "ckpt_ours")
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(save_dir, ignore_errors=True)
    command = [args.trainer, "--config", args.config, "--device", "cpu", "--num_training_steps", str(args.steps),
               "--batch_size", str(args.batch), "--total_batch_size", str(args.batch), "--max_length",
               str(args.length), "--eval_every", "0", "--eval_batches", "1", "--lr", "1e-3", "--warmup_steps", "1",
               "--grad_clipping", "1.0", "--weight_decay", "0", "--run_dir", run_dir, "--save_dir", save_dir]
    run(command + mode_flags(args, mode), dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    args.save_bytes = folder_bytes(os.path.join(save_dir, f"step_{args.steps}"))
    shutil.rmtree(save_dir, ignore_errors=True)
    return loop_seconds(read_jsonl(os.path.join(run_dir, "metrics.jsonl")))


def theirs(args, mode, round_index):
    out = os.path.join(args.scratch, f"dcp_{mode}_{round_index}.jsonl")
    save_dir = os.path.join(args.scratch, "ckpt_dcp")
    shutil.rmtree(save_dir, ignore_errors=True)
    command = [sys.executable, os.path.join(os.path.dirname(__file__), "pytorch_peers.py"), "eager", "--config",
               args.config, "--steps", str(args.steps), "--batch", str(args.batch), "--length", str(args.length),
               "--threads", str(args.threads), "--out", out, "--save_dir", save_dir]
    run(command + mode_flags(args, mode))
    shutil.rmtree(save_dir, ignore_errors=True)
    return loop_seconds(read_jsonl(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/llama_20m.json")
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trainer", default=os.path.join(os.environ.get("BUILD_DIR", "build"), "trainer"))
    parser.add_argument("--scratch", default="runs/save_cost")
    parser.add_argument("--sides", default="ours,dcp", help="which sides to run, comma-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.scratch, exist_ok=True)
    periodic = (args.steps - 1) // args.every  # saves before the last step's
    sides = {side: runner for side, runner in (("ours", ours), ("dcp", theirs)) if side in args.sides.split(",")}
    loops = {(side, mode): [] for side in sides for mode in MODES}
    blocked = {(side, mode): [] for side in sides for mode in MODES}
    for round_index in range(args.rounds):
        for mode in MODES:
            for side, runner in sides.items():
                seconds, saves = runner(args, mode, round_index)
                loops[(side, mode)].append(seconds)
                # The periodic saves' own wait (the last step's save is the same synchronous one everywhere).
                blocked[(side, mode)] += [s["blocked_s"] for s in saves if s["step"] != args.steps]
                print(f"[round {round_index + 1}/{args.rounds}] {side} {mode}: loop {seconds:.2f} s", file=sys.stderr,
                      flush=True)
    # The bound for a synchronous save: its bytes (ours, one step folder) written and fsynced.
    bound = write_bound_seconds(args.save_bytes, args.scratch) if "ours" in sides else float("nan")
    results = []
    for side in sides:
        for mode in ("sync", "async"):
            per_round = [(loops[(side, mode)][r] - loops[(side, "end")][r]) / periodic for r in range(args.rounds)]
            results.append({"side": side, "mode": mode, "config": args.config, "steps": args.steps,
                            "every": args.every, "periodic_saves": periodic, "threads": args.threads,
                            "batch": args.batch, "length": args.length,
                            "end_loop_s": statistics.median(loops[(side, "end")]),
                            "cost_per_save_s": statistics.median(per_round), "cost_min_s": min(per_round),
                            "cost_max_s": max(per_round),
                            "blocked_per_save_s": statistics.median(blocked[(side, mode)]),
                            "save_bytes": getattr(args, "save_bytes", 0), "write_fsync_bound_s": bound})
    if args.json:
        for result in results:
            print(json.dumps(result))
        return
    print(f"{args.config}, {args.steps} steps of {args.batch} x {args.length}, a save every {args.every} steps "
          f"({periodic} before the last), {args.threads} threads, median of {args.rounds} rounds; bound for a "
          f"synchronous save: its {getattr(args, 'save_bytes', 0) / 1e9:.3f} GB written and fsynced, best of 3: "
          f"{bound:.3f} s")
    print("| side | mode | loop without periodic saves | step time one save costs (min-max) | loop blocked per save |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['side']} | {r['mode']} | {r['end_loop_s']:.2f} s | {r['cost_per_save_s']:.3f} s "
              f"({r['cost_min_s']:.3f}-{r['cost_max_s']:.3f}) | {r['blocked_per_save_s']:.3f} s |")


if __name__ == "__main__":
    main()
