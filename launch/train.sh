#!/usr/bin/env bash
# The main job of the README on a fresh machine: set up, then train with four ranks under mpirun,
# parameters, gradients and optimizer state sharded FSDP-style (full_shard). On GPUs each rank takes
# its local GPU (NCCL); without GPUs the ranks run on CPU (MPI). Extra arguments go to the trainer.
#   bash launch/train.sh [trainer flags]
#   RANKS=8 CONFIG=configs/llama_350m.json bash launch/train.sh --batch_size 16
# Defaults: with GPUs, one rank per visible GPU (NCCL cannot put two ranks on one GPU) and
# CONFIG=configs/llama_350m.json; without, RANKS=4 on CPU and configs/llama_9m.json with a small batch
# so the CPU run shows the loss falling in a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  # CUDA_VISIBLE_DEVICES, when set, is what the ranks see: count its entries, else every GPU.
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
  else
    gpus=$(nvidia-smi -L | grep -c '^GPU')
  fi
  RANKS=${RANKS:-$gpus}
  CONFIG=${CONFIG:-configs/llama_350m.json}
  defaults=(--batch_size 8 --max_length 256 --num_training_steps 1000 --warmup_steps 100
            --dtype bfloat16)
else
  RANKS=${RANKS:-4}
  CONFIG=${CONFIG:-configs/llama_9m.json}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  defaults=(--batch_size 4 --max_length 128 --num_training_steps 100 --lr 3e-3
            --eval_every 25)
fi
# launch/mpirun.sh: a SIGTERM or Ctrl-C to this job reaches every rank, which saves (with --save_dir)
exec bash launch/mpirun.sh --oversubscribe -np "$RANKS" build/trainer --config "$CONFIG" --run_dir runs/default \
     "${defaults[@]}" "$@"
