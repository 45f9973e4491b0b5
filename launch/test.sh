#!/usr/bin/env bash
# The test command of the README: set up (install what is missing, build), then run every test, then
# say where the time went (launch/test_report.py: set-up, build, tests, the ten slowest).
#   bash launch/test.sh             # TEST_JOBS=N for another number of parallel ctest entries
# Multi-rank tests run under mpirun --oversubscribe on CPU; GPU tests skip cleanly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
trap 'echo "[test.sh] set-up, build and tests: ${SECONDS} s"' EXIT
bash launch/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # CI runs as root
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}                        # ranks share 2 cores
jobs=${TEST_JOBS:-3}  # 3 on 2 cores: many entries wait on processes they start (see README, Tests)
cd "${BUILD_DIR:-build}"
rm -rf test-results ctest-results.xml
tests_start=$SECONDS
status=0
ctest --output-on-failure --timeout 900 -j "$jobs" --output-junit "$PWD/ctest-results.xml" || status=$?
python3 "$root/launch/test_report.py" --build . --ctest-junit ctest-results.xml \
  --tests-wall "$((SECONDS - tests_start))" --jobs "$jobs" || true
exit "$status"
