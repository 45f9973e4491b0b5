#!/usr/bin/env bash
# The GPU kit tried here, on CPU, where the lent machine's gaps are made: in a mount namespace this
# machine's Open MPI, PMIx, hwloc, libevent, spdlog, fmt and SentencePiece are hidden (empty folders
# and /dev/null over their files) and so is build/, and the working tree is copied as the device
# tool copies it (tracked files, untracked ones git does not ignore, and the carried gpu-kit/). Then
# each stage of launch/gpu/run.sh runs there, with the project's venv python standing in for the
# image's python3. On CPU the CUDA cases skip: what this proves is that the kit starts, finds its
# libraries and MPI, runs the trainer and the test binaries, and writes its results. The bench stage
# runs its plan with llama_micro on the CPU (bench/gpu_bench.py): its commands, its JSON and
# report.py's tables, not a figure.
#
#   bash launch/gpu/pack.sh && bash launch/gpu/dry_run.sh [STAGE ...]   # default: every stage
# Results: /tmp/gpu-dry-run/out (the files a GPU run brings back), a line per stage with its time.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WORK=${DRY_RUN_DIR:-/tmp/gpu-dry-run}
PYTHON=${TRAINER_PYTHON:-$HOME/.cache/llama-trainer/venv-torch-2.11.0/bin/python}
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(probe tests smoke sanitize bench)
[ -x gpu-kit/bin/trainer ] || { echo "no gpu-kit: bash launch/gpu/pack.sh first" >&2; exit 2; }
# A mount namespace needs the privilege to make one (root here and on CI): 77 tells ctest to skip.
unshare -m --propagation private true 2>/dev/null || { echo "[dry_run] cannot make a mount namespace here" >&2; exit 77; }

rm -rf "$WORK"
mkdir -p "$WORK/tree" "$WORK/out"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$WORK/tree"
cp -r gpu-kit "$WORK/tree/"

hide=$(mktemp)
trap 'rm -f "$hide"' EXIT
{
  for folder in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /etc/openmpi /usr/share/openmpi \
                "$ROOT/build"; do
    [ -d "$folder" ] && echo "mount -t tmpfs none '$folder'"
  done
  for file in /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info \
              /usr/lib/x86_64-linux-gnu/lib{mpi,open-rte,open-pal,pmix,hwloc,event,spdlog,fmt,sentencepiece,mca_common}*.so*; do
    [ -e "$file" ] && echo "mount --bind /dev/null '$(readlink -f "$file")'"
  done
} | sort -u > "$hide"
echo "[dry_run] hiding $(wc -l < "$hide") paths of this machine; the tree is $WORK/tree"

failed=0
for stage in "${stages[@]}"; do
  started=$SECONDS
  set +e
  unshare -m --propagation private bash -c "set -e; $(tr '\n' ';' < "$hide") cd '$WORK/tree' && \
    OUT='$WORK/out' BENCH_WORK='$WORK/bench' TRAINER_PYTHON='$PYTHON' bash launch/gpu/run.sh $stage"
  rc=$?
  set -e
  echo "[dry_run] $stage: exit $rc in $((SECONDS - started)) s"
  [ $rc -eq 0 ] || failed=1
done
ls "$WORK/out"
exit $failed
