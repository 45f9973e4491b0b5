#!/usr/bin/env bash
# Breaks one feature at a time on purpose (the patches of tests/breakage/), builds, and shows that
# the tests fail, and how long they took to: ctest --stop-on-failure over the entries the patch's
# first line names ("# ctest: REGEX"), or over the whole suite with FULL=1 (the time is then until
# the first failing entry ends, which depends on where ctest's order puts it). What the suite proves
# is kept only if every patch makes it fail.
#
#   bash launch/breakage_demo.sh [NAME ...]    # default: every tests/breakage/*.patch; NAME without .patch
#
# Works on a copy of the tree (tracked files and untracked ones git does not ignore) in
# ${BREAKAGE_DIR:-/tmp/breakage-demo} with a build folder of its own (launch/setup.sh builds it, the
# compiler cache makes it quick), so this checkout and its build/ are untouched. A line per patch:
#   offload_bitwise: fails after 41 s (first failure: offload_test; failed: offload_test ...)
# and a table of them at the end in $BREAKAGE_DIR/results.md. TEST_JOBS as launch/test.sh (3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${BREAKAGE_DIR:-/tmp/breakage-demo}
jobs=${TEST_JOBS:-3}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for patch in tests/breakage/*.patch; do names+=("$(basename "$patch" .patch)"); done
fi
for name in "${names[@]}"; do
  [ -f "tests/breakage/$name.patch" ] || { echo "no tests/breakage/$name.patch" >&2; exit 2; }
done

echo "[breakage] copying the tree to $WORK/tree and building it in $WORK/build"
# Only the files that differ are copied (and get a new time), so a second demo rebuilds only what
# changed (a file deleted here stays in the copy: remove $BREAKAGE_DIR to start afresh).
mkdir -p "$WORK/tree"
rm -rf "$WORK/tree/.git"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' file; do
  cmp -s "$file" "$WORK/tree/$file" || cp --parents -t "$WORK/tree" "$file"
done
# A repository of its own: the GPU kit's dry run lists the tree's files with git.
(cd "$WORK/tree" && git init -q && git add -A && git -c user.name=breakage -c user.email=breakage@localhost \
   commit -qm "the tree under test")
BUILD_DIR="$WORK/build" bash "$WORK/tree/launch/setup.sh" > "$WORK/setup.log" 2>&1 \
  || { tail -n 20 "$WORK/setup.log"; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
results="$WORK/results.md"
{
  echo "| patch | the tests | time to fail | first failing entry | entries failed |"
  echo "|---|---|---:|---|---|"
} > "$results"
status=0
for name in "${names[@]}"; do
  patch="$ROOT/tests/breakage/$name.patch"
  (cd "$WORK/tree" && patch -s -p1 < "$patch")
  if ! cmake --build "$WORK/build" > "$WORK/$name.build.log" 2>&1; then
    echo "[breakage] $name: does not build (see $WORK/$name.build.log)"
    (cd "$WORK/tree" && patch -s -R -p1 < "$patch")
    status=1
    continue
  fi
  selection=()
  entries=$(sed -n '1s/^# ctest: //p' "$patch")
  [ -n "$entries" ] && [ -z "${FULL:-}" ] && selection=(-R "$entries")
  started=$SECONDS
  set +e
  (cd "$WORK/build" && ctest -j "$jobs" --stop-on-failure --output-on-failure --timeout 300 "${selection[@]}" \
     > "$WORK/$name.ctest.log" 2>&1)
  rc=$?
  set -e
  took=$((SECONDS - started))
  (cd "$WORK/tree" && patch -s -R -p1 < "$patch")
  failed=$(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (\(Failed\|Timeout\|SEGFAULT\|Subprocess aborted\|Child aborted\|Exception\).*/\1/p' \
             "$WORK/$name.ctest.log" | tr '\n' ' ')
  first=$(grep -m1 -E '\*\*\*(Failed|Timeout|Exception)|Subprocess aborted|SEGFAULT' "$WORK/$name.ctest.log" \
            | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/')
  if [ $rc -ne 0 ] && [ -n "$failed" ]; then
    echo "[breakage] $name: ${entries:+ctest -R '$entries' }fails after $took s (first failure: $first; failed: $failed)"
    echo "| $name | ${entries:+\`-R $entries\` }fails | $took s | $first | $failed|" >> "$results"
  else
    echo "[breakage] $name: PASSES ($took s): nothing catches this breakage"
    echo "| $name | **passes** | $took s | | |" >> "$results"
    status=1
  fi
done
cmake --build "$WORK/build" > /dev/null 2>&1 || true  # back to the unbroken tree
echo "[breakage] $results:"
cat "$results"
exit $status
