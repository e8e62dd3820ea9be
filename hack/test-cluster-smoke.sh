#!/usr/bin/env bash
# Smoke test of the local cluster with the upstream kubelet as node agent:
# brings the cluster up, runs a busybox pod to completion, reads its log
# through the apiserver and the kubelet, checks that the node's credentials
# are confined by the Node authorizer, brings the cluster down and checks that
# no component is left running.
#
#   hack/test-cluster-smoke.sh [--agent kubelet|rustlet]     (default: kubelet)
#
# Ends with one line "N passed, M failed"; exits non-zero if any check failed.
set -euo pipefail
PROG=smoke
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

agent=kubelet
case ${1:-} in
  --agent) agent=${2:?--agent needs a value} ;;
  --agent=*) agent=${1#*=} ;;
  "") ;;
  *) die "unknown argument '$1'" ;;
esac

passed=0
failed=0

up=false
down() {
  $up || return 0
  up=false
  "$ROOT/hack/local-down.sh"
}
finish() {
  local rc=$?
  trap - EXIT
  down || fail "local-down.sh"
  ((rc == 0)) || failed=$((failed + 1))
  echo "$passed passed, $failed failed"
  ((failed == 0))
}
trap finish EXIT

# ---------------------------------------------------------------- up
up=true
t0=$(now_ms)
if "$ROOT/hack/local-up.sh" --agent "$agent"; then
  pass "local-up.sh --agent $agent ($(since "$t0"))"
else
  fail "local-up.sh --agent $agent"
  exit 1
fi
export KUBECONFIG=$ADMIN_KUBECONFIG

# ---------------------------------------------------------------- a pod
kubectl delete pod t --ignore-not-found --wait=true >/dev/null
t0=$(now_ms)
check "kubectl run t (busybox:1.36)" \
  kubectl run t --image=docker.io/library/busybox:1.36 --restart=Never -- sh -c 'echo hello'
pod_succeeded() { [[ $(kubectl get pod t -o jsonpath='{.status.phase}') == Succeeded ]]; }
if wait_for "pod t to succeed" 90 pod_succeeded; then
  pass "pod t Succeeded ($(since "$t0"))"
else
  fail "pod t Succeeded (phase: $(kubectl get pod t -o jsonpath='{.status.phase}' 2>&1))"
  kubectl describe pod t 2>&1 | tail -20 | sed 's/^/    /'
fi
logs=$(kubectl logs t 2>&1 || true)
if [[ $logs == hello ]]; then pass "kubectl logs t == hello"; else fail "kubectl logs t == hello (got: $logs)"; fi

# ---------------------------------------------------------------- node authz
# "no - node: can only read namespaced object of this type"
can=$(kubectl --kubeconfig "$NODE_KUBECONFIG" auth can-i list secrets --all-namespaces 2>/dev/null || true)
if [[ ${can%% *} == no ]]; then pass "node cannot list secrets cluster-wide"; else fail "node cannot list secrets cluster-wide (can-i: $can)"; fi

kubectl delete pod t --wait=false >/dev/null 2>&1 || true

# ---------------------------------------------------------------- down
t0=$(now_ms)
if down; then pass "local-down.sh ($(since "$t0"))"; else fail "local-down.sh"; fi
# This cluster's processes: its binaries, and the shims of its containerd.
# Another containerd on the host (Docker's, say) is not this cluster's.
for c in "${COMPONENTS[@]}" containerd-shim-runc-v2; do
  pattern="^($BIN|$CARGO_TARGET_DIR/(debug|release))/$c( |$)"
  [[ $c == containerd-shim-runc-v2 ]] && pattern="containerd-shim-runc-v2 .*-address $CTRD_SOCK( |$)"
  if pids=$(pgrep -f "$pattern"); then
    fail "no $c process left (found: ${pids//$'\n'/ })"
  else
    pass "no $c process left"
  fi
done
if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then fail "bridge $CNI_BRIDGE removed"; else pass "bridge $CNI_BRIDGE removed"; fi
mounts=$(awk -v d="$LOCAL/" 'index($5, d) == 1' /proc/self/mountinfo | wc -l)
if ((mounts == 0)); then pass "no mounts left under _output/local"; else fail "no mounts left under _output/local ($mounts)"; fi
