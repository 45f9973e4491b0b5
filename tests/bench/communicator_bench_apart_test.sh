#!/usr/bin/env bash
# communicator_bench --apart times each iteration on its own, after a barrier, and reports their mean
# with each iteration's time (iteration_seconds, the slowest rank's); the loop reports one mean and no
# iteration times. One rank held back 0.6 s inside the second of three timed all-reduces
# (LLM_DEBUG_DELAY_COLLECTIVE on the bench's communicator, labelled "bench"): --apart must show it in
# that iteration alone and its row must be the three times' mean; the loop's mean must hold at least a
# third of it; both rows exact. Two ranks, a 4 KiB all-reduce.
#
#   tests/bench/communicator_bench_apart_test.sh MPIEXEC COMMUNICATOR_BENCH
set -uo pipefail
MPIEXEC=${1:?usage: communicator_bench_apart_test.sh MPIEXEC COMMUNICATOR_BENCH}
BENCH=${2:?usage: communicator_bench_apart_test.sh MPIEXEC COMMUNICATOR_BENCH}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Collective 3 of the bench's communicator on rank 1: the loop's first timed iteration (its are 3-5,
# after the warm-up and its barrier), --apart's second (2-4 after the warm-up: its barriers are the
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
def fail(text):
    global failed
    print("FAIL: " + text); failed = True
for name, row in (("loop", loop), ("apart", apart)):
    if row["wrong"] != 0: fail(f"{name}: {row['wrong']} wrong elements")
if "iteration_seconds" in loop: fail("the loop's row has iteration times it did not measure")
if loop["seconds"] < 0.6 / 3: fail(f"the loop's mean {loop['seconds']:.3f} s leaves out the 0.6 s held back")
times = apart.get("iteration_seconds", [])
if len(times) != 3:
    fail(f"--apart's row has {len(times)} iteration times, not 3")
else:
    if not (times[1] >= 0.6 and times[0] < 0.1 and times[2] < 0.1):
        fail(f"--apart's iterations {times}: the 0.6 s held back is not in the second alone")
    if abs(apart["seconds"] - sum(times) / 3) > 1e-9:
        fail(f"--apart's {apart['seconds']:.6f} s is not its iterations' mean {sum(times) / 3:.6f}")
print(f"loop {loop['seconds']:.4f} s; apart {apart['seconds']:.4f} s from {times}")
sys.exit(1 if failed else 0)
PY
