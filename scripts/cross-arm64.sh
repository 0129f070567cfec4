#!/usr/bin/env bash
# Cross-builds kplegd for arm64 (its BPF object against bpf/vmlinux/arm64/vmlinux.h), for the
# arm64 VM test (vmtest.6.1-arm64): the arm64 Debian root first (scripts/sysroot.sh), then
# CMake with cmake/aarch64-linux-gnu.cmake into <build>/arm64, target kplegd only. Prints the
# arm64 build directory.
#
#   scripts/cross-arm64.sh [BUILD_DIR]    (default $KPLEG_BUILD_DIR, else <repo>/build)
#
# Unoptimised (no CMAKE_BUILD_TYPE): the VM test runs the self-test once under software
# emulation, and -O0 halves the build. Needs clang and lld (scripts/install-deps.sh).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-${KPLEG_BUILD_DIR:-$repo/build}}
out=$build/arm64
sysroot=$(bash "$repo/scripts/sysroot.sh") || { echo "cross-arm64: no arm64 root" >&2; exit 1; }
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$repo" -B "$out" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$repo/cmake/aarch64-linux-gnu.cmake" \
  -DKPLEG_SYSROOT="$sysroot" -DCMAKE_BUILD_TYPE= -DKPLEG_FUZZ=OFF -DKPLEG_BENCH=OFF \
  "${launcher[@]}" >&2
cmake --build "$out" --target kplegd >&2
file "$out/bin/kplegd" | grep -q 'ARM aarch64' || { echo "cross-arm64: $out/bin/kplegd is not an arm64 binary" >&2; exit 1; }
echo "$out"
