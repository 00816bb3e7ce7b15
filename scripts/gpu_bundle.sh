#!/usr/bin/env bash
# Packs the trex binary and the CUDA op harness built here, with every shared library they load
# except the NVIDIA driver's and CUDA's own (libcuda, libcudart, libcublasLt: the GPU machine has
# them), and this machine's dynamic loader, into .gpu/bundle.tar.xz. scripts/gpu_check.sh runs
# the binaries from it through that loader, so they do not depend on the GPU machine's system
# libraries (its image has no oneDNN, CBC or OpenMPI).
#   scripts/gpu_bundle.sh [BUILD_DIR=build]     (then: carry .gpu to the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
for f in "$BUILD/trex" "$BUILD/trex_cuda_ops"; do
  [ -x "$f" ] || { echo "error: $f is missing: build with TREX_CUDA=ON first (make build)"; exit 1; }
done
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bundle/lib" .gpu
cp "$BUILD/trex" "$BUILD/trex_cuda_ops" "$STAGE/bundle/"
strip "$STAGE/bundle/trex" "$STAGE/bundle/trex_cuda_ops" 2>/dev/null || true
for b in "$BUILD/trex" "$BUILD/trex_cuda_ops"; do
  ldd "$b" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | while read -r lib; do
    case "$(basename "$lib")" in
      libcuda.so*|libcudart.so*|libcublas*|libnvidia*|linux-vdso*) continue ;;
    esac
    [ -f "$lib" ] && cp -L "$lib" "$STAGE/bundle/lib/"
  done
done
# The loader by the name the bundle calls it.
cp -L "$(ldd "$BUILD/trex" | awk '/ld-linux/ {print $1}')" "$STAGE/bundle/lib/ld.so"
git rev-parse --short HEAD > "$STAGE/bundle/commit" 2>/dev/null || echo unknown > "$STAGE/bundle/commit"
tar -C "$STAGE" -cJf .gpu/bundle.tar.xz bundle
echo "wrote .gpu/bundle.tar.xz ($(du -h .gpu/bundle.tar.xz | cut -f1), $(ls "$STAGE/bundle/lib" | wc -l) libraries)"
