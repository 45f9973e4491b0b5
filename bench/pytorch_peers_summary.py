"""`bench/pytorch_peers.py summarize`: reads ours's and the peers' JSONL (the trainer's metrics.jsonl,
the peers' same "start" / "train" records) round by round and prints the comparison
(pytorch_peers.py's docstring says what each side runs). Apart from pytorch_peers.py for its length;
it imports nothing of torch.
"""

import json
import math
import statistics
import sys

WARMUP_STEPS = 2  # discarded per run: allocator growth, lazy init, first-touch of the optimizer state

# ------------------------------------------------------------------------------------------------
# summarize: both sides, round by round


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_records(path):
    records = read_jsonl(path)
    start = next((r for r in records if r.get("event") == "start"), {})
    steps = [r for r in records if r.get("event") == "train"]
    return start, steps


NOT_PHASES = {"step_time_s", "tokens_per_s"}  # the total, and a rate that happens to end in _s


def phase_fields(step):
    """Per-phase seconds of one train record: numeric *_s fields but the total, and the members of a
    phase object ("phase_s": {"forward": ...} as the trainer writes it, or "phases"), named <phase>_s."""
    phases = {k: v for k, v in step.items()
              if k.endswith("_s") and k not in NOT_PHASES and isinstance(v, (int, float))}
    for key in ("phase_s", "phases"):
        nested = step.get(key)
        if isinstance(nested, dict):
            for name, value in nested.items():
                if isinstance(value, (int, float)):
                    phases[name if name.endswith("_s") else name + "_s"] = value
    return phases


def side_summary(paths, label):
    """Median over all kept steps of all rounds, the per-round medians, phase medians, first loss."""
    kept, round_medians, phases, first_losses, start = [], [], {}, [], {}
    for path in paths:
        start, steps = train_records(path)
        if not steps:
            sys.exit(f"pytorch_peers: {label}: no train records in {path}")
        first_losses.append(steps[0].get("loss", math.nan))
        times = [s["step_time_s"] for s in steps if s["step"] > WARMUP_STEPS]
        if not times:
            sys.exit(f"pytorch_peers: {label}: {path} has no step past the {WARMUP_STEPS} warm-up steps")
        kept += times
        round_medians.append(statistics.median(times))
        for s in steps:
            if s["step"] > WARMUP_STEPS:
                for key, value in phase_fields(s).items():
                    phases.setdefault(key, []).append(value)
    phase_medians = {k: statistics.median(v) for k, v in phases.items() if any(x != 0 for x in v)}
    # The trainer's own MFU (trainer/model_flops.h) of the kept steps; the peers record none.
    mfus = [s["mfu"] for path in paths for s in train_records(path)[1] if s["step"] > WARMUP_STEPS and "mfu" in s]
    return {"median": statistics.median(kept), "times": kept, "round_medians": round_medians, "kept_steps": len(kept),
            "phases": phase_medians, "first_loss": statistics.median(first_losses), "start": start,
            "mfu_median": statistics.median(mfus) if mfus else None}


def model_flops_per_token(config_path, parameters, length):
    """PaLM's count: 6 x matmul parameters + 12 x layers x hidden x length (attention scores)."""
    with open(config_path) as f:
        raw = json.load(f)
    hidden, layers, vocab = raw["hidden_size"], raw["num_hidden_layers"], raw["vocab_size"]
    norms = (2 * layers + 1) * hidden
    matmul_parameters = parameters - vocab * hidden - norms  # the embedding lookup is no matmul
    return 6 * matmul_parameters + 12 * layers * hidden * length


def peer_deaths(args):
    """The rounds where a peer died once and ran again, or twice (bench/train_vs_pytorch.sh's run_theirs),
    as lines for the table and fields for the JSON record."""
    fields, lines = {}, []
    for side, label, retried, died in (("pytorch", args.pytorch_label, args.retried, args.died),
                                       ("pytorch_tuned", args.pytorch_label + " with our allocator policy",
                                        args.retried_tuned, args.died_tuned)):
        retried, died = [int(r) for r in retried.split()], [int(r) for r in died.split()]
        fields.update({f"{side}_retried_rounds": retried, f"{side}_died_rounds": died})
        if retried:
            lines.append(f"   {label} died once and ran again in round(s) {', '.join(map(str, retried))}")
        if died:
            lines.append(f"   {label} DIED TWICE in round(s) {', '.join(map(str, died))}: its figure is over the "
                         f"other rounds (logs: the round's .jsonl.died1.log and .died2.log)")
    return fields, lines


def run_summarize(args):
    ours = side_summary(args.ours, "ours")
    deaths, death_lines = peer_deaths(args)
    if not args.theirs:  # the plain peer died twice in every round: ours alone, and why
        if args.json:
            print(json.dumps({"comparison": args.comparison, "ours_s": ours["median"], **deaths}))
            return
        print(f"\n== {args.comparison}: {args.config}, {args.ranks} rank(s) x {args.threads} thread(s)")
        print(f"   {args.ours_label:<34} {ours['median']:8.3f} s/step; no comparison:")
        print("\n".join(death_lines))
        return
    theirs = side_summary(args.theirs, "pytorch")
    # The same PyTorch run with our trainer's host-allocator policy put in by environment variables
    # (common/host_memory.h: keep freed memory, no per-block mappings): what of the difference is the
    # allocator rather than the computation.
    tuned = side_summary(args.theirs_tuned, "pytorch tuned") if args.theirs_tuned else None
    ranks, batch, length = args.ranks, args.batch, args.length
    tokens = ranks * batch * length
    parameters = ours["start"].get("parameters") or theirs["start"].get("parameters")
    flops = model_flops_per_token(args.config, parameters, length) * tokens
    ratio = theirs["median"] / ours["median"]
    ln_vocab = math.log(json.load(open(args.config))["vocab_size"])
    # A sanity check rather than an equality: the two sides start from different random weights and
    # data, but a model of this shape at its init must start near ln(vocab) on both.
    agree = all(abs(side["first_loss"] - ln_vocab) < 0.5 for side in (ours, theirs))
    optimizer = theirs["start"].get("optimizer", "?")
    record = {
        "comparison": args.comparison, "config": args.config, "ranks": ranks, "batch": batch,
        "length": length, "threads": args.threads, "steps": args.steps, "rounds": len(args.ours),
        "parameters": parameters, "ours_s": ours["median"], "pytorch_s": theirs["median"], "ratio": ratio,
        "ours_round_medians": ours["round_medians"], "pytorch_round_medians": theirs["round_medians"],
        "ours_tokens_per_s": tokens / ours["median"], "pytorch_tokens_per_s": tokens / theirs["median"],
        "ours_phases_s": ours["phases"], "pytorch_phases_s": theirs["phases"],
        "pytorch_optimizer": optimizer,
        "pytorch_optimizer_fallback": theirs["start"].get("optimizer_fallback", ""),
        "model_gflop_per_step": flops / 1e9,
        "ours_gflops": flops / ours["median"] / 1e9, "pytorch_gflops": flops / theirs["median"] / 1e9,
        "peak_gflops": args.peak_gflops, "first_loss_ours": ours["first_loss"],
        "first_loss_pytorch": theirs["first_loss"], "ln_vocab": ln_vocab, "first_losses_sane": agree,
        "machine": json.loads(args.machine) if args.machine else {},
        **deaths,
    }
    # The same figure as the trainer's step line: this script's FLOPs per token on the trainer's own
    # peak (its start record) over each kept step's time, beside the trainer's own per-step MFU (medians).
    trainer_peak = ours["start"].get("peak_flops") or 0
    record.update({"trainer_flops_per_token": ours["start"].get("model_flops_per_token"),
                   "bench_flops_per_token": model_flops_per_token(args.config, parameters, length),
                   "trainer_peak_flops": trainer_peak, "trainer_peak_source": ours["start"].get("peak_flops_source"),
                   "ours_mfu_trainer": ours["mfu_median"],
                   # step by step, as the trainer does, then the median (of an even count, the middle two's mean)
                   "ours_mfu_bench": statistics.median(flops / t / (trainer_peak * ranks) for t in ours["times"])
                   if trainer_peak else None})
    if tuned:
        record.update({"pytorch_tuned_s": tuned["median"], "ratio_vs_tuned": tuned["median"] / ours["median"],
                       "pytorch_tuned_round_medians": tuned["round_medians"],
                       "pytorch_tuned_phases_s": tuned["phases"], "pytorch_tuned_env": args.tuned_env})
    if args.json:
        print(json.dumps(record))
        return

    def seconds_range(medians):
        return f"{min(medians):.3f}-{max(medians):.3f}"

    def fraction(gflops):
        return f"{gflops / args.peak_gflops:6.1%}" if args.peak_gflops else "   n/a"

    print(f"\n== {args.comparison}: {args.config}, {ranks} rank(s) x {args.threads} thread(s), "
          f"{batch} x {length} per rank ({tokens} tokens/step), {parameters / 1e6:.2f}M parameters")
    print(f"   {args.steps} steps per run ({WARMUP_STEPS} warm-up discarded), {len(args.ours)} round(s), "
          f"median over all kept steps; rounds = min-max of per-round medians")
    print(f"   {'side':<34} {'s/step':>8} {'rounds':>13} {'tokens/s':>9} {'GFLOP/s':>8} {'of peak':>7}")
    sides = [(args.ours_label, ours), (args.pytorch_label + " " + optimizer, theirs)]
    if tuned:
        sides.append(("  same, with our allocator policy", tuned))
    for name, side in sides:
        gflops = flops / side["median"] / 1e9
        print(f"   {name:<34} {side['median']:8.3f} {seconds_range(side['round_medians']):>13} "
              f"{tokens / side['median']:9.0f} {gflops:8.1f} {fraction(gflops):>7}")
    print(f"   ratio pytorch / ours: {ratio:.3f} ({'we are faster' if ratio > 1 else 'pytorch is faster'})")
    if tuned:
        print(f"   ratio pytorch with our allocator policy / ours: {record['ratio_vs_tuned']:.3f} "
              f"(env {args.tuned_env})")
    peak = (f"measured fp32 GEMM peak {args.peak_gflops:.1f} GFLOP/s at {args.peak_threads} thread(s)"
            if args.peak_gflops else "no GEMM peak given (--peak_gflops)")
    print(f"   bound: {flops / 1e9:.1f} GFLOP per step (6N + 12LHT); {peak}")
    if record["ours_mfu_bench"] is not None and record["ours_mfu_trainer"] is not None:
        print(f"   MFU against the trainer's peak ({record['trainer_peak_source']}): the trainer's median "
              f"{record['ours_mfu_trainer']:.2%}, this script's formula {record['ours_mfu_bench']:.2%}; FLOPs per "
              f"token {record['trainer_flops_per_token']:.0f} (trainer) and {record['bench_flops_per_token']:.0f} (here)")
    # Phases as each side records them (a side that does not split its step shows "-").
    names = sorted(set(ours["phases"]) | set(theirs["phases"]))
    if names:
        def cell(side, name):
            return f"{side['phases'][name]:8.3f}" if name in side["phases"] else f"{'-':>8}"

        header = f"   {'phase medians (s/step)':<34} {'ours':>8} {'pytorch':>8}" + (f" {'tuned':>8}" if tuned else "")
        print(header)
        for name in names:
            print(f"   {name:<34} {cell(ours, name)} {cell(theirs, name)}" + (f" {cell(tuned, name)}" if tuned else ""))
        if ranks > 1:
            print("   (FSDP2's all-gathers and reduce-scatters run in its forward and backward hooks, so "
                  "pytorch's forward_s / backward_s include them)")
    if record["pytorch_optimizer_fallback"]:
        print(f"   note: fused AdamW refused DTensors ({record['pytorch_optimizer_fallback']}); "
              "pytorch ran foreach=True")
    for line in death_lines:
        print(line)
    print(f"   first-step loss: ours {ours['first_loss']:.3f}, pytorch {theirs['first_loss']:.3f}, "
          f"ln(vocab) {ln_vocab:.3f}: {'both at init, as expected' if agree else 'NOT NEAR ln(vocab): check'}")


