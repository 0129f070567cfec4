#!/usr/bin/env bash
# Regenerates the vendored vmlinux.h from a kernel's BTF. The build never reads the build
# host's /sys: run this by hand when the BPF code needs types from a newer kernel.
#
#   scripts/gen-vmlinux.sh [BTF_FILE]    (default: /sys/kernel/btf/vmlinux)
#
# Writes bpf/vmlinux/<arch>/vmlinux_<kernel>.h and points bpf/vmlinux/<arch>/vmlinux.h at it.
set -euo pipefail
btf=${1:-/sys/kernel/btf/vmlinux}
top=$(cd "$(dirname "$0")/.." && pwd)
case "$(uname -m)" in
  x86_64) arch=x86 ;;
  aarch64) arch=arm64 ;;
  *) echo "gen-vmlinux: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
[ -r "$btf" ] || { echo "gen-vmlinux: cannot read BTF at $btf" >&2; exit 1; }
kver=$(uname -r | cut -d. -f1-2)
[ "$btf" = /sys/kernel/btf/vmlinux ] || kver=${KVER:-custom}
dir="$top/bpf/vmlinux/$arch"
mkdir -p "$dir"
bpftool btf dump file "$btf" format c > "$dir/vmlinux_${kver}.h"
ln -sf "vmlinux_${kver}.h" "$dir/vmlinux.h"
echo "gen-vmlinux: wrote $dir/vmlinux_${kver}.h ($(wc -l < "$dir/vmlinux_${kver}.h") lines)"
