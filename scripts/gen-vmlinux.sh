#!/usr/bin/env bash
# Regenerates the vendored vmlinux.h from a kernel's BTF. The build never reads the build
# host's /sys: run this by hand when the BPF code needs types from a newer kernel.
#
#   scripts/gen-vmlinux.sh [BTF_FILE]    (default: /sys/kernel/btf/vmlinux)
#   ARCH=arm64 KVER=6.1 scripts/gen-vmlinux.sh build/vmtests/kernels/6.1-arm64/vmlinuz
#
# Writes bpf/vmlinux/<arch>/vmlinux_<kernel>.h and points bpf/vmlinux/<arch>/vmlinux.h at it.
# ARCH (x86 or arm64) defaults to the host's. BTF_FILE may also be an uncompressed or gzipped
# kernel image (Debian's arm64 vmlinuz), whose BTF blob is cut out of it: another
# architecture's header needs no machine of that architecture.
set -euo pipefail
btf=${1:-/sys/kernel/btf/vmlinux}
top=$(cd "$(dirname "$0")/.." && pwd)
case "${ARCH:-$(uname -m)}" in
  x86_64|x86) arch=x86 ;;
  aarch64|arm64) arch=arm64 ;;
  *) echo "gen-vmlinux: unsupported architecture ${ARCH:-$(uname -m)}" >&2; exit 1 ;;
esac
[ -r "$btf" ] || { echo "gen-vmlinux: cannot read BTF at $btf" >&2; exit 1; }
kver=$(uname -r | cut -d. -f1-2)
[ "$btf" = /sys/kernel/btf/vmlinux ] || kver=${KVER:-custom}
# BTF starts with 0xeB9F (little-endian) and version 1; anything else is taken for an image.
if [ "$(od -An -tx1 -N3 "$btf" | tr -d ' ')" != 9feb01 ]; then
  blob=$(mktemp)
  trap 'rm -f "$blob"' EXIT
  python3 - "$btf" "$blob" <<'PY' || { echo "gen-vmlinux: no BTF found in $btf" >&2; exit 1; }
import gzip, struct, sys
data = open(sys.argv[1], "rb").read()
if data[:2] == b"\x1f\x8b":
    data = gzip.decompress(data)
# The kernel's .BTF section: header (magic, version 1, flags 0, hdr_len 24), then types and
# strings back to back. Small blobs elsewhere in the image (modules' BTF is not there) are skipped.
at = 0
while (at := data.find(b"\x9f\xeb\x01\x00", at)) >= 0:
    hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<5I", data, at + 4)
    if hdr_len == 24 and type_off == 0 and str_off == type_len and type_len > 1 << 20:
        open(sys.argv[2], "wb").write(data[at:at + hdr_len + str_off + str_len])
        sys.exit(0)
    at += 1
sys.exit(1)
PY
  btf=$blob
fi
dir="$top/bpf/vmlinux/$arch"
mkdir -p "$dir"
bpftool btf dump file "$btf" format c > "$dir/vmlinux_${kver}.h"
ln -sf "vmlinux_${kver}.h" "$dir/vmlinux.h"
echo "gen-vmlinux: wrote $dir/vmlinux_${kver}.h ($(wc -l < "$dir/vmlinux_${kver}.h") lines)"
