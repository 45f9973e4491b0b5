# The training-quality studies' shared recipe (sourced by launch/state_dtype_quality.sh and
# launch/offload_delay_quality.sh): one short run of CONFIG on the built-in synthetic corpus, the
# same for every side of a comparison, and the summary's reading of its metrics (quality_summary.py).
#
# Every run: STEPS steps (>= 40), global batch 8 x 128 tokens, lr LR (3e-3) with 30 warm-up steps and
# cosine decay, weight decay 0.1, evaluation every 50 steps on 16 held-out sequences.
#   quality_setup NAME                       checks STEPS and CONFIG (exit 2 naming NAME), sets TRAINER
#   quality_run DIR THREADS LAUNCH... -- FLAGS...
#                                            runs `LAUNCH... TRAINER <recipe> FLAGS...` into DIR (its log
#                                            DIR.log), drops the corpus copies, appends DIR to `dirs`
set -euo pipefail

quality_setup() {
  QUALITY_NAME=$1
  [ -x "${BUILD_DIR:-build}/trainer" ] || bash launch/setup.sh
  TRAINER=${BUILD_DIR:-build}/trainer
  CONFIG=${CONFIG:-configs/llama_20m.json}
  STEPS=${STEPS:-300}
  LR=${LR:-3e-3}
  OUT=${OUT:-docs}
  [[ "$STEPS" =~ ^[1-9][0-9]*$ ]] && [ "$STEPS" -ge 40 ] ||
    { echo "$QUALITY_NAME: STEPS: expected an integer >= 40 (got '$STEPS')" >&2; exit 2; }
  [ -f "$CONFIG" ] || { echo "$QUALITY_NAME: $CONFIG: no such config file" >&2; exit 2; }
  QUALITY_STARTED=$(date +%s)
  dirs=()
}

quality_run() {
  local dir=$1 threads=$2
  shift 2
  local launch=()
  while [ "$1" != -- ]; do launch+=("$1"); shift; done
  shift
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  printf '[quality] %-28s ' "$(basename "$dir")"
  if ! OMP_NUM_THREADS=$threads ${launch[@]+"${launch[@]}"} "$TRAINER" --config "$CONFIG" --device cpu --run_dir "$dir" \
      --num_training_steps "$STEPS" --warmup_steps 30 --lr "$LR" --weight_decay 0.1 --total_batch_size 8 \
      --max_length 128 --eval_every 50 --eval_sequences 16 "$@" >"$dir.log" 2>&1; then
    echo "failed; the last lines of $dir.log:"
    tail -n 20 "$dir.log"
    exit 1
  fi
  rm -f "$dir"/synthetic.rank*.tok
  echo "done ($(($(date +%s) - QUALITY_STARTED)) s so far)"
  dirs+=("$dir")
}
