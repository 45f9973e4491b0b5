"""The PyTorch side of bench/train_vs_pytorch.sh and bench/gpu_bench.py, and the summary that sets it
beside ours.

The peers are what a PyTorch user would write for the same training step as build/trainer: transformers'
LlamaForCausalLM built from the same HF config JSON (sdpa attention, fp32 unless eager's --dtype says
otherwise), loss through the model's own `labels=` path, global-norm clipping to --grad_clipping,
torch.optim.AdamW with the trainer's hyper-parameters, and the loss read back every step (our trainer
reads it too). The timed step is forward + backward + clip + optimizer.step +
zero_grad(set_to_none=True) + loss.item(); data is random ids drawn before the loop (speed only: the
content of the tokens does not change the work).

    eager      one process, torch.set_num_threads(--threads), AdamW(fused=True); --device cpu (default)
               or cuda, and --dtype float32 (default) or bfloat16 with --precision to match the
               trainer's modes: mixed = fp32 weights, gradients and AdamW state, the forward (the loss
               included) under torch.autocast(bfloat16) as our --precision mixed runs it; pure = the
               model cast to bf16 (weights, gradients and fused AdamW's state in bf16), GaLore's
               reference. Our --precision pure computes with bf16 weights too but keeps fp32 master
               shards, gradient shards and AdamW state beside them (docs/memory.md): the same
               forward and backward, not the same optimizer bytes. On CUDA the phases are timed
               with CUDA events on the stream (no host wait inside the step) and the step between two
               torch.cuda.synchronize calls; the "end" record has torch.cuda.max_memory_allocated
               (the run's peak, model building included) as peak_memory_bytes
    fsdp2      one rank of `python -m torch.distributed.run --nproc_per_node R`: gloo on CPU,
               fully_shard on each decoder layer and then on the root model (torchtitan's
               parallelize_llama order), fused AdamW where DTensor parameters allow it, else
               foreach (the fallback is printed and recorded), clipping as torchtitan does it
               (the total norm's full_tensor(), then clip_grads_with_norm_)
    peak       the bound: best fp32 matmul GFLOP/s of this machine at --threads (one number)
    summarize  reads both sides' JSONL (ours: RUN_DIR/metrics.jsonl; the peers write the same
               "start" / "train" records) round by round and prints the comparison

Each peer writes JSONL to --out like the trainer's metrics.jsonl: one "start" record (parameters,
optimizer, world size, threads; eager: device, dtype, precision) and one "train" record per step
(step, loss, grad_norm, step_time_s and the per-phase forward_s, backward_s, clip_s, optimizer_s);
eager ends with an "end" record (peak_memory_bytes and what measured it: the CUDA allocator's peak,
or the process's peak RSS on CPU). Under fsdp2 only rank 0 writes, and
its times are rank 0's, as the trainer's are; ranks meet at every step's clip and loss all-reduce.

Run from the repository root with the project venv's python; bench/train_vs_pytorch.sh drives it.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time

# bench/ is on the path (the script's own folder); gpu_bench.py and save_cost.py take these from here.
from pytorch_peers_summary import model_flops_per_token, read_jsonl, run_summarize  # noqa: F401



# ------------------------------------------------------------------------------------------------
# The model and the step, shared by both peers


def hf_config(path):
    """A LlamaConfig from one of configs/*.json (GaLore's keys, as our trainer reads them)."""
    from transformers import LlamaConfig

    with open(path) as f:
        raw = json.load(f)
    keys = dict(raw)
    # GaLore's files name the context max_sequence_length; transformers reads max_position_embeddings.
    if "max_sequence_length" in keys:
        keys.setdefault("max_position_embeddings", keys.pop("max_sequence_length"))
    # pad_token_id -1 means vocab-1 (GaLore's nn.Embedding resolved it so; our ModelConfig does too).
    if keys.get("pad_token_id", None) == -1:
        keys["pad_token_id"] = keys["vocab_size"] - 1
    for stale in ("architectures", "transformers_version", "model_type"):
        keys.pop(stale, None)
    keys["use_cache"] = False  # training: no KV cache objects built in forward
    return LlamaConfig(**keys, attn_implementation="sdpa")


def build_model(config_path, seed, device="cpu", dtype="float32", precision="mixed"):
    """The model on `device`, built there (a 1B model's init on the host would cost more than its run).
    Its weights are fp32, except bf16 with --precision pure (mixed keeps fp32 weights; the forward's
    autocast makes the bf16 copies)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)  # every FSDP rank builds the same weights before sharding
    with torch.device(device):
        model = LlamaForCausalLM(hf_config(config_path))
    pure_bf16 = dtype == "bfloat16" and precision == "pure"
    model = model.to(torch.bfloat16) if pure_bf16 else model.float()
    model.train()
    return model


def random_batches(vocab, steps, batch, length, seed):
    """(steps, batch, length) int64 ids in [0, vocab), drawn once before timing."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (steps, batch, length), generator=generator)


def make_adamw(params, args, implementation):
    import torch

    flags = {"fused": True} if implementation == "fused" else {"foreach": True}
    return torch.optim.AdamW(params, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                             weight_decay=args.weight_decay, **flags)


def count_parameters(model):
    """Full (unsharded) parameter count; DTensor.numel() is the global size."""
    return sum(p.numel() for p in model.parameters())


class JsonlWriter:
    """Rank 0's records in the trainer's metrics.jsonl shape; other ranks write nothing."""

    def __init__(self, path, enabled):
        self.file = open(path, "w") if enabled else None

    def write(self, record):
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()


def timed_step(model, ids, clip, step_optimizer, read_loss, forward_context=contextlib.nullcontext, cuda=False):
    """One training step, timed as every peer times it: forward (the loss through the model's labels=
    path, inside forward_context: autocast for bf16 mixed), backward, clip, and the optimizer with
    zero_grad and the loss read. Returns the loss, the gradient norm and the train record's time
    fields. On CPU the phase boundaries are host clock reads. On CUDA they are events recorded on the
    stream, so nothing waits inside the step (a host clock there would time kernel launches); the
    step's total is host time between a torch.cuda.synchronize before it and one after it."""
    import torch

    marks = []

    def mark():
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks.append(event)
        else:
            marks.append(time.perf_counter())

    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    mark()
    with forward_context():
        loss = model(input_ids=ids, labels=ids).loss
    mark()
    loss.backward()
    mark()
    grad_norm = clip()
    mark()
    step_optimizer()
    loss_value = read_loss(loss)
    mark()
    if cuda:
        torch.cuda.synchronize()
        spans = [begin.elapsed_time(end) / 1e3 for begin, end in zip(marks, marks[1:])]  # ms -> s
    else:
        spans = [end - begin for begin, end in zip(marks, marks[1:])]
    finished = time.perf_counter()
    return loss_value, grad_norm, {"step_time_s": finished - started, "forward_s": spans[0],
                                   "backward_s": spans[1], "clip_s": spans[2], "optimizer_s": spans[3]}


def check_parameters(parameters, ours_metrics):
    """The HF model must be the model our trainer ran: same count as its metrics.jsonl "start" record."""
    if not ours_metrics:
        return "unchecked"
    if not os.path.exists(ours_metrics):  # our run failed before its first record: this side still counts
        return f"unchecked ({ours_metrics} does not exist)"
    start = next((r for r in read_jsonl(ours_metrics) if r.get("event") == "start"), {})
    expected = start.get("parameters")
    if parameters != expected:
        sys.exit(f"pytorch_peers: the HF model has {parameters} parameters but {ours_metrics} says "
                 f"{expected}: the two sides would not train the same model")
    return f"= ours ({ours_metrics})"


# ------------------------------------------------------------------------------------------------
# eager: one process


def run_eager(args):
    import torch

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("pytorch_peers: --device cuda but torch sees no GPU (torch.cuda.is_available() is False)")
    if cuda:
        device = torch.device("cuda", device.index if device.index is not None else 0)  # set_device needs one
        torch.cuda.set_device(device)
    model = build_model(args.config, args.seed, device, args.dtype, args.precision)
    config = model.config
    parameters = count_parameters(model)
    checked = check_parameters(parameters, args.check_against)
    optimizer = make_adamw(model.parameters(), args, "fused")
    if args.compile:
        # What torchtitan users run: the model under torch.compile (inductor on a GPU; "eager" checks
        # the plumbing on a CPU quickly); its compile time falls in the warm-up steps.
        model = torch.compile(model, backend=args.compile)
    batches = random_batches(config.vocab_size, args.steps, args.batch, args.length, args.seed + 1).to(device)
    autocast = args.dtype == "bfloat16" and args.precision == "mixed"
    forward_context = ((lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)) if autocast
                       else contextlib.nullcontext)
    mode = "float32" if args.dtype == "float32" else f"bfloat16 {args.precision}"
    mode_detail = {"float32": "fp32", "bfloat16 mixed": "fp32 weights, forward under autocast(bfloat16)",
                   "bfloat16 pure": "bf16 weights, gradients and AdamW state"}[mode]
    out = JsonlWriter(args.out, True)
    out.write({"event": "start", "peer": "compiled" if args.compile else "eager", "compile": args.compile,
               "parameters": parameters, "world_size": 1,
               "threads": torch.get_num_threads(), "optimizer": "AdamW(fused=True)",
               "attn_implementation": config._attn_implementation,
               "torch": torch.__version__, "batch": args.batch, "length": args.length,
               "device": str(device), "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
               "dtype": args.dtype, "precision": args.precision if args.dtype == "bfloat16" else "",
               "autocast": autocast, "mode": mode_detail})
    print(f"[pytorch {'compiled (' + args.compile + ')' if args.compile else 'eager'}] {parameters} parameters {checked}, {torch.get_num_threads()} threads, on {device} in "
          f"{mode} ({mode_detail}), AdamW(fused=True), {args.steps} steps of {args.batch} x {args.length}",
          flush=True)

    def step_optimizer():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    saver = DcpSaver(args, model, optimizer, out) if args.save_dir else None
    for step in range(1, args.steps + 1):
        loss, grad_norm, times = timed_step(
            model, batches[step - 1], lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clipping),
            step_optimizer, lambda loss: loss.item(), forward_context, cuda)
        out.write({"event": "train", "step": step, "loss": loss, "grad_norm": grad_norm.item(), **times})
        if saver:
            saver.after_step(step, step == args.steps)
    if cuda:
        peak, measured_by = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    else:
        import resource

        peak, measured_by = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS (getrusage)"
    out.write({"event": "end", "steps": args.steps, "peak_memory_bytes": peak, "peak_memory_measured_by": measured_by})
    print(f"[pytorch eager] peak memory {peak / 2**30:.2f} GiB ({measured_by})", flush=True)


class DcpSaver:
    """Checkpoints as torchtitan writes them: torch.distributed.checkpoint's save of the model's and the
    optimizer's state dicts into SAVE_DIR/step_<N> every --save_every steps and after the last one,
    or with --async_save dcp.async_save (the state staged in host memory and written on a thread;
    the previous one is waited for before the next save), the last save synchronous as the
    trainer's is. Each save's "checkpoint" record has blocked_s: the seconds the loop waited on it,
    its start and any wait for it counted together, as the trainer counts them."""

    def __init__(self, args, model, optimizer, out):
        self.args, self.model, self.optimizer, self.out = args, model, optimizer, out
        self.pending = None  # (step, future, seconds spent starting it)
        import warnings

        # One process without torch.distributed: what DCP then does, said at every save.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")

    def after_step(self, step, last):
        import torch.distributed.checkpoint as dcp

        if self.pending and (last or (self.args.save_every and step % self.args.save_every == 0)):
            started = time.perf_counter()
            saved_step, future, start_seconds = self.pending
            future.result()
            self.pending = None
            self.out.write({"event": "checkpoint", "step": saved_step, "completed_at_step": step, "background": True,
                            "blocked_s": start_seconds + time.perf_counter() - started})
        if not (last or (self.args.save_every and step % self.args.save_every == 0)):
            return
        started = time.perf_counter()
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        path = f"{self.args.save_dir}/step_{step}"
        if self.args.async_save and not last:
            self.pending = (step, dcp.async_save(state, checkpoint_id=path), time.perf_counter() - started)
            return
        dcp.save(state, checkpoint_id=path)
        self.out.write({"event": "checkpoint", "step": step, "completed_at_step": step, "background": False,
                        "blocked_s": time.perf_counter() - started})


# ------------------------------------------------------------------------------------------------
# fsdp2: one rank of R, under torch.distributed.run


def run_fsdp2(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(args.config, args.seed)
    parameters = count_parameters(model)
    checked = check_parameters(parameters, args.check_against)
    # torchtitan's order: each transformer block is a unit, then the root takes what is left
    # (embedding, final norm, lm_head). Defaults otherwise: reshard after forward (ZeRO-3, as our
    # full_shard), the root kept gathered for backward, fp32 throughout.
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert count_parameters(model) == parameters

    implementation = "fused"
    fallback_reason = ""
    optimizer = make_adamw(model.parameters(), args, implementation)
    # Each rank's share of the global batch: rank r reads rows [r*batch, (r+1)*batch) of a global one.
    batches = random_batches(model.config.vocab_size, args.steps, args.batch * world, args.length,
                             args.seed + 1)[:, rank * args.batch:(rank + 1) * args.batch]
    out = JsonlWriter(args.out, rank == 0)

    def log(message):
        if rank == 0:
            print(f"[pytorch fsdp2] {message}", flush=True)

    log(f"{parameters} parameters {checked}, {world} ranks x {torch.get_num_threads()} thread(s), gloo, "
        f"fully_shard per decoder layer + root, {args.steps} steps of {args.batch} x {args.length} per rank")
    def clip():
        # As torchtitan's clip_grad_norm_: the norm of the sharded gradients is a Partial DTensor;
        # full_tensor() all-reduces it, then every shard is scaled by the same coefficient.
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), args.grad_clipping, grad_norm)
        return grad_norm

    def step_optimizer():
        nonlocal optimizer, implementation, fallback_reason
        try:
            optimizer.step()
        except Exception as error:  # noqa: BLE001 - any refusal of the fused kernel on DTensors
            if step != 1 or implementation != "fused":
                raise
            # Step 1 is a warm-up step (discarded), so switching here costs no measured step.
            fallback_reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            log(f"AdamW(fused=True) failed on DTensor parameters ({fallback_reason}); using foreach=True")
            implementation = "foreach"
            optimizer = make_adamw(model.parameters(), args, implementation)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def read_loss(loss):
        # Our trainer averages the loss over ranks each step; the same one-scalar all-reduce here.
        loss_sum = loss.detach().clone()
        dist.all_reduce(loss_sum)
        return loss_sum.item() / world

    for step in range(1, args.steps + 1):
        loss, grad_norm, times = timed_step(model, batches[step - 1], clip, step_optimizer, read_loss)
        if step == 1:
            out.write({"event": "start", "peer": "fsdp2", "parameters": parameters, "world_size": world,
                       "threads": torch.get_num_threads(), "backend": dist.get_backend(),
                       "optimizer": f"AdamW({implementation}=True)", "optimizer_fallback": fallback_reason,
                       "attn_implementation": model.config._attn_implementation,
                       "torch": torch.__version__, "batch": args.batch, "length": args.length})
        out.write({"event": "train", "step": step, "loss": loss, "grad_norm": grad_norm.item(), **times})
    log(f"optimizer AdamW({implementation}=True)")
    # Leave without the interpreter's finalization. A gloo worker thread (ProcessGroupGloo::runLoop)
    # still holds the last all-reduce's AsyncWork, whose tensors hold Python objects: when it frees them
    # during Py_FinalizeEx it takes the GIL, CPython ends the thread (pthread_exit), and the forced
    # unwind through a noexcept destructor is std::terminate, "terminate called without an active
    # exception", SIGABRT: 4 to 5 runs in 15 of this peer on the 2-core machine (a core file's stack,
    # docs/performance.md; pytorch/pytorch PR 179291 describes the same). destroy_process_group()
    # does not end it: FSDP2's mesh keeps the group alive. Every record is written and flushed by now,
    # and the barrier has every rank past its last collective.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------------------------------------
# peak: the physical bound


def run_peak(args):
    """Best fp32 GEMM rate at --threads: a training step is matmul-bound, so this is its ceiling."""
    import torch

    torch.set_num_threads(args.threads)
    n = 1536
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    best = math.inf
    deadline = time.perf_counter() + 3.0
    for _ in range(200):
        started = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - started)
        if time.perf_counter() > deadline:
            break
    print(f"{2 * n**3 / best / 1e9:.1f}")  # GFLOP/s, for the shell


# ------------------------------------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("eager", "fsdp2"):
        p = sub.add_parser(mode)
        p.add_argument("--config", required=True)
        p.add_argument("--steps", type=int, required=True)
        p.add_argument("--batch", type=int, required=True, help="sequences per rank")
        p.add_argument("--length", type=int, required=True)
        p.add_argument("--threads", type=int, required=True)
        p.add_argument("--out", required=True, help="JSONL in the trainer's metrics.jsonl shape")
        p.add_argument("--check_against", default="", help="our run's metrics.jsonl: the parameter counts must agree")
        p.add_argument("--lr", type=float, default=1e-3)
        p.add_argument("--beta1", type=float, default=0.9)
        p.add_argument("--beta2", type=float, default=0.999)
        p.add_argument("--eps", type=float, default=1e-8)
        p.add_argument("--weight_decay", type=float, default=0.0)
        p.add_argument("--grad_clipping", type=float, default=1.0)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--save_dir", default="", help="eager: checkpoint with torch.distributed.checkpoint (DcpSaver)")
        p.add_argument("--save_every", type=int, default=0)
        p.add_argument("--async_save", action="store_true")
        if mode == "eager":
            p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
            p.add_argument("--compile", choices=("", "inductor", "eager"), default="",
                           help="torch.compile the model with this backend (the compiled peer)")
            p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
            p.add_argument("--precision", choices=("mixed", "pure"), default="mixed",
                           help="with bfloat16: mixed (fp32 weights, autocast forward) or pure (bf16 weights)")
    p = sub.add_parser("peak")
    p.add_argument("--threads", type=int, required=True)
    p = sub.add_parser("summarize")
    p.add_argument("--comparison", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ours", nargs="+", required=True, help="metrics.jsonl per round, in order")
    p.add_argument("--theirs", nargs="*", default=[], help="peer JSONL per round, in order (none: it died in every round)")
    for flag in ("--retried", "--died", "--retried_tuned", "--died_tuned"):
        p.add_argument(flag, default="", help="rounds (space-separated) where the peer died once, or twice")
    p.add_argument("--theirs_tuned", nargs="*", default=[],
                   help="peer JSONL per round run with our allocator policy through the environment")
    p.add_argument("--tuned_env", default="", help="the environment the tuned peer ran with")
    p.add_argument("--ours_label", default="ours")
    p.add_argument("--pytorch_label", default="pytorch")
    p.add_argument("--peak_gflops", type=float, default=0.0)
    p.add_argument("--peak_threads", type=int, default=0)
    p.add_argument("--machine", default="", help="JSON object describing the machine")
    p.add_argument("--json", action="store_true")
    return parser.parse_args()


def main():
    args = parse_args()
    {"eager": run_eager, "fsdp2": run_fsdp2, "peak": run_peak, "summarize": run_summarize}[args.mode](args)


if __name__ == "__main__":
    main()
