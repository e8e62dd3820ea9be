#!/usr/bin/env bash
# The local cluster's mirror of registry.k8s.io: an OCI distribution registry
# (_output/bin/registry, github.com/distribution/distribution/v3) on
# 127.0.0.1:5005 holding a copy of the local test images
# (registry.k8s.io/e2e-test-images/* and registry.k8s.io/pause:*, which
# hack/images.sh builds and imports), and containerd's hosts.toml that makes it
# registry.k8s.io's mirror. A pod or a test that pulls one of those images
# with imagePullPolicy Always then pulls it through CRI, as a node behind a
# pull-through cache does; any other registry.k8s.io image is not found, and
# other registries stay unreachable.
#
#   hack/registry-mirror.sh start   # start it (if not running), fill it, write hosts.toml
#   hack/registry-mirror.sh stop    # stop it and remove hosts.toml
#
# containerd reads the hosts directory ($LOCAL/containerd/certs.d, the
# `config_path` of hack/containerd-config.toml) at each pull: no restart.
# hack/local-up.sh --registry-mirror runs `start` once containerd is up, and
# hack/local-down.sh stops it.
set -euo pipefail
PROG=registry-mirror
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MIRROR_ADDR=127.0.0.1:5005
MIRROR_DIR=$LOCAL/mirror
HOSTS_DIR=$CTRD_DIR/certs.d/registry.k8s.io
# The images the mirror serves: what the upstream tests pull by name.
MIRRORED='^registry\.k8s\.io/(e2e-test-images/[^@]+|pause):[^@]+$'

ctr_k8s() { "$BIN/ctr" --address "$CTRD_SOCK" --namespace k8s.io "$@"; }

start() {
  [[ -S $CTRD_SOCK ]] || die "containerd is not running ($CTRD_SOCK): start the cluster first"
  build_if_missing registry registry
  mkdir -p "$MIRROR_DIR/data"
  if running_pid registry-mirror >/dev/null; then
    log "already running on $MIRROR_ADDR"
  else
    cat >"$MIRROR_DIR/config.yml" <<EOF
version: 0.1
log: { level: warn }
storage: { filesystem: { rootdirectory: $MIRROR_DIR/data } }
http: { addr: $MIRROR_ADDR }
EOF
    # No OpenTelemetry export: there is no collector to send traces to.
    start_daemon registry-mirror OTEL_TRACES_EXPORTER=none "$BIN/registry" serve "$MIRROR_DIR/config.yml"
    wait_daemon registry-mirror "the mirror on $MIRROR_ADDR" 20 \
      curl -sf --max-time 2 "http://$MIRROR_ADDR/v2/"
  fi
  # Each image under its path in registry.k8s.io; a push of what the mirror
  # already holds sends nothing but the manifest.
  local image path n=0
  while read -r image; do
    path=${image#registry.k8s.io/}
    ctr_k8s images tag --force "$image" "$MIRROR_ADDR/$path" >/dev/null 2>&1
    ctr_k8s images push --plain-http "$MIRROR_ADDR/$path" >/dev/null 2>"$MIRROR_DIR/push.err" ||
      die "push $image to the mirror: $(tail -1 "$MIRROR_DIR/push.err")"
    ctr_k8s images rm "$MIRROR_ADDR/$path" >/dev/null 2>&1
    n=$((n + 1))
  done < <(ctr_k8s images ls -q | grep -E "$MIRRORED" | sort)
  ((n > 0)) || die "no local registry.k8s.io test image to mirror (hack/images.sh imports them)"
  mkdir -p "$HOSTS_DIR"
  cat >"$HOSTS_DIR/hosts.toml" <<EOF
# Written by hack/registry-mirror.sh: registry.k8s.io through the local mirror.
server = "https://registry.k8s.io"

[host."http://$MIRROR_ADDR"]
  capabilities = ["pull", "resolve"]
EOF
  log "registry.k8s.io mirrored on $MIRROR_ADDR: $n images"
}

stop() {
  rm -f "$HOSTS_DIR/hosts.toml"
  stop_daemon registry-mirror
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  *) die "usage: hack/registry-mirror.sh start|stop" ;;
esac
