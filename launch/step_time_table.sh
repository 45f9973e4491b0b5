#!/usr/bin/env bash
# The step-time model against measured runs on this machine (issue 54's validation table): for each row,
# `trainer estimate --profile` predicts the step, and the trainer runs it ROUNDS times; the measured step
# is the median over the rounds of each run's median step time from step SKIP + 1 on (the first steps
# carry the warm-up: oneDNN's first primitives, and the host heap growing to its steady size, a step's
# new pages faulted in for the first several steps: llama_9m's forward takes 0.37 s a micro-batch in
# steps 1-4 and 0.094 s from step 7 at one rank). The links inside the node are probed first with
# build/bench/communicator_bench at the ranks of the 4-rank rows, every collective from 4 KiB to 64 MiB
# (--jsonl), and the rows passed to the estimate as --collective_table (kept beside OUT as
# OUT's name .collectives.jsonl). Each round profiles the units once for each micro-batch (--profile_cache,
# kept as OUT's name .profile.ROUND.json), so a round's rows differ only by what the model prices. Writes a Markdown table (default docs/step_time.md) with the commit, the probe and
# each row's predicted and measured step and phases.
#
#   bash launch/step_time_table.sh [OUT]        # ROUNDS=3 STEPS=16 SKIP=8 BUILD_DIR=build ONLY=REGEX; on an idle machine
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/step_time.md}
BUILD=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-16}
SKIP=${SKIP:-8}
WORK=$(mktemp -d /tmp/step_time_table.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=$(command -v python3)
MODEL="--config configs/llama_9m.json --device cpu --max_length 128 --eval_every 0 --total_batch_size 8"

# The probe: 4 ranks, as the 4-rank rows, every size from 4 KiB to 64 MiB (the units' collectives
# fall between), averaging as the trainer's reductions do, each from buffers out of the caches (64 MiB
# of them a rank, twice the last-level cache here) as training's are. Its rows are the estimate's
# --collective_table; the bus bandwidth at 1 MiB and the latency at 4 KiB are printed beside them.
# Three probes, each row the median of the three (one probe's row of 16 MiB varied by 1.6x on this
# machine).
for probe in 1 2 3; do
  mpirun --oversubscribe -np 4 "$BUILD/bench/communicator_bench" --collectives all_gather,reduce_scatter,all_reduce \
    --min-bytes 4K --max-bytes 64M --step-factor 2 --iters 10 --op average --cold_bytes 64M \
    --jsonl "$WORK/probe.$probe.jsonl" > "$WORK/probe.$probe.txt"
done
"$PY" launch/median_of_probes.py "$WORK"/probe.{1,2,3}.jsonl > "$WORK/table.jsonl"
cp "$WORK/table.jsonl" "${OUT%.md}.collectives.jsonl"
# The wait of each collective for the last rank (ranks sharing cores arrive apart): communicator_bench's
# wait row, each rank computing WAIT_COMPUTE_MS of its own CPU time between collectives (about a unit's
# forward or backward on these rows: a step's compute over its collectives), the median of three.
WAIT_COMPUTE_MS=${WAIT_COMPUTE_MS:-6}
WAIT_US=$(for probe in 1 2 3; do
  mpirun --oversubscribe -np 4 "$BUILD/bench/communicator_bench" --collectives all_reduce --min-bytes 4 --max-bytes 4 \
    --iters 100 --compute_ms "$WAIT_COMPUTE_MS" | sed -n 's/^# collective wait: \([-0-9.]*\) us.*/\1/p'
done | sort -g | sed -n 2p)
WAIT_US=$("$PY" -c "print(max(0.0, float('$WAIT_US')))")
read -r GBS LATENCY_US < <("$PY" - "$WORK/table.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
big = [r["busbw_gbs"] for r in rows if r["bytes"] == 1048576 and r["collective"] != "all_reduce"]
small = [r["seconds"] * 1e6 for r in rows if r["bytes"] == 4096 and r["collective"] != "all_reduce"]
# A ring step's latency: the 4 KiB collective's time over its n - 1 = 3 steps.
print(sum(big) / len(big), sum(small) / len(small) / 3)
EOF
)
echo "[step_time] probe: ${GBS} GB/s bus bandwidth at 1 MiB, ${LATENCY_US} us a ring step, ${WAIT_US} us a collective's wait"

# Every strategy with and without each offload mode (on a CPU there is no PCIe: the modes differ by where
# and when the host step runs and what it copies): at 1 rank, and at 4 ranks for each strategy.
MODES=(
  "|"
  ", --offload optimizer|--offload optimizer"
  ", --offload optimizer,parameters|--offload optimizer,parameters"
  ", --offload_step speculative|--offload optimizer --offload_step speculative"
  ", --offload_step device|--offload optimizer --offload_step device"
  ", --offload_delayed_update 0|--offload optimizer --offload_delayed_update 0"
)
ROWS=()
for strategy in "1 rank|1|--batch_size 4" "4 ranks full_shard|4|--batch_size 2" \
                "4 ranks shard_grad_op|4|--batch_size 2 --sharding shard_grad_op" \
                "4 ranks no_shard|4|--batch_size 2 --sharding no_shard" \
                "4 ranks hybrid_shard 2 x 2|4|--batch_size 2 --sharding hybrid_shard --shard_group_size 2"; do
  IFS='|' read -r name ranks flags <<< "$strategy"
  for mode in "${MODES[@]}"; do
    ROWS+=("$name${mode%%|*}|$ranks|$flags ${mode#*|}")
  done
done
# ONLY=REGEX: the rows whose names match (a partial table, for a look before the whole one).
if [ -n "${ONLY:-}" ]; then
  picked=()
  for row in "${ROWS[@]}"; do [[ "${row%%|*}" =~ $ONLY ]] && picked+=("$row"); done
  ROWS=("${picked[@]}")
fi
{
  echo "# Step time: predicted against measured"
  echo
  echo "Made by \`bash launch/step_time_table.sh\` at commit $(git rev-parse --short HEAD) on $(date -u +%F) ($(nproc --all) cores,"
  echo "OMP_NUM_THREADS=$OMP_NUM_THREADS, llama_9m, 8 x 128 tokens a step, $STEPS steps a run, $ROUNDS runs a row)."
  echo "Links probed with communicator_bench at 4 ranks (\`--jsonl\`, 4 KiB to 64 MiB from cold buffers, each row the median of 3 probes, kept as $(basename "${OUT%.md}").collectives.jsonl):"
  echo "the estimate takes each collective at its measured time for its size (\`--collective_table\`);"
  echo "for reference, ${GBS} GB/s of bus bandwidth at 1 MiB and ${LATENCY_US} us a ring step at 4 KiB."
  echo "Each collective's wait for the last rank: ${WAIT_US} us (\`--collective_wait_us\`; communicator_bench --compute_ms $WAIT_COMPUTE_MS, the median of 3)."
  echo "Predicted: \`trainer estimate --profile 3\` (memory/step_time.h), each micro-batch's units profiled once a round, before the round's runs"
  echo "(\`--profile_cache\`, kept as $(basename "${OUT%.md}").profile.ROUND.json): a round's rows differ by what the model prices, not by the profile's noise;"
  echo "a row's prediction is the median of its rounds' (each beside it). Measured: the median over the runs of each"
  echo "run's median step_time_s after step $SKIP, the runs round by round (round r of every row before round r + 1 of any)."
  echo "Error: predicted / measured - 1. The rows between nodes (the"
  echo "namespace cluster, the link shaped by tc): \`bash bench/multinode_links.sh\`, docs/bench/multinode_links.md;"
  echo "--fit's pick measured against the command: \`bash bench/fit_speed.sh\`, docs/bench/fit_speed.md."
  echo
  echo "| row | predicted s (rounds) | measured s (runs) | error | predicted forward / backward / collectives / optimizer | measured |"
  echo "|---|---:|---:|---:|---|---|"
} > "$WORK/table.md"
# Round by round: round r of every row before round r + 1 of any, so a drift of the machine over the
# table's quarter hour lands on every row alike, not on one row's runs (the 4-rank hybrid row's runs
# once spread 0.33-0.415 s, run back to back). Each round profiles the units first (once for each
# micro-batch, --profile_cache: the rows differ by what the model prices, not by the profile's noise)
# and estimates every row from that profile, before its runs: the machine's speed drifts as much as
# the runs' (one table's single profile put the forward at 0.088 s, its runs took 0.09-0.12 s), so a row's
# prediction is the median of its rounds' as its measured step is the median of its runs.
for round in $(seq "$ROUNDS"); do
  for i in "${!ROWS[@]}"; do
    IFS='|' read -r name ranks flags <<< "${ROWS[$i]}"
    # shellcheck disable=SC2086
    "$BUILD/trainer" estimate $MODEL $flags --world_size "$ranks" --profile 3 --profile_cache "$WORK/profile.$round.json" --intra_node_gbs "$GBS" \
      --link_latency_us "$LATENCY_US" --collective_table "$WORK/table.jsonl" --collective_wait_us "$WAIT_US" --json > "$WORK/estimate.$i.$round.json"
  done
  for i in "${!ROWS[@]}"; do
    IFS='|' read -r name ranks flags <<< "${ROWS[$i]}"
    launch=("$BUILD/trainer")
    [ "$ranks" -gt 1 ] && launch=(mpirun --oversubscribe -np "$ranks" "$BUILD/trainer")
    rm -rf "$WORK/run"
    # shellcheck disable=SC2086
    "${launch[@]}" $MODEL $flags --num_training_steps "$STEPS" --run_dir "$WORK/run" > "$WORK/run.log" 2>&1 \
      || { echo "[step_time] $name: the run failed (see below)" >&2; tail -20 "$WORK/run.log" >&2; exit 1; }
    cp "$WORK/run/metrics.jsonl" "$WORK/metrics.$i.$round.jsonl"
    echo "[step_time] round $round/$ROUNDS, row $((i + 1))/${#ROWS[@]}: $name"
  done
done
for i in "${!ROWS[@]}"; do
  IFS='|' read -r name ranks flags <<< "${ROWS[$i]}"
  "$PY" - "$name" "$WORK" "$ROUNDS" "$SKIP" "$i" >> "$WORK/table.md" <<'EOF'
import json, statistics, sys
name, work, rounds, skip, row = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
phases = ["forward", "backward", "collectives", "optimizer"]
steps, runs, by_phase = [], [], {p: [] for p in phases}
for r in range(1, rounds + 1):
    text = open(f"{work}/estimate.{row}.{r}.json").read()
    steps.append(json.loads(text[text.index('{'):])["step_time"])
    train = [json.loads(l) for l in open(f"{work}/metrics.{row}.{r}.jsonl")]
    train = [e for e in train if e.get("event") == "train" and e["step"] > skip]
    runs.append(statistics.median(e["step_time_s"] for e in train))
    for p in phases:
        by_phase[p].append(statistics.median(e["phase_s"][p] for e in train))
measured = statistics.median(runs)
predicted = statistics.median(s["step_seconds"] for s in steps)
fmt = lambda xs: " / ".join(f"{x:.3g}" for x in xs)
each = ", ".join(f"{s['step_seconds']:.3g}" for s in steps)
print(f"| {name} | {predicted:.3g} ({each}) | {measured:.3g} "
      f"({', '.join(f'{x:.3g}' for x in runs)}) | {100 * (predicted / measured - 1):+.0f} % "
      f"| {fmt(statistics.median(s['phase_s'][p] for s in steps) for p in phases)} | {fmt(statistics.median(by_phase[p]) for p in phases)} |")
EOF
  echo "[step_time] $(tail -1 "$WORK/table.md")"
done
cp "$WORK/table.md" "$OUT"
rm -f "${OUT%.md}".profile.*.json  # a table of more rounds before left more
for round in $(seq "$ROUNDS"); do cp "$WORK/profile.$round.json" "${OUT%.md}.profile.$round.json"; done
echo "[step_time] $OUT"
