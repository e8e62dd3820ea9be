#!/usr/bin/env bash
# The README's own path, as a newcomer takes it: plain `hack/local-up.sh`
# (rustlet as the node agent, no other flag), the node Ready, then
# `kubectl apply -f examples/busybox-sleep.yaml` and the pod Running with its
# greeting in its log, then `hack/local-down.sh`. (`hack/install-deps.sh`,
# the first half of the README's command, runs at the start of
# hack/test.sh.)
#
#   hack/test-readme.sh
#
# Ends with one line "N passed, M failed"; exits non-zero if any check failed.
set -euo pipefail
PROG=readme
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

passed=0
failed=0
up=false
finish() {
  local rc=$?
  trap - EXIT
  if $up; then
    kubectl delete -f examples/busybox-sleep.yaml --wait=false >/dev/null 2>&1 || true
    "$ROOT/hack/local-down.sh" >/dev/null || fail "hack/local-down.sh"
  fi
  ((rc == 0)) || failed=$((failed + 1))
  echo "$passed passed, $failed failed"
  ((failed == 0))
}
trap finish EXIT

up=true
t0=$(now_ms)
if hack/local-up.sh; then
  pass "hack/local-up.sh ($(since "$t0"))"
else
  fail "hack/local-up.sh"
  exit 1
fi
export KUBECONFIG=$PWD/_output/local/admin.kubeconfig
node_ready() {
  [[ $(kubectl get nodes -o jsonpath='{.items[*].status.conditions[?(@.type=="Ready")].status}') == True ]]
}
check "kubectl get nodes: one node, Ready" wait_for "the node Ready" 60 node_ready
check "kubectl apply -f examples/busybox-sleep.yaml" kubectl apply -f examples/busybox-sleep.yaml
sleeper_running() { [[ $(kubectl get pod sleeper -o jsonpath='{.status.phase}') == Running ]]; }
t0=$(now_ms)
if wait_for "pod sleeper Running" 90 sleeper_running; then
  pass "pod sleeper Running ($(since "$t0"))"
else
  fail "pod sleeper Running (phase: $(kubectl get pod sleeper -o jsonpath='{.status.phase}' 2>&1))"
  kubectl describe pod sleeper 2>&1 | tail -20 | sed 's/^/    /'
fi
greeted() { kubectl logs sleeper 2>/dev/null | grep -qx 'hello from sleeper'; }
check "kubectl logs sleeper: hello from sleeper" wait_for "the greeting" 30 greeted
