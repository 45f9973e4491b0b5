#!/usr/bin/env bash
# What each memory technique buys, alone and combined, and how peak memory grows with the context
# length: trains one workload under each technique and combination at 1 rank and at RANKS ranks, and
# a context-length sweep at 1 rank, then `trainer report --techniques` writes OUT/techniques.md and
# OUT/techniques/*.svg (memory/techniques.h says what they hold).
#
#   bash launch/techniques.sh                                  # llama_20m, 1 and 4 ranks, OUT = docs
#   bash launch/techniques.sh configs/llama_9m.json 2          # another model, 1 and 2 ranks
#   OUT=/tmp/techniques STEPS=4 bash launch/techniques.sh
#   REUSE=1 bash launch/techniques.sh                          # keep finished runs of the same command
#
# The global batch is BATCH (default 4) sequences of LENGTH (default 256, at most the config's maximum)
# tokens at every world size: BATCH / ranks per rank where the ranks divide it, else BATCH per rank.
# Technique runs (each at 1 and RANKS ranks, the first the baseline of the shares): fp32 AdamW;
# bf16 mixed; bf16 pure; activation checkpointing; recompute by operation (norm and SwiGLU; norm, MLP
# and attention); the fused optimizer step; the optimizer offloaded; the parameters offloaded, alone
# and with the optimizer;
# bf16 optimizer state; AdamW-SN; GaLore; checkpointing + fused; bf16 pure + checkpointing + fused;
# and all savers together, once with the fused step and GaLore, once with offload and GaLore and once
# with the fused step and bf16 AdamW state, and once with both offloaded and bf16 state (the fused
# step and the optimizer's offload do
# not combine: offload already steps each unit on the host as its gradient lands). Clipping is off in
# every run, so that the fused step's runs do the same maths as the others. Compilation has no
# LibTorch counterpart: the report says so.
#
# Context sweep: fp32 and bf16 mixed at context lengths 128, 256, ... and the config's
# max_position_embeddings (max_sequence_length), one training step and one evaluation batch each.
#
# On CPU (the default without a GPU) the ranks share the cores; with GPUs (nvidia-smi lists them)
# the runs take --device cuda and world sizes above the GPU count are left out with a message. Runs
# go to ${RUNS_DIR:-runs/techniques}/w<ranks>/<name> and ${RUNS_DIR}/context/<dtype>_<length>; their
# synthetic corpora are deleted after each run. About 25 minutes on two cores with the defaults:
# bf16 on a CPU without AVX-512 is slow (bench/cpu_bf16_gemm.py measures why).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "${BUILD_DIR:-build}/trainer" ] || bash launch/setup.sh
TRAINER=${BUILD_DIR:-build}/trainer
CONFIG=${1:-configs/llama_20m.json}
RANKS=${2:-4}
OUT=${OUT:-docs}
RUNS=${RUNS_DIR:-runs/techniques}
STEPS=${STEPS:-3}
BATCH=${BATCH:-4}
SWEEP_BATCH=${SWEEP_BATCH:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # as the tests do, for root on CI

[ -f "$CONFIG" ] || { echo "techniques.sh: $CONFIG: no such config file" >&2; exit 2; }
[[ "$RANKS" =~ ^[1-9][0-9]*$ ]] || { echo "techniques.sh: RANKS: expected a number of ranks >= 1 (got '$RANKS')" >&2; exit 2; }
for value in STEPS BATCH SWEEP_BATCH; do
  [[ "${!value}" =~ ^[1-9][0-9]*$ ]] || { echo "techniques.sh: $value: expected an integer >= 1 (got '${!value}')" >&2; exit 2; }
done
[ "$STEPS" -ge 2 ] || { echo "techniques.sh: STEPS: expected 2 or more (tokens/s is the median of the steps after the first)" >&2; exit 2; }

gpus=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | grep -c '^GPU')
fi
if [ "$gpus" -gt 0 ]; then
  device=cuda
else
  device=cpu
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # up to RANKS ranks share the cores
fi
max_length=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('max_position_embeddings', c.get('max_sequence_length', 0)))" "$CONFIG")
hidden=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['hidden_size'])" "$CONFIG")
LENGTH=${LENGTH:-$((max_length < 256 ? max_length : 256))}
[[ "$LENGTH" =~ ^[1-9][0-9]*$ ]] || { echo "techniques.sh: LENGTH: expected an integer >= 1 (got '$LENGTH')" >&2; exit 2; }
galore=(--optimizer galore_adamw --rank $((hidden / 4)))   # GaLore's ratio: rank 128 for hidden 512

common=(--config "$CONFIG" --device "$device" --warmup_steps 0 --grad_clipping 0 --eval_every 0 --eval_batches 1)
# name | flags
techniques=(
  "baseline_fp32|"
  "bf16_mixed|--dtype bfloat16 --precision mixed"
  "bf16_pure|--dtype bfloat16 --precision pure"
  "checkpointing|--activation_checkpointing"
  "recompute_norm_swiglu|--recompute norm,swiglu"
  "recompute_mlp_attention|--recompute norm,mlp,attention"
  "fused_step|--fuse_optimizer_with_backward"
  "offload|--offload optimizer"
  "offload_parameters|--offload parameters"
  "offload_optimizer_parameters|--offload optimizer,parameters"
  "bf16_state|--optimizer_state_dtype bfloat16"
  "adamw_sn|--optimizer adamw_sn"
  "galore|${galore[*]}"
  "checkpointing_fused|--activation_checkpointing --fuse_optimizer_with_backward"
  "bf16_pure_checkpointing_fused|--dtype bfloat16 --precision pure --activation_checkpointing --fuse_optimizer_with_backward"
  "all_savers_fused_galore|--dtype bfloat16 --precision pure --activation_checkpointing --fuse_optimizer_with_backward ${galore[*]}"
  "all_savers_offload_galore|--dtype bfloat16 --precision pure --activation_checkpointing --offload optimizer ${galore[*]}"
  "all_savers_fused_bf16_state|--dtype bfloat16 --precision pure --activation_checkpointing --fuse_optimizer_with_backward --optimizer_state_dtype bfloat16"
  "all_savers_offload_both_bf16_state|--dtype bfloat16 --precision pure --activation_checkpointing --offload optimizer,parameters --optimizer_state_dtype bfloat16"
)

started=$(date +%s)
# run NAME DIR RANKS FLAGS...: one training run; its log beside its folder; stops the script on failure.
# With REUSE=1 a run whose folder holds a finished run with the same command line is kept.
run() {
  local name=$1 dir=$2 ranks=$3
  shift 3
  local command="mpirun -np $ranks $TRAINER ${common[*]} --run_dir $dir $*"
  if [ "${REUSE:-0}" = 1 ] && [ -f "$dir/command" ] && [ "$(cat "$dir/command")" = "$command" ] &&
     grep -q '"event":"end"' "$dir/metrics.jsonl" 2>/dev/null; then
    printf '[techniques] %-50s kept (REUSE=1)\n' "$name"
    return
  fi
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  printf '[techniques] %-50s ' "$name"
  if ! mpirun --oversubscribe -np "$ranks" "$TRAINER" "${common[@]}" --run_dir "$dir" "$@" >"$dir.log" 2>&1; then
    echo "failed; the last lines of $dir.log:"
    tail -n 20 "$dir.log"
    exit 1
  fi
  rm -f "$dir"/synthetic.rank*.tok
  echo "$command" >"$dir/command"
  echo "done ($(($(date +%s) - started)) s so far)"
}

technique_dirs=()
worlds=(1)
[ "$RANKS" != 1 ] && worlds+=("$RANKS")
for ranks in "${worlds[@]}"; do
  if [ "$device" = cuda ] && [ "$ranks" -gt "$gpus" ]; then
    echo "[techniques] $ranks ranks left out: $gpus GPU(s) here, and NCCL ranks cannot share one"
    continue
  fi
  # The same global batch at every world size where the ranks divide it (strong scaling).
  micro=$BATCH
  [ $((BATCH % ranks)) = 0 ] && micro=$((BATCH / ranks))
  for entry in "${techniques[@]}"; do
    name=${entry%%|*}
    read -r -a flags <<<"${entry#*|}"
    dir=$RUNS/w$ranks/$name
    run "w$ranks/$name" "$dir" "$ranks" --num_training_steps "$STEPS" --batch_size "$micro" --max_length "$LENGTH" \
        "${flags[@]}"
    technique_dirs+=("$dir")
  done
done

sweep_dirs=()
lengths=()
for ((length = 128; length < max_length; length *= 2)); do lengths+=("$length"); done
lengths+=("$max_length")
for dtype in float32 bfloat16; do
  for length in "${lengths[@]}"; do
    dir=$RUNS/context/${dtype}_$length
    run "context/${dtype}_$length" "$dir" 1 --num_training_steps 1 --batch_size "$SWEEP_BATCH" --max_length "$length" \
        --dtype "$dtype"
    sweep_dirs+=("$dir")
  done
done

"$TRAINER" report --techniques "${technique_dirs[@]}" --context_sweep "${sweep_dirs[@]}" --out "$OUT"
echo "[techniques] $((${#technique_dirs[@]} + ${#sweep_dirs[@]})) runs in $(($(date +%s) - started)) s: $OUT/techniques.md, $OUT/techniques/*.svg"
