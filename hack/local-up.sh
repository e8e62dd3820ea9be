#!/usr/bin/env bash
# Starts a one-node Kubernetes cluster on 127.0.0.1, all state under
# _output/local/: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd (own socket, root and state) with bridge CNI,
# the local images, and a node agent.
#
#   hack/local-up.sh [--agent rustlet|kubelet|none] [--metrics-server] [--node-e2e]
#                    [--runtime-pid-ns] [--registry-mirror] [--test-images]
#   hack/local-up.sh --self-hosted
#
# --agent picks the node agent (default rustlet). --metrics-server also runs
# metrics-server (hack/build-cluster.sh metrics-server) on the host, registered
# with the API server's aggregation layer as v1beta1.metrics.k8s.io, scraping
# the agent's /metrics/resource: `kubectl top` works. --node-e2e configures
# the agent as the upstream node suite's own harness does
# (test/e2e_node/services/kubelet.go), for hack/conformance.sh --suite node:
# the node API on 0.0.0.0 (the suite calls 127.0.0.1:10250), the read-only
# port 10255, a static pod directory,
# _output/local/<agent>/manifests, read every 10 s, a 30 s
# evictionPressureTransitionPeriod, and no node lifecycle
# controller (nothing taints the node under pressure, as in the suite's own
# harness, which runs no controller-manager). It also links the paths the
# suite takes from the kubelet's defaults to the local cluster's:
# /var/lib/kubelet/pod-resources and /var/lib/kubelet/plugins_registry to the
# agent's, /var/run/cdi to _output/local/cdi (left in place by
# hack/local-down.sh; a real directory at one of them is left alone).
#
# --runtime-pid-ns runs containerd as pid 1 of a pid namespace of its own,
# with a /proc of that namespace in a mount namespace that shares every
# other mount with the host's (`/` made rshared). The upstream storage tests
# set volumes up on the node from a privileged pod that enters the mount
# namespace of the /proc/1 it sees through a hostPath of `/` (test/e2e
# hostexec: nsenter --mount=/rootfs/proc/1/ns/mnt); this machine's own
# pid 1 refuses that to root, and containerd's namespace is the host's
# mounts (hack/conformance.sh --suite storage). The pids the runtime reports
# are then of its namespace: rustlet's per-container stats, which read
# /proc/<pid>/cgroup, are missing.
#
# --test-images also builds and imports the images the tests use (agnhost,
# the e2e busybox and the other registry.k8s.io/e2e-test-images of
# hack/images.sh --tests); without it, the node gets the pause image and
# busybox, what the examples need. Images imported by an earlier start stay.
#
# --registry-mirror serves the local test images as registry.k8s.io from a
# registry on loopback (hack/registry-mirror.sh): pods and tests that pull
# them with imagePullPolicy Always pull them through CRI, as a node behind a
# pull-through cache does.
#
# --self-hosted runs the control plane as kubeadm does: etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler are static pods
# of rustlet (manifests in _output/local/self-hosted/manifests, images built
# from the same binaries by hack/images.sh --control-plane), and rustlet
# joins as `kubeadm join` makes a node join: it starts with a bootstrap
# token only (bootstrap kubeconfig), runs the static pods while it has no
# credentials, and gets its client certificate from the certificates API
# once its own API server answers (the controller-manager approves it). Its
# mirror pods appear in kube-system. Each start is a fresh cluster: its own
# etcd data, certificate directory and node kubeconfig under
# _output/local/self-hosted (the PKI is shared). Only with rustlet, without
# --metrics-server and --node-e2e; hack/test-self-hosted.sh tests it.
#
# Idempotent: a component that is already running is left alone, so running
# it twice is harmless. Stop everything with hack/local-down.sh.
#
# Environment: NODE_NAME (default local-node), NODE_IP (default 10.88.0.1, the
# pod bridge's address: the kubelet refuses a loopback node IP and the API
# server will not proxy to one), CARGO_TARGET_DIR (default
# ~/.cache/rustlet/target), RUSTLET_PROFILE (debug or release, default debug:
# the cargo profile rustlet is built with), RUSTLET_BIN (a rustlet binary to
# run instead of building one, e.g. the one a conformance sitting pinned),
# RUSTLET_CONFIG (a KubeletConfiguration file rustlet reads with --config
# instead of _output/local/rustlet.yaml, which turns disk eviction and image
# GC off as the kubelet's configuration here does), AGENT_ROOT_DIR (the
# agent's root directory instead of _output/local/<agent>, e.g.
# /var/lib/kubelet for node tests that read and delete the resource managers'
# checkpoints there), RUSTLET_FLAGS (more flags
# for rustlet, split at spaces, e.g. --image-credential-provider-config F
# --image-credential-provider-bin-dir D), KUBELET_CONFIG (the same
# for the kubelet, instead of _output/local/kubelet.yaml), READY_TIMEOUT (seconds, default 120).
#
# The API server writes an audit log of the node's own requests (users in the
# group system:nodes, metadata only) to _output/local/logs/audit.log: it counts
# an agent's API calls by verb and resource (hack/bench.sh).
set -euo pipefail
PROG=local-up
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; }

agent=rustlet
metrics_server=false
node_e2e=false
runtime_pid_ns=false
registry_mirror=false
test_images=false
self_hosted=false
while (($#)); do
  case $1 in
    --self-hosted) self_hosted=true; shift ;;
    --metrics-server) metrics_server=true; shift ;;
    --node-e2e) node_e2e=true; shift ;;
    --runtime-pid-ns) runtime_pid_ns=true; shift ;;
    --registry-mirror) registry_mirror=true; shift ;;
    --test-images) test_images=true; shift ;;
    --agent) agent=${2:-}; shift 2 || die "--agent needs a value" ;;
    --agent=*) agent=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (usage: hack/local-up.sh [--agent rustlet|kubelet|none] [--metrics-server] [--node-e2e] [--runtime-pid-ns] [--registry-mirror] [--test-images] | --self-hosted)" ;;
  esac
done
case $agent in
  rustlet | kubelet | none) ;;
  *) die "unknown agent '$agent' (rustlet|kubelet|none)" ;;
esac
if $self_hosted; then
  [[ $agent == rustlet ]] || die "--self-hosted runs the control plane under rustlet, not --agent $agent"
  ! $metrics_server || die "--self-hosted runs no metrics-server"
  ! $node_e2e || die "--self-hosted and --node-e2e do not go together"
  ! $runtime_pid_ns || die "--self-hosted and --runtime-pid-ns do not go together"
fi
# Where the agent keeps container logs (podLogsDir): the local cluster's own
# directory; --node-e2e: the kubelet's default, /var/log/pods, which the node
# suite's log path test reads from a pod.
POD_LOGS=$LOCAL/pod-logs
! $node_e2e || POD_LOGS=/var/log/pods
# The self-hosted cluster's own state (the PKI is the shared one).
SH=$LOCAL/self-hosted

# The node's address is the pod bridge's: the kubelet refuses a loopback node
# IP, and the API server refuses to proxy (logs, exec) to one.
NODE_IP=${NODE_IP:-$POD_GATEWAY}
READY_TIMEOUT=${READY_TIMEOUT:-120}
API=https://127.0.0.1:6443
RUSTLET_PROFILE=${RUSTLET_PROFILE:-debug}
case $RUSTLET_PROFILE in
  debug) cargo_profile=() ;;
  release) cargo_profile=(--release) ;;
  *) die "RUSTLET_PROFILE must be debug or release, not '$RUSTLET_PROFILE'" ;;
esac
RUSTLET=${RUSTLET_BIN:-$CARGO_TARGET_DIR/$RUSTLET_PROFILE/rustlet}
# Both agents' node protection here: disk pressure never evicts on a
# developer machine, and images are local and cannot be pulled again, so
# image GC never runs.
LOCAL_NODE_PROTECTION='evictionHard:
  memory.available: 100Mi
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99'

t_start=$(now_ms)
timings=()
# The background builds of this run (name -> pid).
declare -A builds=()
phase_t=$t_start
phase() { timings+=("$1 $(since "$phase_t")"); phase_t=$(now_ms); }

# On failure, stop what this run started (newest first) and nothing else.
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  # Builds still running in the background stop with this run.
  local pid
  for pid in "${builds[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
  if ((rc != 0 && ${#STARTED[@]} > 0)); then
    warn "failed; stopping what this run started: ${STARTED[*]}"
    local i name
    for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do
      name=${STARTED[i]}
      [[ $name != containerd ]] || cleanup_runtime || true
      stop_daemon "$name" 10 || true
      # The control plane this rustlet ran goes with it (containerd may be
      # an earlier run's).
      if [[ $name == rustlet ]] && $self_hosted; then
        cleanup_runtime || true
        rm -f "$RUN/self-hosted"
      fi
    done
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

((EUID == 0)) || die "must run as root (containerd, runc and CNI need it)"

# ---------------------------------------------------------------- dependencies
need_cmd openssl "Debian package openssl"
need_cmd runc "Debian package runc"
need_cmd ip "Debian package iproute2"
need_cmd ss "Debian package iproute2"
need_cmd iptables "Debian package iptables"
need_cmd jq "Debian package jq"
need_cmd curl "Debian package curl"
need_cmd kubectl "a kubectl client"
for p in bridge host-local portmap loopback; do
  [[ -x $CNI_BIN_DIR/$p ]] || die "missing dependency: $CNI_BIN_DIR/$p (Debian package containernetworking-plugins)"
done
[[ -x /bin/busybox ]] || die "missing dependency: /bin/busybox (Debian package busybox-static)"

# Only the agent asked for may run: both serve the node API on :10250.
for other in kubelet rustlet; do
  [[ $other == "$agent" ]] && continue
  if running_pid "$other" >/dev/null; then
    die "$other is running as this cluster's agent; run hack/local-down.sh before switching to --agent $agent"
  fi
done

# One control plane at a time: as daemons, or as rustlet's static pods.
if $self_hosted && running_pid kube-apiserver >/dev/null; then
  die "the control plane runs as daemons here; run hack/local-down.sh before --self-hosted"
fi
if ! $self_hosted && [[ -f $RUN/self-hosted ]] && running_pid rustlet >/dev/null; then
  die "a self-hosted cluster runs here; run hack/local-down.sh first"
fi

# ---------------------------------------------------------------- builds
# Only what this start runs, side by side (each build's log in
# _output/local/logs/build-<target>.log); the test images' binaries are
# built when a test asks for them (--test-images, hack/images.sh --tests).
mkdir -p "$LOGS"
declare -A bins_of=(
  [k8s]="kube-apiserver kube-controller-manager kube-scheduler etcd"
  [kubelet]=kubelet
  [containerd]="containerd containerd-shim-runc-v2 ctr"
  [images]="imagebuild pause"
  [metrics-server]=metrics-server
)
# build_chain NAME TARGET...: in the background, `hack/build-cluster.sh
# TARGET` for each TARGET one of whose binaries is missing, one after
# another (targets of one Go module share its compiled packages that way).
build_chain() {
  local name=$1 t b todo=()
  shift
  for t in "$@"; do
    for b in ${bins_of[$t]}; do
      if [[ ! -x $BIN/$b ]]; then
        todo+=("$t")
        break
      fi
    done
  done
  ((${#todo[@]})) || return 0
  need_cmd go "needed to build ${todo[*]}"
  log "building ${todo[*]} (log: ${LOGS#"$ROOT"/}/build-$name.log)"
  # A process group of its own (setsid), so that a stopped start stops it.
  setsid bash -c 'for t; do "$0" "$t" || exit 1; done' "$ROOT/hack/build-cluster.sh" "${todo[@]}" \
    >"$LOGS/build-$name.log" 2>&1 &
  builds[$name]=$!
}
control_plane=(k8s)
[[ $agent != kubelet ]] || control_plane+=(kubelet)
build_chain control-plane "${control_plane[@]}"
build_chain node containerd images
! $metrics_server || build_chain metrics-server metrics-server

rustlet_built=true
if [[ $agent == rustlet && -n ${RUSTLET_BIN:-} ]]; then
  [[ -x $RUSTLET_BIN ]] || die "RUSTLET_BIN=$RUSTLET_BIN is not an executable file"
  log "rustlet: $RUSTLET_BIN (not built)"
elif [[ $agent == rustlet ]]; then
  need_cmd cargo "needed to build rustlet"
  log "building rustlet (cargo build ${cargo_profile[*]} --bin rustlet, target dir $CARGO_TARGET_DIR)"
  if ! (cd "$ROOT" && CARGO_TARGET_DIR=$CARGO_TARGET_DIR cargo build "${cargo_profile[@]}" --bin rustlet) >"$LOGS/rustlet-build.log" 2>&1 || [[ ! -x $RUSTLET ]]; then
    rustlet_built=false
  fi
fi
failed_builds=()
for target in "${!builds[@]}"; do
  wait "${builds[$target]}" || failed_builds+=("$target")
done
for target in "${failed_builds[@]}"; do
  tail -n 20 "$LOGS/build-$target.log" >&2
  die "building $target failed (log: ${LOGS#"$ROOT"/}/build-$target.log)"
done
if ! $rustlet_built; then
  first_error=$(grep -m1 -E '^error' "$LOGS/rustlet-build.log" || true)
  die "rustlet cannot be built (cargo build --bin rustlet failed${first_error:+: $first_error}; log: ${LOGS#"$ROOT"/}/rustlet-build.log); try --agent kubelet or --agent none"
fi
phase builds

# ---------------------------------------------------------------- ports
declare -A ports=(
  [etcd]="2379 2380"
  [kube-apiserver]="6443"
  [kube-controller-manager]="10257"
  [kube-scheduler]="10259"
  [kubelet]="10250 10248"
  [rustlet]="10250 10248"
  [metrics-server]="4443"
)
ms=none
! $metrics_server || ms=metrics-server
for c in etcd kube-apiserver kube-controller-manager kube-scheduler "$agent" "$ms"; do
  [[ $c == none ]] && continue
  running_pid "$c" >/dev/null && continue
  # Static pods hold the control plane's ports while rustlet runs.
  if $self_hosted && running_pid rustlet >/dev/null; then continue; fi
  # shellcheck disable=SC2086 # a list of ports
  require_free_ports "$c" ${ports[$c]}
done

mkdir -p "$LOCAL" "$LOGS" "$RUN" "$PKI"

# ---------------------------------------------------------------- PKI
# One CA signs everything: serving certs, client certs, and (through the
# controller-manager) kubelet CSRs. Files are reused while they verify
# against the CA and carry the expected subject.
ossl_conf() {
  # ossl_conf FILE EXTENSIONS...: a minimal openssl config with a [ext] section.
  local f=$1
  shift
  {
    printf '[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n[ext]\n'
    printf '%s\n' "$@"
  } >"$f"
}

make_key() { [[ -s $1 ]] || (umask 077 && openssl genrsa -out "$1" 2048 2>/dev/null); }

make_ca() {
  if [[ -s $PKI/ca.crt && -s $PKI/ca.key ]]; then return; fi
  log "pki: creating the cluster CA"
  rm -f "$PKI"/*.crt "$PKI"/*.key "$PKI"/*.pub
  make_key "$PKI/ca.key"
  ossl_conf "$PKI/ca.cnf" 'basicConstraints = critical, CA:TRUE' \
    'keyUsage = critical, keyCertSign, cRLSign, digitalSignature' 'subjectKeyIdentifier = hash'
  openssl req -x509 -new -config "$PKI/ca.cnf" -extensions ext -key "$PKI/ca.key" \
    -subj "/CN=rustlet-local-ca" -days 3650 -sha256 -out "$PKI/ca.crt"
  rm -f "$PKI/ca.cnf"
}

# make_cert NAME SUBJECT USAGE [SAN]: NAME.crt/NAME.key signed by the CA.
make_cert() {
  local name=$1 subj=$2 usage=$3 san=${4:-}
  local crt=$PKI/$name.crt key=$PKI/$name.key
  if [[ -s $crt && -s $key ]] &&
    openssl verify -CAfile "$PKI/ca.crt" "$crt" >/dev/null 2>&1 &&
    [[ $(openssl x509 -in "$crt" -noout -subject -nameopt compat) == "subject=$subj" ]]; then
    return
  fi
  log "pki: $name ($subj)"
  rm -f "$crt"
  make_key "$key"
  local ext=(
    'basicConstraints = critical, CA:FALSE'
    'keyUsage = critical, digitalSignature, keyEncipherment'
    "extendedKeyUsage = $usage"
    'authorityKeyIdentifier = keyid'
  )
  [[ -z $san ]] || ext+=("subjectAltName = $san")
  ossl_conf "$PKI/$name.cnf" "${ext[@]}"
  openssl req -new -config "$PKI/$name.cnf" -key "$key" -subj "$subj" -out "$PKI/$name.csr"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 \
    -extfile "$PKI/$name.cnf" -extensions ext -out "$crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.cnf"
}

# make_kubeconfig FILE CERT-NAME USER: a kubeconfig with embedded credentials.
make_kubeconfig() {
  local f=$1 cert=$2 user=$3 tmp
  tmp=$(mktemp "$f.XXXXXX")
  cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $API
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$cert.crt")
    client-key-data: $(base64 -w0 "$PKI/$cert.key")
contexts:
- name: local
  context:
    cluster: local
    user: $user
current-context: local
EOF
  chmod 600 "$tmp"
  if cmp -s "$tmp" "$f"; then rm -f "$tmp"; else mv "$tmp" "$f"; fi
}

make_ca
make_cert apiserver "/CN=kube-apiserver" serverAuth \
  "IP:127.0.0.1, IP:10.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local"
make_cert admin "/O=system:masters/CN=admin" clientAuth
make_cert kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
make_cert kube-scheduler "/CN=system:kube-scheduler" clientAuth
make_cert node "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
make_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
# The aggregation layer: the API server proxies to extension API servers
# (metrics-server) as front-proxy-client, passing the user in request headers.
make_cert front-proxy-client "/CN=front-proxy-client" clientAuth
if $metrics_server; then
  make_cert metrics-server "/CN=system:metrics-server" "serverAuth, clientAuth" \
    "DNS:metrics-server.kube-system.svc, IP:$NODE_IP"
  make_kubeconfig "$LOCAL/metrics-server.kubeconfig" metrics-server system:metrics-server
fi
if [[ ! -s $PKI/sa.key || ! -s $PKI/sa.pub ]]; then
  log "pki: service-account signing key pair"
  rm -f "$PKI/sa.key" "$PKI/sa.pub"
  make_key "$PKI/sa.key"
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
fi
make_kubeconfig "$ADMIN_KUBECONFIG" admin admin
make_kubeconfig "$LOCAL/kube-controller-manager.kubeconfig" kube-controller-manager system:kube-controller-manager
make_kubeconfig "$LOCAL/kube-scheduler.kubeconfig" kube-scheduler system:kube-scheduler
make_kubeconfig "$NODE_KUBECONFIG" node "system:node:$NODE_NAME"
phase pki

# ---------------------------------------------------------------- pod network
# The bridge is created here rather than by the first pod's CNI ADD so the
# node IP (the kubelet's is the bridge address) exists before the agent
# starts. The bridge plugin adopts it: same name, same gateway address.
mkdir -p "$CNI_CONF_DIR" "$LOCAL/cni/ipam"
conflist=$CNI_CONF_DIR/10-rustlet.conflist
cat >"$conflist.tmp" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$LOCAL/cni/ipam",
        "ranges": [[{ "subnet": "$POD_SUBNET", "gateway": "$POD_GATEWAY" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    {
      "type": "portmap",
      "capabilities": { "portMappings": true }
    }
  ]
}
EOF
if cmp -s "$conflist.tmp" "$conflist"; then rm -f "$conflist.tmp"; else mv "$conflist.tmp" "$conflist"; fi
if ! ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
  log "network: creating bridge $CNI_BRIDGE ($POD_GATEWAY/${POD_SUBNET#*/})"
  ip link add "$CNI_BRIDGE" type bridge
fi
prefix=${POD_SUBNET#*/}
if ! ip -o -4 addr show dev "$CNI_BRIDGE" | grep -qw "$POD_GATEWAY/$prefix"; then
  ip addr add "$POD_GATEWAY/$prefix" dev "$CNI_BRIDGE"
fi
ip link set "$CNI_BRIDGE" up

# ---------------------------------------------------------------- etcd
ETCD_DATA=$LOCAL/etcd
! $self_hosted || ETCD_DATA=$SH/etcd
ETCD_FLAGS=(--data-dir "$ETCD_DATA"
  --listen-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380)
if $self_hosted; then
  : # a static pod (below)
elif pid=$(running_pid etcd); then
  log "etcd already running (pid $pid)"
else
  mkdir -p "$ETCD_DATA"
  chmod 700 "$ETCD_DATA"
  start_daemon etcd "$BIN/etcd" "${ETCD_FLAGS[@]}"
fi

# ---------------------------------------------------------------- containerd
# CDI_DIR before containerd starts, which then watches it for CDI specs
# from the start (hack/dra-driver.sh).
mkdir -p "$CTRD_DIR" "$CTRD_DIR/tmp" "$CTRD_DIR/opt" "$CDI_DIR"
sed -e "s|@LOCAL@|$LOCAL|g" -e "s|@CNI_BIN_DIR@|$CNI_BIN_DIR|g" \
  "$ROOT/hack/containerd-config.toml" >"$CTRD_DIR/config.toml.tmp"
if cmp -s "$CTRD_DIR/config.toml.tmp" "$CTRD_DIR/config.toml"; then
  rm -f "$CTRD_DIR/config.toml.tmp"
else
  mv "$CTRD_DIR/config.toml.tmp" "$CTRD_DIR/config.toml"
  if pid=$(running_pid containerd); then
    warn "containerd config changed; restart it with hack/local-down.sh && hack/local-up.sh to apply"
  fi
fi
if pid=$(running_pid containerd); then
  log "containerd already running (pid $pid)"
  ! $runtime_pid_ns || [[ $(readlink "/proc/$pid/ns/pid") != "$(readlink /proc/self/ns/pid)" ]] ||
    warn "containerd runs in the host's pid namespace: --runtime-pid-ns needs hack/local-down.sh first"
elif $runtime_pid_ns; then
  rm -f "$CTRD_SOCK" "$CTRD_SOCK.ttrpc" "$CTRD_DIR/debug.sock"
  # Mounts made on either side (the agent's volumes, the tests' loop
  # devices and tmpfs) reach the other; only /proc is containerd's own.
  mount --make-rshared /
  # unshare forks containerd (pid 1 of the new namespace; --kill-child: it
  # goes when unshare does), which is the daemon recorded and stopped.
  start_daemon containerd "PATH=$BIN:$PATH" "$(command -v unshare)" --pid --fork --mount \
    --propagation unchanged --kill-child -- \
    sh -c 'mount --make-private /proc && mount -t proc proc /proc && exec "$@"' sh \
    "$BIN/containerd" --config "$CTRD_DIR/config.toml"
  # The daemon to record is unshare's child.
  ns_pid=$(running_pid containerd) || die "unshare for containerd did not start: see ${LOGS#"$ROOT"/}/containerd.log"
  pid=''
  for _ in $(seq 1 100); do
    pid=$(pgrep -P "$ns_pid" | head -1) || true
    [[ -n $pid && $(readlink "/proc/$pid/exe" 2>/dev/null) == "$(readlink -f "$BIN/containerd")" ]] && break
    pid=''
    sleep 0.05
  done
  [[ -n $pid ]] || die "containerd did not start under unshare: see ${LOGS#"$ROOT"/}/containerd.log"
  printf '%s\n%s\n' "$pid" "$(readlink -f "$BIN/containerd")" >"$RUN/containerd.pid"
  log "containerd is pid 1 of its own pid namespace (host pid $pid)"
else
  rm -f "$CTRD_SOCK" "$CTRD_SOCK.ttrpc" "$CTRD_DIR/debug.sock"
  start_daemon containerd "PATH=$BIN:$PATH" "$BIN/containerd" --config "$CTRD_DIR/config.toml"
fi

# ---------------------------------------------------------------- kube-apiserver
# --endpoint-reconciler-type=none: the apiserver refuses to publish a loopback
# advertise address in the kubernetes Service's endpoints, and exits.
# Audit only the node's requests, without bodies.
cat >"$LOCAL/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [system:nodes]
- level: None
POLICY
# shellcheck disable=SC2054 # commas inside flag values
APISERVER_FLAGS=(
  --audit-policy-file="$LOCAL/audit-policy.yaml"
  --audit-log-path="$LOGS/audit.log" --audit-log-format=json
  --audit-log-maxsize=200 --audit-log-maxbackup=1
  --etcd-servers=http://127.0.0.1:2379
  --secure-port=6443 --bind-address=127.0.0.1 --advertise-address=127.0.0.1
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key"
  --client-ca-file="$PKI/ca.crt"
  --enable-bootstrap-token-auth
  --authorization-mode=Node,RBAC
  --enable-admission-plugins=NodeRestriction
  --allow-privileged=true
  --service-cluster-ip-range=10.0.0.0/24
  --service-account-issuer=https://kubernetes.default.svc.cluster.local
  --service-account-key-file="$PKI/sa.pub"
  --service-account-signing-key-file="$PKI/sa.key"
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt"
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key"
  --kubelet-preferred-address-types=InternalIP
  --requestheader-client-ca-file="$PKI/ca.crt"
  --requestheader-allowed-names=front-proxy-client
  --requestheader-username-headers=X-Remote-User
  --requestheader-group-headers=X-Remote-Group
  --requestheader-extra-headers-prefix=X-Remote-Extra-
  --proxy-client-cert-file="$PKI/front-proxy-client.crt"
  --proxy-client-key-file="$PKI/front-proxy-client.key"
  --enable-aggregator-routing=true
  --endpoint-reconciler-type=none
)
# --node-e2e: as the node suite's own harness runs the apiserver, no
# TaintNodesByCondition admission: with no node lifecycle controller (below)
# nothing would lift the not-ready taint it puts on a new Node.
! $node_e2e || APISERVER_FLAGS+=(--disable-admission-plugins=TaintNodesByCondition)
if ! $self_hosted; then
  wait_daemon etcd "etcd health" 60 curl -sf --max-time 2 http://127.0.0.1:2379/health
  if pid=$(running_pid kube-apiserver); then
    log "kube-apiserver already running (pid $pid)"
  else
    start_daemon kube-apiserver "$BIN/kube-apiserver" "${APISERVER_FLAGS[@]}"
  fi
fi
phase "start etcd, containerd, apiserver"

# ---------------------------------------------------------------- images
# Imported while the apiserver starts.
wait_daemon containerd "containerd's socket" 30 "$BIN/ctr" --address "$CTRD_SOCK" version
image_args=()
! $self_hosted || image_args+=(--control-plane)
! $test_images || image_args+=(--tests)
"$ROOT/hack/images.sh" "${image_args[@]}"
# Left running by a start without the flag (as every component here).
if $registry_mirror; then "$ROOT/hack/registry-mirror.sh" start; fi
phase images

# ---------------------------------------------------------------- control plane
# controller-manager and scheduler flags, as daemons or static pods.
# --node-e2e: the node suite's own harness runs no controller-manager, so
# nothing taints the node under pressure (its eviction tests then find no
# schedulable node); the node lifecycle controller stays off.
controllers='*'
! $node_e2e || controllers='*,-node-lifecycle-controller'
CM_KUBECONFIG=$LOCAL/kube-controller-manager.kubeconfig
CM_FLAGS=(
  --kubeconfig="$CM_KUBECONFIG" --authentication-kubeconfig="$CM_KUBECONFIG"
  --authorization-kubeconfig="$CM_KUBECONFIG"
  --bind-address=127.0.0.1 --secure-port=10257
  --leader-elect=false
  --controllers="$controllers"
  --use-service-account-credentials=true
  --service-account-private-key-file="$PKI/sa.key"
  --root-ca-file="$PKI/ca.crt"
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key"
  --allocate-node-cidrs=true --cluster-cidr="$CLUSTER_CIDR" --node-cidr-mask-size-ipv4=24
)
SCHED_KUBECONFIG=$LOCAL/kube-scheduler.kubeconfig
SCHED_FLAGS=(
  --kubeconfig="$SCHED_KUBECONFIG" --authentication-kubeconfig="$SCHED_KUBECONFIG"
  --authorization-kubeconfig="$SCHED_KUBECONFIG"
  --bind-address=127.0.0.1 --secure-port=10259
  --leader-elect=false
)
curl_api() { curl -sf --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$API$1"; }

# start_rustlet CONFIG ARGS...: rustlet with KubeletConfiguration CONFIG and
# the flags ARGS (its credentials).
start_rustlet() {
  local config=$1 extra=()
  shift
  read -ra extra <<<"${RUSTLET_FLAGS:-}"
  start_daemon rustlet "RUST_LOG=${RUST_LOG:-info}" NO_COLOR=1 "$RUSTLET" run \
    --config "$config" "$@" "${extra[@]}" \
    --node-name "$NODE_NAME" \
    --node-ip "$NODE_IP" \
    --container-runtime-endpoint "unix://$CTRD_SOCK" \
    --root-dir "${AGENT_ROOT_DIR:-$LOCAL/rustlet}" \
    --pod-logs-dir "$POD_LOGS" \
    --rotate-server-certificates
}

if $self_hosted; then
  # yaml_args ARG...: a YAML list of single-quoted strings, 4 spaces in.
  yaml_args() {
    local a q="'"
    for a in "$@"; do printf "    - '%s'\n" "${a//$q/$q$q}"; done
  }
  # host_path NAME PATH TYPE [ro]: adds a hostPath volume to vols and its
  # mount, at the same path, to mnts.
  host_path() {
    vols+="  - name: $1
    hostPath:
      path: $2
      type: $3
"
    mnts+="    - name: $1
      mountPath: $2${4:+
      readOnly: true}
"
  }
  # static_pod NAME CPU PORT PROBE-PATH SCHEME COMMAND...: the manifest of
  # control-plane component NAME with the volumes of vols and mnts, as
  # kubeadm writes one: host network, system-node-critical, a liveness and a
  # startup probe on its own port (and readiness for the API server).
  static_pod() {
    local name=$1 cpu=$2 port=$3 path=$4 scheme=$5
    shift 5
    local probe="httpGet: {host: 127.0.0.1, path: $path, port: $port, scheme: $scheme}"
    local image
    image=$(control_plane_image "$name") || return 1
    local readiness=''
    [[ $name != kube-apiserver ]] || readiness="    readinessProbe:
      httpGet: {host: 127.0.0.1, path: /readyz, port: $port, scheme: $scheme}
      periodSeconds: 1
      timeoutSeconds: 15
      failureThreshold: 3
"
    cat <<EOF
# Written by hack/local-up.sh --self-hosted.
apiVersion: v1
kind: Pod
metadata:
  name: $name
  namespace: kube-system
  labels:
    component: $name
    tier: control-plane
spec:
  hostNetwork: true
  priorityClassName: system-node-critical
  securityContext:
    seccompProfile:
      type: RuntimeDefault
  containers:
  - name: $name
    image: $image
    imagePullPolicy: IfNotPresent
    command:
$(yaml_args "$@")
    resources:
      requests:
        cpu: $cpu
    livenessProbe:
      $probe
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
      failureThreshold: 8
    startupProbe:
      $probe
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
      failureThreshold: 24
${readiness}    volumeMounts:
${mnts}  volumes:
${vols}
EOF
  }

  if pid=$(running_pid rustlet); then
    [[ -f $RUN/self-hosted ]] || die "rustlet runs here as the agent of another cluster; run hack/local-down.sh first"
    log "rustlet already running (pid $pid), the control plane its static pods"
  else
    # A fresh cluster: no etcd data, no node credentials but the token.
    rm -rf "$SH/etcd" "$SH/pki" "$SH/kubelet.conf" "$SH/manifests" "$SH/bootstrap.kubeconfig"
    mkdir -p "$SH/etcd" "$SH/pki" "$SH/manifests" "$LOCAL/rustlet" "$LOCAL/pod-logs"
    chmod 700 "$SH/etcd"

    vols='' mnts=''
    host_path etcd-data "$ETCD_DATA" DirectoryOrCreate
    static_pod etcd 100m 2379 /health HTTP \
      /usr/local/bin/etcd "${ETCD_FLAGS[@]}" >"$SH/manifests/etcd.yaml"
    vols='' mnts=''
    host_path pki "$PKI" Directory ro
    host_path audit-policy "$LOCAL/audit-policy.yaml" File ro
    host_path logs "$LOGS" DirectoryOrCreate
    static_pod kube-apiserver 250m 6443 /livez HTTPS \
      /usr/local/bin/kube-apiserver "${APISERVER_FLAGS[@]}" >"$SH/manifests/kube-apiserver.yaml"
    vols='' mnts=''
    host_path pki "$PKI" Directory ro
    host_path kubeconfig "$CM_KUBECONFIG" File ro
    static_pod kube-controller-manager 200m 10257 /healthz HTTPS \
      /usr/local/bin/kube-controller-manager "${CM_FLAGS[@]}" >"$SH/manifests/kube-controller-manager.yaml"
    vols='' mnts=''
    host_path kubeconfig "$SCHED_KUBECONFIG" File ro
    static_pod kube-scheduler 100m 10259 /livez HTTPS \
      /usr/local/bin/kube-scheduler "${SCHED_FLAGS[@]}" >"$SH/manifests/kube-scheduler.yaml"

    # The join: a bootstrap token (kubeadm's form, [a-z0-9]{6}.[a-z0-9]{16})
    # in a bootstrap kubeconfig, as `kubeadm join` writes
    # bootstrap-kubelet.conf. Its Secret is created once the API server
    # answers: rustlet's first requests fail until then, and it retries.
    token_part() { tr -dc 'a-z0-9' </dev/urandom | head -c "$1" || true; }
    BOOTSTRAP_TOKEN_ID=$(token_part 6)
    BOOTSTRAP_TOKEN_SECRET=$(token_part 16)
    (
      umask 077
      cat >"$SH/bootstrap.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $API
    certificate-authority: $PKI/ca.crt
users:
- name: tls-bootstrap-token-user
  user:
    token: $BOOTSTRAP_TOKEN_ID.$BOOTSTRAP_TOKEN_SECRET
contexts:
- name: tls-bootstrap-token-user@local
  context:
    cluster: local
    user: tls-bootstrap-token-user
current-context: tls-bootstrap-token-user@local
EOF
    )
    cat >"$SH/rustlet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The control plane (hack/local-up.sh --self-hosted).
staticPodPath: $SH/manifests
# The TLS bootstrap runs in the background, the static pods meanwhile.
rotateCertificates: true
authentication:
  x509:
    clientCAFile: $PKI/ca.crt
$LOCAL_NODE_PROTECTION
EOF
    touch "$RUN/self-hosted"
    start_rustlet "$SH/rustlet.yaml" --bootstrap-kubeconfig "$SH/bootstrap.kubeconfig" \
      --kubeconfig "$SH/kubelet.conf" --cert-dir "$SH/pki"
  fi
  wait_daemon rustlet "kube-apiserver (a static pod of rustlet) /readyz" 180 curl_api /readyz
  phase "apiserver ready (a static pod)"

  if [[ -n ${BOOTSTRAP_TOKEN_ID:-} ]]; then
    log "bootstrap token $BOOTSTRAP_TOKEN_ID (group system:bootstrappers:kubeadm:default-node-token)"
    # create, not apply: no copy of the secret in an annotation.
    kubectl_admin create -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: bootstrap-token-$BOOTSTRAP_TOKEN_ID
  namespace: kube-system
type: bootstrap.kubernetes.io/token
stringData:
  description: hack/local-up.sh --self-hosted
  token-id: $BOOTSTRAP_TOKEN_ID
  token-secret: $BOOTSTRAP_TOKEN_SECRET
  expiration: $(date -u -d '+24 hours' +%Y-%m-%dT%H:%M:%SZ)
  usage-bootstrap-authentication: "true"
  auth-extra-groups: system:bootstrappers:kubeadm:default-node-token
EOF
  fi
  # As kubeadm: bootstrap tokens may ask for node client certificates, and
  # the controller-manager approves those requests.
  log "rbac: node bootstrap (system:node-bootstrapper, nodeclient auto-approval)"
  {
    cluster_role_binding kubeadm:kubelet-bootstrap system:node-bootstrapper \
      Group system:bootstrappers:kubeadm:default-node-token
    echo ---
    cluster_role_binding kubeadm:node-autoapprove-bootstrap \
      system:certificates.k8s.io:certificatesigningrequests:nodeclient \
      Group system:bootstrappers:kubeadm:default-node-token
  } | kubectl_admin apply -f - >/dev/null
else
  wait_daemon kube-apiserver "kube-apiserver /readyz" 90 curl_api /readyz
  phase "apiserver ready"
  if pid=$(running_pid kube-controller-manager); then
    log "kube-controller-manager already running (pid $pid)"
  else
    start_daemon kube-controller-manager "$BIN/kube-controller-manager" "${CM_FLAGS[@]}"
  fi
  if pid=$(running_pid kube-scheduler); then
    log "kube-scheduler already running (pid $pid)"
  else
    start_daemon kube-scheduler "$BIN/kube-scheduler" "${SCHED_FLAGS[@]}"
  fi
fi

# The apiserver reaches the node API (logs, exec, attach, port-forward) with
# the kube-apiserver-kubelet-client certificate. It is in system:masters, but
# bind the kubelet API role explicitly, as kubeadm does, so node agents that
# authorize with SubjectAccessReview see a plain RBAC grant.
log "rbac: binding system:kubelet-api-admin to kube-apiserver-kubelet-client"
cluster_role_binding kube-apiserver-kubelet-client system:kubelet-api-admin User kube-apiserver-kubelet-client |
  kubectl_admin apply -f - >/dev/null

# Nodes renew their own client certificates (rotateCertificates): the
# controller-manager approves a node's request for itself when the node may
# create certificatesigningrequests/selfnodeclient, as kubeadm binds it.
log "rbac: binding selfnodeclient to system:nodes"
cluster_role_binding node-autoapprove-certificate-rotation \
  system:certificates.k8s.io:certificatesigningrequests:selfnodeclient Group system:nodes |
  kubectl_admin apply -f - >/dev/null

# The project's custom resources (crds/), and what the Helm chart grants
# nodes on them: get, list and watch NodeConfigurations (under a name of
# its own: hack/test-chart.sh installs the chart as release "rustlet").
log "crds: NodeConfiguration, readable by system:nodes"
kubectl_admin apply --server-side --force-conflicts -f "$ROOT/crds" >/dev/null
kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: local-node-configurations
rules:
  - apiGroups: ["rustlet.dev"]
    resources: ["nodeconfigurations"]
    verbs: ["get", "list", "watch"]
EOF
cluster_role_binding local-node-configurations local-node-configurations Group system:nodes |
  kubectl_admin apply -f - >/dev/null

# ---------------------------------------------------------------- agent
# --node-e2e: the node suite reaches the pod resources API at
# /var/lib/kubelet/pod-resources/kubelet.sock, whatever the agent's root
# directory: that path leads to the agent's own. Its DRA tests run their
# driver with the kubelet's default paths (hack/conformance.sh --suite dra):
# the registration socket in /var/lib/kubelet/plugins_registry, led to the
# agent's <root-dir>/plugins_registry, which the agent watches, and the CDI
# specs in /var/run/cdi, led to CDI_DIR, the one directory containerd reads
# them from (the DRA socket, in /var/lib/kubelet/plugins/<driver>, the agent
# dials where the driver says). A real file or directory already at one of
# these paths is the host's and is left alone.
# node_e2e_link PATH TARGET WHAT: PATH made a link to TARGET, unless
# something other than a link is there (WHAT: what then fails).
node_e2e_link() {
  if [[ -L $1 || ! -e $1 ]]; then
    ln -sfn "$2" "$1"
  else
    log "warning: $1 is not a link; $3"
  fi
}
# With AGENT_ROOT_DIR=/var/lib/kubelet those paths are the agent's own: links
# an earlier run left there go.
if $node_e2e && [[ $agent != none ]]; then
  mkdir -p "$CDI_DIR" /var/lib/kubelet
  if [[ ${AGENT_ROOT_DIR:-} == /var/lib/kubelet ]]; then
    for l in /var/lib/kubelet/pod-resources /var/lib/kubelet/plugins_registry; do
      [[ -L $l ]] && rm -f "$l"
    done
  else
    mkdir -p "$LOCAL/$agent/pod-resources" "$LOCAL/$agent/plugins_registry"
    node_e2e_link /var/lib/kubelet/pod-resources "$LOCAL/$agent/pod-resources" \
      "the node suite's pod resources tests will not reach the agent"
    node_e2e_link /var/lib/kubelet/plugins_registry "$LOCAL/$agent/plugins_registry" \
      "the node suite's DRA drivers will not register with the agent"
  fi
  node_e2e_link /var/run/cdi "$CDI_DIR" \
    "containerd will not find the CDI specs of the node suite's DRA drivers"
fi
case $agent in
  kubelet)
    if pid=$(running_pid kubelet); then
      log "kubelet already running (pid $pid)"
    else
      mkdir -p "${AGENT_ROOT_DIR:-$LOCAL/kubelet}" "$POD_LOGS"
      # The pods' cgroups are the kubelet's defaults (cgroupsPerQOS,
      # enforceNodeAllocatable [pods]), as rustlet makes them: both agents
      # are measured alike. The node suite's eviction tests use the
      # kubepods cgroup too.
      node_e2e_config='' read_only_port=0 kubelet_address=$NODE_IP
      if $node_e2e; then
        # The node suite's harness leaves the kubelet on its default
        # address, 0.0.0.0 (rustlet's): its endpoint and certificate
        # reload tests call https://127.0.0.1:10250.
        kubelet_address=0.0.0.0
        mkdir -p "$LOCAL/kubelet/manifests"
        read_only_port=10255
        node_e2e_config="# --node-e2e: as the upstream node suite's harness runs the kubelet.
staticPodPath: $LOCAL/kubelet/manifests
fileCheckFrequency: 10s
evictionPressureTransitionPeriod: 30s"
      fi
      cat >"$LOCAL/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $kubelet_address
port: 10250
readOnlyPort: $read_only_port
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://$CTRD_SOCK
podLogsDir: $POD_LOGS
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
# This host has cgroup v1 and no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: []
resolvConf: /etc/resolv.conf
$LOCAL_NODE_PROTECTION
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
$node_e2e_config
EOF
      # The kubelet sets vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
      # kernel.panic_on_oops and kernel.keys.root_max*; local-down.sh puts
      # the values from before the first start back.
      if [[ ! -f $RUN/sysctl.saved ]]; then
        sysctl -e vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
          kernel.keys.root_maxkeys kernel.keys.root_maxbytes 2>/dev/null | sed 's/ = /=/' >"$RUN/sysctl.saved" || true
      fi
      if [[ ! -f $RUN/kubelet-iptables ]] && ! iptables -t filter -S KUBE-FIREWALL >/dev/null 2>&1 &&
        ! iptables -t nat -S KUBE-KUBELET-CANARY >/dev/null 2>&1; then
        touch "$RUN/kubelet-iptables"
      fi
      start_daemon kubelet "$BIN/kubelet" \
        --config="${KUBELET_CONFIG:-$LOCAL/kubelet.yaml}" \
        --kubeconfig="$NODE_KUBECONFIG" \
        --root-dir="${AGENT_ROOT_DIR:-$LOCAL/kubelet}" \
        --cert-dir="$LOCAL/kubelet/pki" \
        --node-ip="$NODE_IP" \
        --hostname-override="$NODE_NAME"
    fi
    ;;
  rustlet)
    if $self_hosted; then
      : # started with its static pods, above
    elif pid=$(running_pid rustlet); then
      log "rustlet already running (pid $pid)"
    else
      mkdir -p "$LOCAL/rustlet/manifests" "$POD_LOGS"
      # The kubelet's settings of LOCAL_NODE_PROTECTION, for rustlet.
      rustlet_node_e2e=''
      if $node_e2e; then
        rustlet_node_e2e="# --node-e2e: as the upstream node suite's harness runs the kubelet.
readOnlyPort: 10255
fileCheckFrequency: 10s
evictionPressureTransitionPeriod: 30s"
      fi
      cat >"$LOCAL/rustlet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Static pods: the manifests of this directory (tests/e2e/static_pods.rs).
staticPodPath: $LOCAL/rustlet/manifests
# The client certificate is renewed from the certificates API, kept in
# $LOCAL/rustlet/pki (tests/e2e/serial/client_cert.rs).
rotateCertificates: true
# In the file, as the kubelet's: a configuration that replaces this one
# (the node suite's) names its own client CA.
authentication:
  x509:
    clientCAFile: $PKI/ca.crt
$LOCAL_NODE_PROTECTION
$rustlet_node_e2e
EOF
      start_rustlet "${RUSTLET_CONFIG:-$LOCAL/rustlet.yaml}" --kubeconfig "$NODE_KUBECONFIG"
    fi
    ;;
esac

# Static pods are watched through rustlet, daemons through themselves.
cm=kube-controller-manager sched=kube-scheduler
! $self_hosted || cm=rustlet sched=rustlet
wait_daemon "$cm" "kube-controller-manager /healthz" 120 curl -skf --max-time 2 https://127.0.0.1:10257/healthz
wait_daemon "$sched" "kube-scheduler /healthz" 120 curl -skf --max-time 2 https://127.0.0.1:10259/healthz
# Pods cannot be created in a namespace before its default service account
# exists; on a fresh etcd the controller-manager makes it within seconds.
wait_daemon "$cm" "the default service account" 60 kubectl_admin get serviceaccount default -n default
phase "controller-manager, scheduler ready"

# A Node kept in etcd from an earlier run still says Ready until the
# node-lifecycle controller notices (40 s), so a fresh agent must also have
# reported: the Ready condition's heartbeat must be no older than its start.
ready_since() {
  local after=$1 got
  kubectl_admin wait "node/$NODE_NAME" --for=condition=Ready --timeout=5s >/dev/null || return 1
  got=$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}') || return 1
  [[ $got > "$after" || $got == "$after" ]]
}
if [[ $agent != none ]]; then
  agent_since=1970-01-01T00:00:00Z
  [[ ! -f $RUN/$agent.started ]] || agent_since=$(<"$RUN/$agent.started")
  wait_daemon "$agent" "node $NODE_NAME to register" "$READY_TIMEOUT" kubectl_admin get node "$NODE_NAME"
  wait_daemon "$agent" "node $NODE_NAME to be Ready" "$READY_TIMEOUT" ready_since "$agent_since"
  phase "node Ready ($agent)"
fi

# rustlet asks the certificates API for its serving certificate
# (--rotate-server-certificates); as the cluster's admin, approve it (the
# controller-manager signs it with the cluster CA) and wait until it is served.
approve_serving_csr() {
  local -a names
  mapfile -t names < <(kubectl_admin get csr -o json | jq -r --arg user "system:node:$NODE_NAME" \
    '.items[] | select(.spec.signerName == "kubernetes.io/kubelet-serving" and .spec.username == $user
      and ((.status.conditions // []) | length) == 0) | .metadata.name')
  ((${#names[@]})) && kubectl_admin certificate approve "${names[@]}" >/dev/null
}
serving_cert_verified() { curl -s -o /dev/null --max-time 2 --cacert "$PKI/ca.crt" "https://$NODE_IP:10250/healthz"; }
# A configuration that names its own serving certificate (tlsCertFile, as the
# node suite's TLS test writes) wins over the request: none is made.
own_serving_cert=false
if [[ $agent == rustlet ]] && ! $self_hosted &&
  grep -Eq '^tlsCertFile: *[^ ]' "${RUSTLET_CONFIG:-$LOCAL/rustlet.yaml}" 2>/dev/null; then
  own_serving_cert=true
  log "rustlet serves the certificate its configuration names (tlsCertFile)"
fi
if [[ $agent == rustlet ]] && ! $own_serving_cert && ! serving_cert_verified; then
  wait_daemon rustlet "rustlet's serving certificate request" 30 approve_serving_csr
  wait_daemon rustlet "rustlet to serve its issued certificate" 30 serving_cert_verified
  phase "serving certificate approved and issued (rustlet)"
fi

# The control plane's mirror pods, once rustlet has its credentials.
if $self_hosted; then
  mirror_pods() {
    local n
    n=$(kubectl_admin get pods -n kube-system -o json | jq --arg node "$NODE_NAME" '[.items[]
      | select(.metadata.annotations["kubernetes.io/config.mirror"] != null and .spec.nodeName == $node
        and (.metadata.labels.tier // "") == "control-plane")] | length')
    ((n == 4))
  }
  wait_daemon rustlet "the control plane's 4 mirror pods in kube-system" 60 mirror_pods
  phase "mirror pods (self-hosted)"
  # Joined: the token is not needed any more, as kubeadm removes
  # bootstrap-kubelet.conf after the TLS bootstrap.
  rm -f "$SH/bootstrap.kubeconfig"
fi

# ---------------------------------------------------------------- metrics-server
# On the host, on the node IP: a Service without selector and a hand-made
# EndpointSlice name it, and the API server (--enable-aggregator-routing)
# proxies metrics.k8s.io to that endpoint, so no kube-proxy is needed.
if $metrics_server; then
  log "registering metrics-server as APIService v1beta1.metrics.k8s.io"
  touch "$RUN/metrics-server.apiservice"
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:metrics-server
rules:
- apiGroups: [""]
  resources: [nodes/metrics]
  verbs: [get]
- apiGroups: [""]
  resources: [pods, nodes]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:metrics-server
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:metrics-server
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:metrics-server
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: metrics-server:system:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:metrics-server
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: metrics-server-auth-reader
  namespace: kube-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: extension-apiserver-authentication-reader
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:metrics-server
---
apiVersion: v1
kind: Service
metadata:
  name: metrics-server
  namespace: kube-system
spec:
  ports:
  - name: https
    port: 443
    protocol: TCP
    targetPort: 4443
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: metrics-server
  namespace: kube-system
  labels:
    kubernetes.io/service-name: metrics-server
    endpointslice.kubernetes.io/managed-by: local-up.rustlet
addressType: IPv4
ports:
- name: https
  port: 4443
  protocol: TCP
endpoints:
- addresses: ["$NODE_IP"]
  conditions:
    ready: true
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.metrics.k8s.io
spec:
  group: metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  caBundle: $(base64 -w0 "$PKI/ca.crt")
  service:
    name: metrics-server
    namespace: kube-system
    port: 443
EOF
  # metrics-server reads extension-apiserver-authentication at start and exits
  # if it may not: start it once its RBAC is in force.
  wait_for "RBAC of system:metrics-server in force" 30 \
    kubectl_admin auth can-i get configmaps/extension-apiserver-authentication \
    -n kube-system --as system:metrics-server || die "metrics-server's RBAC is not in force"
  if pid=$(running_pid metrics-server); then
    log "metrics-server already running (pid $pid)"
  else
    start_daemon metrics-server "$BIN/metrics-server" \
      --kubeconfig="$LOCAL/metrics-server.kubeconfig" \
      --authentication-kubeconfig="$LOCAL/metrics-server.kubeconfig" \
      --authorization-kubeconfig="$LOCAL/metrics-server.kubeconfig" \
      --bind-address="$NODE_IP" --secure-port=4443 \
      --tls-cert-file="$PKI/metrics-server.crt" --tls-private-key-file="$PKI/metrics-server.key" \
      --kubelet-preferred-address-types=InternalIP \
      --kubelet-use-node-status-port \
      --kubelet-insecure-tls \
      --kubelet-request-timeout=5s \
      --metric-resolution=10s
  fi
  wait_daemon metrics-server "APIService v1beta1.metrics.k8s.io to be Available" 90 \
    kubectl_admin wait apiservice v1beta1.metrics.k8s.io --for=condition=Available --timeout=5s
  phase "metrics-server Available"
else
  # Left registered by an earlier run whose metrics-server is gone.
  running_pid metrics-server >/dev/null || unregister_metrics_server
fi

log "cluster up in $(since "$t_start") (agent: $agent, node: $NODE_NAME)"
for t in "${timings[@]}"; do
  printf '    %-40s %s\n' "${t% *}" "${t##* }"
done
echo "export KUBECONFIG=$ADMIN_KUBECONFIG"
