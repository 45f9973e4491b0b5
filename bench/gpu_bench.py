"""The GPU kit's bench stage (launch/gpu/run.sh bench): our trainer's speed and memory on one GPU, set
beside transformers + torch on the same GPU, in one run of a few minutes (issue 31's comparisons).

    speed    llama_350m in bf16 mixed (16 x 1024 tokens a step) and llama_1b in bf16 pure (8 x 1024):
             the kit's trainer (--device cuda) against bench/pytorch_peers.py eager on the same GPU
             (LlamaForCausalLM, SDPA, torch.optim.AdamW(fused=True), the same batch, length, mode and
             hyper-parameters; mixed: autocast over fp32 weights on both sides, pure: bf16 weights on
             both, theirs with bf16 gradients and AdamW state, ours with fp32 masters, gradient shards
             and AdamW state beside them: the same forward and backward, more optimizer bytes on our
             side). Per side the median step time over the kept steps, tokens/s, model TFLOP/s, the
             model FLOPs utilisation against the card's published dense bf16 peak and against a bf16
             GEMM measured on the card, the peak memory (ours: the CUDA allocator's peak as
             metrics.jsonl records it; theirs: torch.cuda.max_memory_allocated), and per phase (ours:
             metrics.jsonl phase_s, the compute stream's, and host_phase_s; theirs: CUDA events).
    memory   `trainer estimate --json` against the measured peak of the same run (the ledger's
             memory.rank0.jsonl "end" summary: the caching allocator's allocated bytes, which is what
             the estimate predicts; its reserved bytes beside the estimate's CUDA runtime budgets) for
             llama_130m fp32, llama_350m bf16 mixed, llama_1b bf16 pure and llama_1b bf16 pure with
             --offload optimizer (also its host side: estimated host and pinned bytes against the
             ledger's host and pinned peaks)
    offload  the offloaded llama_1b's tokens/s as a share of the same run without offload (it fits both
             ways on one H100)
Model FLOPs a token: 6 x the matmul parameters (all but the embedding lookup and the norms) + 12 x
layers x hidden x length for attention's scores and values, torchtitan's count (pytorch_peers'
model_flops_per_token); a step's FLOPs are that times batch x length. Each run drops its first
WARMUP_STEPS steps (cuBLAS's heuristics, the caching allocator's growth, lazy initialisation).

Without a GPU (launch/gpu/dry_run.sh on the CPU machine) the same plan runs with llama_micro on the
CPU for a few steps: what that proves is the plumbing (the commands, the JSON, report.py's tables),
not a figure. The card's published peak is then unknown and MFU is not computed.

    python3 bench/gpu_bench.py device --device cuda|cpu                   # the card and its peaks, JSON
    python3 bench/gpu_bench.py plan --device cuda|cpu --work DIR --python PY   # NAME<TAB>COMMAND lines
    python3 bench/gpu_bench.py summarize --device cuda|cpu --work DIR --out FILE

run.sh writes `device` into WORK/device.json as the plan's first step, runs the plan's commands as its
steps (each under STEP_TIMEOUT, all under the stage's budget), then `summarize`, which prints the
tables (Markdown) into bench.log and writes the results JSON that run.sh puts into bench.json under
"bench"; launch/gpu/report.py renders them with markdown() below. A figure whose files are missing (a
step that failed or ran out of time) is null and shows as "n/a": nothing is filled in.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # configs/ are read from the repository, wherever this is started
sys.path.insert(0, HERE)
from pytorch_peers import model_flops_per_token, read_jsonl  # noqa: E402
from gpu_bench_tables import markdown  # noqa: E402,F401  (launch/gpu/report.py takes it from here)

WARMUP_STEPS = 3

# Published dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, by a part of
# torch.cuda.get_device_name; the first that matches counts, so the specific names come first.
PUBLISHED_BF16_DENSE_TFLOPS = [
    ("H100 PCIe", 756.0, "NVIDIA H100 datasheet, PCIe: 1,513 TFLOP/s bf16 with sparsity, half of it dense"),
    ("H100 NVL", 835.0, "NVIDIA H100 datasheet, NVL: 1,671 TFLOP/s bf16 with sparsity, half of it dense"),
    ("H100", 989.0, "NVIDIA H100 datasheet, SXM: 1,979 TFLOP/s bf16 with sparsity, half of it dense"),
    ("H200", 989.0, "NVIDIA H200 datasheet, SXM: 1,979 TFLOP/s bf16 with sparsity, half of it dense"),
]


@dataclass
class Case:
    """One run of our trainer, and what it is compared with."""

    config: str
    dtype: str                 # float32 or bfloat16
    precision: str             # mixed or pure (bfloat16 only)
    batch: int
    length: int
    steps: int
    peer: bool = False         # also the same run through pytorch_peers.py eager (speed)
    offload: bool = False      # --offload optimizer
    params: bool = False       # --offload parameters (with offload: --offload optimizer,parameters)
    offload_of: str = ""       # the case this one is the offloaded twin of (offload share)
    checkpointing: bool = False  # --activation_checkpointing
    state_bf16: bool = False   # --optimizer_state_dtype bfloat16
    run: bool = True           # False: estimated only (a model the machine cannot hold)
    accumulation: int = 1      # micro-batches a step (a realistic step: 64k tokens and more)
    tag: str = ""              # added to the name: what sets this run apart from its lever_of run
    levers: str = ""           # issue 42's levers toggled against the default ("--pad_matmul_dims off", ...)
    lever_of: str = ""         # the case this one toggles a lever of (the lever's ratio)
    name: str = field(init=False)

    def __post_init__(self):
        stem = os.path.splitext(os.path.basename(self.config))[0]
        mode = "fp32" if self.dtype == "float32" else f"bf16_{self.precision}"
        self.name = f"{stem}_{mode}" + ("_offload" if self.offload else "") + ("_params" if self.params else "") + (
            "_ac" if self.checkpointing else "") + (
            "_bf16state" if self.state_bf16 else "") + (
            f"_{self.tag}" if self.tag else "") + "".join(
            "_" + word.lstrip("-").replace(",", "_") for word in self.levers.split())

    def mode(self):
        return ("fp32" if self.dtype == "float32" else f"bf16 {self.precision}") + (
            " checkpointing" if self.checkpointing else "") + (" bf16 state" if self.state_bf16 else "")

    def tokens_per_step(self):
        return self.batch * self.length * self.accumulation


def cases(device):
    """The plan's runs: issue 31's on a GPU; the same shapes of comparison with llama_micro on a CPU."""
    if device == "cuda":
        speed_350m = Case("configs/llama_350m.json", "bfloat16", "mixed", 16, 1024, 20, peer=True)
        speed_1b = Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 20, peer=True)
        memory_130m = Case("configs/llama_130m.json", "float32", "mixed", 8, 1024, 8)
        offload_1b = Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 10, offload=True,
                          offload_of=speed_1b.name)
        # The largest model on one GPU with offload and activation checkpointing: the host holds 16
        # bytes a parameter (fp32 master, AdamW's two moments, the gradient), so a 128 GiB machine
        # bounds it near 7B; llama_13b is estimated only (the estimate's host figure says why).
        # bf16 optimizer state (issue 28): the offloaded llama_1b's host step with 20 bytes an element
        # instead of 28, its share against the same run without offload; llama_13b's host figure.
        bf16_state = [Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 10, offload=True, state_bf16=True,
                           offload_of=speed_1b.name),
                      Case("configs/llama_13b.json", "bfloat16", "pure", 1, 2048, 5, offload=True, checkpointing=True,
                           state_bf16=True, run=False)]
        # Parameter offload (issue 28): the offloaded llama_1b with its rows in host memory too, its share
        # against the same run without offload; llama_7b with every lever, its peak against the estimate.
        parameters = [Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 10, offload=True, params=True,
                           offload_of=speed_1b.name),
                      Case("configs/llama_7b.json", "bfloat16", "pure", 1, 2048, 5, offload=True, params=True,
                           checkpointing=True, state_bf16=True)]
        largest = [Case("configs/llama_7b.json", "bfloat16", "pure", 1, 2048, 5, offload=True, checkpointing=True),
                   Case("configs/llama_13b.json", "bfloat16", "pure", 1, 2048, 5, offload=True, checkpointing=True,
                        run=False)] + bf16_state + parameters
        # Issue 42's levers, each toggled against the default run of the same shape: llama_1b's MLP
        # unpadded (5461 wide: cuBLAS's align1 kernels), LibTorch's fused RMSNorm and our fused SwiGLU
        # (both off by default until their GPU tests pass).
        # Most important first (a budget cut drops the last): padding, every kernel together, each alone.
        every_kernel = "--fused_ops rms_norm,swiglu,rotary,cross_entropy"
        acc8_1b = Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 8, accumulation=8, tag="acc8",
                       lever_of=speed_1b.name)
        levers = [Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 20, levers="--pad_matmul_dims off",
                       lever_of=speed_1b.name),
                  Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 20, levers=every_kernel,
                       lever_of=speed_1b.name),
                  Case("configs/llama_350m.json", "bfloat16", "mixed", 16, 1024, 20, levers=every_kernel,
                       lever_of=speed_350m.name),
                  Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 20, levers="--grouped_projections",
                       lever_of=speed_1b.name),
                  Case("configs/llama_350m.json", "bfloat16", "mixed", 16, 1024, 20,
                       levers="--grouped_projections " + every_kernel, lever_of=speed_350m.name)] + [
                  Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 20, levers=f"--fused_ops {kernel}",
                       lever_of=speed_1b.name) for kernel in ("rms_norm", "swiglu", "rotary", "cross_entropy")] + [
                  # A realistic step (64k tokens by accumulation, as LLMQ measures at 524k) and a larger
                  # micro-batch, each against the default run's tokens/s.
                  acc8_1b,
                  Case("configs/llama_350m.json", "bfloat16", "mixed", 16, 1024, 8, accumulation=4, tag="acc4",
                       lever_of=speed_350m.name),
                  Case("configs/llama_1b.json", "bfloat16", "pure", 16, 1024, 12, tag="b16", lever_of=speed_1b.name),
                  Case("configs/llama_350m.json", "bfloat16", "mixed", 32, 1024, 12, tag="b32", lever_of=speed_350m.name)]
        # Issue 43: offload's share at 32k and 128k tokens a step (the host step is per step, the GPU's
        # work per token), fp32 and bf16 state, against the 64k-token run without offload (acc8).
        # The delayed update (opt-in, not exact) at 8k tokens a step, after 2 exact steps, first.
        # Then the step during backward (--offload_step speculative, exact) at 8k and 32k tokens a step,
        # with the run's clipping and with none (every speculative step adopted).
        offload_steps = [Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 10, offload=True,
                              levers="--offload_delayed_update 2", offload_of=speed_1b.name),
                         Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 10, offload=True,
                              levers="--offload_step speculative", offload_of=speed_1b.name),
                         Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 10, offload=True,
                              levers="--offload_step speculative --grad_clipping 0", offload_of=speed_1b.name),
                         Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 5, accumulation=4, offload=True,
                              levers="--offload_step speculative", tag="acc4", offload_of=acc8_1b.name),
                         # The device step (master and state across PCIe, the step on the GPU) at 8k and 32k.
                         Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 10, offload=True,
                              levers="--offload_step device", offload_of=speed_1b.name),
                         Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 5, accumulation=4, offload=True,
                              levers="--offload_step device", tag="acc4", offload_of=acc8_1b.name)] + [
                         Case("configs/llama_1b.json", "bfloat16", "pure", 8, 1024, 5, accumulation=acc, offload=True,
                              state_bf16=bf16, tag=f"acc{acc}", offload_of=acc8_1b.name)
                         for acc in (4, 16) for bf16 in (False, True)] + [
                         # Last: llama_7b on one GPU (no run without offload fits it, so no share: its
                         # tokens/s per mode, host against device stepping), bf16 state so the host
                         # holds it (about 81 GB host, 54 GB page-locked for the device step).
                         Case("configs/llama_7b.json", "bfloat16", "pure", 4, 1024, 4, accumulation=2, offload=True,
                              checkpointing=True, state_bf16=True, levers=f"--offload_step {mode}")
                         for mode in ("host", "device")]
    else:
        speed_350m = Case("configs/llama_micro.json", "bfloat16", "mixed", 2, 32, 6, peer=True)
        speed_1b = Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 6, peer=True)
        memory_130m = Case("configs/llama_micro.json", "float32", "mixed", 2, 32, 5)
        offload_1b = Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 5, offload=True,
                          offload_of=speed_1b.name)
        largest = [Case("configs/llama_micro.json", "bfloat16", "pure", 1, 64, 5, offload=True, checkpointing=True),
                   Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 5, offload=True, state_bf16=True,
                        offload_of=speed_1b.name),
                   Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 5, offload=True, params=True,
                        offload_of=speed_1b.name)]
        # The CPU has no fused kernels: padding alone, forced on (llama_micro's 88 to 128).
        levers = [Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 6, levers="--pad_matmul_dims on",
                       lever_of=speed_1b.name),
                  Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 5, accumulation=4, tag="acc4",
                       lever_of=speed_1b.name)]
        offload_steps = [Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 5, offload=True,
                              levers="--offload_delayed_update 2", offload_of=speed_1b.name),
                         Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 5, offload=True,
                              levers="--offload_step speculative", offload_of=speed_1b.name),
                         Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 5, offload=True,
                              levers="--offload_step device", offload_of=speed_1b.name),
                         Case("configs/llama_micro.json", "bfloat16", "pure", 2, 32, 5, accumulation=4, offload=True,
                              tag="acc4", offload_of=levers[-1].name)]
    # Speed first (issue 42): the default runs with their peers, then each lever; memory after.
    return [speed_350m, speed_1b] + levers + [memory_130m, offload_1b] + largest + offload_steps


# ------------------------------------------------------------------------------------------------
# device: the card, its published peak, a measured bf16 GEMM


def fastest_product(torch, m, k, n, device):
    """Seconds of the fastest of 10 bf16 products (m x k) @ (k x n) on `device`, after 3 warm-ups."""
    a = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    b = torch.randn(k, n, dtype=torch.bfloat16, device=device)
    best = float("inf")
    for repeat in range(13):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        if repeat >= 3:
            best = min(best, time.perf_counter() - started)
    return best


def run_device(args):
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("gpu_bench: --device cuda but torch sees no GPU")
        name = torch.cuda.get_device_name(0)
        properties = torch.cuda.get_device_properties(0)
        memory, multiprocessors, n = properties.total_memory, properties.multi_processor_count, 8192
    else:
        import platform

        name, memory, multiprocessors, n = platform.processor() or platform.machine() or "cpu", None, None, 512
    published = next(((tflops, source) for part, tflops, source in PUBLISHED_BF16_DENSE_TFLOPS if part in name),
                     (None, f"no published dense bf16 peak known for {name!r}: MFU not computed"))
    # The ceiling as this card delivers it: the best of 10 bf16 products of n x n x n after 3.
    best = fastest_product(torch, n, n, n, args.device)
    # llama_1b's MLP products at 8 x 1024 tokens, with GaLore's intermediate size 5461 (not a multiple
    # of 64) beside 5504 and 5632: does the odd width keep cuBLAS off its best tiles?
    tokens, hidden = (8192, 2048) if args.device == "cuda" else (256, 64)
    mlp = {}
    for width in ((5461, 5504, 5632) if args.device == "cuda" else (171, 176)):
        mlp[str(width)] = 2 * tokens * hidden * width / fastest_product(torch, tokens, hidden, width, args.device) / 1e12
    print(json.dumps({
        "mlp_gemm_tflops": mlp, "mlp_gemm": f"({tokens} x {hidden}) @ ({hidden} x N) bf16, best of 10",
        "device": args.device, "name": name, "memory_bytes": memory, "multiprocessors": multiprocessors,
        "cpu_cores": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "published_bf16_dense_tflops": published[0], "published_source": published[1],
        "measured_bf16_gemm_tflops": 2 * n**3 / best / 1e12, "measured_gemm": f"{n} x {n} x {n} bf16, best of 10",
    }))


# ------------------------------------------------------------------------------------------------
# plan: the commands, one step each


def training_flags(case, device):
    """The flags our run and its estimate share, with the peers' hyper-parameters (pytorch_peers'
    defaults): constant lr 1e-3, AdamW 0.9 / 0.999 / 1e-8, no weight decay, clipping at 1.0."""
    flags = ["--config", case.config, "--device", device, "--dtype", case.dtype]
    if case.dtype == "bfloat16":
        flags += ["--precision", case.precision]
    if case.offload or case.params:
        flags += ["--offload", ",".join(["optimizer"] * case.offload + ["parameters"] * case.params)]
    if case.checkpointing:
        flags += ["--activation_checkpointing"]
    if case.state_bf16:
        flags += ["--optimizer_state_dtype", "bfloat16"]
    flags += case.levers.split()
    if case.accumulation > 1:
        flags += ["--total_batch_size", str(case.batch * case.accumulation)]
    flags += ["--batch_size", case.batch, "--max_length", case.length, "--num_training_steps", case.steps,
              "--warmup_steps", 0, "--scheduler", "constant", "--lr", "1e-3", "--adam_beta1", 0.9,
              "--adam_beta2", 0.999, "--adam_eps", "1e-8", "--weight_decay", 0, "--grad_clipping", 1.0,
              "--optimizer", "adamw", "--sharding", "full_shard", "--eval_every", 0, "--eval_batches", 1]
    return [str(flag) for flag in flags]


def plan(device, work, python):
    """(name, shell command) per step, cheapest first: the device, every estimate, then the runs."""
    threads = os.cpu_count()
    q = shlex.quote
    steps = [("device", f"{q(python)} {q(os.path.join(HERE, 'gpu_bench.py'))} device --device {device} "
                        f"> {q(os.path.join(work, 'device.json'))}")]
    for case in cases(device):
        flags = " ".join(map(q, training_flags(case, device)))
        estimate = os.path.join(work, case.name + ".estimate.json")
        # The runs' step time predicted beside their memory (issue 54's GPU rows): the units timed on
        # the GPU for 2 s (--profile) where the run is measured too; on a CPU (the dry run) at the
        # declared rate, which costs nothing and takes the same path.
        profile = "" if not case.run else " --profile 2" if device == "cuda" else " --device_tflops 0.07"
        steps.append((f"estimate_{case.name}",
                      f"trainer estimate {flags} --world_size 1{profile} --json > {q(estimate)} && echo wrote {q(estimate)}"))
    for case in cases(device):
        if not case.run:
            continue
        flags = " ".join(map(q, training_flags(case, device)))
        run_dir = os.path.join(work, case.name)
        steps.append((f"ours_{case.name}",
                      f"rm -rf {q(run_dir)} && OMP_NUM_THREADS={threads} trainer {flags} --log_every 5 "
                      f"--run_dir {q(run_dir)} && tail -n 1 {q(os.path.join(run_dir, 'metrics.jsonl'))}"))
        if case.peer:
            precision = case.precision if case.dtype == "bfloat16" else "mixed"
            steps.append((f"pytorch_{case.name}",
                          f"OMP_NUM_THREADS={threads} {q(python)} {q(os.path.join(HERE, 'pytorch_peers.py'))} eager "
                          f"--device {device} --dtype {case.dtype} --precision {precision} --config {q(case.config)} "
                          f"--steps {case.steps} --batch {case.batch} --length {case.length} --threads {threads} "
                          f"--out {q(os.path.join(work, case.name + '.pytorch.jsonl'))} "
                          f"--check_against {q(os.path.join(run_dir, 'metrics.jsonl'))}"))
            # The third side: the same model under torch.compile (inductor on a GPU; on a CPU the
            # "eager" backend, which checks the plumbing without inductor's C++ build).
            steps.append((f"compiled_{case.name}",
                          f"OMP_NUM_THREADS={threads} {q(python)} {q(os.path.join(HERE, 'pytorch_peers.py'))} eager "
                          f"--compile {'inductor' if device == 'cuda' else 'eager'} "
                          f"--device {device} --dtype {case.dtype} --precision {precision} --config {q(case.config)} "
                          f"--steps {case.steps} --batch {case.batch} --length {case.length} --threads {threads} "
                          f"--out {q(os.path.join(work, case.name + '.compiled.jsonl'))}"))
    return steps


def run_plan(args):
    for name, command in plan(args.device, args.work, args.python):
        print(f"{name}\t{command}")


# ------------------------------------------------------------------------------------------------
# summarize: the results JSON and its tables


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_jsonl(path):
    try:
        return read_jsonl(path)
    except (OSError, ValueError):
        return []


def medians(records):
    """Each numeric key's median over the records that have it."""
    keys = sorted({key for record in records for key, value in record.items() if isinstance(value, (int, float))})
    return {key: statistics.median([r[key] for r in records if isinstance(r.get(key), (int, float))]) for key in keys}


def side(records, case, config_path, device_info, peak_kind):
    """One side's speed figures from its metrics.jsonl-shaped records; None when it has no kept step."""
    start = next((r for r in records if r.get("event") == "start"), {})
    end = next((r for r in records if r.get("event") == "end"), {})
    kept = [r for r in records if r.get("event") == "train" and r.get("step", 0) > WARMUP_STEPS]
    if not kept:
        return None
    seconds = statistics.median(r["step_time_s"] for r in kept)
    parameters = start.get("parameters")
    tokens_per_s = case.tokens_per_step() / seconds
    tflops = (model_flops_per_token(config_path, parameters, case.length) * tokens_per_s / 1e12
              if parameters else None)
    # Utilisation is against bf16 peaks: an fp32 run has none to be measured against here.
    bf16 = case.dtype == "bfloat16"
    published = device_info.get("published_bf16_dense_tflops") if bf16 else None
    measured = device_info.get("measured_bf16_gemm_tflops") if bf16 else None
    result = {
        "parameters": parameters, "kept_steps": len(kept), "step_s": seconds,
        "step_s_min": min(r["step_time_s"] for r in kept), "step_s_max": max(r["step_time_s"] for r in kept),
        "tokens_per_s": tokens_per_s, "model_tflops": tflops,
        "mfu": tflops / published if tflops and published else None,
        "of_measured_gemm": tflops / measured if tflops and measured else None,
        "peak_memory_bytes": end.get("peak_memory_bytes"), "peak_memory_measured_by": peak_kind,
        "first_loss": next((r["loss"] for r in records if r.get("event") == "train"), None),
    }
    if "phase_s" in kept[0]:  # ours
        result["phase_s"] = medians([r.get("phase_s") or {} for r in kept])  # read a step late on CUDA
        result["host_phase_s"] = medians([r.get("host_phase_s", {}) for r in kept])
        if any("offload" in r for r in kept):
            result["offload_s"] = medians([r.get("offload", {}) for r in kept])
    else:  # a peer: forward_s, backward_s, clip_s, optimizer_s
        result["phase_s"] = medians([{k[:-2]: v for k, v in r.items()
                                      if k in ("forward_s", "backward_s", "clip_s", "optimizer_s")} for r in kept])
        result["optimizer"] = start.get("optimizer")
        result["mode"] = start.get("mode")
        result["peak_memory_measured_by"] = end.get("peak_memory_measured_by", peak_kind)
    return result


def memory_entry(case, work):
    estimate = load_json(os.path.join(work, case.name + ".estimate.json"))
    ledger = load_jsonl(os.path.join(work, case.name, "memory.rank0.jsonl"))
    metrics = load_jsonl(os.path.join(work, case.name, "metrics.jsonl"))
    summary = next((r.get("summary", {}) for r in ledger if r.get("event") == "end"), None)
    metrics_end = next((r for r in metrics if r.get("event") == "end"), {})
    entry = {"case": case.name, "config": case.config, "mode": case.mode(), "offload": case.offload, "offload_parameters": case.params,
             "batch": case.batch, "length": case.length}
    if estimate:
        rank = estimate["ranks"][0]
        node = estimate["nodes"][0]
        entry.update({"estimate_peak_bytes": rank["peak_bytes"], "estimate_peak_phase": rank["peak_phase"],
                      "estimate_at_peak": rank.get("at_peak"),
                      "estimate_cuda_runtime_bytes": sum(rank.get("cuda_runtime", {}).values()),
                      "estimate_cuda_runtime": rank.get("cuda_runtime", {}),
                      "estimate_host_bytes": node.get("host_bytes"), "estimate_pinned_bytes": node.get("pinned_bytes")})
    if summary:
        entry.update({"measured_peak_bytes": summary.get("peak_bytes"), "measured_peak_phase": summary.get("peak_phase"),
                      "measured_peak_step": summary.get("peak_step"), "measured_at_peak": summary.get("at_peak"),
                      "measured_reserved_peak_bytes": summary.get("reserved_peak_bytes"),
                      "measured_host_peak_bytes": summary.get("host_peak_bytes"),
                      "measured_pinned_peak_bytes": summary.get("pinned_peak_bytes"),
                      "measured_rss_peak_bytes": summary.get("rss_peak_bytes")})
    entry["metrics_peak_memory_bytes"] = metrics_end.get("peak_memory_bytes")
    if entry.get("estimate_peak_bytes") and entry.get("measured_peak_bytes"):
        entry["error"] = entry["estimate_peak_bytes"] / entry["measured_peak_bytes"] - 1
    if entry.get("estimate_host_bytes") and entry.get("measured_host_peak_bytes") is not None:
        measured_host = entry["measured_host_peak_bytes"] + (entry.get("measured_pinned_peak_bytes") or 0)
        entry["measured_host_and_pinned_peak_bytes"] = measured_host
        entry["host_error"] = entry["estimate_host_bytes"] / measured_host - 1 if measured_host else None
    return entry


def summarize(device, work):
    device_info = load_json(os.path.join(work, "device.json")) or {}
    ours_peak = ("metrics.jsonl peak_memory_bytes: the CUDA caching allocator's peak allocated bytes"
                 if device == "cuda" else "metrics.jsonl peak_memory_bytes: the process's peak RSS")
    speed, runs = [], {}
    for case in cases(device):
        if not case.run:
            continue
        config_path = os.path.join(ROOT, case.config)
        ours = side(load_jsonl(os.path.join(work, case.name, "metrics.jsonl")), case, config_path, device_info,
                    ours_peak)
        runs[case.name] = ours
        entry = {"case": case.name, "config": case.config, "mode": case.mode(), "offload": case.offload, "offload_parameters": case.params,
                 "batch": case.batch, "length": case.length, "tokens_per_step": case.tokens_per_step(),
                 "steps": case.steps, "warmup_steps": WARMUP_STEPS, "ours": ours}
        # `trainer estimate --profile`'s step time for the same flags, beside the measured step.
        predicted = ((load_json(os.path.join(work, case.name + ".estimate.json")) or {}).get("step_time") or {})
        entry["predicted_step_s"] = predicted.get("step_seconds")
        entry["predicted_phase_s"] = predicted.get("phase_s")
        entry["predicted_over_measured"] = (predicted["step_seconds"] / ours["step_s"]
                                            if ours and predicted.get("step_seconds") else None)
        if case.peer:
            theirs = side(load_jsonl(os.path.join(work, case.name + ".pytorch.jsonl")), case, config_path,
                          device_info, "torch.cuda.max_memory_allocated")
            entry["pytorch"] = theirs
            entry["ours_over_pytorch_tokens_per_s"] = (ours["tokens_per_s"] / theirs["tokens_per_s"]
                                                       if ours and theirs else None)
            compiled = side(load_jsonl(os.path.join(work, case.name + ".compiled.jsonl")), case, config_path,
                            device_info, "torch.cuda.max_memory_allocated")
            entry["pytorch_compiled"] = compiled
            entry["ours_over_compiled_tokens_per_s"] = (ours["tokens_per_s"] / compiled["tokens_per_s"]
                                                        if ours and compiled else None)
        speed.append(entry)
    offload = []
    for case in cases(device):
        if case.offload_of:
            with_offload, without = runs.get(case.name), runs.get(case.offload_of)
            host_step_s = ((with_offload.get("offload_s") or {}).get("host_step_s") if with_offload else None)
            parameters = with_offload.get("parameters") if with_offload else None
            # The bytes an element the host step reads and writes (AdamW): the gradient (bf16 at one
            # rank in pure bf16), the master and both moments read and written, the rounded bf16 row.
            moment_bytes = 2 if case.state_bf16 else 4
            step_bytes = (2 + 8 + 4 * moment_bytes + 2) * parameters if parameters else None
            offload.append({"case": case.name, "baseline": case.offload_of,
                            "tokens_per_step": case.tokens_per_step(), "host_step_s": host_step_s,
                            "host_step_gb_per_s": step_bytes / host_step_s / 1e9 if step_bytes and host_step_s else None,
                            "tokens_per_s": with_offload["tokens_per_s"] if with_offload else None,
                            "baseline_tokens_per_s": without["tokens_per_s"] if without else None,
                            "share_kept": (with_offload["tokens_per_s"] / without["tokens_per_s"]
                                           if with_offload and without else None),
                            "offload_s": with_offload.get("offload_s") if with_offload else None})
    levers = []
    for case in cases(device):
        if case.lever_of:
            toggled, base = runs.get(case.name), runs.get(case.lever_of)
            levers.append({"case": case.name, "baseline": case.lever_of,
                           "levers": case.levers or f"{case.batch} x {case.length}, accumulation {case.accumulation}",
                           "tokens_per_s": toggled["tokens_per_s"] if toggled else None,
                           "baseline_tokens_per_s": base["tokens_per_s"] if base else None,
                           "mfu": toggled.get("mfu") if toggled else None, "baseline_mfu": base.get("mfu") if base else None,
                           "ratio": toggled["tokens_per_s"] / base["tokens_per_s"] if toggled and base else None})
    return {"device": device_info, "warmup_steps": WARMUP_STEPS,
            "flops_formula": "6 x matmul parameters + 12 x layers x hidden x length, per token (torchtitan's)",
            "speed": speed, "memory": [memory_entry(case, work) for case in cases(device)], "offload": offload,
            "levers": levers}


def run_summarize(args):
    results = summarize(args.device, args.work)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(markdown(results))
    # A figure is missing when the step that makes it ran (BENCH_ONLY, passed as --only, may run a part
    # of the plan) and left nothing.
    planned = lambda step: not args.only or re.search(args.only, step) is not None
    missing = [e["case"] for e in results["speed"] if not e["ours"] and planned(f"ours_{e['case']}")]
    missing += [f"pytorch {e['case']}" for e in results["speed"]
                if "pytorch" in e and not e["pytorch"] and planned(f"pytorch_{e['case']}")]
    missing += [f"pytorch compiled {e['case']}" for e in results["speed"]
                if "pytorch_compiled" in e and not e["pytorch_compiled"] and planned(f"compiled_{e['case']}")]
    estimated_only = {case.name for case in cases(args.device) if not case.run}
    missing += [f"memory {e['case']}" for e in results["memory"]
                if "error" not in e and e["case"] not in estimated_only
                and planned(f"estimate_{e['case']}") and planned(f"ours_{e['case']}")]
    if missing:
        print(f"gpu_bench: no figures for {', '.join(missing)} (their steps failed or did not run); the rest in {args.out}")
        sys.exit(1)
    print(f"gpu_bench: every figure of the plan, in {args.out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("device")
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p = sub.add_parser("plan")
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--work", required=True, help="folder for the runs' files")
    p.add_argument("--python", default=sys.executable, help="python with torch and transformers, for the peers")
    p = sub.add_parser("summarize")
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True, help="the results JSON")
    p.add_argument("--only", default="", help="the part of the plan that ran (BENCH_ONLY, a regular expression "
                   "over the steps' names): the figures of the steps it leaves out are not reported missing")
    args = parser.parse_args()
    {"device": run_device, "plan": run_plan, "summarize": run_summarize}[args.mode](args)


if __name__ == "__main__":
    main()
