"""bench/gpu_bench.py's tables: its results JSON as Markdown (gpu_bench.py summarize prints them;
launch/gpu/report.py renders a GPU session's with them). Apart from gpu_bench.py for its length.
"""


def markdown(results):
    """The results as Markdown tables; a figure the JSON lacks is "n/a"."""

    def number(value, form):
        return "n/a" if value is None else format(value, form)

    def rate(value):  # TFLOP/s: one decimal on a GPU, three significant digits for the CPU's small ones
        return number(value, ".1f" if value is None or value >= 10 else ".3g")

    def size(value):
        if value is None:
            return "n/a"
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= scale:
                return f"{value / scale:.2f} {unit}"
        return f"{value} B"

    def percent(value, signed=False):
        return number(None if value is None else 100 * value, "+.1f" if signed else ".1f")

    def mode(entry):
        return entry["mode"] + (" offload" if entry.get("offload") else "") + (
            " parameters offloaded" if entry.get("offload_parameters") else "")

    lines = []
    device = results.get("device") or {}
    lines.append(f"Device: {device.get('name', 'n/a')} (torch {device.get('torch', 'n/a')}, CUDA "
                 f"{device.get('cuda', 'n/a')}). MFU is over the published dense bf16 peak, "
                 f"{number(device.get('published_bf16_dense_tflops'), '.0f')} TFLOP/s "
                 f"({device.get('published_source', 'n/a')}); beside it, the share of a bf16 GEMM measured "
                 f"on this device: {rate(device.get('measured_bf16_gemm_tflops'))} TFLOP/s "
                 f"({device.get('measured_gemm', 'n/a')}); the MLP's product {device.get('mlp_gemm', 'n/a')} at N = "
                 + ", ".join(f"{width}: {rate(tflops)}" for width, tflops in (device.get('mlp_gemm_tflops') or {}).items())
                 + f" TFLOP/s. Model FLOPs: {results.get('flops_formula', 'n/a')}; "
                 f"the first {results.get('warmup_steps', 'n/a')} steps of each run are not counted; an fp32 run "
                 f"has no MFU (the peaks are bf16's).\n")

    lines.append("### Speed: ours against transformers + torch.optim.AdamW(fused=True), eager and under torch.compile, "
                 "on the same device\n")
    lines.append("| model | mode | batch x length | side | s/step (median; min-max) | tokens/s | model TFLOP/s "
                 "| MFU % | of measured GEMM % | peak memory |")
    lines.append("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for entry in results.get("speed", []):
        sides = [("ours", entry.get("ours"))] + ([("pytorch", entry.get("pytorch")),
                                                  ("pytorch compiled", entry.get("pytorch_compiled"))]
                                                 if "pytorch" in entry else [])
        for label, figures in sides:
            figures = figures or {}
            step = figures.get("step_s")
            span = (f"{step:.4f} ({figures['step_s_min']:.4f}-{figures['step_s_max']:.4f})"
                    if step is not None else "n/a")
            lines.append(f"| {entry['config']} | {mode(entry)} | {entry['batch']} x {entry['length']} | {label} | "
                         f"{span} | {number(figures.get('tokens_per_s'), '.0f')} | {rate(figures.get('model_tflops'))} | "
                         f"{percent(figures.get('mfu'))} | {percent(figures.get('of_measured_gemm'))} | "
                         f"{size(figures.get('peak_memory_bytes'))} |")
        if "pytorch" in entry:
            lines.append(f"| | | | tokens/s ours / pytorch | | {number(entry.get('ours_over_pytorch_tokens_per_s'), '.3f')} "
                         "| | | | |")
            lines.append(f"| | | | tokens/s ours / pytorch compiled | | "
                         f"{number(entry.get('ours_over_compiled_tokens_per_s'), '.3f')} | | | | |")
    predicted = [e for e in results.get("speed", []) if e.get("predicted_step_s")]
    if predicted:
        lines.append("\n### Step time: `trainer estimate --profile 2` against the measured step (issue 54)\n")
        lines.append("| model | mode | batch x length | predicted s/step | measured s/step | predicted / measured |")
        lines.append("|---|---|---|---:|---:|---:|")
        for entry in predicted:
            measured = (entry.get("ours") or {}).get("step_s")
            lines.append(f"| {entry['config']} | {mode(entry)} | {entry['batch']} x {entry['length']} | "
                         f"{entry['predicted_step_s']:.4f} | {number(measured, '.4f')} | "
                         f"{number(entry.get('predicted_over_measured'), '.3f')} |")
    lines.append("\nPeak memory: ours is metrics.jsonl's peak_memory_bytes (on CUDA the caching allocator's peak "
                 "allocated bytes, on CPU the peak RSS); pytorch's is torch.cuda.max_memory_allocated (the peak "
                 "RSS on CPU).\n")

    phase_names = ["forward", "backward", "collectives", "clip", "optimizer", "other"]
    lines.append("### Where a step's time goes (medians over the kept steps, seconds)\n")
    lines.append("| model | mode | side: clock | step | " + " | ".join(phase_names) +
                 " | offload host step | offload waits |")
    lines.append("|---|---|---|" + "---:|" * (len(phase_names) + 3))
    for entry in results.get("speed", []):
        ours, theirs = entry.get("ours") or {}, entry.get("pytorch") or {}
        rows = [("ours: phase_s", ours, ours.get("phase_s"), ours.get("offload_s") or {}),
                ("ours: host_phase_s", ours, ours.get("host_phase_s"), {})]
        if "pytorch" in entry:
            rows.append(("pytorch: events" if results.get("device", {}).get("device") == "cuda" else "pytorch: host",
                         theirs, theirs.get("phase_s"), {}))
        for label, figures, phases, offload in rows:
            if not phases:
                continue
            cells = [number(phases.get(name), ".4f") if name in phases else "-" for name in phase_names]
            lines.append(f"| {entry['config']} | {mode(entry)} | {label} | {number(figures.get('step_s'), '.4f')} | "
                         + " | ".join(cells) + f" | {number(offload.get('host_step_s'), '.4f') if offload else '-'} "
                         f"| {number(offload.get('wait_s'), '.4f') if offload else '-'} |")
    lines.append("\nOurs: phase_s is timed on the compute stream on CUDA (on CPU it is the host clock), "
                 "host_phase_s by the host clock; offload's host step and waits are the host's. PyTorch's phases "
                 "are CUDA events on its stream (host clock on CPU); its optimizer phase includes zero_grad and "
                 "the loss read, its clip the gradient norm.\n")

    lines.append("### Memory: `trainer estimate` against the measured peak of the same run\n")
    lines.append("| model | mode | batch x length | estimate (phase) | measured (phase) | error % "
                 "| estimated CUDA runtime | measured reserved peak | estimated host (pinned) "
                 "| measured host + pinned peaks | host error % |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for entry in results.get("memory", []):
        lines.append(f"| {entry['config']} | {mode(entry)} | {entry['batch']} x {entry['length']} | "
                     f"{size(entry.get('estimate_peak_bytes'))} ({entry.get('estimate_peak_phase', 'n/a')}) | "
                     f"{size(entry.get('measured_peak_bytes'))} ({entry.get('measured_peak_phase', 'n/a')}) | "
                     f"{percent(entry.get('error'), signed=True)} | {size(entry.get('estimate_cuda_runtime_bytes'))} | "
                     f"{size(entry.get('measured_reserved_peak_bytes'))} | {size(entry.get('estimate_host_bytes'))} "
                     f"({size(entry.get('estimate_pinned_bytes'))}) | {size(entry.get('measured_host_and_pinned_peak_bytes'))} "
                     f"| {percent(entry.get('host_error'), signed=True)} |")
    lines.append("\nMeasured: the ledger's peak of tracked bytes (memory.rank0.jsonl's end summary: on CUDA the "
                 "caching allocator's allocated bytes, on CPU the counting CPU allocator's). Error: estimate / "
                 "measured - 1 (above 0: the estimate is the larger). The estimate's CUDA runtime budgets (kernel "
                 "modules, cuBLAS workspaces, NCCL buffers, the allocator's slack) are not in its peak; the "
                 "reserved peak is the caching allocator's. The host error is computed where the estimate has "
                 "host bytes, against the sum of the host allocator's and the pinned peaks (which need not "
                 "coincide).\n")

    lines.append("### Offload: the share of the throughput kept with --offload optimizer\n")
    lines.append("| run | tokens a step | tokens/s | without offload | tokens/s | share kept % | host step s | host step GB/s |")
    lines.append("|---|---:|---:|---|---:|---:|---:|---:|")
    for entry in results.get("offload", []):
        lines.append(f"| {entry['case']} | {number(entry.get('tokens_per_step'), '.0f')} | "
                     f"{number(entry.get('tokens_per_s'), '.0f')} | {entry['baseline']} | "
                     f"{number(entry.get('baseline_tokens_per_s'), '.0f')} | {percent(entry.get('share_kept'))} | "
                     f"{number(entry.get('host_step_s'), '.3f')} | {number(entry.get('host_step_gb_per_s'), '.1f')} |")
    lines.append("\nThe host step's GB/s: the AdamW bytes an element it reads and writes (gradient 2, master 8, "
                 "moments 16 or 8 with bf16 state, the rounded row 2) times the parameters, over the measured "
                 "host_step_s (the worker's and the main thread's host time a step).\n")

    lines.append("\n### Levers: each toggled against the default run of the same shape\n")
    lines.append("| run | flags | tokens/s | MFU % | default run | tokens/s | MFU % | toggled / default |")
    lines.append("|---|---|---:|---:|---|---:|---:|---:|")
    for entry in results.get("levers", []):
        lines.append(f"| {entry['case']} | `{entry['levers']}` | {number(entry.get('tokens_per_s'), '.0f')} | "
                     f"{percent(entry.get('mfu'))} | {entry['baseline']} | {number(entry.get('baseline_tokens_per_s'), '.0f')} "
                     f"| {percent(entry.get('baseline_mfu'))} | {number(entry.get('ratio'), '.3f')} |")
    return "\n".join(lines) + "\n"
