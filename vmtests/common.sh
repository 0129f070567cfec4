# shellcheck shell=bash disable=SC2034  # its variables are used by the scripts that source it
# Shared by the vmtests scripts (sourced, not run).

KPLEG_VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KPLEG_REPO_ROOT=$(cd "$KPLEG_VM_DIR/.." && pwd)
KPLEG_VM_KERNEL_LIST=${KPLEG_VM_KERNEL_LIST:-$KPLEG_VM_DIR/kernels.txt}
# Where kernels are unpacked unless told otherwise: $KPLEG_VM_KERNELS_DIR, else under the build
# tree ($KPLEG_BUILD_DIR, else <repo>/build).
kpleg_vm_kernels_dir() {
  echo "${KPLEG_VM_KERNELS_DIR:-${KPLEG_BUILD_DIR:-$KPLEG_REPO_ROOT/build}/vmtests/kernels}"
}

# Exit codes shared by the scripts; vmtest.sh turns them into the test's verdict.
KPLEG_VM_EXIT_UNAVAILABLE=3   # fetch-kernels.sh: apt cannot provide the package
KPLEG_VM_EXIT_SKIP=77         # vmtest.sh: no qemu or no kernel here (CTest SKIP_RETURN_CODE)
KPLEG_VM_EXIT_TIMEOUT=124     # run-in-vm.sh: the guest ran out of time
KPLEG_VM_EXIT_VM_FAILURE=125  # run-in-vm.sh: no boot, init failure, or no exit status reported

kpleg_vm_log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }

# Prints "name package flavour suite" for each kernel of the list (all, or those named); the
# suite is "-" (the host's apt sources) where the line names none.
kpleg_vm_kernels() {
  local list=$KPLEG_VM_KERNEL_LIST
  [ -r "$list" ] || { kpleg_vm_log "cannot read the kernel list $list"; return 1; }
  awk -v want="$*" '
    BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) wanted[w[i]] = 1 }
    /^[[:space:]]*(#|$)/ { next }
    NF != 3 && NF != 4 { printf "%s:%d: expected \"name package flavour [suite]\", got: %s\n", FILENAME, NR, $0 > "/dev/stderr"; bad = 1; next }
    n == 0 || ($1 in wanted) { print $1, $2, $3, (NF == 4 ? $4 : "-"); found[$1] = 1 }
    END {
      for (k in wanted) if (!(k in found)) { printf "%s: no kernel named %s\n", FILENAME, k > "/dev/stderr"; bad = 1 }
      exit bad
    }' "$list"
}
