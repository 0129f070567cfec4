# shellcheck shell=bash
# One OCI image from one root filesystem, without a container engine: the test bed's image
# (scripts/testbed/image.sh) and kplegd's (scripts/image.sh) are both made here. Sourced; the
# caller defines die.

# oci_arch: the OCI architecture name of this host.
oci_arch() {
  case $(uname -m) in
    x86_64) echo amd64 ;; aarch64) echo arm64 ;; armv7l) echo arm ;; i686) echo 386 ;;
    ppc64le) echo ppc64le ;; s390x) echo s390x ;; riscv64) echo riscv64 ;;
    *) die "unsupported architecture $(uname -m)" ;;
  esac
}

# oci_blob FILE DIR: moves FILE into DIR/blobs/sha256 under its digest; sets BLOB_DIGEST
# (sha256:<hex>) and BLOB_SIZE.
oci_blob() {
  local hex
  hex=$(sha256sum "$1" | cut -d' ' -f1)
  BLOB_SIZE=$(stat -c %s "$1")
  BLOB_DIGEST=sha256:$hex
  mv "$1" "$2/blobs/sha256/$hex"
}

# oci_image_archive ROOTFS OUT NAME CONFIG HISTORY: OUT/image.tar, an OCI image layout as one
# archive (what `ctr images import` and skopeo's oci-archive: take) with one uncompressed layer
# made of ROOTFS, and OUT/config.json, a copy of its image config. NAME is the image reference
# (its tag goes into the index). CONFIG is the image config's "config" object and HISTORY its
# one "history" entry, both JSON, their keys kept in the order given. Every tar is reproducible
# (sorted, fixed owners and times) and every JSON document compact, so the same ROOTFS gives the
# same bytes and the same digest. Sets OCI_MANIFEST_DIGEST.
oci_image_archive() {
  local rootfs=$1 out=$2 name=$3 config=$4 history=$5 oci=$2/oci arch ld ls cfg cs
  arch=$(oci_arch)
  rm -rf "$oci"
  mkdir -p "$oci/blobs/sha256"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$rootfs" -cf "$out/layer.tar" .
  oci_blob "$out/layer.tar" "$oci"
  ld=$BLOB_DIGEST ls=$BLOB_SIZE

  jq -cn --arg arch "$arch" --arg diff "$ld" --argjson config "$config" \
    --argjson history "$history" '{
      architecture: $arch, os: "linux", config: $config,
      rootfs: {type: "layers", diff_ids: [$diff]}, history: [$history]
    }' | tr -d '\n' >"$out/config.json"
  cp "$out/config.json" "$out/config.blob"
  oci_blob "$out/config.blob" "$oci"
  cfg=$BLOB_DIGEST cs=$BLOB_SIZE

  jq -cn --arg cd "$cfg" --argjson cs "$cs" --arg ld "$ld" --argjson ls "$ls" '{
      schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $ld, size: $ls}]
    }' | tr -d '\n' >"$out/manifest.json"
  oci_blob "$out/manifest.json" "$oci"
  # shellcheck disable=SC2034  # read by the caller
  OCI_MANIFEST_DIGEST=$BLOB_DIGEST

  jq -cn --arg md "$BLOB_DIGEST" --argjson ms "$BLOB_SIZE" --arg arch "$arch" \
    --arg name "$name" --arg tag "${name##*:}" '{
      schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [{
        mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $md, size: $ms,
        platform: {architecture: $arch, os: "linux"},
        annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $tag}
      }]
    }' >"$oci/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$oci" -cf "$out/image.tar" oci-layout index.json blobs
  rm -rf "$oci"
}
