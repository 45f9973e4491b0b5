#!/usr/bin/env bash
# Records the behaviour of the trainer as it is built now, so that a change that reshapes the code can
# show it changed nothing: every optimizer x fp32 / bf16 mixed / bf16 pure x 1, 2, 4 ranks x each
# sharding strategy (81 short CPU runs of llama_micro with gradient accumulation, clipping, weight
# decay, evaluation and GaLore refreshes inside the run). Each run keeps its metrics.jsonl (losses,
# gradient norms, eval losses) and its final checkpoint (parameters and optimizer state).
#
#   bash launch/record_runs.sh /tmp/before            # with build/trainer
#   BUILD_DIR=build-old bash launch/record_runs.sh /tmp/before
#   python launch/compare_runs.py /tmp/before /tmp/after   # fp32 bitwise, bf16 within a stated bound
#
# About a minute on two cores. ONLY=<substring> records the runs whose name contains it; EXTRA="flags"
# adds flags to every run (e.g. EXTRA="--pad_matmul_dims on", compared against runs without them).
set -euo pipefail
cd "$(dirname "$0")/.."
TRAINER=${BUILD_DIR:-build}/trainer
OUT=${1:?usage: bash launch/record_runs.sh OUT_DIR}
[ -x "$TRAINER" ] || { echo "no $TRAINER: build first (bash launch/setup.sh)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1  # up to 4 ranks share the cores; one thread keeps the sums' order fixed

# 16 sequences per step: accumulation of 8, 4 and 2 micro-batches at 1, 2 and 4 ranks.
common=(--config configs/llama_micro.json --device cpu --num_training_steps 6 --warmup_steps 1
        --max_length 32 --batch_size 2 --total_batch_size 16 --lr 3e-3 --weight_decay 0.1
        --grad_clipping 0.5 --eval_every 3 --eval_batches 2 --log_every 6)
mkdir -p "$OUT"
started=$(date +%s)
count=0
for optimizer in adamw adamw_sn galore_adamw; do
  extra=()
  # Rank 8 of llama_micro's 32-wide matrices, refreshed at steps 1 and 4.
  [ "$optimizer" = galore_adamw ] && extra=(--rank 8 --update_proj_gap 3)
  for precision in float32 bfloat16_mixed bfloat16_pure; do
    case $precision in
      float32) dtype=(--dtype float32) ;;
      bfloat16_mixed) dtype=(--dtype bfloat16 --precision mixed) ;;
      bfloat16_pure) dtype=(--dtype bfloat16 --precision pure) ;;
    esac
    for ranks in 1 2 4; do
      for sharding in full_shard shard_grad_op no_shard; do
        name=${optimizer}_${precision}_w${ranks}_${sharding}
        [[ -n "${ONLY:-}" && "$name" != *"$ONLY"* ]] && continue
        dir=$OUT/$name
        rm -rf "$dir"
        mkdir -p "$dir"
        if ! mpirun --oversubscribe -np "$ranks" "$TRAINER" "${common[@]}" --optimizer "$optimizer" \
               "${dtype[@]}" --sharding "$sharding" --run_dir "$dir/run" --save_dir "$dir/ckpt" \
               "${extra[@]}" ${EXTRA:-} >"$dir/log" 2>&1; then
          echo "[record_runs] $name failed; the last lines of $dir/log:" >&2
          tail -n 20 "$dir/log" >&2
          exit 1
        fi
        rm -f "$dir"/run/synthetic.rank*.tok
        count=$((count + 1))
      done
    done
  done
  echo "[record_runs] $optimizer done ($count runs, $(($(date +%s) - started)) s)"
done
git rev-parse HEAD > "$OUT/commit" 2>/dev/null || true
echo "[record_runs] $count runs in $(($(date +%s) - started)) s under $OUT"
