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
            print(f"## {stage}: {summary['device']}, {summary['date']}, commit {summary['commit']}\n")
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


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
