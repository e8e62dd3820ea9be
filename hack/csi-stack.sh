#!/usr/bin/env bash
# Starts or stops the storage tests' CSI stack on the running local cluster:
# the project's hostpath test driver (src/bin/csi-hostpath.rs: volumes are
# directories under its state directory, mounted with bind mounts), the
# registrar that registers it with the node agent through
# <root-dir>/plugins_registry (tests/cluster/cmd/csi-registrar, in the place
# of node-driver-registrar), the upstream external-provisioner and
# external-attacher (hack/build-cluster.sh csi builds the three), the
# driver's CSIDriver and a StorageClass for it.
#
#   hack/csi-stack.sh up [--agent rustlet|kubelet] [--class NAME]
#   hack/csi-stack.sh down
#
#   up       starts the four as daemons of the local cluster (logs in
#            _output/local/logs/csi-*.log; hack/local-down.sh stops them
#            too), registers the driver with the agent's root directory
#            (default rustlet's; kubelet: the upstream kubelet's) and waits
#            until the agent lists it in the node's CSINode; then applies the
#            CSIDriver (attach required, pod info on mount, fsGroupPolicy
#            File, persistent and inline ephemeral volumes) and the
#            StorageClass NAME (default csi-hostpath-rustlet: late binding,
#            volumes deleted with their claims)
#   down     deletes the StorageClasses of the driver and the CSIDriver,
#            stops the four daemons
#
# The driver is $CSI_HOSTPATH_BIN if set, else the debug build of this
# checkout (built when missing). The upstream driver (csi-driver-host-path)
# and node-driver-registrar are not used: this machine's Go module proxy
# refuses them.
set -euo pipefail
PROG=csi-stack
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; }

CSI_DRIVER=hostpath.csi.rustlet.io
CSI_DIR=$LOCAL/csi

cmd=${1:-}
(($#)) && shift
agent=rustlet
class=csi-hostpath-rustlet
while (($#)); do
  case $1 in
    --agent) agent=${2:-}; shift 2 || die "--agent needs a value" ;;
    --agent=*) agent=${1#*=}; shift ;;
    --class) class=${2:-}; shift 2 || die "--class needs a value" ;;
    --class=*) class=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see hack/csi-stack.sh --help)" ;;
  esac
done
case $agent in rustlet | kubelet) ;; *) die "unknown agent '$agent' (rustlet|kubelet)" ;; esac
[[ $class =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "--class must be a DNS label, not '$class'"
((EUID == 0)) || die "must run as root (the driver mounts)"

up() {
  running_pid kube-apiserver >/dev/null || die "no local cluster runs (hack/local-up.sh first)"
  running_pid "$agent" >/dev/null || die "the local cluster's agent is not $agent"
  build_if_missing csi csi-provisioner csi-attacher csi-registrar
  local driver=$CSI_HOSTPATH_BIN
  if [[ ! -x $driver ]]; then
    log "building the test driver (cargo build --bin csi-hostpath)"
    (cd "$ROOT" && cargo build --bin csi-hostpath) || die "cargo build --bin csi-hostpath failed"
  fi
  mkdir -p "$CSI_DIR"
  local common=(--csi-address="$CSI_DIR/csi.sock" --kubeconfig="$ADMIN_KUBECONFIG" --leader-election=false --timeout=30s)
  start_daemon csi-hostpath "$driver" --endpoint="$CSI_DIR/csi.sock" --node-id="$NODE_NAME" \
    --state-dir="$CSI_DIR/state"
  # A CSINode an earlier cluster's agent wrote still names the driver: only
  # a registration from now counts.
  kubectl_admin delete csinode "$NODE_NAME" --ignore-not-found >/dev/null || true
  start_daemon csi-registrar "$BIN/csi-registrar" --driver-name="$CSI_DRIVER" --csi-address="$CSI_DIR/csi.sock" \
    --registration-dir="$LOCAL/$agent/plugins_registry"
  start_daemon csi-provisioner "$BIN/csi-provisioner" "${common[@]}"
  start_daemon csi-attacher "$BIN/csi-attacher" "${common[@]}"
  kubectl_admin apply -f - >/dev/null <<EOF || die "could not apply the CSIDriver and the StorageClass"
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: $CSI_DRIVER}
spec: {attachRequired: true, podInfoOnMount: true, fsGroupPolicy: File, volumeLifecycleModes: [Persistent, Ephemeral]}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $class}
provisioner: $CSI_DRIVER
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
EOF
  local i
  for ((i = 0; i < 60; i++)); do
    if kubectl_admin get csinode "$NODE_NAME" -o jsonpath='{.spec.drivers[*].name}' 2>/dev/null |
      grep -qw "$CSI_DRIVER"; then
      log "$CSI_DRIVER registered with $agent (CSINode $NODE_NAME), StorageClass $class"
      return 0
    fi
    sleep 1
  done
  tail -n 20 "$LOGS/csi-hostpath.log" >&2 || true
  die "$agent did not register $CSI_DRIVER within 60 s"
}

down() {
  if running_pid kube-apiserver >/dev/null; then
    local classes
    classes=$(kubectl_admin get storageclass -o jsonpath="{range .items[?(@.provisioner==\"$CSI_DRIVER\")]}{.metadata.name}{' '}{end}" 2>/dev/null || true)
    # shellcheck disable=SC2086 # a list of names
    [[ -z $classes ]] || kubectl_admin delete storageclass $classes --ignore-not-found >/dev/null || true
    kubectl_admin delete csidriver "$CSI_DRIVER" --ignore-not-found >/dev/null || true
  fi
  stop_daemon csi-attacher
  stop_daemon csi-provisioner
  stop_daemon csi-registrar
  stop_daemon csi-hostpath
}

case $cmd in
  up) up ;;
  down) down ;;
  *) usage >&2; exit 2 ;;
esac
