#!/usr/bin/env bash
# Builds the upstream control plane, the kubelet, etcd, containerd and agnhost
# from their Go modules into _output/bin/. Go's module and build caches make a
# warm rebuild take seconds.
#
#   hack/build-cluster.sh [all|k8s|kubelet|containerd|agnhost|images|busybox|registry|e2e|e2e-node|ginkgo|metrics-server|helm|kind|csi|dra]
#
# `busybox` builds busybox $BUSYBOX_VERSION as upstream configures it by default
# (defconfig, static) into _output/bin/busybox-$BUSYBOX_VERSION, for the e2e
# busybox image (hack/images.sh): the upstream image's applets (nmeter, which
# Debian's busybox leaves out and the node suite's lifecycle tests time
# with) and its sh's behaviour. The source is Debian's source package, whose
# original tarball is upstream's release; apt verifies it against Debian's
# signed index, and its SHA-256 is checked against the one recorded here.
#
# `e2e` (not part of `all`) builds the upstream e2e test binary e2e.test and
# the ginkgo CLI that runs it in parallel (hack/conformance.sh); `e2e-node`
# the node suite's e2e_node.test and ginkgo.
# `metrics-server` (not part of `all`) builds metrics-server, which
# `hack/local-up.sh --metrics-server` runs behind the aggregation layer.
# `helm` (not part of `all`) builds the helm CLI the chart is checked with.
# `kind` (not part of `all`) builds kind, kubeadm, kubectl and etcd's own
# command line (_output/bin/kind-node/etcd) for hack/kind-e2e.sh.
# `dra` (not part of `all`) builds the upstream DRA test driver,
# dra-test-driver, whose kubelet plugin hack/dra-driver.sh runs.
#
# Each target's binaries are kept outside the checkout, in
# $RUSTLET_CACHE/bin/<target>-<key> (default ~/.cache/rustlet), keyed by what
# builds them: the Go toolchain, the modules and sources under tests/cluster,
# this script and the busybox version. A clean clone at a new path (as CI's) copies them from
# there instead of building them again; a change to any input builds anew.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=$root/_output/bin
mkdir -p "$bin"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

what=${1:-all}

log() { echo "$(date +%H:%M:%S) build-cluster: $*" >&2; }

# kind (sigs.k8s.io/kind, its own module tests/cluster/kind) and what its node
# image holds of Kubernetes besides the kubelet: kubeadm and kubectl, from the
# same k8s.io/kubernetes as the rest (hack/kind-e2e.sh).
build_kind() {
  local v
  v=$(grep -m1 'sigs.k8s.io/kind v' tests/cluster/kind/go.mod | awk '{print $NF}')
  log "kind (sigs.k8s.io/kind $v), kubeadm, kubectl, etcd's command line (kind-node/etcd)"
  (cd tests/cluster/kind && go build -trimpath -ldflags='-s -w' -o "$bin/" sigs.k8s.io/kind)
  # kubeadm reads its own version to choose what it deploys: stamped as the
  # module's, as Kubernetes' own build does.
  v=$(grep -m1 'k8s.io/kubernetes v' tests/cluster/go.mod | awk '{print $NF}')
  local major=${v#v} minor
  minor=${major#*.}
  minor=${minor%%.*}
  major=${major%%.*}
  local pkg=k8s.io/component-base/version
  (cd tests/cluster && go build -trimpath -o "$bin/" \
    -ldflags="-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
    k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kubectl)
  # etcd's own command line, for kubeadm's etcd static pod (static: the image
  # holds nothing else).
  (cd tests/cluster && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$bin/kind-node/etcd" ./cmd/etcdmain)
}

build_k8s() {
  log "kube-apiserver, kube-controller-manager, kube-scheduler, etcd (k8s.io/kubernetes $(grep -m1 'k8s.io/kubernetes v' tests/cluster/go.mod | awk '{print $NF}'))"
  (cd tests/cluster && go build -trimpath -ldflags='-s -w' -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    ./cmd/etcd)
}

# The upstream kubelet: the baseline agent (hack/local-up.sh --agent kubelet)
# and kind's node agent; a node run by rustlet needs none.
build_kubelet() {
  log "kubelet (k8s.io/kubernetes $(grep -m1 'k8s.io/kubernetes v' tests/cluster/go.mod | awk '{print $NF}'))"
  (cd tests/cluster && go build -trimpath -ldflags='-s -w' -o "$bin/" k8s.io/kubernetes/cmd/kubelet)
}

# The version is E2E_BUSYBOX_VERSION of hack/lib.sh (hack/images.sh and
# hack/local-up.sh use it too).
BUSYBOX_VERSION=$(sed -n 's/^E2E_BUSYBOX_VERSION=//p' "$root/hack/lib.sh")
BUSYBOX_SHA256=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
# The build time stamped into it: the release date of 1.37.0 (2024-09-26).
BUSYBOX_SOURCE_DATE_EPOCH=1727308800
# The Debian release whose source package has that version.
BUSYBOX_SUITE=trixie

build_busybox() {
  # Its version names the binary, and its source and configuration are fixed:
  # one that is there is kept, unless it was built before its build time was
  # fixed (its banner names another date).
  if [[ -x $bin/busybox-$BUSYBOX_VERSION ]] &&
    grep -aq "BusyBox v$BUSYBOX_VERSION ($(date -u -d "@$BUSYBOX_SOURCE_DATE_EPOCH" '+%Y-%m-%d %H:%M:%S') UTC)" "$bin/busybox-$BUSYBOX_VERSION"; then
    log "busybox $BUSYBOX_VERSION: up to date (_output/bin/busybox-$BUSYBOX_VERSION)"
    return 0
  fi
  log "busybox $BUSYBOX_VERSION (defconfig, static; Debian $BUSYBOX_SUITE's source package)"
  local src=$root/_output/src/busybox
  local tarball=$src/busybox_$BUSYBOX_VERSION.orig.tar.bz2
  mkdir -p "$src/lists/partial" "$src/cache/archives/partial"
  if [[ ! -f $tarball ]] || ! echo "$BUSYBOX_SHA256  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
    # apt with a source list and package lists of its own: the host's apt
    # configuration is left alone.
    echo "deb-src http://deb.debian.org/debian $BUSYBOX_SUITE main" >"$src/sources.list"
    local apt=(apt-get -q -o Dir::Etc::SourceList="$src/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$src/lists" -o Dir::Cache="$src/cache" -o Dir::State::Status=/dev/null
      -o APT::Sandbox::User=root)
    "${apt[@]}" update >"$src/apt.log" 2>&1 || { cat "$src/apt.log" >&2; log "apt-get update failed"; return 1; }
    (cd "$src" && rm -f ./*.dsc ./*.debian.tar.* && "${apt[@]}" source --download-only "busybox/$BUSYBOX_SUITE") >>"$src/apt.log" 2>&1 ||
      { cat "$src/apt.log" >&2; log "apt-get source busybox failed"; return 1; }
    [[ -f $tarball ]] || { log "Debian $BUSYBOX_SUITE's busybox source is no longer $BUSYBOX_VERSION (see $src)"; return 1; }
    echo "$BUSYBOX_SHA256  $tarball" | sha256sum -c --quiet - || { log "$tarball: unexpected SHA-256"; return 1; }
  fi
  rm -rf "$src/busybox-$BUSYBOX_VERSION"
  tar -xjf "$tarball" -C "$src"
  (
    cd "$src/busybox-$BUSYBOX_VERSION"
    make defconfig >/dev/null
    sed -i 's/^# CONFIG_STATIC is not set$/CONFIG_STATIC=y/' .config
    grep -qx 'CONFIG_STATIC=y' .config
    # The build time busybox stamps into its banner is SOURCE_DATE_EPOCH's,
    # fixed at the release date: the same source gives the same binary on
    # any machine (a conformance sitting compares its binaries' digest).
    SOURCE_DATE_EPOCH=$BUSYBOX_SOURCE_DATE_EPOCH make -j"$(nproc)" >"$src/build.log" 2>&1 ||
      { tail -n 30 "$src/build.log" >&2; exit 1; }
  )
  install -m 755 "$src/busybox-$BUSYBOX_VERSION/busybox" "$bin/busybox-$BUSYBOX_VERSION"
}

build_agnhost() {
  log "agnhost (static, for the agnhost image) and porter's localhost certificate"
  (cd tests/cluster && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$bin/agnhost" k8s.io/kubernetes/test/images/agnhost)
  local src
  src=$(cd tests/cluster && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter
  mkdir -p "$bin/agnhost-porter"
  install -m 644 "$src/localhost.crt" "$src/localhost.key" "$bin/agnhost-porter/"
}

build_containerd() {
  log "containerd, containerd-shim-runc-v2, ctr (github.com/containerd/containerd/v2)"
  (cd tests/cluster/node && go build -trimpath -ldflags='-s -w' -o "$bin/" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr)
}

build_images() {
  log "image builder, registry layout writer and the small programs of the local images (pause, nnp)"
  (cd tests/cluster/node && CGO_ENABLED=0 go build -trimpath -o "$bin/" ./cmd/imagebuild ./cmd/registrylayout ./cmd/pause ./cmd/nnp)
}

build_registry() {
  log "registry (github.com/distribution/distribution/v3, for private image pulls in the e2e tests)"
  (cd tests/cluster/registry && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$bin/registry" \
    github.com/distribution/distribution/v3/cmd/registry)
}

build_e2e() {
  log "e2e.test (k8s.io/kubernetes/test/e2e)"
  (cd tests/cluster && go test -c -trimpath -o "$bin/e2e.test" k8s.io/kubernetes/test/e2e)
  build_ginkgo
}

# e2e_node.test: the node's own conformance suite (test/e2e_node), which
# hack/conformance.sh --suite node runs against the local node.
build_e2e_node() {
  log "e2e_node.test (k8s.io/kubernetes/test/e2e_node)"
  (cd tests/cluster && go test -c -trimpath -o "$bin/e2e_node.test" k8s.io/kubernetes/test/e2e_node)
  build_ginkgo
}

# The ginkgo CLI runs e2e.test in parallel; its version is the one
# k8s.io/kubernetes pins (tests/cluster/go.mod).
build_ginkgo() {
  log "ginkgo ($(grep -m1 'github.com/onsi/ginkgo/v2 v' tests/cluster/go.mod | awk '{print $NF}'))"
  (cd tests/cluster && go build -trimpath -ldflags='-s -w' -o "$bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
}

# metrics-server scrapes the node agents' /metrics/resource and serves
# metrics.k8s.io (kubectl top). Its own module (tests/cluster/metrics-server)
# keeps its Kubernetes library versions apart from the control plane's.
build_metrics_server() {
  log "metrics-server (sigs.k8s.io/metrics-server $(grep -m1 'sigs.k8s.io/metrics-server v' tests/cluster/metrics-server/go.mod | awk '{print $NF}'))"
  (cd tests/cluster/metrics-server && go build -trimpath -ldflags='-s -w' -o "$bin/" sigs.k8s.io/metrics-server/cmd/metrics-server)
}

# helm (helm.sh/helm/v4): the chart in charts/ is linted, rendered and
# installed with the real CLI. Its own module (tests/cluster/helm), as
# metrics-server's; the version is stamped as helm's own Makefile does.
build_helm() {
  local v
  v=$(grep -m1 'helm.sh/helm/v4 v' tests/cluster/helm/go.mod | awk '{print $NF}')
  log "helm (helm.sh/helm/v4 $v)"
  (cd tests/cluster/helm && go build -trimpath \
    -ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$v" \
    -o "$bin/" helm.sh/helm/v4/cmd/helm)
}

# The upstream CSI sidecars the storage tests run against the project's test
# driver (src/bin/csi-hostpath.rs): external-provisioner and
# external-attacher, from their own module (tests/cluster/csi), as
# metrics-server's; and the registrar hack/csi-stack.sh registers the driver
# with (tests/cluster/cmd/csi-registrar, on the kubelet's own registration
# API package); and the kubelet's own pod resources client, which the device
# tests call the agent with (tests/cluster/cmd/podresources-client).
build_csi() {
  log "CSI sidecars (external-provisioner $(grep -m1 'external-provisioner/v6 v' tests/cluster/csi/go.mod | awk '{print $NF}'), external-attacher $(grep -m1 'external-attacher/v4 v' tests/cluster/csi/go.mod | awk '{print $NF}'))"
  (cd tests/cluster/csi && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$bin/" \
    github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner \
    github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher)
  (cd tests/cluster && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$bin/" \
    ./cmd/csi-registrar ./cmd/podresources-client)
}

# The upstream DRA test driver (test/e2e/dra/test-driver of the same
# k8s.io/kubernetes as the control plane): its `kubelet-plugin` subcommand
# publishes the node's simulated devices as a ResourceSlice, registers with
# the agent through <root-dir>/plugins_registry and writes a CDI spec per
# prepared claim (hack/dra-driver.sh). e2e.test compiles the same packages
# into its in-process driver.
build_dra() {
  log "dra-test-driver (k8s.io/kubernetes $(grep -m1 'k8s.io/kubernetes v' tests/cluster/go.mod | awk '{print $NF}') test/e2e/dra/test-driver)"
  (cd tests/cluster && go build -trimpath -ldflags='-s -w' -o "$bin/dra-test-driver" \
    k8s.io/kubernetes/test/e2e/dra/test-driver)
}

cache=${RUSTLET_CACHE:-${HOME:-/root}/.cache/rustlet}/bin
# The key of every target's inputs (computed once, on first use).
inputs_key=''
key_of_inputs() {
  [[ -z $inputs_key ]] || return 0
  inputs_key=$( {
    go version
    uname -m
    echo "${GOFLAGS:-}"
    sha256sum hack/build-cluster.sh
    grep '^E2E_BUSYBOX_VERSION=' hack/lib.sh
    find tests/cluster -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16)
}

# cached TARGET: TARGET's binaries from the cache when it has them for these
# inputs; otherwise built by build_TARGET into a directory of their own, kept
# in the cache and copied into _output/bin.
cached() {
  local target=$1 fn=build_${1//-/_}
  key_of_inputs
  local dir=$cache/$target-$inputs_key
  if [[ -f $dir.done ]]; then
    log "$target: from the cache (${dir/#"${HOME:-/root}"/\~})"
    cp -a --reflink=auto "$dir/." "$bin/"
    return 0
  fi
  mkdir -p "$cache"
  local stage
  stage=$(mktemp -d "$cache/.build-$target.XXXXXX") || return 1
  if ! (bin=$stage && "$fn"); then
    rm -rf "$stage"
    return 1
  fi
  cp -a --reflink=auto "$stage/." "$bin/"
  # Older builds of this target go: each may be hundreds of megabytes.
  local k16=????????????????
  rm -rf "$cache/$target"-$k16 "$cache/$target"-$k16.done "$dir"
  mv "$stage" "$dir"
  touch "$dir.done"
}

case "$what" in
  all)
    # One chain per Go module, the chains side by side: within a chain the
    # later targets reuse the packages the first compiled (two builds of one
    # module at once would each compile them); across chains, downloads,
    # links and busybox's make overlap the compiles.
    key_of_inputs
    chains=("k8s kubelet agnhost" "containerd images" "registry" "busybox")
    pids=()
    for chain in "${chains[@]}"; do
      # No `|| exit` here: it would turn errexit off inside cached; the
      # subshell stops at the first failure by itself.
      (for t in $chain; do cached "$t"; done) &
      pids+=($!)
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    ((failed == 0)) || { log "a build failed (see above)"; exit 1; }
    ;;
  k8s | kubelet | containerd | agnhost | images | busybox | registry | e2e | e2e-node | ginkgo | metrics-server | helm | kind | csi | dra)
    cached "$what" ;;
  *) echo "build-cluster: unknown target '$what' (all|k8s|kubelet|containerd|agnhost|images|busybox|registry|e2e|e2e-node|ginkgo|metrics-server|helm|kind|csi|dra)" >&2; exit 2 ;;
esac
