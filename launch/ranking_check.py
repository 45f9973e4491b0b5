#!/usr/bin/env python3
"""Does the step-time model rank the configurations as they were measured? For each group of rows
measured together (a link rate of the cluster bench, the 1-rank or the 4-rank rows of the step-time
table), every pair whose measured spreads do not overlap (one's slowest run faster than the other's
fastest) is "separated", and the prediction must put the pair in the measured order (a pair the model
prices the same, to the table's digits, is listed as predicted equal); a pair whose spreads overlap is a
tie the runs cannot order, counted apart.

    python3 launch/ranking_check.py docs/bench/multinode_links.md     (rows grouped by link rate)
    python3 launch/ranking_check.py docs/step_time.md                 (rows grouped by rank count)

Prints a line a group and the pairs out of order; exit 1 when a separated pair is predicted reversed.
"""
import re
import sys
from itertools import combinations


def rows_of(path):
    """[(group, name, predicted, measured, fastest, slowest)] from either table, by its header's names."""
    rows, columns = [], None
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3:
            continue
        if columns is None:
            if any(c.startswith("predicted s") for c in cells):
                columns = cells
            continue
        if set(cells[0]) <= set("-: "):
            continue
        cell = dict(zip(columns, cells))
        predicted = float(next(v for k, v in cell.items() if k.startswith("predicted s")).split(" ")[0])  # "0.33" or "0.33 (rounds)"
        if "strategy" in cell:  # the cluster bench: a row a link rate and strategy, the spread over the rounds
            measured, fastest, slowest = map(float, re.match(r"([\d.]+) \(([\d.]+)-([\d.]+)\)",
                                                              cell[next(k for k in cell if k.startswith("step time s"))]).groups())
            rows.append((cell[columns[0]], cell["strategy"], predicted, measured, fastest, slowest))
        else:  # the step-time table: the runs listed
            match = re.match(r"([\d.]+) \(([^)]*)\)", cell[next(k for k in cell if k.startswith("measured s"))])
            runs = [float(x) for x in match.group(2).split(",")]
            group = cell["row"].split(",")[0].split(" ")[0] + " rank(s)"
            rows.append((group, cell["row"], predicted, float(match.group(1)), min(runs), max(runs)))
    return rows


def main():
    rows = rows_of(sys.argv[1])
    if not rows:
        sys.exit(f"ranking_check.py: no rows with a prediction and a measured spread in {sys.argv[1]}")
    wrong_anywhere = False
    for group in dict.fromkeys(r[0] for r in rows):
        members = [r for r in rows if r[0] == group]
        separated, wrong, level, ties = 0, [], [], 0
        for a, b in combinations(members, 2):
            fast, slow = (a, b) if a[3] <= b[3] else (b, a)
            if fast[5] >= slow[4]:  # the runs overlap: a tie they cannot order
                ties += 1
                continue
            separated += 1
            said = (f"{fast[1]} measured {fast[3]:.3f} ({fast[4]:.3f}-{fast[5]:.3f}) faster than {slow[1]} "
                    f"{slow[3]:.3f} ({slow[4]:.3f}-{slow[5]:.3f}), predicted {fast[2]:.3f} against {slow[2]:.3f}")
            if fast[2] > slow[2]:
                wrong.append(said)
            elif fast[2] == slow[2]:  # the model prices the two the same (to the table's digits)
                level.append(said)
        print(f"{group}: {len(members)} rows; of the {separated} pairs the runs separate, {separated - len(wrong) - len(level)} "
              f"in the predicted order, {len(wrong)} reversed, {len(level)} predicted equal; {ties} pairs tied (their runs overlap)")
        for line in wrong:
            print(f"  reversed: {line}")
        for line in level:
            print(f"  predicted equal: {line}")
        wrong_anywhere = wrong_anywhere or bool(wrong)
    sys.exit(1 if wrong_anywhere else 0)


if __name__ == "__main__":
    main()
