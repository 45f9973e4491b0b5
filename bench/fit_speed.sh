#!/usr/bin/env bash
# Does --fit name a faster run than the command as given? (issue 54) On the namespace cluster
# (tests/multinode): 2 nodes x 2 CPU ranks, the link between the nodes shaped by tc to RATE, a
# full_shard command that fits the budget as it is. `trainer estimate --fit --profile` ranks what fits
# by the predicted step; then the command as given, the named flags and every other sharding choice
# of the fit's table run side by side, ROUNDS rounds each, and the table puts each one's predicted
# step beside the measured one (the median over the steps after the first, then over the rounds;
# min-max beside). Needs root (network namespaces).
#   bash bench/fit_speed.sh [OUT.md] [CONFIG]        (default docs/bench/fit_speed.md, llama_9m)
#   RATE=1gbit ROUNDS=3 STEPS=5 bash bench/fit_speed.sh ...
# No set -e: the cluster's clean-up (namespaces.sh, on EXIT) must run every command of it.
set -u
cd "$(dirname "$0")/.." || exit 2
out=$(readlink -f "${1:-docs/bench/fit_speed.md}")
config=${2:-llama_9m}
rate=${RATE:-200mbit}
rounds=${ROUNDS:-3}
steps=${STEPS:-5}
source "$(dirname "$0")/../tests/cluster_test_lib.sh" build/trainer "${MPIEXEC:-mpirun}"
source "$SOURCE/tests/multinode/namespaces.sh"
cluster_start 10.81.0 2
cluster_shape "$rate"
gbs=$(rate_gbs "$rate")
# The run: the multi-node bench's shape (tests/multinode/link_bytes_test.sh), 2 micro-batches a step.
shape=(--config "$SOURCE/configs/$config.json" --device cpu --max_length 32 --batch_size 2 --total_batch_size 16)
# Each node of the cluster is half of this machine: its cores are the machine's over the two nodes.
fit_flags=(--world_size 4 --ranks_per_node 2 --host_cores "$(node_cores)" --inter_node_gbs "$gbs" --profile 2
           --fit --memory_budget_gib 2)
"$TRAINER" estimate "${shape[@]}" "${fit_flags[@]}" > "$work/fit.txt" 2>&1 || fail "estimate --fit: $(tail -n 5 "$work/fit.txt")"
# The command as given, the named flags, and the table's other rows that change only the sharding.
"$PY" - "$work/fit.txt" > "$work/configs.tsv" <<'PY' || fail "no table in the fit's output: $(cat "$work/fit.txt")"
import re, sys
text = open(sys.argv[1]).read()
command = float(re.search(r"The command as it is: predicted ([0-9.e+-]+) s a step", text).group(1))
print(f"the command as given\t-\t{command}")  # "-": no flags (read would merge two tabs)
rows = [line.split(" | ") for line in text.splitlines() if re.match(r"\| \d+ \| ", line)]
seen = set()
for number, (first, flags, peak, host, step, tokens, against) in ((r[0][2:], r) for r in rows):
    if number != "1" and re.search(r"--(optimizer_state_dtype|recompute|activation_checkpointing|batch_size)", flags):
        continue
    if flags in seen:
        continue
    seen.add(flags)
    print(f"--fit's #{number}{' (named)' if number == '1' else ''}\t{flags}\t{step}")
PY
run() {  # NAME FLAGS...
  local name=$1
  shift
  timeout 600 "$MPIEXEC" --hostfile "$(hostfile 2 2)" -np 4 "${across[@]}" "$TRAINER" "${shape[@]}" \
    --eval_every 0 --eval_batches 1 --warmup_steps 0 --num_training_steps "$steps" "$@" \
    --run_dir "$work/$name" < /dev/null > "$work/$name.log" 2>&1 || fail "$name: $(tail -n 5 "$work/$name.log")"
}
index=0
while IFS=$'\t' read -r label flags predicted; do
  index=$((index + 1))
  for round in $(seq 1 "$rounds"); do
    [ "$flags" = - ] && flags=""
    echo "[fit_speed] $label ${flags:-(the command)}: round $round of $rounds"
    # shellcheck disable=SC2086  # the flags are words
    run "config${index}_$round" $flags
  done
done < "$work/configs.tsv"
{
  echo "# Does --fit name a faster run? bench/fit_speed.sh"
  echo
  dirty=$(git -C "$SOURCE" status --porcelain --untracked-files=no | grep -q . && echo " with uncommitted changes" || true)
  echo "Made $(date -u +%Y-%m-%d) at commit $(git -C "$SOURCE" rev-parse --short HEAD)$dirty on this machine ($(nproc --all) cores), $config,"
  echo "4 ranks on 2 namespace nodes (tests/multinode), the link between them shaped to $rate by tc, micro-batch"
  echo "2 x 32 tokens, 2 micro-batches a step, $rounds rounds of $steps steps a row. The command:"
  echo "\`trainer ${shape[*]/$SOURCE\//} --sharding full_shard\`; the fit:"
  echo "\`trainer estimate ... ${fit_flags[*]}\`. Measured: the step records' step_time_s, the median over the"
  echo "steps after the first, then over the rounds (min-max beside)."
  echo
  echo "| run | flags added | predicted s/step | measured s/step (min-max) | predicted / measured |"
  echo "|---|---|---:|---:|---:|"
  "$PY" - "$work" "$rounds" "$work/configs.tsv" <<'PY'
import json, statistics, sys
work, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for index, line in enumerate(open(configs), start=1):
    label, flags, predicted = line.rstrip("\n").split("\t")
    flags = "" if flags == "-" else flags
    times = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l) for l in open(f"{work}/config{index}_{r}/metrics.jsonl")]
        steps = [s for s in steps if s.get("event") == "train"][1:]
        times.append(statistics.median(s["step_time_s"] for s in steps))
    measured = statistics.median(times)
    print(f"| {label} | {('`' + flags + '`') if flags else '(none)'} | {float(predicted):.3f} | {measured:.3f} "
          f"({min(times):.3f}-{max(times):.3f}) | {float(predicted) / measured:.2f} |")
PY
  echo
  echo "The fit's own output:"
  echo
  echo '```'
  grep -v "^\[" "$work/fit.txt" | sed -n '1,30p'
  echo '```'
} > "$out"
echo "wrote $out"
