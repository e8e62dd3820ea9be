#!/usr/bin/env bash
# The test command: installs what is missing, checks formatting and lints, runs
# the unit tests, builds the local cluster, checks the Helm chart (helm lint
# and template), runs the cluster smoke test with the
# upstream kubelet, the end-to-end tests with rustlet as the node agent, the
# self-hosted cluster's test (the control plane as rustlet's static pods), the
# Helm chart on a cluster with the kubelet as host agent and on kind, then a
# small subset of the upstream [NodeConformance] tests (hack/conformance-ci.txt)
# and two of the upstream storage tests on the CSI test driver
# (hack/conformance-ci-csi.txt) with rustlet.
#
#   hack/test.sh [--quick]     (--quick: format, lints and unit tests only)
#
# Ends with one line "N passed, M failed"; exits non-zero if anything failed.
set -euo pipefail
PROG=test
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export CARGO_TARGET_DIR
export PATH=$BIN:$PATH
cd "$ROOT"

quick=false
[[ ${1:-} == --quick ]] && quick=true

passed=0
failed=0
results=()
# Why each failed step failed, in a few lines: the end of this script's
# output is often all a reader of a CI run gets.
why=()
step_logs=$(mktemp -d)
trap 'rm -rf "$step_logs"' EXIT
# step NAME COMMAND...: runs one step, records its result, goes on after a failure.
step() {
  local name=$1 start step_log
  shift
  start=$(now_ms)
  log "== $name"
  step_log=$step_logs/$((passed + failed)).log
  if "$@" > >(tee "$step_log") 2>&1; then
    passed=$((passed + 1))
    results+=("PASS $name ($(since "$start"))")
  else
    failed=$((failed + 1))
    results+=("FAIL $name ($(since "$start"))")
    sleep 0.2 # tee's last lines
    local line
    while IFS= read -r line; do why+=("  $name: ${line:0:240}"); done < <(
      grep -aE 'FAIL|[Ff]ailed|[Ee]rror|panicked|timed out' "$step_log" | grep -aviE 'deprecat|0 failed' | tail -6
    )
  fi
}

e2e() {
  # With metrics-server, so that tests/e2e_stats.rs can check `kubectl top`,
  # and the registry mirror, so that tests/e2e_images.rs pulls with Always.
  "$ROOT/hack/local-up.sh" --agent rustlet --metrics-server --registry-mirror || return 1
  # The in-cluster CSI driver's image (tests/e2e_csi_in_cluster.rs).
  "$ROOT/hack/image.sh" --import --debug --csi || return 1
  local rc=0
  # Every tests/e2e*.rs in one run; the scenarios that restart the agent
  # (restart, eviction, devices), add a node (image GC) or take most of the
  # node's cpu (admission) run alone, last.
  local -a alone=(e2e_restart e2e_eviction e2e_image_gc e2e_admission e2e_devices) targets=()
  local f
  for f in tests/e2e*.rs; do
    f=$(basename "$f" .rs)
    [[ " ${alone[*]} " == *" $f "* ]] || targets+=(--test "$f")
  done
  cargo test --no-fail-fast "${targets[@]}" -- --ignored --test-threads 4 || rc=1
  for f in "${alone[@]}"; do
    cargo test --test "$f" -- --ignored --test-threads 1 || rc=1
  done
  ((rc == 0)) || tail_log rustlet 60
  "$ROOT/hack/local-down.sh" || rc=1
  return $rc
}

# The build directories (one per checkout, hack/lib.sh) keep every past
# build's artefacts; on a full disk the linker fails midway through. Below
# 20 GiB free, every checkout's starts anew.
mkdir -p "$CARGO_TARGET_DIR"
free_kib=$(df --output=avail "$CARGO_TARGET_DIR" | tail -1)
if ((free_kib < 20 * 1024 * 1024)); then
  log "only $((free_kib / 1024 / 1024)) GiB free: removing the build directories in ${CARGO_TARGET_DIR%/*}"
  rm -rf "${CARGO_TARGET_DIR%/*}"/target*
  mkdir -p "$CARGO_TARGET_DIR"
fi

hack/install-deps.sh
step "cargo fmt --check" cargo fmt --check
step "cargo clippy" cargo clippy --all-targets -- -D warnings
step "unit tests" cargo test --lib --bins --test cli --test layering
step "conformance-table.py self-test" python3 hack/conformance-table.py selftest
step "conformance-shards.py self-test" python3 hack/conformance-shards.py selftest
if ! $quick; then
  # Start from a clean node: no bridge, veths or mounts left by an earlier run.
  hack/local-down.sh >/dev/null 2>&1 || true
  step "build cluster" hack/build-cluster.sh all
  step "build metrics-server" hack/build-cluster.sh metrics-server
  step "build CSI sidecars" hack/build-cluster.sh csi
  step "Helm chart: lint, template, schema and RBAC" hack/chart-lint.sh
  step "cluster smoke test (kubelet)" hack/test-cluster-smoke.sh --agent kubelet
  step "end-to-end tests (rustlet)" e2e
  step "self-hosted control plane (rustlet)" hack/test-self-hosted.sh
  step "Helm chart on a cluster: install, upgrade, uninstall" hack/test-chart.sh
  step "Helm chart on kind" hack/kind-e2e.sh
  step "build e2e.test" hack/build-cluster.sh e2e
  step "upstream conformance subset (rustlet)" hack/conformance.sh --agent rustlet --name ci \
    --procs 4 --focus "$(grep -v '^#' hack/conformance-ci.txt | paste -sd'|')" --expect hack/conformance-ci.txt
  step "upstream storage tests on the CSI test driver (rustlet)" hack/conformance.sh --suite storage-csi \
    --agent rustlet --name ci-csi --procs 2 --focus "$(grep -v '^#' hack/conformance-ci-csi.txt | paste -sd'|')" \
    --expect hack/conformance-ci-csi.txt
fi
printf '%s\n' "${results[@]}"
((${#why[@]} == 0)) || printf '%s\n' "why:" "${why[@]}"
echo "$passed passed, $failed failed"
((failed == 0))
