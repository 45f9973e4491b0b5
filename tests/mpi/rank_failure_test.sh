#!/usr/bin/env bash
# One rank fails while the others wait in a collective: the whole job must end, quickly, non-zero,
# with a message that says which rank on which host failed and why. Runs rank_failure_probe
# (tests/mpi/rank_failure_probe.cpp) under mpirun in three modes:
#   none        control: must exit 0 (else the checks below prove nothing)
#   user_error  rank 1 gets a bad argument: our "[rank 1 on HOST] error: ..." line, then MPI_Abort
#               with status 2 (Open MPI's own MPI_ABORT banner is not checked: Open MPI 4.1 may fail
#               to print it, "ORTE_ERROR_LOG: Out of resource in show_help.c")
#   sigkill     rank 1 dies of SIGKILL: mpirun's "process rank 1 ... on node HOST ... signal 9"
# Each failing run must end within 20 s (a hang would end only at ctest's timeout or ours).
#
#   tests/mpi/rank_failure_test.sh MPIEXEC PROBE [RANKS]
set -uo pipefail

MPIEXEC=${1:?usage: rank_failure_test.sh MPIEXEC PROBE [RANKS]}
PROBE=${2:?usage: rank_failure_test.sh MPIEXEC PROBE [RANKS]}
RANKS=${3:-3}
LIMIT_SECONDS=20
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run_probe MODE: sets status, seconds, output.
run_probe() {
  local start end
  start=$(date +%s.%N)
  # Our own limit, well above LIMIT_SECONDS, so a hang is reported here rather than by ctest.
  # timeout exits 124 when it had to stop the job (mpirun itself exits 137 for a SIGKILLed rank).
  output=$(timeout --kill-after=5 50 "$MPIEXEC" --oversubscribe -np "$RANKS" "$PROBE" \
           --mode "$1" --failing-rank 1 2>&1)
  status=$?
  end=$(date +%s.%N)
  seconds=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", e - s }')
  echo "--- mode $1: exit status $status after ${seconds}s; output:"
  echo "$output" | sed 's/^/    /'
}

expect_quick_failure() {
  local mode=$1
  [ "$status" -ne 0 ] || fail "$mode: mpirun exited 0 although rank 1 failed"
  [ "$status" -ne 124 ] || fail "$mode: mpirun hung and was stopped by the test's timeout"
  awk -v s="$seconds" -v limit="$LIMIT_SECONDS" 'BEGIN { exit !(s < limit) }' ||
    fail "$mode: the job took ${seconds}s to end (limit ${LIMIT_SECONDS}s)"
}

expect_output() {
  local mode=$1 pattern=$2 what=$3
  grep -Eq -- "$pattern" <<<"$output" || fail "$mode: output does not say $what (/$pattern/)"
}

run_probe none
[ "$status" -eq 0 ] || fail "none: the control run failed (status $status); the probe is broken"
expect_output none "all_gather finished on all $RANKS ranks" "that the collective finished"

run_probe user_error
expect_quick_failure user_error
expect_output user_error '\[rank 1 on [^]]+\] error: ' "which rank and host failed"
expect_output user_error 'all_gather \(mpi communicator\): output: holds [0-9]+ elements' \
  "what was wrong"
[ "$status" -eq 2 ] ||
  fail "user_error: status $status, expected 2 (the code rank 1 passed to MPI_Abort)"

run_probe sigkill
expect_quick_failure sigkill
expect_output sigkill 'rank 1 with PID [0-9]+ on node [^ ]+ exited on signal 9' \
  "which rank and host died, and of what"

if [ "$failures" -ne 0 ]; then
  echo "rank_failure_test: $failures check(s) failed"
  exit 1
fi
echo "rank_failure_test: all checks passed"
