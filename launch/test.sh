#!/usr/bin/env bash
# The test command of the README: set up (install what is missing, build), then run every test.
#   bash launch/test.sh
# Multi-rank tests run under mpirun --oversubscribe on CPU; GPU tests skip cleanly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "[test.sh] set-up, build and tests: ${SECONDS} s"' EXIT
bash launch/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # CI runs as root
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}                        # ranks share 2 cores
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "${TEST_JOBS:-2}"
