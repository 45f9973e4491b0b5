#!/usr/bin/env python3
"""Several communicator_bench --jsonl probes of the same rows merged into one table: each row's seconds
and bus bandwidth the median over the probes (4 ranks on 2 cores: one probe's row can be a scheduler's
tick or more off). A probe's `iteration_seconds` (--apart) are left out: they are one probe's, not the
merged row's. The probes must list the same (collective, bytes) rows in the same order.

    python3 launch/median_of_probes.py PROBE.jsonl PROBE.jsonl ... > TABLE.jsonl
(launch/step_time_table.sh, tests/multinode/link_bytes_test.sh's bench)
"""
import json
import statistics
import sys

probes = [[json.loads(line) for line in open(path) if line.strip()] for path in sys.argv[1:]]
if not probes or len({len(rows) for rows in probes}) != 1:
    sys.exit(f"median_of_probes.py: the probes {sys.argv[1:]} have different row counts (or none given)")
for rows in zip(*probes):
    if len({(r["collective"], r["bytes"]) for r in rows}) != 1:
        sys.exit(f"median_of_probes.py: the probes' rows differ: {[(r['collective'], r['bytes']) for r in rows]}")
    row = dict(rows[0])
    row["seconds"] = statistics.median(r["seconds"] for r in rows)
    row["busbw_gbs"] = statistics.median(r["busbw_gbs"] for r in rows)
    row.pop("iteration_seconds", None)  # one probe's iterations (--apart): not the merged row's
    print(json.dumps(row))
