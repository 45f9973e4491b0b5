#!/usr/bin/env bash
# What --offload_delayed_update (ZeRO-Offload's delayed parameter update: each step's update reaches
# the model one step late) does to training: the same run exact and delayed, each with SEEDS seeds
# (the weights' initialisation and the data order), on the built-in synthetic corpus; the delayed
# runs' final losses against the exact runs' own spread, in OUT/offload_delay_quality.md.
#
#   bash launch/offload_delay_quality.sh                        # llama_20m, 300 steps, seeds 1 2 3
#   STEPS=100 SEEDS="1 2" LR=1e-3 OUT=/tmp bash launch/offload_delay_quality.sh
#
# Every run: one rank, --offload optimizer, global batch 8 x 128 tokens, lr LR (3e-3) with 30 warm-up steps
# and cosine decay, weight decay 0.1, evaluation every 50 steps on 16 held-out sequences; the delayed
# runs take WARMUP (default 30) exact steps first. The "final training loss" is the mean of the last
# 20 steps' losses; the evaluation loss is the last one. About 3 minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "${BUILD_DIR:-build}/trainer" ] || bash launch/setup.sh
TRAINER=${BUILD_DIR:-build}/trainer
CONFIG=${CONFIG:-configs/llama_20m.json}
STEPS=${STEPS:-300}
SEEDS=${SEEDS:-1 2 3}
WARMUP=${WARMUP:-30}
LR=${LR:-3e-3}
OUT=${OUT:-docs}
RUNS=${RUNS_DIR:-runs/offload_delay_quality}
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] && [ "$STEPS" -ge 40 ] || { echo "offload_delay_quality.sh: STEPS: expected an integer >= 40 (got '$STEPS')" >&2; exit 2; }
[[ "$WARMUP" =~ ^[0-9]+$ ]] || { echo "offload_delay_quality.sh: WARMUP: expected an integer >= 0 (got '$WARMUP')" >&2; exit 2; }
[ -f "$CONFIG" ] || { echo "offload_delay_quality.sh: $CONFIG: no such config file" >&2; exit 2; }

started=$(date +%s)
dirs=()
for seed in $SEEDS; do
  [[ "$seed" =~ ^[0-9]+$ ]] || { echo "offload_delay_quality.sh: SEEDS: expected integers (got '$seed')" >&2; exit 2; }
  for mode in exact delayed; do
    dir=$RUNS/${mode}_seed$seed
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    delay=()
    [ "$mode" = delayed ] && delay=(--offload_delayed_update "$WARMUP")
    printf '[quality] %-20s ' "${mode}_seed$seed"
    if ! OMP_NUM_THREADS=$(nproc) "$TRAINER" --config "$CONFIG" --device cpu --run_dir "$dir" --seed "$seed" \
        --num_training_steps "$STEPS" --warmup_steps 30 --lr "$LR" --weight_decay 0.1 --total_batch_size 8 \
        --batch_size 8 --max_length 128 --eval_every 50 --eval_sequences 16 --offload optimizer \
        ${delay[@]+"${delay[@]}"} >"$dir.log" 2>&1; then
      echo "failed; the last lines of $dir.log:"
      tail -n 20 "$dir.log"
      exit 1
    fi
    rm -f "$dir"/synthetic.rank*.tok
    echo "done ($(($(date +%s) - started)) s so far)"
    dirs+=("$dir")
  done
done

python3 - "$OUT/offload_delay_quality.md" "$CONFIG" "$STEPS" "$WARMUP" "$LR" "${dirs[@]}" <<'EOF'
import json, pathlib, statistics, sys

out, config, steps, warmup, lr, *dirs = sys.argv[1:]
def events(folder, kind):
    return [r for r in map(json.loads, open(pathlib.Path(folder, "metrics.jsonl"))) if r.get("event") == kind]
rows, by_mode = [], {"exact": [], "delayed": []}
for folder in dirs:
    mode, seed = pathlib.Path(folder).name.split("_seed")
    train, evals = events(folder, "train"), events(folder, "eval")
    final = (statistics.fmean(r["loss"] for r in train[-20:]), evals[-1]["eval_loss"])
    by_mode[mode].append(final)
    rows.append(f"| {seed} | {mode} | {final[0]:.4f} | {final[1]:.4f} |")
def spread(values):
    return min(values), max(values), statistics.fmean(values)
summary = []
for index, what in ((0, "final training loss"), (1, "final eval loss")):
    low, high, exact_mean = spread([v[index] for v in by_mode["exact"]])
    d_low, d_high, delayed_mean = spread([v[index] for v in by_mode["delayed"]])
    inside = low <= delayed_mean <= high
    summary.append(f"| {what} | {low:.4f} to {high:.4f} (mean {exact_mean:.4f}) | {d_low:.4f} to {d_high:.4f} "
                   f"(mean {delayed_mean:.4f}) | {delayed_mean - exact_mean:+.4f} | {'yes' if inside else 'no'} |")
text = f"""# Delayed parameter update (`--offload_delayed_update`): what it does to the loss

`bash launch/offload_delay_quality.sh` ({config}, {steps} steps, AdamW, `--offload optimizer` at one
rank, the synthetic corpus, global batch 8 x 128 tokens, lr {lr}, CPU; the delayed runs after {warmup}
exact steps). Final training loss: the mean of the last 20 steps; evaluation: the last evaluation (16
held-out sequences). Each seed changes the initialisation and the data order.

| seed | mode | final training loss | final eval loss |
|---:|---|---:|---:|
""" + "\n".join(rows) + """

| figure | exact runs (their spread over seeds) | delayed runs | delayed - exact (means) | delayed mean inside the exact spread |
|---|---|---|---:|---|
""" + "\n".join(summary) + "\n"
pathlib.Path(out).write_text(text)
print(text)
EOF
