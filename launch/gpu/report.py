#!/usr/bin/env python3
"""docs/gpu-results.md from what a GPU run brought back (launch/gpu/run.sh: STAGE.json and STAGE.log).

    python3 launch/gpu/report.py FOLDER [FOLDER ...] > docs/gpu-results.md

Each stage becomes a section with the device, date and commit it ran on, and a row per step: the
command, its exit status, its time and what it reported (GoogleTest's counts, the failing tests,
mpi_tests' verdict, or the step's last line). The bench stage's figures (bench.json's "bench", from
bench/gpu_bench.py summarize) follow its steps as tables: speed against PyTorch, the phases, the
estimate against the measured peak, offload's share; they are rendered by gpu_bench.markdown from the
JSON alone, and a figure the JSON lacks shows as "n/a". Nothing is written that the files do not hold:
a stage whose files did not come back is not mentioned.
"""
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gpu_bench import markdown as bench_markdown  # noqa: E402

STAGES = ["probe", "tests", "smoke", "sanitize", "bench"]


def log_sections(log_text, names):
    """The log's '### NAME' sections, NAME a step's name: name -> the lines after the command line.
    Only the steps' names start a section: a step's output may hold Markdown headings (bench's tables)."""
    sections, name = {}, None
    for line in log_text.splitlines():
        if line.startswith("### ") and line[4:].strip() in names:
            name = line[4:].strip()
            sections[name] = []
        elif name is not None and not line.startswith("$ "):
            sections[name].append(line)
    return sections


def outcome(lines):
    """A short account of a step's output."""
    text = "\n".join(lines)
    parts = []
    ran = re.search(r"\[=+\] (\d+) tests? from \d+ test suites? ran", text)
    if ran:
        parts.append(f"{ran.group(1)} tests ran")
    for label in ("PASSED", "SKIPPED", "FAILED"):
        found = re.search(rf"\[\s*{label}\s*\] (\d+) tests?", text)
        if found:
            parts.append(f"{found.group(1)} {label.lower()}")
    failed = sorted(set(re.findall(r"\[\s*FAILED\s*\] ([\w/.]+)", text)))
    if failed:
        parts.append("failing: " + ", ".join(failed[:8]) + (" ..." if len(failed) > 8 else ""))
    verdict = re.search(r"mpi_tests: .*", text)
    if verdict:
        parts.append(verdict.group(0))
    if not parts:
        last = [line for line in lines if line.strip()]
        parts.append(last[-1].strip()[:160] if last else "(no output)")
    return "; ".join(parts)


def main(folders):
    print("# GPU results\n")
    print("Written by `launch/gpu/report.py` from the files `launch/gpu/run.sh` brought back; each figure "
          "names the stage, device, date and commit it came from.\n")
    found = False
    for folder in map(Path, folders):
        for stage in STAGES:
            summary_file = folder / f"{stage}.json"
            if not summary_file.exists():
                continue
            found = True
            summary = json.loads(summary_file.read_text())
            log_file = folder / f"{stage}.log"
            names = {step["name"] for step in summary["steps"]}
            sections = log_sections(log_file.read_text(errors="replace"), names) if log_file.exists() else {}
            print(f"## {stage} ({folder.name}): {summary['device']}, {summary['date']}, commit {summary['commit']}\n")
            print("| step | command | exit | seconds | outcome |\n|---|---|---:|---:|---|")
            for step in summary["steps"]:
                command = step["command"].replace("|", "\\|")
                print(f"| {step['name']} | `{command}` | {step['rc']} | {step['seconds']} | "
                      f"{outcome(sections.get(step['name'], [])).replace('|', '/')} |")
            print()
            if "bench" in summary:
                print(bench_markdown(summary["bench"]))
    if not found:
        sys.exit("no STAGE.json in " + ", ".join(folders))
    across_calls(folders)


def spread(values):
    """'median (min-max, n=N)' of the values present; n/a when none."""
    values = sorted(v for v in values if isinstance(v, (int, float)))
    if not values:
        return "n/a"
    def number(value):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"

    text = number(statistics.median(values))
    return text + (f" ({number(values[0])}-{number(values[-1])}, n={len(values)})" if len(values) > 1 else " (n=1)")


def across_calls(folders):
    """The speed figures of every bench.json given, side by side: a figure's spread from call to call."""
    benches = []
    for folder in map(Path, folders):
        summary_file = folder / "bench.json"
        if summary_file.exists():
            bench = json.loads(summary_file.read_text()).get("bench")
            if bench:
                benches.append(bench)
    if len(benches) < 2:
        return
    print(f"## Across calls: {len(benches)} bench stages, each run once per call\n")
    print("Median over the calls that ran it (min-max, number of calls); each call's own figure is the median "
          "step of its run.\n")
    print("| case | ours tokens/s | pytorch tokens/s | ours / pytorch | ours MFU % | peak memory ours (GiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    cases = []
    for bench in benches:
        cases += [row["case"] for row in bench.get("speed", []) if row["case"] not in cases]
    for case in cases:
        rows = [row for bench in benches for row in bench.get("speed", []) if row["case"] == case]
        ours = [row.get("ours") or {} for row in rows]
        theirs = [row.get("pytorch") or {} for row in rows]
        mfu = [o.get("mfu") * 100 if o.get("mfu") else None for o in ours]
        peak = [o.get("peak_memory_bytes") / 2**30 if o.get("peak_memory_bytes") else None for o in ours]
        print(f"| {case} | {spread(o.get('tokens_per_s') for o in ours)} | "
              f"{spread(t.get('tokens_per_s') for t in theirs)} | "
              f"{spread(row.get('ours_over_pytorch_tokens_per_s') for row in rows)} | {spread(mfu)} | {spread(peak)} |")
    shares = [row for bench in benches for row in bench.get("offload", [])]
    for case in dict.fromkeys(row["case"] for row in shares):
        values = [row.get("share_kept") * 100 for row in shares if row["case"] == case and row.get("share_kept")]
        print(f"\nOffload, {case}: share of the throughput kept {spread(values)} %.")
    print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
