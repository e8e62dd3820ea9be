#!/usr/bin/env bash
# Starts or stops the upstream DRA test driver (k8s.io/kubernetes
# test/e2e/dra/test-driver, `hack/build-cluster.sh dra`, built when missing)
# on the running local cluster: its kubelet plugin, driver
# test-driver.cdi.k8s.io, which publishes the node's four simulated devices
# (device-00 ... device-03) in a ResourceSlice, registers with the node agent
# through <root-dir>/plugins_registry and, for each claim the agent prepares,
# writes a CDI spec (<driver>-<claim uid>-<request>.json, device ID
# test-driver.cdi.k8s.io/test=claim-<claim uid>-<request>) that sets the
# container's environment: user_<key>=<value> for the claim's opaque
# parameters, claim_<claim name>_<request>=true (each character but
# [a-zA-Z0-9] as _); and the DeviceClass `example` of its devices
# (hack/dra-deviceclass.yaml).
#
#   hack/dra-driver.sh up [--agent rustlet|kubelet]
#   hack/dra-driver.sh down
#
#   up       starts the driver as a daemon of the local cluster (log in
#            _output/local/logs/dra-test-driver.log, at -v=6: every gRPC call
#            with its request and response; hack/local-down.sh stops it too)
#            with the admin kubeconfig, for the local node (NODE_NAME,
#            default local-node), its registration socket in the agent's
#            root directory (default rustlet's, _output/local/rustlet;
#            kubelet: the upstream kubelet's), its DRA socket in
#            <root-dir>/plugins/test-driver.cdi.k8s.io and its CDI specs in
#            _output/local/cdi (containerd's CDI spec directory,
#            hack/containerd-config.toml); applies the DeviceClass and waits
#            until the driver's ResourceSlice for the node exists, then up to
#            20 s for the agent to register it (a warning if it does not)
#   down     deletes the DeviceClass, stops the driver and deletes its
#            ResourceSlices (no driver is left to prepare their devices)
#
# A claim of the class and a pod that uses it:
#   kind: ResourceClaimTemplate
#   spec: {spec: {devices: {requests: [{name: my-device, exactly: {deviceClassName: example}}],
#          config: [{opaque: {driver: test-driver.cdi.k8s.io, parameters: {a: b}}}]}}}
# and, in the pod, resourceClaims: [{name: resource, resourceClaimTemplateName: ...}]
# and the container's resources.claims: [{name: resource}].
set -euo pipefail
PROG=dra-driver
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; }

DRA_DRIVER=test-driver.cdi.k8s.io
DEVICE_CLASS_FILE=$ROOT/hack/dra-deviceclass.yaml

cmd=${1:-}
(($#)) && shift
case $cmd in -h | --help) usage; exit 0 ;; esac
agent=rustlet
while (($#)); do
  case $1 in
    --agent) agent=${2:-}; shift 2 || die "--agent needs a value" ;;
    --agent=*) agent=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see hack/dra-driver.sh --help)" ;;
  esac
done
case $agent in rustlet | kubelet) ;; *) die "unknown agent '$agent' (rustlet|kubelet)" ;; esac
((EUID == 0)) || die "must run as root (the driver's sockets are in the agent's root directory)"

# slice_exists: the driver's ResourceSlice for the node is there.
slice_exists() {
  [[ -n $(kubectl_admin get resourceslices -o name \
    --field-selector "spec.nodeName=$NODE_NAME,spec.driver=$DRA_DRIVER" 2>/dev/null) ]]
}

# registered OFFSET: the driver's log from byte OFFSET on (its current run)
# shows the agent's NotifyRegistrationStatus call with plugin_registered:true.
registered() {
  tail -c "+$1" "$LOGS/dra-test-driver.log" |
    grep -qF 'method="/pluginregistration.Registration/NotifyRegistrationStatus" request="plugin_registered:true"'
}

up() {
  running_pid kube-apiserver >/dev/null || die "no local cluster runs (hack/local-up.sh first)"
  running_pid "$agent" >/dev/null || die "the local cluster's agent is not $agent"
  local pid root_dir=$LOCAL/$agent log_from=''
  if pid=$(running_pid dra-test-driver); then
    # Its command line names the root directory it registers in.
    tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qxF -- "--plugin-registration-path=$root_dir/plugins_registry" ||
      die "the driver (pid $pid) runs for another agent than $agent; hack/dra-driver.sh down first"
    log "dra-test-driver already running (pid $pid)"
  else
    build_if_missing dra dra-test-driver
    # Its sockets go to --datadir/<driver>, which it does not make itself
    # (only --datadir).
    mkdir -p "$CDI_DIR" "$root_dir/plugins_registry" "$root_dir/plugins/$DRA_DRIVER"
    log_from=$(($(stat -c %s "$LOGS/dra-test-driver.log" 2>/dev/null || echo 0) + 1))
    start_daemon dra-test-driver "$BIN/dra-test-driver" -v=6 --kubeconfig="$ADMIN_KUBECONFIG" \
      kubelet-plugin \
      --node-name="$NODE_NAME" \
      --plugin-registration-path="$root_dir/plugins_registry" \
      --datadir="$root_dir/plugins" \
      --cdi-dir="$CDI_DIR"
  fi
  kubectl_admin apply -f "$DEVICE_CLASS_FILE" >/dev/null || die "could not apply ${DEVICE_CLASS_FILE#"$ROOT"/}"
  wait_daemon dra-test-driver "the ResourceSlice of $DRA_DRIVER for node $NODE_NAME" 60 slice_exists
  log "$DRA_DRIVER publishes node $NODE_NAME's devices (registration: ${root_dir#"$ROOT"/}/plugins_registry," \
    "CDI specs: ${CDI_DIR#"$ROOT"/}), DeviceClass example"
  # The slice is published whether or not the agent takes the driver: its
  # registration shows in the driver's log (the gRPC calls, at -v=6).
  [[ -n $log_from ]] || return 0
  if wait_for "$agent to register $DRA_DRIVER" 20 registered "$log_from"; then
    log "$agent registered $DRA_DRIVER"
  else
    warn "$agent has not registered $DRA_DRIVER: pods with claims of class example will not start" \
      "(the driver's log: ${LOGS#"$ROOT"/}/dra-test-driver.log)"
  fi
}

down() {
  local api=false
  if running_pid kube-apiserver >/dev/null; then
    api=true
    kubectl_admin delete -f "$DEVICE_CLASS_FILE" --ignore-not-found >/dev/null || true
  fi
  stop_daemon dra-test-driver
  if $api; then
    kubectl_admin delete resourceslices --field-selector "spec.nodeName=$NODE_NAME,spec.driver=$DRA_DRIVER" \
      --ignore-not-found >/dev/null || true
  fi
}

case $cmd in
  up) up ;;
  down) down ;;
  *) usage >&2; exit 2 ;;
esac
