#!/usr/bin/env bash
# communicator_bench --apart reports the median of iterations timed one at a time, the back-to-back
# loop their mean: one rank held back 0.6 s before one timed all-reduce (LLM_DEBUG_DELAY_COLLECTIVE on
# the bench's communicator, labelled "bench") must put at least a third of it into the loop's time and
# nothing into --apart's; both rows exact. Two ranks, a 4 KiB all-reduce, three timed iterations.
#
#   tests/bench/communicator_bench_apart_test.sh MPIEXEC COMMUNICATOR_BENCH
set -uo pipefail
MPIEXEC=${1:?usage: communicator_bench_apart_test.sh MPIEXEC COMMUNICATOR_BENCH}
BENCH=${2:?usage: communicator_bench_apart_test.sh MPIEXEC COMMUNICATOR_BENCH}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Collective 3 of the bench's communicator on rank 1: a timed iteration in both modes (the loop's
# are 3-5 after the warm-up and its barrier, --apart's 2-4 after the warm-up; its barriers are the
# world's, not the bench communicator's).
export LLM_DEBUG_DELAY_COLLECTIVE=1:bench:3:0.6
probe() {  # NAME [flags]
  local name=$1
  shift
  timeout 60 "$MPIEXEC" --oversubscribe -np 2 -x LLM_DEBUG_DELAY_COLLECTIVE "$BENCH" --collectives all_reduce \
    --min-bytes 4K --max-bytes 4K --iters 3 --warmup 1 --jsonl "$work/$name.jsonl" "$@" > "$work/$name.txt" 2>&1 \
    || { echo "FAIL: communicator_bench $*: $(tail -n 5 "$work/$name.txt")"; exit 1; }
}
probe loop
probe apart --apart
python3 - "$work/loop.jsonl" "$work/apart.jsonl" <<'PY'
import json, sys
loop, apart = (json.loads(open(path).readline()) for path in sys.argv[1:3])
failed = False
for name, row in (("loop", loop), ("apart", apart)):
    if row["wrong"] != 0:
        print(f"FAIL: {name}: {row['wrong']} wrong elements"); failed = True
if loop["seconds"] < 0.6 / 3:
    print(f"FAIL: the loop's mean {loop['seconds']:.3f} s leaves out the 0.6 s held back (at least 0.2 s)"); failed = True
if apart["seconds"] >= 0.1:
    print(f"FAIL: --apart's {apart['seconds']:.3f} s holds the one iteration held back: not the median"); failed = True
print(f"loop {loop['seconds']:.4f} s, apart {apart['seconds']:.4f} s")
sys.exit(1 if failed else 0)
PY
