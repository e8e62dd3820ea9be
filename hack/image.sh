#!/usr/bin/env bash
# Builds the container images the Helm chart (charts/rustlet) runs, from files
# on this machine with the project's image builder (imagebuild, no Docker, no
# registry), as docker-archive tarballs in _output/images/:
#   rustlet:<version>               the release rustlet binary at
#                                   /usr/local/bin/rustlet, the shared
#                                   libraries ldd finds for it, and the CA
#                                   certificates (/etc/ssl/certs); nothing else.
#                                   The chart runs it three ways: the agent
#                                   (`run`), the certificate approver
#                                   (`approve-csrs`) and the uninstall hook
#                                   (`delete-nodes`)
#   rustlet-node-runtime:<version>  the node runtime the chart runs beside it:
#                                   containerd, containerd-shim-runc-v2 and ctr
#                                   (_output/bin), runc (Debian's), the CNI
#                                   plugins bridge, host-local, loopback and
#                                   portmap (Debian's containernetworking-plugins,
#                                   at /opt/cni/bin), with their libraries,
#                                   and Debian's static busybox as /bin/sh
#                                   (the chart's shim.sh runs in it)
#   rustlet-csi-hostpath:<version>  with --csi: the project's hostpath test
#                                   CSI driver (src/bin/csi-hostpath.rs), the
#                                   upstream external-provisioner
#                                   (hack/build-cluster.sh csi) and Debian's
#                                   losetup, with their libraries, for
#                                   examples/csi-hostpath.yaml
# <version> is Cargo.toml's; all are also tagged `latest`.
#
#   hack/image.sh [--import] [--debug] [--csi]
#
# --import also imports both into the local cluster's containerd (k8s.io
# namespace, hack/local-up.sh), where a pod can run them without a registry.
# --debug puts the debug builds in the images instead of the release
# builds (the tests' builds, which are already there; a release build with
# link-time optimization takes minutes).
# Needs hack/build-cluster.sh (imagebuild, containerd) and cargo.
set -euo pipefail
PROG=image
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

import=false
profile=release
csi=false
while (($#)); do
  case $1 in
    --import) import=true; shift ;;
    --debug) profile=debug; shift ;;
    --csi) csi=true; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (usage: hack/image.sh [--import] [--debug] [--csi])" ;;
  esac
done

need_cmd cargo "needed to build rustlet"
for b in imagebuild containerd containerd-shim-runc-v2 ctr; do
  [[ -x $BIN/$b ]] || die "missing $BIN/$b (run hack/build-cluster.sh)"
done
RUNC=$(command -v runc) || die "missing dependency: runc (Debian package runc)"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
[[ -s $CA_BUNDLE ]] || die "missing dependency: $CA_BUNDLE (Debian package ca-certificates)"
CNI_PLUGINS=(bridge host-local loopback portmap)
for p in "${CNI_PLUGINS[@]}"; do
  [[ -x $CNI_BIN_DIR/$p ]] || die "missing dependency: $CNI_BIN_DIR/$p (Debian package containernetworking-plugins)"
done
if $csi; then
  [[ -x $BIN/csi-provisioner ]] || die "missing $BIN/csi-provisioner (run hack/build-cluster.sh csi)"
  LOSETUP=$(command -v losetup) || die "missing dependency: losetup (Debian package mount)"
fi
if $import; then
  [[ -S $CTRD_SOCK ]] || die "containerd is not running on $CTRD_SOCK (start it with hack/local-up.sh)"
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1)
[[ -n $version ]] || die "no version in Cargo.toml"
OUT=$ROOT/_output/images
mkdir -p "$OUT"

cargo_args=(build --bin rustlet)
! $csi || cargo_args+=(--bin csi-hostpath)
[[ $profile == release ]] && cargo_args+=(--release)
log "building rustlet (cargo ${cargo_args[*]})"
(cd "$ROOT" && CARGO_TARGET_DIR=$CARGO_TARGET_DIR cargo "${cargo_args[@]}") >"$OUT/rustlet-build.log" 2>&1 ||
  die "cargo ${cargo_args[*]} failed (log: ${OUT#"$ROOT"/}/rustlet-build.log)"
RUSTLET=$CARGO_TARGET_DIR/$profile/rustlet

# build NAME ARGS...: _output/images/NAME.tar tagged NAME:<version> and
# NAME:latest; prints its image ID. The tarball is written beside and renamed
# into place, so that a reader of the last one (another test's import or
# `kind load`) never sees half of it.
build() {
  local name=$1
  shift
  "$BIN/imagebuild" --out "$OUT/.$name.tar.$$" --tag "$name:$version" --tag "$name:latest" "$@" >/dev/null
  mv -f "$OUT/.$name.tar.$$" "$OUT/$name.tar"
  local id
  id=$(tar -xOf "$OUT/$name.tar" manifest.json | jq -r '.[0].Config')
  log "$name:$version: ${OUT#"$ROOT"/}/$name.tar (${id:7:12})"
}

image_libs "$RUSTLET" || die "$libs_missing"
build rustlet --add "$RUSTLET=/usr/local/bin/rustlet" "${libs[@]}" \
  --add "$CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt" --dir /tmp \
  --entrypoint '["/usr/local/bin/rustlet"]' --cmd '["run"]'

runtime_bins=("$BIN/containerd" "$BIN/containerd-shim-runc-v2" "$BIN/ctr" "$RUNC")
runtime_args=()
for b in "${runtime_bins[@]}"; do runtime_args+=(--add "$b=/usr/local/bin/${b##*/}"); done
cni_srcs=()
for p in "${CNI_PLUGINS[@]}"; do
  cni_srcs+=("$CNI_BIN_DIR/$p")
  runtime_args+=(--add "$CNI_BIN_DIR/$p=/opt/cni/bin/$p")
done
image_libs "${runtime_bins[@]}" "${cni_srcs[@]}" || die "$libs_missing"
# A shell (static busybox) for the chart's shim.sh, which starts each shim.
[[ -x /bin/busybox ]] || die "missing dependency: /bin/busybox (Debian package busybox-static)"
runtime_args+=(--add /bin/busybox=/bin/busybox --link /bin/sh=busybox --link /bin/mkdir=busybox)
build rustlet-node-runtime "${runtime_args[@]}" "${libs[@]}" --dir /tmp --dir /run \
  --env "PATH=/usr/local/bin:/usr/bin:/bin" \
  --entrypoint '["/usr/local/bin/containerd"]'

images=(rustlet rustlet-node-runtime)
if $csi; then
  CSI_HOSTPATH=$CARGO_TARGET_DIR/$profile/csi-hostpath
  image_libs "$CSI_HOSTPATH" "$LOSETUP" || die "$libs_missing"
  build rustlet-csi-hostpath --add "$CSI_HOSTPATH=/usr/local/bin/csi-hostpath" \
    --add "$BIN/csi-provisioner=/usr/local/bin/csi-provisioner" --add "$LOSETUP=/usr/sbin/losetup" \
    "${libs[@]}" --dir /tmp --env "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/bin" \
    --entrypoint '["/usr/local/bin/csi-hostpath"]'
  images+=(rustlet-csi-hostpath)
fi

if $import; then
  for name in "${images[@]}"; do
    ctr_k8s images import --snapshotter overlayfs "$OUT/$name.tar" >/dev/null 2>"$OUT/import.log" ||
      die "ctr images import $OUT/$name.tar failed: $(tail -1 "$OUT/import.log")"
    log "imported $name:$version and $name:latest"
  done
fi
