#!/usr/bin/env bash
# Several stages of launch/gpu/run.sh in one device call, each under its own budget in seconds, so
# that a short lease (the device tool now lends 15 minutes a session, the machine's start included)
# runs correctness and figures in one command and brings back every stage's two files (8 at most):
#   bash launch/gpu/session.sh probe:45 tests:90 smoke:150 bench:220:100
# STAGE:BUDGET[:STEP]: the stage's budget bounds when its steps may start and end (run.sh's
# STAGE_BUDGET_S); each step is also under STEP seconds (STEP_TIMEOUT; default: the budget).
# Exit 0 when every stage passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
failed=0
started=$SECONDS
for item in "$@"; do
  IFS=: read -r stage budget step <<< "$item"
  budget=${budget:-420}
  STAGE_BUDGET_S=$budget STEP_TIMEOUT=${step:-$budget} bash launch/gpu/run.sh "$stage" || failed=1
  echo "[session] $stage done at $((SECONDS - started)) s"
done
exit $failed
