#!/usr/bin/env bash
# SentencePiece 0.2.1, built once from its source release on PyPI into the cache, for `trainer
# prepare`. Debian's libsentencepiece is 0.1.97, whose encoder ran at 0.61x the `sentencepiece`
# package's (0.2.x) on the same model and text (docs/status.md, issue 27); the package's own C++
# sources, built here with -O2 as static libraries (absl bundled inside), make ours the same library
# as the Python one. Its model messages are generated and linked against the system's protobuf
# (SPM_PROTOBUF_PROVIDER=package: Debian's libprotobuf-dev), the library the trainer's TensorBoard
# messages use: its bundled protobuf-lite beside that one would put two protobufs in one binary.
#
#   bash launch/build_sentencepiece.sh PYTHON PREFIX   # prints PREFIX once PREFIX/lib holds both libraries
#
# PYTHON: a python with pip (the sdist comes through the registry). About 40 s on two cores, once.
set -euo pipefail
PYTHON=$1
PREFIX=$2
VERSION=0.2.1
if [ -f "$PREFIX/lib/libsentencepiece.a" ] && [ -f "$PREFIX/lib/libsentencepiece_train.a" ] && \
   [ -f "$PREFIX/include/sentencepiece_processor.h" ]; then
  echo "$PREFIX"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download -q --no-binary :all: --no-deps "sentencepiece==$VERSION" -d "$work" >&2
tar xzf "$work/sentencepiece-$VERSION.tar.gz" -C "$work"
source_dir="$work/sentencepiece-$VERSION/sentencepiece"
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPM_ENABLE_SHARED=OFF \
      -DSPM_ENABLE_TCMALLOC=OFF -DSPM_PROTOBUF_PROVIDER=package -DCMAKE_POSITION_INDEPENDENT_CODE=ON >&2
cmake --build "$work/build" --target sentencepiece-static sentencepiece_train-static -j "${BUILD_JOBS:-$(nproc)}" >&2
# Installed by hand: the project's install rule also wants the command-line tools, not built here.
rm -rf "$PREFIX.partial"
mkdir -p "$PREFIX.partial/lib" "$PREFIX.partial/include"
cp "$work/build/src/libsentencepiece.a" "$work/build/src/libsentencepiece_train.a" "$PREFIX.partial/lib/"
cp "$source_dir/src/sentencepiece_processor.h" "$source_dir/src/sentencepiece_trainer.h" "$PREFIX.partial/include/"
rm -rf "$PREFIX"
mv "$PREFIX.partial" "$PREFIX"
echo "$PREFIX"
