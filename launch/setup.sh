#!/usr/bin/env bash
# Set-up for a fresh Debian machine (with or without a GPU): system packages, the cached Python
# environment that provides LibTorch (the torch wheel) and the golden-file references, then the build.
#
#   bash launch/setup.sh            # install what is missing, configure and build into build/
#
# The virtual environment lives outside the clone, keyed by the torch version, so a second run (or a
# second clone) reuses it: ${TRAINER_CACHE:-$HOME/.cache/llama-trainer}/venv-torch-<version>.
# On a machine that already has torch (the GPU image) set TRAINER_PYTHON to that python instead.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0            # a CUDA 13.0 build on PyPI, the same as the GPU machines' image
CACHE=${TRAINER_CACHE:-$HOME/.cache/llama-trainer}
VENV="$CACHE/venv-torch-$TORCH_VERSION"
BUILD_DIR=${BUILD_DIR:-build}

# Each line says how long setup has run (seconds), so a CI log shows where a fresh machine's time goes.
log() { printf '[setup %ds] %s\n' "$SECONDS" "$*"; }

apt_packages=(cmake ninja-build g++ ccache pkg-config libopenmpi-dev openmpi-bin libspdlog-dev
              nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
              libexpat1-dev patchelf zlib1g-dev libzstd-dev libprotobuf-dev protobuf-compiler
              slurmctld slurmd slurm-client munge)  # the last four: tests/slurm (a one-host cluster)
missing=()
for package in "${apt_packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -n "${TRAINER_PYTHON:-}" ]; then
  PYTHON=$TRAINER_PYTHON
else
  PYTHON="$VENV/bin/python"
  if ! "$PYTHON" -c "import torch, transformers, galore_torch" >/dev/null 2>&1; then
    log "creating $VENV (torch==$TORCH_VERSION with its CUDA libraries: several GB, once)"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" transformers galore-torch numpy sentencepiece pyarrow
  fi
  # Added later: `trainer prepare` reads Parquet through pyarrow (data/parquet_text.py).
  "$PYTHON" -c "import pyarrow" >/dev/null 2>&1 || "$VENV/bin/pip" install -q pyarrow
  # Added later: tests/tensorboard_test.py reads the run's event files with TensorBoard's own reader.
  # and launch/tensorboard_to_wandb.py sends them to Weights & Biases (tested offline).
  "$PYTHON" -c "import tensorboard, wandb" >/dev/null 2>&1 || "$VENV/bin/pip" install -q tensorboard wandb
fi
TORCH_CMAKE=$("$PYTHON" -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
log "torch $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)"

# SentencePiece from its source release (launch/build_sentencepiece.sh: Debian's is two versions older).
SENTENCEPIECE=$(bash launch/build_sentencepiece.sh "$PYTHON" "$CACHE/sentencepiece-0.2.1-system-protobuf")
log "sentencepiece 0.2.1 in $SENTENCEPIECE"

CUDA_ARGS=()
if [ -x "${CUDAToolkit_ROOT:-/usr/local/cuda}/bin/nvcc" ]; then
  CUDA_ARGS+=("-DCUDAToolkit_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}")
fi

configure_start=$SECONDS
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_PREFIX_PATH="$TORCH_CMAKE" \
      -DTRAINER_PYTHON="$PYTHON" -DSENTENCEPIECE_ROOT="$SENTENCEPIECE" "${CUDA_ARGS[@]}" >/dev/null
# Two compile jobs on two cores; LibTorch translation units take ~2 GB each.
log "configured $BUILD_DIR; building"
cmake --build "$BUILD_DIR" -j "${BUILD_JOBS:-$(nproc)}"
log "built $BUILD_DIR/trainer"
# For launch/test_report.py: set-up (packages, venv, SentencePiece) and the build (configure included).
printf '{"setup_s": %d, "build_s": %d}\n' "$configure_start" "$((SECONDS - configure_start))" \
  > "$BUILD_DIR/setup-times.json"
