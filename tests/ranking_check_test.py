#!/usr/bin/env python3
"""launch/ranking_check.py (issue 54: the model's ranking against the measured one): a cluster table
and a step-time table of a few rows each, written here, with pairs the runs separate in and out of the
predicted order, a pair the model prices the same and a pair whose runs overlap; the counts, the named
pairs and the exit status checked. Exit status 0 when they are right."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = """| link between nodes | strategy | step time s (median over rounds; min-max) | wall-clock s a step | predicted s (trainer estimate) | predicted / measured |
|---|---|---:|---:|---:|---:|
| 1 Gbit/s | a | 1.000 (0.950-1.050) | 1.0 | 1.100 | 1.10 |
| 1 Gbit/s | b | 2.000 (1.900-2.100) | 2.0 | 2.200 | 1.10 |
| 1 Gbit/s | c | 1.040 (1.000-1.100) | 1.0 | 0.900 | 0.87 |
| 200 Mbit/s | a | 3.000 (2.900-3.100) | 3.0 | 5.000 | 1.67 |
| 200 Mbit/s | b | 4.000 (3.900-4.100) | 4.0 | 4.500 | 1.12 |
"""
STEP = """| row | predicted s | measured s (runs) | error | predicted phases | measured |
|---|---:|---:|---:|---|---|
| 4 ranks x | 0.300 | 0.300 (0.29, 0.30, 0.31) | +0 % | - | - |
| 4 ranks x, --offload optimizer | 0.300 | 0.400 (0.39, 0.40, 0.41) | -25 % | - | - |
| 1 rank | 0.500 | 0.500 (0.49, 0.5, 0.51) | +0 % | - | - |
"""


def check(table, want_exit, want_lines):
    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as file:
        file.write(table)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "launch/ranking_check.py"), file.name],
                            capture_output=True, text=True)
    os.unlink(file.name)
    print(result.stdout + result.stderr)
    ok = result.returncode == want_exit
    for line in want_lines:
        if line not in result.stdout:
            print(f"missing: {line!r}")
            ok = False
    return ok


def main():
    ok = check(CLUSTER, 1, [
        # a < b and c < b separated and in order; a and c overlap (a tie)
        "1 Gbit/s: 3 rows; of the 2 pairs the runs separate, 2 in the predicted order, 0 reversed, 0 predicted equal; 1 pairs tied",
        "200 Mbit/s: 2 rows; of the 1 pairs the runs separate, 0 in the predicted order, 1 reversed",
        "reversed: a measured 3.000 (2.900-3.100) faster than b 4.000 (3.900-4.100), predicted 5.000 against 4.500",
    ])
    ok = check(STEP, 0, [
        "4 rank(s): 2 rows; of the 1 pairs the runs separate, 0 in the predicted order, 0 reversed, 1 predicted equal",
        "predicted equal: 4 ranks x measured 0.300 (0.290-0.310) faster than 4 ranks x, --offload optimizer",
        "1 rank(s): 1 rows; of the 0 pairs",
    ]) and ok
    # The table's predicted cell as launch/step_time_table.sh writes it now: the median of the rounds'
    # predictions, each beside it; the first number is the prediction.
    rounds = STEP.replace("| predicted s |", "| predicted s (rounds) |").replace(
        "| 4 ranks x | 0.300 |", "| 4 ranks x | 0.200 (0.2, 0.19, 0.21) |")
    ok = check(rounds, 0, [
        "4 rank(s): 2 rows; of the 1 pairs the runs separate, 1 in the predicted order, 0 reversed, 0 predicted equal",
    ]) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
