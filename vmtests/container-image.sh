#!/usr/bin/env bash
# Builds the test bed's image (scripts/testbed/image.sh: busybox-static and pause, OCI archive)
# on the host into DIR, for vmtest.container.<kernel>: built in the guest under software
# emulation it cost a minute and a half. container-check.sh copies it into the guest's test bed,
# whose `up` then finds it current (same stamp) and only imports it.
#
#   vmtests/container-image.sh DIR
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$REPO/scripts/testbed
IMAGE=$(sed -n 's/^IMAGE=//p' "$REPO/scripts/testbed.sh")
IMAGE_DIR=${1:?usage: container-image.sh DIR}
IMAGE_REBUILT=0
log() { echo "container-image: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=scripts/testbed/image.sh
. "$HERE/image.sh"
mkdir -p "$(dirname "$IMAGE_DIR")"
exec 9>"$IMAGE_DIR.lock"
flock 9
build_image
