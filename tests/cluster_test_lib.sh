# Shared by the test scripts that start the trainer under launchers of their own (tests/multinode,
# tests/slurm). Sourced as
#   source "$(dirname "$0")/../cluster_test_lib.sh" TRAINER MPIEXEC
# it sets TRAINER (absolute), MPIEXEC, SOURCE (the repository, then the working folder) and PY, and
# defines skip MESSAGE (exit 77: ctest's skip), fail MESSAGE (exit 1, after the script's own
# on_fail, when it has one) and records METRICS_JSONL (each step's [loss, grad_norm, lr], the last
# record of a step, as one JSON line: two runs are the same bits when their lines are equal).
set -u
TRAINER=$(readlink -f "$1")
MPIEXEC=$2
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SOURCE=$(pwd)
PY=${PYTHON:-python3}

skip() { echo "SKIP: $*"; exit 77; }
fail() {
  echo "FAIL: $*"
  declare -F on_fail >/dev/null && on_fail
  exit 1
}
records() {
  "$PY" -c "
import json, sys
steps = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get('event') == 'train':
        steps[r['step']] = [r['loss'], r['grad_norm'], r['lr']]
print(json.dumps(steps, sort_keys=True))" "$1"
}
