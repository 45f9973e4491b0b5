#!/usr/bin/env bash
# What --offload_delayed_update (ZeRO-Offload's delayed parameter update: each step's update reaches
# the model one step late) does to training: the same run exact and delayed, each with SEEDS seeds
# (the weights' initialisation and the data order), on the built-in synthetic corpus; the delayed
# runs' final losses against the exact runs' own spread, in OUT/offload_delay_quality.md.
#
#   bash launch/offload_delay_quality.sh                        # llama_20m, 300 steps, seeds 1 2 3
#   STEPS=100 SEEDS="1 2" LR=1e-3 OUT=/tmp bash launch/offload_delay_quality.sh
#
# The recipe is launch/quality_runs.sh's (lr LR, 3e-3 by default); every run here is one rank with
# --offload optimizer and all of the machine's cores, and the delayed runs take WARMUP (default 30)
# exact steps first. About 3 minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/quality_runs.sh
quality_setup offload_delay_quality.sh
SEEDS=${SEEDS:-1 2 3}
WARMUP=${WARMUP:-30}
RUNS=${RUNS_DIR:-runs/offload_delay_quality}
[[ "$WARMUP" =~ ^[0-9]+$ ]] || { echo "offload_delay_quality.sh: WARMUP: expected an integer >= 0 (got '$WARMUP')" >&2; exit 2; }

for seed in $SEEDS; do
  [[ "$seed" =~ ^[0-9]+$ ]] || { echo "offload_delay_quality.sh: SEEDS: expected integers (got '$seed')" >&2; exit 2; }
  for mode in exact delayed; do
    delay=()
    [ "$mode" = delayed ] && delay=(--offload_delayed_update "$WARMUP")
    quality_run "$RUNS/${mode}_seed$seed" "$(nproc)" -- --seed "$seed" --batch_size 8 --offload optimizer \
      ${delay[@]+"${delay[@]}"}
  done
done

python3 - "$OUT/offload_delay_quality.md" "$CONFIG" "$STEPS" "$WARMUP" "$LR" "${dirs[@]}" <<'PY'
import pathlib, statistics, sys
sys.path.insert(0, "launch")
from quality_summary import final_losses

out, config, steps, warmup, lr, *dirs = sys.argv[1:]
rows, by_mode = [], {"exact": [], "delayed": []}
for folder in dirs:
    mode, seed = pathlib.Path(folder).name.split("_seed")
    final = final_losses(folder)
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
PY
