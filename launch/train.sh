#!/usr/bin/env bash
# The main job of the README on a fresh machine: set up, then train the default model on the
# built-in synthetic corpus and show the loss falling. Extra arguments go to the trainer.
#   bash launch/train.sh [trainer flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec build/trainer --config configs/llama_9m.json --run_dir runs/default "$@"
