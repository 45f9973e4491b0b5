#!/usr/bin/env bash
# Installs the Python peers of build/bench/adamw_bench into the project's venv: DeepSpeed, with its
# CPU Adam op (DeepSpeedCPUAdam) built now for the CPU accelerator, so the bench times the step and
# not a first-call compile. torch and galore-torch come with launch/setup.sh.
#
#   bash bench/install_peers.sh            # the venv of launch/setup.sh
#   TRAINER_PYTHON=/path/to/python bash bench/install_peers.sh
#
# DS_ACCELERATOR=cpu: the torch wheel here is a CUDA build, and without it DeepSpeed would pick its
# CUDA accelerator and try to build the op with nvcc. The op is built by DeepSpeed's own JIT loader
# (torch.utils.cpp_extension, -O3 -march=native -fopenmp, its AVX2/AVX-512 path chosen from the CPU)
# into the torch extensions cache (~/.cache/torch_extensions), where later imports find it.
set -euo pipefail

PY=${TRAINER_PYTHON:-$HOME/.cache/llama-trainer/venv-torch-2.11.0/bin/python}
DEEPSPEED_VERSION=${DEEPSPEED_VERSION:-0.19.8}
[ -x "$PY" ] || { echo "no python at $PY: run bash launch/setup.sh or set TRAINER_PYTHON" >&2; exit 2; }

export DS_ACCELERATOR=cpu
# The JIT build needs ninja on PATH; the venv's own copy keeps this independent of the system's.
export PATH="$(dirname "$PY"):$PATH"
"$PY" -m pip install --quiet ninja wheel setuptools
# --no-build-isolation: DeepSpeed's setup.py imports torch and must see the venv's, not a fresh one
# (hence wheel and setuptools above).
"$PY" -m pip install --quiet --no-build-isolation "deepspeed==$DEEPSPEED_VERSION"

"$PY" - <<'EOF'
import time
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam

start = time.perf_counter()
param = torch.nn.Parameter(torch.zeros(16))
param.grad = torch.ones(16)
DeepSpeedCPUAdam([param], lr=1e-3, adamw_mode=True).step()  # builds (or loads) the op
print(f"DeepSpeedCPUAdam ready ({time.perf_counter() - start:.1f} s, update {param[0].item():.6f})")
EOF
