#!/usr/bin/env bash
# Breaks one property at a time on purpose (the patches of tests/breakage/), builds incrementally, runs
# the tests the patch names, and writes which tests failed: the table of docs/breakage.md, with the
# commit it was made at. What the suite claims is kept only where its patch makes the tests fail.
#
#   bash launch/breakage_demo.sh [NAME ...]   # default: every tests/breakage/*.patch; NAME without .patch
#   TABLE=/tmp/b.md bash launch/breakage_demo.sh offload_bitwise   # the table elsewhere (default: docs/breakage.md
#                                                                  # for every patch, $BREAKAGE_DIR/breakage.md for some)
#
# Each patch opens with "# breaks: WHAT" (the property, in words) and "# ctest: REGEX" (the ctest
# entries that test it). Works on a copy of the tree (tracked files and untracked ones git does not
# ignore) in ${BREAKAGE_DIR:-/tmp/breakage-demo} with a build folder of its own (launch/setup.sh
# builds it the first time, about as long as the test command's build; then each patch rebuilds what
# it touches), so this checkout and its build/ are untouched. The entries run whole (no stop at the
# first failure), and the table lists every gtest case that failed (from the entries' XML), or the
# entry itself for the script and MPI tests. A line per patch as it goes:
#   offload_bitwise: 14 tests fail in 96 s (Cases/OffloadEquivalence.EqualsTheStepWithoutOffloadBitwise/adamw_1rank, ...)
# Exit status 1 when a patch does not build or no test fails with it. TEST_JOBS as launch/test.sh (3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${BREAKAGE_DIR:-/tmp/breakage-demo}
TABLE_GIVEN=${TABLE:-}
TABLE=${TABLE:-$ROOT/docs/breakage.md}
jobs=${TEST_JOBS:-3}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for patch in tests/breakage/*.patch; do names+=("$(basename "$patch" .patch)"); done
fi
for name in "${names[@]}"; do
  patch="tests/breakage/$name.patch"
  [ -f "$patch" ] || { echo "no $patch" >&2; exit 2; }
  grep -q '^# ctest: ' "$patch" && grep -q '^# breaks: ' "$patch" \
    || { echo "$patch: needs its '# breaks: ' and '# ctest: ' lines" >&2; exit 2; }
done
# A run over some of the patches never replaces the whole table in docs.
if [ -z "${TABLE_GIVEN:-}" ] && [ ${#names[@]} -lt "$(ls tests/breakage/*.patch | wc -l)" ]; then
  TABLE=$WORK/breakage.md
fi
commit=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit with uncommitted changes"

echo "[breakage] copying the tree to $WORK/tree and building it in $WORK/build"
# Only the files that differ are copied (and get a new time), so a second demo rebuilds only what
# changed (a file deleted here stays in the copy: remove $BREAKAGE_DIR to start afresh).
mkdir -p "$WORK/tree"
rm -rf "$WORK/tree/.git"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' file; do
  cmp -s "$file" "$WORK/tree/$file" || cp --parents -t "$WORK/tree" "$file"
done
# A repository of its own: the GPU kit's dry run lists the tree's files with git, and the patches
# are checked to apply with git.
(cd "$WORK/tree" && git init -q && git add -A && git -c user.name=breakage -c user.email=breakage@localhost \
   commit -qm "the tree under test")
BUILD_DIR="$WORK/build" bash "$WORK/tree/launch/setup.sh" > "$WORK/setup.log" 2>&1 \
  || { tail -n 20 "$WORK/setup.log"; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
status=0
for name in "${names[@]}"; do
  patch="$ROOT/tests/breakage/$name.patch"
  breaks=$(sed -n 's/^# breaks: //p' "$patch")
  entries=$(sed -n 's/^# ctest: //p' "$patch")
  (cd "$WORK/tree" && git apply "$patch")
  started=$SECONDS
  if ! cmake --build "$WORK/build" > "$WORK/$name.build.log" 2>&1; then
    echo "[breakage] $name: does not build (see $WORK/$name.build.log)"
    echo "| \`$name\` | $breaks | \`$entries\` | **does not build** | |" >> "$rows"
    (cd "$WORK/tree" && git apply -R "$patch")
    status=1
    continue
  fi
  rm -rf "$WORK/build/test-results" && mkdir -p "$WORK/build/test-results"
  set +e
  (cd "$WORK/build" && ctest -j "$jobs" --output-on-failure --timeout 300 -R "$entries" > "$WORK/$name.ctest.log" 2>&1)
  set -e
  took=$((SECONDS - started))
  (cd "$WORK/tree" && git apply -R "$patch")
  # The failed gtest cases of the entries that wrote XML; the failed entries that wrote none.
  failed=$(python3 "$ROOT/launch/breakage_failures.py" "$WORK/build/test-results" "$WORK/$name.ctest.log")
  count=$(printf '%s' "$failed" | grep -c . || true)
  if [ "$count" -gt 0 ]; then
    listed=$(printf '%s\n' "$failed" | head -n 12 | sed 's/.*/`&`/' | paste -sd ',' | sed 's/,/, /g')
    [ "$count" -gt 12 ] && listed="$listed and $((count - 12)) more"
    echo "[breakage] $name: $count test(s) fail in $took s ($(printf '%s\n' "$failed" | head -n 3 | paste -sd ' '))"
    echo "| \`$name\` | $breaks | \`$entries\` | $count fail ($took s) | $listed |" >> "$rows"
  else
    echo "[breakage] $name: PASSES ($took s): nothing catches this breakage"
    echo "| \`$name\` | $breaks | \`$entries\` | **passes** ($took s) | |" >> "$rows"
    status=1
  fi
done
cmake --build "$WORK/build" > /dev/null 2>&1 || true  # back to the unbroken tree
{
  echo "# What the suite catches: one breakage at a time"
  echo
  echo "Made by \`bash launch/breakage_demo.sh\` at commit $commit on $(date -u +%Y-%m-%d) ($(nproc --all) cores)."
  echo "Each patch of \`tests/breakage/\` breaks one property of the product code with a small,"
  echo "realistic bug (never in tests/); the tree is rebuilt with it and the ctest entries it names are"
  echo "run whole. A property is shown only where its patch makes tests fail; \`breakage_patches_apply\`"
  echo "checks in every run of the suite that each patch still applies. Run the script before resolving"
  echo "an issue that touches a property here, and keep this table current."
  echo
  echo "| patch | what it breaks | ctest entries run | result | the tests that failed |"
  echo "|---|---|---|---|---|"
  cat "$rows"
} > "$TABLE"
echo "[breakage] $TABLE"
exit $status
