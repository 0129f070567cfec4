#!/usr/bin/env bash
# Installs every build and test dependency of kpleg from Debian's packages.
# Idempotent and non-interactive: packages already present are left alone.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang llvm lld libclang-rt-14-dev
  # BPF
  libbpf-dev bpftool libelf-dev zlib1g-dev
  # userspace libraries
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev
  libnghttp2-dev prometheus-cpp-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # the local CRI runtime test bed
  containerd runc busybox-static containernetworking-plugins iproute2 curl
  # metrics format check, plots, VM kernels
  prometheus gnuplot-nox qemu-system-x86 jq procps psmisc kmod
  # vmtests: unpacking the xz-compressed modules of Debian's newer kernels; the arm64 guest
  # (qemu-system-aarch64; kplegd cross-built with clang and lld against scripts/sysroot.sh's
  # arm64 root, checked with file)
  xz-utils qemu-system-arm file
  # deploy/ manifest check
  python3-yaml
  # virtme-ng (scripts/vng.sh) is installed from PyPI into a virtual environment; virtiofsd
  # (scripts/virtiofsd.sh), which it needs for cloud kernels, is built from the Rust crate registry
  python3-venv libseccomp-dev libcap-ng-dev
  # throwaway CA and certificates for the API's TLS tests
  openssl
  # a wall-clock step seen by kplegd alone (FaultsTest.AWallClockStep...)
  libfaketime
  # systemd-socket-activate: kpleg-cri-relay socket-activated in the kubelet e2e
  systemd
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
