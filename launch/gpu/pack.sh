#!/usr/bin/env bash
# The GPU kit, made here (CPU machine), carried to a lent GPU machine (device tool: carry gpu-kit):
# the trainer, the test binaries and the benchmarks of build/ (sm_90 CUDA code, RelWithDebInfo,
# stripped), with their run path pointed at the kit's own lib/, plus every shared library they and
# Open MPI need that the GPU image lacks (Open MPI, its plugins and help files, PMIx, hwloc,
# libevent, spdlog, fmt, SentencePiece). LibTorch and CUDA's libraries are not carried: launch/gpu/run.sh
# finds them in the GPU image's torch at run time. Nothing in the kit names a folder of this machine.
#
#   bash launch/gpu/pack.sh            # build/ -> gpu-kit/ (ignored by git), checks its size
#   KIT_DIR=/tmp/kit BUILD_DIR=build bash launch/gpu/pack.sh
#
# The device tool carries at most 64 MiB of ignored paths: the script fails above 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build}
KIT=${KIT_DIR:-gpu-kit}
LIMIT_MIB=60

log() { printf '[pack] %s\n' "$*"; }
[ -x "$BUILD/trainer" ] && [ -x "$BUILD/tests/unit_tests" ] ||
  { echo "no $BUILD/trainer or tests: build first (bash launch/setup.sh)" >&2; exit 2; }
if ! command -v patchelf >/dev/null; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
  $sudo_cmd apt-get install -y -qq patchelf >/dev/null
fi

rm -rf "$KIT"
mkdir -p "$KIT/bin" "$KIT/lib" "$KIT/mpi"
binaries=("$BUILD/trainer" "$BUILD/tests/unit_tests" "$BUILD/tests/mpi_tests" "$BUILD/tests/rank_failure_probe")
for bench in "$BUILD"/bench/*; do [ -f "$bench" ] && [ -x "$bench" ] && binaries+=("$bench"); done
for binary in "${binaries[@]}"; do
  cp "$binary" "$KIT/bin/"
  # The test binaries (built without optimisation, so twice the code) lose their symbol tables too:
  # a failing test names itself, and the kit stays under the device tool's limit. The trainer and the
  # benchmarks keep theirs, for a backtrace's function names.
  case "$(basename "$binary")" in
    unit_tests|mpi_tests|rank_failure_probe) strip --strip-all "$KIT/bin/$(basename "$binary")" ;;
    *) strip --strip-debug "$KIT/bin/$(basename "$binary")" ;;
  esac
done

# A library is carried unless the GPU image has it for certain: glibc's, the compiler runtime
# (the image's are newer), and what LibTorch and CUDA bring (the image's torch and toolkit).
provided_by_image() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*|libgomp*.so*) return 0 ;;
    libtorch*|libc10*|libcuda.so*|libcudart*|libcublas*|libcudnn*|libnccl*|libnv*|libcusparse*|libcufft*) return 0 ;;
    libcurand*|libcusolver*|libcupti*|libshm.so*|libgloo*|libkineto*) return 0 ;;
  esac
  return 1
}
# Copies the libraries `file` needs (transitively, as ldd resolves them here) into $2.
carry_libraries_of() {
  local file=$1 into=$2
  ldd "$file" 2>/dev/null | while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    provided_by_image "$name" && continue
    case "$path" in */site-packages/*|/usr/local/cuda*) continue ;; esac
    [ -f "$path" ] || { echo "[pack] $file needs $name, not found here" >&2; continue; }
    [ -f "$into/$name" ] || cp -L "$path" "$into/$name"
  done
}

# Open MPI as Debian installs it (prefix /usr), under mpi/ with the same tree: run.sh points
# OPAL_PREFIX (and PMIx's prefix) there, and Open MPI finds its plugins, help files and mpirun.
# The plugins that need libraries absent there (InfiniBand, UCX, OFI) are left out: shared memory
# and TCP carry one machine's ranks.
for package in openmpi-bin libopenmpi3 openmpi-common libpmix2; do
  dpkg -L "$package" | while read -r path; do
    [ -f "$path" ] || continue
    case "$path" in */doc/*|*/man/*|*/include/*|*.a|*.la|*/pkgconfig/*|*java*|*fortran*|*mpif*) continue ;; esac
    case "$path" in *ucx*|*ofi*|*verbs*|*openib*|*psm*|*portals*|*_ucc*|*_hcoll*|*_fca*) continue ;; esac
    mkdir -p "$KIT/mpi$(dirname "$path")"
    cp -P "$path" "$KIT/mpi$path"
  done
done
# Debian keeps mpirun and friends as symlinks to orterun (mpirun itself through /etc/alternatives):
# relative links in the kit.
for link in "$KIT"/mpi/usr/bin/*; do
  [ -L "$link" ] && ln -sfn "$(basename "$(readlink "$link")")" "$link"
done
ln -sfn orterun "$KIT/mpi/usr/bin/mpirun"
ln -sfn orterun "$KIT/mpi/usr/bin/mpiexec"

# Run paths: the kit's lib/ for our binaries and for Open MPI's; nothing of this machine.
for file in "$KIT"/bin/*; do
  carry_libraries_of "$file" "$KIT/lib"
  patchelf --set-rpath '$ORIGIN/../lib' "$file"
done
while IFS= read -r -d '' file; do
  carry_libraries_of "$file" "$KIT/lib"
done < <(find "$KIT/mpi" -type f -name '*.so*' -print0; find "$KIT/mpi/usr/bin" -type f -print0)
for file in "$KIT"/lib/*; do
  carry_libraries_of "$file" "$KIT/lib"
done
strip --strip-debug "$KIT"/lib/* 2>/dev/null || true

{
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) from commit $(git describe --always --dirty 2>/dev/null || echo unknown)"
  echo "torch built against: $(grep -o 'torch-[0-9.]*' "$BUILD/CMakeCache.txt" | head -1)"
  echo "CUDA architectures: $(grep -E '^TORCH_CUDA_ARCH_LIST|^TRAINER_CUDA_ARCHITECTURES' "$BUILD/CMakeCache.txt" | tr '\n' ' ')"
} > "$KIT/MANIFEST"
(cd "$KIT" && find . -type f | sort) >> "$KIT/MANIFEST"

size_mib=$(du -sm "$KIT" | cut -f1)
absolute=$(grep -rl --binary-files=text "$(cd "$BUILD" && pwd)" "$KIT/bin" "$KIT/lib" 2>/dev/null | wc -l)
log "$KIT: ${size_mib} MiB, $(ls "$KIT/bin" | wc -l) programs, $(ls "$KIT/lib" | wc -l) libraries; run paths \$ORIGIN/../lib"
[ "$absolute" -eq 0 ] || log "note: $absolute file(s) still mention $BUILD (the tests' defaults; run.sh overrides them)"
if [ "$size_mib" -gt "$LIMIT_MIB" ]; then
  echo "[pack] $KIT is ${size_mib} MiB, over the ${LIMIT_MIB} MiB the device tool can carry" >&2
  exit 1
fi
