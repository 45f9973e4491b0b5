#!/usr/bin/env bash
# Step speed against PyTorch, on the same config, batch, sequence length and thread count, in one run:
#   1 rank:  build/trainer (one process, OMP_NUM_THREADS=2, batch 8 x 128) against transformers'
#            LlamaForCausalLM (sdpa, fp32) with torch.optim.AdamW(fused=True), 2 threads;
#   4 ranks: mpirun -np 4 build/trainer --sharding full_shard (2 x 128 per rank, 1 thread each) against
#            PyTorch FSDP2 (fully_shard per decoder layer, then the root; gloo on CPU), 4 processes.
# Both sides clip the global gradient norm to 1.0 and read the loss every step; lr 1e-3, betas
# 0.9/0.999, eps 1e-8, no weight decay. The PyTorch side is bench/pytorch_peers.py.
#
#   bash bench/train_vs_pytorch.sh            # the table
#   bash bench/train_vs_pytorch.sh --json     # one JSON object per comparison (or JSON=1)
#   STEPS=4 ROUNDS=1 SKIP_4=1 bash bench/train_vs_pytorch.sh
#
# Runs alternate (ours, pytorch, pytorch tuned, ours, ...) for ROUNDS rounds so that a change in the
# machine's load falls on every side. "pytorch tuned" is the same PyTorch run with our trainer's
# host-allocator policy (common/host_memory.h: keep freed memory, no per-block mappings) put in through
# glibc's environment variables: the difference between it and "pytorch" is the allocator, the rest is
# the computation. Each run drops its first 2 steps; a side's figure is the median step time
# over all kept steps of all rounds, with the min-max of the per-round medians beside it. The ratio is
# pytorch / ours: above 1 we are faster. Our times are the trainer's own (RUN_DIR/metrics.jsonl,
# "step_time_s" of rank 0, and its per-phase fields when it records them); the peers time the same
# span (forward, backward, clip, optimizer step, zero_grad, loss read) and record the same fields.
# The bound is the model's FLOPs per step (6N + 12LHT) over a measured fp32 GEMM peak.
#
# Knobs: CONFIG (configs/llama_20m.json), STEPS (10), ROUNDS (3), BATCH_1 (8), BATCH_4 (2 per rank),
# LENGTH (128), SKIP_4 (1 = no 4-rank part), SKIP_1 (1 = no 1-rank part), RUNS_DIR (runs/train_vs_pytorch), BUILD_DIR, TRAINER_PYTHON.
# About 8 minutes on two idle cores with the defaults. Progress goes
# to stderr, the comparison to stdout; every run's files stay in RUNS_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
TRAINER=${BUILD_DIR:-build}/trainer
PY=${TRAINER_PYTHON:-$HOME/.cache/llama-trainer/venv-torch-2.11.0/bin/python}
PEERS=bench/pytorch_peers.py
CONFIG=${CONFIG:-configs/llama_20m.json}
STEPS=${STEPS:-10}
ROUNDS=${ROUNDS:-3}
BATCH_1=${BATCH_1:-8}
BATCH_4=${BATCH_4:-2}
LENGTH=${LENGTH:-128}
SKIP_4=${SKIP_4:-0}
SKIP_1=${SKIP_1:-0}
JSON=${JSON:-0}
RUNS=${RUNS_DIR:-runs/train_vs_pytorch}
THREADS_1=2   # the 1-rank comparison: 2 threads in one process
THREADS_4=1   # the 4-rank comparison: 1 thread in each of 4 processes
# Our allocator policy, for the tuned PyTorch side (mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD INT_MAX).
TUNED_ENV="MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647"
case "${1:-}" in
  --json) JSON=1 ;;
  "") ;;
  *) echo "usage: bash bench/train_vs_pytorch.sh [--json]" >&2; exit 2 ;;
esac
[ -x "$TRAINER" ] || { echo "no $TRAINER: build first (bash launch/setup.sh)" >&2; exit 2; }
"$PY" -c "import torch, transformers" 2>/dev/null ||
  { echo "no torch + transformers in $PY: run bash launch/setup.sh or set TRAINER_PYTHON" >&2; exit 2; }
(( STEPS > 2 )) || { echo "STEPS must exceed the 2 warm-up steps (got $STEPS)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # as the tests do, for root on CI

say() { echo "[train_vs_pytorch] $*" >&2; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

# The machine, once: the JSON records carry it and the table opens with it.
cpu_model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//; s/"/ /g')
torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
machine_line="$(nproc) cores, ${cpu_model:-unknown CPU}, torch $torch_version"

# Our side: one process at 1 rank (a world of one needs no mpirun), mpirun above. Rank 0's records.
train_args=(--config "$CONFIG" --device cpu --max_length "$LENGTH" --num_training_steps "$STEPS"
            --warmup_steps 0 --scheduler constant --lr 1e-3 --adam_beta1 0.9 --adam_beta2 0.999
            --adam_eps 1e-8 --weight_decay 0 --grad_clipping 1.0 --optimizer adamw --dtype float32
            --sharding full_shard --log_every 1 --eval_every 0 --eval_batches 1)
run_ours() {  # ranks threads batch dir
  local ranks=$1 threads=$2 batch=$3 dir=$4 launcher=()
  (( ranks > 1 )) && launcher=(mpirun --oversubscribe -np "$ranks")
  rm -rf "$dir"
  mkdir -p "$dir"
  if ! OMP_NUM_THREADS=$threads "${launcher[@]}" "$TRAINER" "${train_args[@]}" --batch_size "$batch" \
         --run_dir "$dir" >"$dir.log" 2>&1; then
    say "ours failed; the last lines of $dir.log:"
    tail -n 20 "$dir.log" >&2
    exit 1
  fi
  rm -f "$dir"/synthetic.rank*.tok
}

# Their side: the peer writes the same JSONL shape to OUT, and checks its model against our run's.
# A peer that dies is run once more: its first log is kept as OUT.died1.log. Dying twice is status 1,
# which the comparison reports for that round instead of dropping the whole table. (FSDP2 over gloo
# used to die in a rank at exit, "terminate called without an active exception", SIGABRT, in 8 of 23
# runs: gloo's worker thread freed the last all-reduce's tensors during the interpreter's finalization.
# The peer now leaves with os._exit after a barrier, bench/pytorch_peers.py; 0 of 15 since.)
run_theirs() {  # ranks threads batch out ours_metrics [environment]
  local ranks=$1 threads=$2 batch=$3 out=$4 ours_metrics=$5 environment=${6:-} launcher=("$PY") mode=eager attempt
  (( ranks > 1 )) && launcher=("$PY" -m torch.distributed.run --standalone --nproc_per_node "$ranks") mode=fsdp2
  for attempt in 1 2; do
    # shellcheck disable=SC2086 # the environment is a list of NAME=value words
    if env $environment OMP_NUM_THREADS=$threads "${launcher[@]}" "$PEERS" "$mode" --config "$CONFIG" --steps "$STEPS" \
         --batch "$batch" --length "$LENGTH" --threads "$threads" --out "$out" \
         --check_against "$ours_metrics" >"$out.log" 2>&1; then
      return 0
    fi
    say "pytorch died (attempt $attempt of 2); the last lines of $out.log:"
    tail -n 8 "$out.log" >&2
    cp "$out.log" "$out.died$attempt.log"
    rm -f "$out"
  done
  return 1
}

# The bound's denominator: best fp32 GEMM GFLOP/s at the cores a comparison uses.
gemm_peak() {  # threads
  OMP_NUM_THREADS=$1 "$PY" "$PEERS" peak --threads "$1"
}

# One comparison: ROUNDS alternations, then the summary (the table, or one JSON object).
compare() {  # name ranks threads batch ours_label pytorch_label
  local name=$1 ranks=$2 threads=$3 batch=$4 ours_label=$5 pytorch_label=$6
  local dir=$RUNS/$name ours=() theirs=() tuned=() load_before peak_threads peak_gflops
  local died=() died_tuned=() retried=() retried_tuned=()  # rounds where a peer died twice, or once
  mkdir -p "$dir"
  load_before=$(load)
  peak_threads=$(( ranks * threads < $(nproc) ? ranks * threads : $(nproc) ))
  peak_gflops=$(gemm_peak "$peak_threads")
  say "$name: fp32 GEMM peak $peak_gflops GFLOP/s at $peak_threads thread(s) (load $load_before)"
  for round in $(seq 1 "$ROUNDS"); do
    say "$name round $round/$ROUNDS: ours (load $(load))"
    run_ours "$ranks" "$threads" "$batch" "$dir/ours_$round"
    ours+=("$dir/ours_$round/metrics.jsonl")
    say "$name round $round/$ROUNDS: pytorch (load $(load))"
    rm -f "$dir/pytorch_$round.jsonl".died*.log
    if run_theirs "$ranks" "$threads" "$batch" "$dir/pytorch_$round.jsonl" "$dir/ours_$round/metrics.jsonl"; then
      theirs+=("$dir/pytorch_$round.jsonl")
    else
      died+=("$round")
    fi
    [ -e "$dir/pytorch_$round.jsonl.died1.log" ] && [ -e "$dir/pytorch_$round.jsonl" ] && retried+=("$round")
    say "$name round $round/$ROUNDS: pytorch with our allocator policy (load $(load))"
    rm -f "$dir/pytorch_tuned_$round.jsonl".died*.log
    if run_theirs "$ranks" "$threads" "$batch" "$dir/pytorch_tuned_$round.jsonl" "$dir/ours_$round/metrics.jsonl" \
         "$TUNED_ENV"; then
      tuned+=("$dir/pytorch_tuned_$round.jsonl")
    else
      died_tuned+=("$round")
    fi
    [ -e "$dir/pytorch_tuned_$round.jsonl.died1.log" ] && [ -e "$dir/pytorch_tuned_$round.jsonl" ] &&
      retried_tuned+=("$round")
  done
  # The peak again after the rounds: a shared machine can steal a 3-second window; the best one counts.
  peak_gflops=$(printf '%s\n' "$peak_gflops" "$(gemm_peak "$peak_threads")" | sort -g | tail -n 1)
  local machine
  machine=$(printf '{"nproc": %d, "cpu": "%s", "torch": "%s", "load_before": "%s", "load_after": "%s"}' \
            "$(nproc)" "$cpu_model" "$torch_version" "$load_before" "$(load)")
  local json_flag=()
  [ "$JSON" = 1 ] && json_flag=(--json)
  "$PY" "$PEERS" summarize --comparison "$name" --config "$CONFIG" --ranks "$ranks" --batch "$batch" \
    --length "$LENGTH" --threads "$threads" --steps "$STEPS" --ours "${ours[@]}" --theirs ${theirs[@]+"${theirs[@]}"} \
    --theirs_tuned "${tuned[@]}" --tuned_env "$TUNED_ENV" \
    --died "${died[*]}" --died_tuned "${died_tuned[*]}" --retried "${retried[*]}" --retried_tuned "${retried_tuned[*]}" \
    --ours_label "$ours_label" --pytorch_label "$pytorch_label" --machine "$machine" \
    --peak_gflops "$peak_gflops" \
    --peak_threads "$peak_threads" "${json_flag[@]}"
  [ "$JSON" = 1 ] || echo "   load average before / after: $load_before / $(load)"
}

started=$(date +%s)
say "$machine_line; $CONFIG, $STEPS steps x $ROUNDS rounds; load $(load)"
[ "$JSON" = 1 ] || echo "machine: $machine_line"
if [ "$SKIP_1" != 1 ]; then
  compare 1rank_vs_eager_fused_adamw 1 "$THREADS_1" "$BATCH_1" "ours (1 process)" "pytorch eager"
fi
if [ "$SKIP_4" != 1 ]; then
  compare 4rank_vs_fsdp2 4 "$THREADS_4" "$BATCH_4" "ours (mpirun -np 4, full_shard)" "pytorch FSDP2"
fi
say "done in $(($(date +%s) - started)) s (load $(load)); runs in $RUNS"
