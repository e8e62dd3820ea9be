#!/usr/bin/env bash
# Installs what building and testing rustlet needs on a fresh Debian machine:
# the Debian packages (runc, CNI plugins, protoc, busybox-static, iproute2,
# iptables, openssl, a C toolchain for the e2e busybox, dbus-daemon for the
# graceful node shutdown tests, ...) and checks for the Go and Rust toolchains.
# Idempotent: installs only what is missing.
set -euo pipefail
PROG=install-deps
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

packages=(containernetworking-plugins runc protobuf-compiler busybox-static iproute2 iptables
  conntrack socat openssl jq psmisc procps util-linux curl ca-certificates apache2-utils
  gcc make libc6-dev bzip2 dbus-daemon)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages present"
fi
# Debian packages whose files go into the local conformance images but which
# are not installed on the host (nginx's maintainer scripts would start a web
# server on it): downloaded and unpacked under _output/debs/<package>/ for
# hack/images.sh.
for p in "${IMAGE_DEBS[@]}"; do
  [[ ! -f $DEBS/$p/.unpacked ]] || continue
  if ! apt-cache show "$p" >/dev/null 2>&1; then
    log "apt-get update (no package list knows $p)"
    apt-get update -qq
  fi
  log "downloading Debian package $p for the local images (unpacked in ${DEBS#"$ROOT"/}/$p, not installed)"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/rustlet-deb.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download -qq "$p" 2>/dev/null) || die "apt-get download $p failed"
  rm -rf "${DEBS:?}/$p"
  mkdir -p "$DEBS/$p"
  dpkg-deb -x "$tmp"/*.deb "$DEBS/$p"
  dpkg-deb -f "$tmp"/*.deb Version >"$DEBS/$p/.unpacked"
  rm -rf "$tmp"
  trap - EXIT
done

command -v go >/dev/null || die "go is not installed (Go 1.26 is needed to build the control plane)"
command -v cargo >/dev/null || die "cargo is not installed (Rust 1.91+ is needed to build rustlet)"
if ! command -v kubectl >/dev/null; then
  log "kubectl not found: building it from the Go module into _output/bin"
  (cd "$ROOT/tests/cluster" && go build -trimpath -o "$BIN/kubectl" k8s.io/kubernetes/cmd/kubectl)
fi
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt >/dev/null 2>&1 || true
log "ready: $(go version | awk '{print $3}'), $(cargo --version | awk '{print $1, $2}')"
