#!/usr/bin/env bash
# Stops the local one-node cluster started by hack/local-up.sh: metrics-server
# (if started, and its APIService), the CSI stack and the DRA test driver (if
# started: hack/csi-stack.sh, hack/dra-driver.sh), the node agent,
# kube-scheduler, kube-controller-manager, kube-apiserver, etcd and
# containerd; removes every pod container and sandbox, unmounts what they
# left under _output/local, and removes the pod network (network namespaces,
# veths, the rustlet0 bridge, IPAM leases, portmap rules).
#
#   hack/local-down.sh [--clean]
#
# Kept for a fast next start: etcd data, PKI, containerd's images.
# --clean also removes those: everything under _output/local (build outputs
# in _output/bin stay), and the kubelet's device manager checkpoint, which it
# keeps in /var/lib/kubelet/device-plugins whatever its root directory and
# from which it would advertise a test's extended resources again.
set -euo pipefail
PROG=local-down
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

clean=false
while (($#)); do
  case $1 in
    --clean) clean=true; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (usage: hack/local-down.sh [--clean])" ;;
  esac
done
((EUID == 0)) || die "must run as root"

t0=$(now_ms)

# metrics-server's APIService goes with it, while the API server still runs.
if running_pid kube-apiserver >/dev/null; then unregister_metrics_server; fi
stop_daemon metrics-server
# The registry mirror (hack/registry-mirror.sh), if it runs.
"$ROOT/hack/registry-mirror.sh" stop
# The CSI stack (hack/csi-stack.sh), if it runs.
for c in csi-attacher csi-provisioner csi-registrar csi-hostpath; do stop_daemon "$c"; done
# The DRA test driver (hack/dra-driver.sh), if it runs.
stop_daemon dra-test-driver
# Agents first, so nothing restarts pods while they are removed.
stop_daemon rustlet 15
stop_daemon kubelet 15
stop_daemon kube-scheduler
stop_daemon kube-controller-manager

# Pods: ask containerd to kill and remove them, then sweep up what is left.
cleanup_runtime
stop_daemon containerd 15
stop_daemon kube-apiserver
stop_daemon etcd
# After containerd: shims and container processes it may have left behind,
# and mounts under the state directory.
cleanup_runtime

cleanup_kubelet_iptables
rm -f "$RUN/self-hosted"
# containerd creates /run/containerd/s for shim sockets whatever its config
# says; remove it when empty (a host containerd's is never empty).
rmdir /run/containerd/s /run/containerd 2>/dev/null || true

# Sysctls the kubelet changed, back to their values before its first start.
if [[ -f $RUN/sysctl.saved ]]; then
  restored=()
  while IFS='=' read -r key value; do
    [[ -n $key ]] || continue
    if [[ $(sysctl -n "$key" 2>/dev/null) != "$value" ]]; then
      if sysctl -q -w "$key=$value" >/dev/null 2>&1; then
        restored+=("$key=$value")
      else
        warn "could not restore $key=$value"
      fi
    fi
  done <"$RUN/sysctl.saved"
  ((${#restored[@]} == 0)) || log "restored sysctls: ${restored[*]}"
  rm -f "$RUN/sysctl.saved"
fi

# Anything of ours that still runs is a bug worth failing on.
left=()
for c in "${COMPONENTS[@]}"; do
  if pgrep -f "^($BIN|$CARGO_TARGET_DIR/debug)/$c( |$)" >/dev/null; then
    left+=("$c($(pgrep -f "^($BIN|$CARGO_TARGET_DIR/debug)/$c( |$)" | paste -sd, -))")
  fi
done
if pgrep -f "containerd-shim-runc-v2 .*-address $CTRD_SOCK" >/dev/null; then
  left+=("containerd-shim-runc-v2")
fi
((${#left[@]} == 0)) || die "still running after stop: ${left[*]}"

if $clean; then
  log "removing ${LOCAL#"$ROOT"/} (etcd data, PKI, images, logs)"
  unmount_under "$LOCAL"
  rm -rf "$LOCAL"
  rm -f /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
fi
log "cluster down in $(since "$t0")"
