#!/usr/bin/env bash
# The Helm chart on a kind cluster, end to end: creates a one-node kind
# cluster (sigs.k8s.io/kind, built from its Go module), loads the rustlet
# images into it with `kind load image-archive`, and runs hack/test-chart.sh
# against it (helm install, the companion node Ready, a pod on it, logs,
# exec, port-forward, the ServiceAccount's permissions, helm upgrade, helm
# uninstall). Deletes the cluster at the end unless --keep.
#
#   hack/kind-e2e.sh [--keep] [--release]
#
# --release puts the release build in the rustlet image (default: the debug
# build, as hack/test-chart.sh).
#
# Docker: the daemon `docker info` reaches (DOCKER_HOST, or the default
# socket) when there is one. Otherwise this script starts Debian's dockerd
# (`apt-get install docker.io` when it is missing) with a socket and state
# of its own under _output/kind/ and its data (the images) under
# $RUSTLET_CACHE/kind/docker (default ~/.cache/rustlet), outside the
# checkout, so that a clean clone finds the images built before; no iptables rules and no default
# bridge, and stops it at the end with the network kind made: the host's
# firewall, bridges and FORWARD policy are left as they were. When this
# host's capability bounding set lacks capabilities that a `--privileged`
# container asks for (some sandboxes drop CAP_SYS_RESOURCE), that dockerd runs
# containers through hack/kind/runc-keep-caps, which leaves those out.
#
# No registry is needed. The node image is built here, as `kind build
# node-image` builds one (a build container, the Kubernetes binaries copied
# in, images imported into its containerd unpacked later, `docker commit`),
# but from local parts only:
#   - the base image: a Debian bookworm root (debootstrap; bookworm's systemd
#     252 still boots on a cgroup v1 host, trixie's 257 does not) with the
#     packages of kind's base image, Debian's runc and CNI plugins, kind's
#     own base-image files from its Go module, and containerd from
#     _output/bin;
#   - kubeadm, kubelet, kubectl (hack/build-cluster.sh kind and k8s);
#   - the images kubeadm runs, named as it names them, and the test images,
#     from hack/images.sh --control-plane --out, with etcd's own command line
#     in the etcd image (`kind build node-image` would fetch etcd, coredns
#     and pause from registry.k8s.io).
# The cluster runs without kube-proxy and CoreDNS (no images of them are
# built here; the chart needs neither) and with a ptp CNI configuration in
# place of kindnetd. Both images are rebuilt only when their inputs change
# (their contents, not their paths or times); the Debian root is kept in
# $RUSTLET_CACHE/kind too.
#
# Before the chart, the systemd cgroup driver's test runs on the kind node,
# against the node's systemd and containerd (cgroups::tests, ignored
# elsewhere).
#
# Ends with hack/test-chart.sh's line "N passed, M failed"; exits non-zero if
# a check failed or a step before them did.
set -euo pipefail
PROG=kind-e2e
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

keep=false
chart_args=()
while (($#)); do
  case $1 in
    --keep) keep=true ;;
    --release) chart_args+=(--release) ;;
    *) die "unexpected argument '$1' (usage: hack/kind-e2e.sh [--keep] [--release])" ;;
  esac
  shift
done

KIND_DIR=$ROOT/_output/kind
KIND_CACHE=${RUSTLET_CACHE:-${HOME:-/root}/.cache/rustlet}/kind
CLUSTER=rustlet-e2e
KIND=$BIN/kind
K8S_VERSION=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$ROOT/tests/cluster/go.mod")
SUITE=bookworm
# kind's base image packages (images/base/Dockerfile), less nfs-common,
# open-iscsi and fuse-overlayfs, which nothing here uses, plus Debian's runc
# and CNI plugins, which kind's Dockerfile builds from source.
PACKAGES=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,curl,jq,procps,runc,containernetworking-plugins
mkdir -p "$KIND_DIR" "$KIND_CACHE"
# The capabilities Docker gives a --privileged container are all it knows;
# CAP_SYS_RESOURCE is the one sandboxes drop. Without it, no process on this
# host may lower its OOM score, which containerd does for every pod.
sys_resource=true
(((16#$(awk '/^CapBnd:/ { print $2 }' /proc/self/status) >> 24 & 1) == 1)) || sys_resource=false

# ------------------------------------------------------------------ docker
own_dockerd=false
forward_policy=''
start_dockerd() {
  command -v dockerd >/dev/null 2>&1 || {
    log "installing Debian's docker.io"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io >"$KIND_DIR/apt.log" 2>&1 ||
      { tail -20 "$KIND_DIR/apt.log" >&2; die "apt-get install docker.io failed"; }
  }
  need_cmd docker "the docker CLI (Debian package docker.io)"
  local args=(--host "unix://$KIND_DIR/docker.sock" --data-root "$KIND_CACHE/docker" --exec-root "$KIND_DIR/run"
    --pidfile "$KIND_DIR/dockerd.pid" --iptables=false --ip-masq=false --bridge=none)
  if ! $sys_resource; then
    log "the capability bounding set lacks CAP_SYS_RESOURCE: containers run through hack/kind/runc-keep-caps"
    args+=(--add-runtime "keep-caps=$ROOT/hack/kind/runc-keep-caps" --default-runtime keep-caps)
  fi
  forward_policy=$(iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" { print $3; exit }')
  nohup setsid dockerd "${args[@]}" >"$KIND_DIR/dockerd.log" 2>&1 </dev/null &
  own_dockerd=true
  export DOCKER_HOST=unix://$KIND_DIR/docker.sock
  wait_for "dockerd" 30 docker info || { tail -20 "$KIND_DIR/dockerd.log" >&2; die "dockerd did not start"; }
  log "started dockerd $(docker version --format '{{.Server.Version}}') (log ${KIND_DIR#"$ROOT"/}/dockerd.log)"
}

stop_dockerd() {
  $own_dockerd || return 0
  docker network rm kind >/dev/null 2>&1 || true
  local pid
  pid=$(cat "$KIND_DIR/dockerd.pid" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
  # Docker made no rules (--iptables=false); the policy is put back in case
  # something else changed it.
  [[ -z $forward_policy ]] || iptables -P FORWARD "$forward_policy" 2>/dev/null || true
  own_dockerd=false
  log "stopped dockerd"
}

# kind mounts the host's /lib/modules into its nodes; Docker makes the
# directory when the host has none, and it goes again at the end.
made_modules=false
[[ -e /lib/modules ]] || made_modules=true

cleanup() {
  local rc=$?
  trap - EXIT
  docker rm -f rustlet-kind-build >/dev/null 2>&1 || true
  if ! $keep; then
    "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    stop_dockerd
    ! $made_modules || rmdir /lib/modules 2>/dev/null || true
  elif $own_dockerd; then
    log "kept: cluster $CLUSTER; export DOCKER_HOST=$DOCKER_HOST KUBECONFIG=$KIND_DIR/kubeconfig"
  fi
  exit "$rc"
}
trap cleanup EXIT

if docker info >/dev/null 2>&1; then
  log "using the Docker daemon at ${DOCKER_HOST:-the default socket}"
else
  start_dockerd
fi

# ------------------------------------------------------------------ builds
build_if_missing all kube-apiserver kube-controller-manager kube-scheduler kubelet etcd containerd ctr imagebuild pause agnhost
build_if_missing kind kind kubeadm kubectl kind-node/etcd
build_if_missing helm helm
"$ROOT/hack/images.sh" --control-plane --tests --out "$KIND_DIR/images" || die "hack/images.sh --out failed"
# kubeadm runs etcd with etcd's own flags: its image holds etcd's command
# line (in place of the local cluster's embedded etcd), under the same name.
etcd_image=$KIND_DIR/etcd-kubeadm.tar
[[ $etcd_image -nt $BIN/kind-node/etcd ]] ||
  "$BIN/imagebuild" --out "$etcd_image" --tag "$(control_plane_image etcd)" \
    --add "$BIN/kind-node/etcd=/usr/local/bin/etcd" --dir /tmp --dir /var/lib/etcd \
    --env PATH=/usr/local/bin:/usr/bin:/bin --entrypoint '["/usr/local/bin/etcd"]' >/dev/null

# key FILE...: a short digest of the files' contents.
key() { sha256sum "$@" | awk '{ print $1 }' | sha256sum | cut -c1-12; }

kind_module=$(cd "$ROOT/tests/cluster/kind" && go list -m -f '{{.Dir}}' sigs.k8s.io/kind)
KIND_FILES=$kind_module/images/base/files

# The Debian root, kept while the suite and packages are the same.
rootfs=$KIND_CACHE/rootfs-$SUITE
if [[ ! -f $rootfs.packages || $(<"$rootfs.packages") != "$PACKAGES" ]]; then
  command -v debootstrap >/dev/null 2>&1 || {
    log "installing Debian's debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >"$KIND_DIR/apt.log" 2>&1 ||
      { tail -20 "$KIND_DIR/apt.log" >&2; die "apt-get install debootstrap failed"; }
  }
  log "debootstrap $SUITE (${PACKAGES//,/ })"
  rm -rf "$rootfs" "$rootfs.packages"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" http://deb.debian.org/debian \
    >"$KIND_DIR/debootstrap.log" 2>&1 || { tail -20 "$KIND_DIR/debootstrap.log" >&2; die "debootstrap failed"; }
  echo "$PACKAGES" >"$rootfs.packages"
fi

# The base image: what kind's images/base/Dockerfile puts in, on that root.
base_key=$( {
  echo "$PACKAGES $sys_resource"
  (cd "$KIND_FILES" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  key "$ROOT/hack/kind-e2e.sh"
  key "$BIN/containerd" "$BIN/containerd-shim-runc-v2" "$BIN/ctr"
} | sha256sum | cut -c1-12)
BASE_IMAGE=rustlet.dev/kind-base:$SUITE-$base_key
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  log "building $BASE_IMAGE"
  install -m 755 "$KIND_FILES"/usr/local/bin/* "$rootfs/usr/local/bin/"
  mkdir -p "$rootfs/kind/bin" "$rootfs/LICENSES" "$rootfs/etc/systemd/system/kubelet.service.d" "$rootfs/etc/kubernetes/manifests"
  cp -r "$KIND_FILES/kind/." "$rootfs/kind/"
  cp -r "$KIND_FILES/etc/." "$rootfs/etc/"
  cp "$KIND_FILES"/LICENSES/* "$rootfs/LICENSES/"
  chmod -R u=rwX,go=rX "$rootfs/kind" "$rootfs/etc/containerd" "$rootfs/etc/systemd/system"
  chmod 755 "$rootfs"/kind/bin/*
  install -m 755 "$BIN/containerd" "$BIN/containerd-shim-runc-v2" "$BIN/ctr" "$rootfs/usr/local/bin/"
  # Debian's CNI plugins where kind's containerd configuration looks.
  mkdir -p "$rootfs/opt/cni/bin"
  for p in "$rootfs"/usr/lib/cni/*; do ln -sfn "/usr/lib/cni/${p##*/}" "$rootfs/opt/cni/bin/${p##*/}"; done
  # As hack/containerd-config.toml: the runtime keeps its pods' OOM scores
  # at or above its own where it may not lower them (containerd then does
  # as for a rootless runtime).
  $sys_resource || sed -i 's/^\( *restrict_oom_score_adj = \)false/\1true/' "$rootfs/etc/containerd/config.toml"
  "$BIN/ctr" oci spec |
    jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
    jq 'del(.process.rlimits)' >"$rootfs/etc/containerd/cri-base.json"
  # systemd as kind's Dockerfile leaves it: no units but its own.
  find "$rootfs/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$rootfs"/lib/systemd/system/multi-user.target.wants/* "$rootfs"/etc/systemd/system/*.wants/* \
    "$rootfs"/lib/systemd/system/local-fs.target.wants/* "$rootfs"/lib/systemd/system/sockets.target.wants/*udev* \
    "$rootfs"/lib/systemd/system/sockets.target.wants/*initctl* "$rootfs"/lib/systemd/system/basic.target.wants/*
  grep -qx ReadKMsg=no "$rootfs/etc/systemd/journald.conf" || echo ReadKMsg=no >>"$rootfs/etc/systemd/journald.conf"
  systemctl --root="$rootfs" enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
  systemctl --root="$rootfs" mask systemd-binfmt.service >/dev/null 2>&1
  tar -C "$rootfs" --numeric-owner -c . | docker import - "$BASE_IMAGE-root" >/dev/null
  # `docker import --change` cannot set the stop signal; a build from it can.
  printf '%s\n' "FROM $BASE_IMAGE-root" 'ENV container=docker' 'STOPSIGNAL SIGRTMIN+3' \
    'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' |
    DOCKER_BUILDKIT=0 docker build -q -t "$BASE_IMAGE" - >/dev/null
  docker rmi "$BASE_IMAGE-root" >/dev/null
fi

# The node image: kubeadm, kubelet, kubectl in /usr/bin, /kind/version, a CNI
# configuration, and every image imported (kind's own import flags).
images=("$etcd_image")
for img in "$KIND_DIR"/images/*.tar; do [[ ${img##*/} == etcd.tar ]] || images+=("$img"); done
node_key=$( {
  echo "$BASE_IMAGE $K8S_VERSION"
  key "$BIN/kubeadm" "$BIN/kubelet" "$BIN/kubectl" "${images[@]}"
} | sha256sum | cut -c1-12)
NODE_IMAGE=rustlet.dev/kind-node:$K8S_VERSION-$node_key
if ! docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
  log "building $NODE_IMAGE"
  docker rm -f rustlet-kind-build >/dev/null 2>&1 || true
  docker run -d --name rustlet-kind-build --entrypoint=sleep "$BASE_IMAGE" infinity >/dev/null
  node() { docker exec rustlet-kind-build "$@"; }
  for b in kubeadm kubelet kubectl; do docker cp "$BIN/$b" "rustlet-kind-build:/usr/bin/$b"; done
  echo "$K8S_VERSION" | docker exec -i rustlet-kind-build tee /kind/version >/dev/null
  # One node: ptp links and host-local addresses from the node's pod CIDR
  # (kubeadm's first /24 of 10.244.0.0/16) serve in place of kindnetd.
  docker exec -i rustlet-kind-build sh -c 'mkdir -p /etc/cni/net.d && cat >/etc/cni/net.d/10-ptp.conflist' <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "kind-ptp",
  "plugins": [
    { "type": "ptp", "ipMasq": false,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.244.0.0/24" }]], "routes": [{ "dst": "0.0.0.0/0" }] } },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
  node bash -c 'nohup containerd >/var/log/containerd-build.log 2>&1 &'
  wait_for "containerd in the build container" 30 node ctr version
  for img in "${images[@]}"; do
    docker exec -i rustlet-kind-build ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
      --all-platforms --no-unpack --digests - <"$img" >"$KIND_DIR/import.log" 2>&1 ||
      { grep -v DEPRECATION "$KIND_DIR/import.log" >&2; die "import $img into the node image failed"; }
  done
  # kind's containerd configuration names pause 3.10; the one built here is 3.10.2.
  node ctr --namespace=k8s.io images tag --force registry.k8s.io/pause:3.10.2 registry.k8s.io/pause:3.10 >/dev/null 2>&1
  node pkill containerd
  docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' rustlet-kind-build "$NODE_IMAGE" >/dev/null
  docker rm -f rustlet-kind-build >/dev/null
fi

# Older builds of both go: each is most of a gigabyte.
docker images --format '{{.Repository}}:{{.Tag}}' |
  awk -v base="$BASE_IMAGE" -v node="$NODE_IMAGE" '/^rustlet\.dev\/kind-(base|node):/ && $0 != base && $0 != node' |
  xargs -r docker rmi >/dev/null 2>&1 || true

# ------------------------------------------------------------------ cluster
"$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
cat >"$KIND_DIR/cluster.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  disableDefaultCNI: true
  kubeProxyMode: none
nodes:
  - role: control-plane
    kubeadmConfigPatches:
      # kind's own list (preflight, and kube-proxy with kubeProxyMode none)
      # and CoreDNS, whose image is not built here.
      - |
        kind: InitConfiguration
        skipPhases: [preflight, addon/kube-proxy, addon/coredns]
      # The host may have cgroup v1, which the kubelet refuses by default;
      # its disk may be more than 85 % full, and the images cannot be pulled
      # again (as hack/local-up.sh configures its agents).
      - |
        kind: KubeletConfiguration
        failCgroupV1: false
        evictionHard: { memory.available: 100Mi, nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%" }
        imageGCHighThresholdPercent: 100
        imageGCLowThresholdPercent: 99
EOF
t0=$(now_ms)
"$KIND" create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config "$KIND_DIR/cluster.yaml" \
  --kubeconfig "$KIND_DIR/kubeconfig" --wait 180s || die "kind create cluster failed"
log "kind cluster $CLUSTER up in $(since "$t0")"

# ------------------------------------------------------------------ systemd
# The systemd cgroup driver against the node's own systemd (over its system
# bus) and containerd (SystemdCgroup = true): the cgroups module's test that
# needs them, run on the node. It keeps to a cgroup root of its own beside
# the node kubelet's kubepods.slice, and the kubelet is stopped meanwhile:
# it would stop the test's sandbox, which it does not know, as an orphan.
log "the systemd cgroup driver on the kind node"
test_bin=$(cd "$ROOT" && CARGO_TARGET_DIR=$CARGO_TARGET_DIR cargo test --lib --no-run --message-format=json 2>"$KIND_DIR/lib-tests-build.log" |
  jq -r 'select(.reason == "compiler-artifact" and .profile.test and (.target.kind | index("lib"))) | .executable' | tail -1) || true
[[ -n $test_bin && -x $test_bin ]] || { tail -20 "$KIND_DIR/lib-tests-build.log" >&2; die "cargo test --lib --no-run gave no test binary"; }
node_container=$CLUSTER-control-plane
docker cp "$test_bin" "$node_container:/usr/local/bin/rustlet-lib-tests"
systemd_test=cgroups::tests::systemd_driver_makes_limits_and_removes_the_kubelets_slices
docker exec "$node_container" systemctl stop kubelet
systemd_ok=false
docker exec "$node_container" /usr/local/bin/rustlet-lib-tests --ignored --exact "$systemd_test" \
  >"$KIND_DIR/systemd-driver.log" 2>&1 && grep -q '^test result: ok. 1 passed' "$KIND_DIR/systemd-driver.log" &&
  systemd_ok=true
docker exec "$node_container" systemctl start kubelet
docker exec "$node_container" rm -f /usr/local/bin/rustlet-lib-tests
if $systemd_ok; then
  log "PASS the systemd cgroup driver ($(docker exec "$node_container" systemctl --version | head -1))"
else
  cat "$KIND_DIR/systemd-driver.log" >&2
  die "the systemd cgroup driver test failed on the kind node (log ${KIND_DIR#"$ROOT"/}/systemd-driver.log)"
fi

"$ROOT/hack/test-chart.sh" --kind "$CLUSTER" --kubeconfig "$KIND_DIR/kubeconfig" "${chart_args[@]}"
