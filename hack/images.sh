#!/usr/bin/env bash
# Builds the local container images from files on this machine and imports
# them into our containerd's k8s.io namespace (no registry needed):
#   registry.k8s.io/pause:3.10.2                      our pause binary
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-2  Debian busybox-static,
#   docker.io/library/busybox:1.36                    every applet a symlink
#   docker.io/library/busybox:latest
#   registry.k8s.io/e2e-test-images/agnhost:2.66.1    agnhost + busybox applets
# An image already present with the same config digest is left alone.
# Needs containerd running (hack/local-up.sh starts it and calls this).
set -euo pipefail
PROG=images
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
BUSYBOX_IMAGES=(registry.k8s.io/e2e-test-images/busybox:1.37.0-2 docker.io/library/busybox:1.36 docker.io/library/busybox:latest)
AGNHOST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:2.66.1
BUSYBOX=${BUSYBOX:-/bin/busybox}

for b in imagebuild pause agnhost ctr; do
  [[ -x $BIN/$b ]] || die "missing $BIN/$b (run hack/build-cluster.sh)"
done
[[ -x $BUSYBOX ]] || die "missing dependency: $BUSYBOX (Debian package busybox-static)"
[[ -S $CTRD_SOCK ]] || die "containerd is not running on $CTRD_SOCK (start it with hack/local-up.sh)"

STAMPS=$LOCAL/images
mkdir -p "$STAMPS"
work=$(mktemp -d "${TMPDIR:-/tmp}/rustlet-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Busybox applets as --link arguments: /bin/sh=/bin/busybox and so on.
busybox_links=()
have_sh=false
while IFS= read -r applet; do
  [[ -n $applet && $applet != bin/busybox ]] || continue
  busybox_links+=(--link "/$applet=/bin/busybox")
  [[ $applet != bin/sh ]] || have_sh=true
done < <("$BUSYBOX" --list-full)
$have_sh || busybox_links+=(--link /bin/sh=/bin/busybox)

# config_digest_of_archive TAR: the image config digest (the image id).
config_digest_of_archive() {
  tar -xOf "$1" manifest.json | jq -r '.[0].Config'
}

# config_digest_in_containerd NAME: the config digest of image NAME in
# containerd, or nothing if it is absent.
config_digest_in_containerd() {
  local target
  target=$(ctr_k8s images list "name==$1" 2>/dev/null | awk 'NR == 2 { print $3 }')
  [[ $target == sha256:* ]] || return 0
  ctr_k8s content get "$target" 2>/dev/null | jq -r '.config.digest // empty' 2>/dev/null || true
}

# inputs_key IMAGEBUILD-ARGS...: a hash of the arguments and of the size,
# mtime and inode of imagebuild and of every --add source: when it matches
# the last build's, the archive would be the same and is not rebuilt.
inputs_key() {
  local a prev='' files=("$BIN/imagebuild")
  for a in "$@"; do
    [[ $prev == --add ]] && files+=("${a%%=*}")
    prev=$a
  done
  { printf '%s\n' "$@"; stat -L -c '%n %s %Y %i' "${files[@]}"; } | sha256sum | cut -c1-64
}

# all_tags_at DIGEST TAG...: every tag names an image with config DIGEST.
all_tags_at() {
  local want=$1 t
  shift
  for t in "$@"; do
    [[ $(config_digest_in_containerd "$t") == "$want" ]] || return 1
  done
}

# image LABEL ARCHIVE-NAME IMAGEBUILD-ARGS...: builds the archive and imports
# it, unless every tag already points at the same config.
image() {
  local label=$1 out=$work/$2.tar stamp=$STAMPS/$2
  shift 2
  local t0 tags=() a prev='' key k want
  t0=$(now_ms)
  for a in "$@"; do
    [[ $prev == --tag ]] && tags+=("$a")
    prev=$a
  done
  key=$(inputs_key "$@")
  # Same inputs as last time, and containerd still has that image.
  if [[ -f $stamp ]] && read -r k want <"$stamp" && [[ $k == "$key" ]] && all_tags_at "$want" "${tags[@]}"; then
    log "$label: up to date (${want:7:12}, ${#tags[@]} tags)"
    return
  fi
  "$BIN/imagebuild" --out "$out" "$@" >/dev/null
  want=$(config_digest_of_archive "$out")
  if all_tags_at "$want" "${tags[@]}"; then
    echo "$key $want" >"$stamp"
    log "$label: up to date (${want:7:12}, ${#tags[@]} tags)"
    return
  fi
  # Importing re-tags every name in the archive, so one import serves all.
  # ctr relays containerd's deprecation warnings (cgroup v1) on stderr; keep
  # them out of the way unless the import fails.
  if ! ctr_k8s images import --snapshotter overlayfs "$out" >"$work/import.log" 2>&1; then
    sed 's/^/    /' "$work/import.log" >&2
    die "$label: ctr images import $out failed"
  fi
  all_tags_at "$want" "${tags[@]}" || die "$label: ${tags[*]} do not all name $want after import"
  echo "$key $want" >"$stamp"
  log "$label: imported ${tags[*]} (${want:7:12}) in $(since "$t0")"
}

busybox_tags=()
for t in "${BUSYBOX_IMAGES[@]}"; do busybox_tags+=(--tag "$t"); done

image pause pause --tag "$PAUSE_IMAGE" \
  --add "$BIN/pause=/pause" --entrypoint '["/pause"]' --user 65535:65535
image busybox busybox "${busybox_tags[@]}" \
  --add "$BUSYBOX=/bin/busybox" "${busybox_links[@]}" --cmd '["sh"]'
image agnhost agnhost --tag "$AGNHOST_IMAGE" \
  --add "$BIN/agnhost=/agnhost" --add "$BUSYBOX=/bin/busybox" "${busybox_links[@]}" \
  --entrypoint '["/agnhost"]'
