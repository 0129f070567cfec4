#!/usr/bin/env bash
# critest (cri-tools' CRI validation suite, built by scripts/crictl.sh) against one CRI endpoint,
# with the specs that can pass on a machine with no registry: one local image
# (localhost/kpleg/busybox:1, which the test bed imports) and a pod network (the test bed with
# --cni). The spec selection below depends only on this file and on the runtime's name and version
# (asked with crictl, through the same endpoint), so a run through a CRI proxy in front of a
# runtime selects the same specs as a run against that runtime, and the two results compare.
#
#   tests/cri/critest.sh [options] ENDPOINT [-- CRITEST_ARGS...]
#
#   ENDPOINT               the CRI runtime service, unix:///path
#   --image-endpoint EP    the CRI image service (default ENDPOINT)
#   --report-dir DIR       also write ginkgo's JSON and JUnit reports there
#   --list                 print the specs selected for this runtime (a ginkgo dry run) and exit
#   CRITEST_ARGS           passed on, e.g. -ginkgo.focus=Streaming or -ginkgo.seed=1
#
# Prints critest's output (ginkgo's summary last), then one line "critest.sh: N passed, ...".
# Exit status: 0 when every selected spec passed (specs that skip themselves, e.g. features the
# runtime reports it lacks, are not failures), 1 when one failed or none ran, 2 on a usage error
# or when critest cannot be had or the runtime has no pod network.
#
# Environment:
#   CRITEST, CRICTL   the programs (default: on PATH, else built by scripts/crictl.sh)
#   KPLEG_CRITEST_IMAGE   the image the specs run (default localhost/kpleg/busybox:1): busybox
#                     applets in /bin, including sh, top, sleep, echo, ls, ps, cat, touch, id
#   KPLEG_CRITEST_TIMEOUT ginkgo's limit for the whole suite (default 15m)
#   KPLEG_CRITEST_RUNTIME "NAME VERSION" of the runtime behind ENDPOINT, for the runtime-specific
#                     part of the selection, when ENDPOINT's Version answer does not say it (a
#                     proxy that answers with its own name); default: what Version answers
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=${KPLEG_CRITEST_IMAGE:-localhost/kpleg/busybox:1}

# --- the spec selection ----------------------------------------------------------------------
# Regular expressions over a spec's full text ("[k8s.io] <container> ... <spec>"); a spec matching
# any is not run. Every other spec of critest v1.34.0 runs (critest itself leaves out its
# benchmarks). The comment above each group says why it cannot pass here.
SKIP=(
  # Pull critest's test-image-* images from a public image registry: nothing can be pulled
  # here. "public image should timeout if requested" stays: its 1 ms deadline expires in the
  # client, before any pull.
  'Image Manager .*(pulled and removed|image status|listImage)'
  # A web server in the container, from images named in critest's code
  # (the e2e test images httpd and nginx, and hostnet-nginx, all on public image registries)
  # or webServerTestImage, which has to be our image: it serves nothing on port 80 (its default
  # command is /pause), so the page checks time out after 60 s each.
  'Multiple Containers'
  'Networking .*port mapping'
  'Streaming .*portforward'
  'NamespaceOption .*(HostPID|PodPID|ContainerPID)'
  # Other images with particular contents: e2e-test-images/nonewprivs (a setuid helper) and
  # k8s-staging-cri-tools/test-image-predefined-group (a user in predefined groups).
  'NoNewPrivs'
  'SupplementalGroupsPolicy'
  # Commands Debian's busybox-static has no applet for: ipcs (HostIpc) and pgrep (execSync
  # with timeout checks that the timed-out process is gone with `pgrep sleep`).
  'NamespaceOption .*HostIpc'
  'execSync with timeout'
  # MaskedPaths masks /bin/ls and then expects `ls` to be denied; in our image every applet is a
  # symlink to /bin/busybox, so the mask lands on busybox itself and not even sh can start.
  'MaskedPaths'
  # The test bed turns AppArmor off in the CRI plugin (disable_apparmor); these specs skip
  # themselves on a host without AppArmor and would fail on one with it.
  'AppArmor'
  # User namespaces need a runtime handler that reports support for them (and idmapped mounts);
  # neither containerd here reports one, so the specs skip themselves: left out so that a host
  # or runtime build that does report it cannot turn them into failures of the test bed's setup.
  'UserNamespaces'
)

# Known differences of a runtime from what critest expects, by the name and version the runtime
# reports (crictl version): $1 name, $2 version.
runtime_skips() {
  case $1 in
    containerd)
      case $2 in
        1.[0-6].* | v1.[0-6].*)
          # StopPodSandbox and StopContainer of an unknown id answer NotFound; critest (and the
          # kubelet since 1.26) expects them to succeed, as containerd 1.7 and later do.
          echo 'Idempotence (StopPodSandbox|StopContainer) should not return an error if not found'
          # containerd 1.6's shim can report an OOM-killed init's exit before the cgroup's OOM
          # event; the CRI plugin says Error until that event comes and OOMKilled after, and
          # critest looks once, right after the exit (later releases' shims send the OOM
          # event first).
          echo 'Container OOM runtime should output OOMKilled reason'
          ;;
      esac
      ;;
  esac
}

# --- arguments --------------------------------------------------------------------------------
usage() { sed -n '/^#   tests/,/^#   CRITEST_ARGS/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "critest.sh: error: $*" >&2; exit 2; }

endpoint="" image_endpoint="" report_dir="" list=0 extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --image-endpoint) [ $# -ge 2 ] || usage; image_endpoint=$2; shift ;;
    --image-endpoint=*) image_endpoint=${1#*=} ;;
    --report-dir) [ $# -ge 2 ] || usage; report_dir=$2; shift ;;
    --report-dir=*) report_dir=${1#*=} ;;
    --list) list=1 ;;
    -h | --help) usage ;;
    --) shift; extra=("$@"); break ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$endpoint" ] || usage; endpoint=$1 ;;
  esac
  shift
done
[ -n "$endpoint" ] || usage
[ -z "$report_dir" ] || case $report_dir in /*) ;; *) report_dir=$PWD/$report_dir ;; esac
case $endpoint in unix://*) ;; /*) endpoint=unix://$endpoint ;; esac
image_endpoint=${image_endpoint:-$endpoint}

find_tool() { # name -> path: $CRITEST/$CRICTL, on PATH, or built by scripts/crictl.sh
  local name=$1 var bin
  var=$(tr '[:lower:]' '[:upper:]' <<<"$name")
  if [ -n "${!var:-}" ]; then
    echo "${!var}"
  elif command -v "$name" >/dev/null; then
    command -v "$name"
  elif bin=$(bash "$repo/scripts/crictl.sh"); then
    echo "$bin/$name"
  else
    return 1
  fi
}
critest=$(find_tool critest) || die "no critest (scripts/crictl.sh could not build it; see above)"
crictl=$(find_tool crictl) || die "no crictl (scripts/crictl.sh could not build it; see above)"
[ -x "$critest" ] || die "$critest is not executable"

tmp=$(mktemp -d /tmp/kpleg-critest.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf 'defaultTestContainerImage: %s\nwebServerTestImage: %s\n' "$IMAGE" "$IMAGE" >"$tmp/images.yaml"

args=(-runtime-endpoint "$endpoint" -image-endpoint "$image_endpoint"
  -test-images-file "$tmp/images.yaml" -ginkgo.no-color
  -ginkgo.timeout "${KPLEG_CRITEST_TIMEOUT:-15m}")
for re in "${SKIP[@]}"; do args+=(-ginkgo.skip "$re"); done

# --config /dev/null: no /etc/crictl.yaml (nor the warning that it is missing).
crictl_() {
  "$crictl" --config /dev/null --runtime-endpoint "$endpoint" --image-endpoint "$image_endpoint" \
    --timeout 10s "$@" 2>"$tmp/crictl.err"
}
version=$(crictl_ version) || die "the runtime at $endpoint does not answer Version: $(cat "$tmp/crictl.err")"
rt_name=$(awk '$1 == "RuntimeName:" { print $2 }' <<<"$version")
rt_version=$(awk '$1 == "RuntimeVersion:" { print $2 }' <<<"$version")
if [ -n "${KPLEG_CRITEST_RUNTIME:-}" ]; then
  read -r rt_name rt_version <<<"$KPLEG_CRITEST_RUNTIME"
fi
while read -r re; do
  [ -n "$re" ] && SKIP+=("$re") && args+=(-ginkgo.skip "$re")
done < <(runtime_skips "$rt_name" "$rt_version")

if ((list)); then
  # A dry run: nothing runs, so specs that would skip themselves are listed too.
  "$critest" "${args[@]}" -ginkgo.dry-run -ginkgo.v "${extra[@]}" 2>/dev/null |
    grep -E '^\[k8s\.io\] ' || true
  exit 0
fi

# Almost every spec runs a pod in a pod network namespace: without one they all fail.
info=$(crictl_ info -o json) || die "crictl info failed: $(cat "$tmp/crictl.err")"
if ! jq -e '.status.conditions[] | select(.type == "NetworkReady") | .status' <<<"$info" |
    grep -qx true; then
  die "the runtime at $endpoint reports NetworkReady false: critest's pods need a pod network (scripts/testbed.sh up --cni)"
fi
crictl_ inspecti "$IMAGE" >/dev/null ||
  die "image $IMAGE is not in the runtime's image store (nothing can be pulled here)"

echo "critest.sh: $("$critest" -version 2>/dev/null | head -n1) against $endpoint ($rt_name $rt_version), image $IMAGE"
echo "critest.sh: skipping specs matching:"
printf '  %s\n' "${SKIP[@]}"

report=$tmp/report.json
args+=(-ginkgo.json-report "$report")
if [ -n "$report_dir" ]; then
  mkdir -p "$report_dir"
  args+=(-ginkgo.junit-report "$report_dir/critest-junit.xml")
fi
start=$SECONDS
rc=0
# critest's working directory is where ginkgo would write relative reports; the temp dir.
(cd "$tmp" && "$critest" "${args[@]}" "${extra[@]}") || rc=$?
secs=$((SECONDS - start))
[ -z "$report_dir" ] || cp "$report" "$report_dir/critest.json" 2>/dev/null || true

if [ ! -s "$report" ]; then
  echo "critest.sh: FAIL: critest exited $rc and wrote no report ($secs s)"
  exit 1
fi
# Counts by state, and the failed specs by name (ginkgo's summary above has their locations). A
# spec left out by the selection is "skipped" with no message; one that skipped itself says why.
counts=$(jq -r '[.[0].SpecReports[] | select(.LeafNodeType == "It") |
    if .State == "skipped" then (if (.Failure.Message // "") == "" then "not selected" else "skipped themselves" end)
    else .State end] | group_by(.) | map("\(length) \(.[0])") | join(", ")' "$report")
passed=$(jq '[.[0].SpecReports[] | select(.LeafNodeType == "It" and .State == "passed")] | length' "$report")
not_ok=$(jq -r '.[0].SpecReports[] | select(.State != "passed" and .State != "skipped" and .State != "pending") |
  "  \(.State): \((.ContainerHierarchyTexts + [.LeafNodeText]) | join(" "))"' "$report")
echo "critest.sh: ${counts:-no specs} in $secs s against $endpoint ($rt_name $rt_version)"
if [ -n "$not_ok" ]; then
  echo "critest.sh: FAIL:"
  echo "$not_ok"
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "critest.sh: FAIL: critest exited $rc"
  exit 1
fi
if [ "$passed" -eq 0 ]; then
  echo "critest.sh: FAIL: no spec ran (focus or skip too wide?)"
  exit 1
fi
echo "critest.sh: PASS"
