#!/usr/bin/env bash
# The memory comparison anyone can rerun on a CPU machine: trains a CPU-sized model for a few steps
# under every configuration (AdamW, AdamwSN, GaLore x fp32, bf16 x 1, 2, 4 ranks x full_shard,
# shard_grad_op, no_shard; one strategy at 1 rank: 42 runs), then `trainer report` over all of them:
# OUT/memory_report.md (peak memory per rank by category, tokens/s, final loss, estimate beside
# measured) and OUT/memory/*.svg.
#
#   bash launch/memory_report.sh            # OUT = docs: docs/memory_report.md, docs/memory/*.svg
#   bash launch/memory_report.sh /tmp/mem   # elsewhere
#   CONFIG=configs/llama_20m.json STEPS=6 bash launch/memory_report.sh
#
# Runs go to ${RUNS_DIR:-runs/memory_report}/<optimizer>_<dtype>_<sharding>_w<ranks> (their synthetic
# corpora are deleted after each run). About 5 minutes on two busy cores with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "${BUILD_DIR:-build}/trainer" ] || bash launch/setup.sh
TRAINER=${BUILD_DIR:-build}/trainer
OUT=${1:-docs}
RUNS=${RUNS_DIR:-runs/memory_report}
CONFIG=${CONFIG:-configs/llama_9m.json}
STEPS=${STEPS:-6}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # as the tests do, for root on CI
export OMP_NUM_THREADS=1                                            # up to 4 ranks share the cores

# Small and short: the per-rank micro-batch is fixed, so the global batch grows with the ranks.
# GaLore at rank 32 (llama_9m's hidden size is 128: the default 128 would be full rank).
common=(--config "$CONFIG" --device cpu --num_training_steps "$STEPS" --warmup_steps 1 --lr 3e-3
        --batch_size 4 --max_length 128 --eval_every 0 --eval_batches 1 --log_every "$STEPS")
mkdir -p "$RUNS"
started=$(date +%s)
run_dirs=()
for optimizer in adamw adamw_sn galore_adamw; do
  extra=()
  [ "$optimizer" = galore_adamw ] && extra=(--rank 32)
  for dtype in float32 bfloat16; do
    for ranks in 1 2 4; do
      strategies=(full_shard shard_grad_op no_shard)
      [ "$ranks" = 1 ] && strategies=(full_shard)
      for sharding in "${strategies[@]}"; do
        name=${optimizer}_${dtype}_${sharding}_w${ranks}
        dir=$RUNS/$name
        rm -rf "$dir"
        printf '[memory_report] %-40s ' "$name"
        if ! mpirun --oversubscribe -np "$ranks" "$TRAINER" "${common[@]}" --optimizer "$optimizer" \
               --dtype "$dtype" --sharding "$sharding" --run_dir "$dir" "${extra[@]}" >"$dir.log" 2>&1; then
          echo "failed; the last lines of $dir.log:"
          tail -n 20 "$dir.log"
          exit 1
        fi
        rm -f "$dir"/synthetic.rank*.tok
        echo "done ($(($(date +%s) - started)) s so far)"
        run_dirs+=("$dir")
      done
    done
  done
done
"$TRAINER" report "${run_dirs[@]}" --out "$OUT"
echo "[memory_report] ${#run_dirs[@]} runs in $(($(date +%s) - started)) s: $OUT/memory_report.md, $OUT/memory/*.svg"
