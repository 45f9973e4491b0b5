#!/usr/bin/env bash
# What bf16 optimizer state (--optimizer_state_dtype bfloat16) does to training: the same run with
# float32 and with bfloat16 moments, at 1 rank and at RANKS ranks, on the built-in synthetic corpus,
# and the final training and evaluation losses side by side in OUT/state_dtype_quality.md.
#
#   bash launch/state_dtype_quality.sh                       # llama_20m, 300 steps, 1 and 4 ranks
#   STEPS=100 RANKS=2 OUT=/tmp bash launch/state_dtype_quality.sh
#   OPTIMIZER="--optimizer adamw_sn" bash launch/state_dtype_quality.sh
#
# Every run: global batch 8 x 128 tokens, lr 3e-3 with 30 warm-up steps and cosine decay, weight
# decay 0.1, evaluation every 50 steps on 16 held-out sequences; each rank takes its share of the
# machine's cores for LibTorch's threads. The "final training loss" is the
# mean of the last 20 steps' losses (one step's loss is noisy); the evaluation loss is the last one.
# About 15 minutes on two cores with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "${BUILD_DIR:-build}/trainer" ] || bash launch/setup.sh
TRAINER=${BUILD_DIR:-build}/trainer
CONFIG=${CONFIG:-configs/llama_20m.json}
STEPS=${STEPS:-300}
RANKS=${RANKS:-4}
OUT=${OUT:-docs}
RUNS=${RUNS_DIR:-runs/state_dtype_quality}
read -r -a optimizer <<<"${OPTIMIZER:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] && [ "$STEPS" -ge 40 ] || { echo "state_dtype_quality.sh: STEPS: expected an integer >= 40 (got '$STEPS')" >&2; exit 2; }
[[ "$RANKS" =~ ^[1-9][0-9]*$ ]] && [ $((8 % RANKS)) = 0 ] || { echo "state_dtype_quality.sh: RANKS: expected 1, 2, 4 or 8 (a share of the global batch of 8; got '$RANKS')" >&2; exit 2; }
[ -f "$CONFIG" ] || { echo "state_dtype_quality.sh: $CONFIG: no such config file" >&2; exit 2; }

started=$(date +%s)
dirs=()
for ranks in 1 "$RANKS"; do
  for dtype in float32 bfloat16; do
    dir=$RUNS/w${ranks}_$dtype
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    printf '[quality] %-28s ' "w${ranks}_$dtype"
    if ! OMP_NUM_THREADS=$((cores / ranks > 0 ? cores / ranks : 1)) \
        mpirun --oversubscribe -np "$ranks" "$TRAINER" --config "$CONFIG" --device cpu --run_dir "$dir" \
        --num_training_steps "$STEPS" --warmup_steps 30 --lr 3e-3 --weight_decay 0.1 --total_batch_size 8 \
        --batch_size $((8 / ranks)) --max_length 128 --eval_every 50 --eval_sequences 16 \
        --optimizer_state_dtype "$dtype" ${optimizer[@]+"${optimizer[@]}"} >"$dir.log" 2>&1; then
      echo "failed; the last lines of $dir.log:"
      tail -n 20 "$dir.log"
      exit 1
    fi
    rm -f "$dir"/synthetic.rank*.tok
    echo "done ($(($(date +%s) - started)) s so far)"
    dirs+=("$dir")
  done
  [ "$RANKS" = 1 ] && break
done

python3 - "$OUT/state_dtype_quality.md" "$CONFIG" "$STEPS" "${OPTIMIZER:-}" "${dirs[@]}" <<'EOF'
import json, pathlib, statistics, sys

out, config, steps, optimizer, *dirs = sys.argv[1:]
def events(folder, kind):
    return [r for r in map(json.loads, open(pathlib.Path(folder, "metrics.jsonl"))) if r.get("event") == kind]
rows, by = [], {}
for folder in dirs:
    train, evals = events(folder, "train"), events(folder, "eval")
    start = events(folder, "start")[0]
    name = pathlib.Path(folder).name
    ranks, dtype = name[1:].split("_", 1)
    final_train = statistics.fmean(r["loss"] for r in train[-20:])
    by[(ranks, dtype)] = (final_train, evals[-1]["eval_loss"], start.get("optimizer_state_bytes"))
for (ranks, dtype), (train, evaluation, state) in by.items():
    base = by.get((ranks, "float32"))
    diff = "" if dtype == "float32" else f"{train - base[0]:+.4f} / {evaluation - base[1]:+.4f}"
    rows.append(f"| {ranks} | {dtype} | {train:.4f} | {evaluation:.4f} | {diff} | {state / 2**20:.1f} |")
text = f"""# bf16 optimizer state: what it does to the loss

`bash launch/state_dtype_quality.sh` ({config}, {steps} steps{', ' + optimizer if optimizer else ', AdamW'}, the synthetic corpus,
global batch 8 x 128 tokens, lr 3e-3, CPU). Final training loss: the mean of the last 20 steps; evaluation:
the last evaluation (16 held-out sequences). Difference: bf16 minus float32 at the same world size.

| ranks | optimizer state | final training loss | final eval loss | bf16 - fp32 (train / eval) | state per rank (MiB) |
|---:|---|---:|---:|---|---:|
""" + "\n".join(rows) + "\n"
pathlib.Path(out).write_text(text)
print(text)
EOF
