#!/usr/bin/env bash
# The test command: installs what is missing, checks formatting, builds every
# Rust target, runs the unit tests, then (with the Go builds of the cluster,
# metrics-server, the CSI sidecars and kind running in the background since
# the start) runs the cluster smoke test with the upstream kubelet, the
# README's own path (hack/test-readme.sh), the end-to-end tests with rustlet
# as the node agent (hack/test-e2e.sh; clippy, helm and the upstream e2e
# binary build beside them), checks the Helm chart (helm lint and template)
# and the feature gates table, runs the Helm chart on kind (in the
# background, beside the steps after it), the self-hosted cluster's test (the
# control plane as rustlet's static pods), the Helm chart on a cluster with
# the kubelet as host agent, then a small subset of the upstream
# [NodeConformance] tests (hack/conformance-ci.txt) and two of the upstream
# storage tests on the CSI test driver (hack/conformance-ci-csi.txt) with
# rustlet.
#
#   hack/test.sh [--quick]     (--quick: format, lints and unit tests only)
#
# Each step has a time limit; a failed build skips the steps that need it
# (each counted as failed, with the reason); every cluster is taken down at
# the end, whatever stopped the run. Builds come from the caches outside the
# checkout when their inputs are unchanged (hack/lib.sh: the Rust target
# directories; hack/build-cluster.sh: the Go binaries). A row per step is
# printed as it ends (a background step's when it is waited for), and the
# table of every step's result and duration at the end, then one line "N
# passed, M failed"; exits non-zero if anything failed.
set -euo pipefail
PROG=test
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export CARGO_TARGET_DIR
# A test run builds each profile once: incremental data would only fill the
# disk (gigabytes a checkout path).
export CARGO_INCREMENTAL=0
export PATH=$BIN:$PATH
cd "$ROOT"

quick=false
[[ ${1:-} == --quick ]] && quick=true

passed=0
failed=0
# One row per step, as it ends: result, name, duration.
rows=()
# Why each failed step failed, in a few lines: the end of this script's
# output is often all a reader of a CI run gets.
why=()
# The build steps that failed: a step that needs one is skipped.
declare -A broken=()
# Builds running in the background: name -> pid, and their logs.
declare -A building=()
step_logs=$(mktemp -d)
finish() {
  local rc=$?
  trap - EXIT
  local name
  for name in "${!building[@]}"; do kill -- "-${building[$name]}" 2>/dev/null || true; done
  # No cluster outlives the run, whatever stopped it.
  hack/local-down.sh >/dev/null 2>&1 || true
  rm -rf "$step_logs"
  exit "$rc"
}
trap finish EXIT

# row RESULT NAME DURATION: records and prints a step's row.
row() {
  rows+=("$(printf '%-4s %-58s %9s' "$1" "$2" "$3")")
  log "${rows[-1]}"
}

# explain NAME LOG: the lines of LOG that say why step NAME failed.
explain() {
  local line
  while IFS= read -r line; do why+=("  $1: ${line:0:240}"); done < <(
    grep -aE 'FAIL|[Ff]ailed|[Ee]rror|panicked|timed out' "$2" | grep -aviE 'deprecat|0 failed' | tail -6
  )
}

# step NAME MINUTES NEEDS COMMAND...: runs one step with a time limit, records
# its result and goes on after a failure. NEEDS: the builds it needs, comma
# separated, or -; when one of them failed, the step is skipped (and counts
# as failed) with the reason printed. A build running in the background is
# waited for first.
step() {
  local name=$1 minutes=$2 needs=$3 start step_log
  shift 3
  have "$name" "$needs" || return 0
  start=$(now_ms)
  log "== $name (at most $minutes min)"
  step_log=$step_logs/$((passed + failed)).log
  local rc=0
  timeout -k 60 "${minutes}m" "$@" > >(tee "$step_log") 2>&1 || rc=$?
  sleep 0.2 # tee's last lines
  if ((rc == 0)); then
    passed=$((passed + 1))
    row PASS "$name" "$(since "$start")"
  else
    failed=$((failed + 1))
    row FAIL "$name" "$(since "$start")"
    ((rc != 124)) || why+=("  $name: stopped after its limit of $minutes min")
    explain "$name" "$step_log"
  fi
  return 0
}

# have NAME NEEDS: waits for the builds NEEDS names (comma separated, or -)
# that run in the background; when one of them failed, step NAME is
# recorded as skipped (and failed) with the reason, and this returns 1.
have() {
  local name=$1 needs=$2 need
  [[ $needs != - ]] || return 0
  local -a list
  IFS=, read -ra list <<<"$needs"
  for need in "${list[@]}"; do
    [[ -z ${building[$need]:-} ]] || await "$need"
    if [[ -n ${broken[$need]:-} ]]; then
      failed=$((failed + 1))
      row SKIP "$name" "-"
      why+=("  $name: skipped: the build '$need' failed")
      return 1
    fi
  done
}

# build NAME MINUTES COMMAND...: a step whose failure skips the steps that need it.
build() {
  local name=$1 minutes=$2 before=$failed
  shift 2
  step "$name" "$minutes" - "$@"
  ((failed == before)) || broken[$name]=1
}

# in_background NICENESS NAME MINUTES COMMAND...: starts a step in the
# background, at that niceness, that `step ... NAME ...` (or the end of the
# run) waits for; its output is printed then.
in_background() {
  local niceness=$1 name=$2 minutes=$3 log_file=$step_logs/bg-${2// /_}.log
  shift 3
  log "== $name: started in the background (at most $minutes min)"
  # Its exit status and duration (ms) go to <its log>.rc.
  setsid nice -n "$niceness" bash -c 'rc_file=$1 limit=$2; shift 2; start=$(date +%s%3N); rc=0
    timeout -k 60 "$limit" "$@" || rc=$?; echo "$rc $(($(date +%s%3N) - start))" >"$rc_file"; exit "$rc"' \
    build "$log_file.rc" "${minutes}m" "$@" >"$log_file" 2>&1 &
  building[$name]=$!
}

# build_in_background NAME MINUTES COMMAND...: a build in the background,
# niced, so that the tests running meanwhile keep the cpu.
build_in_background() { in_background 19 "$@"; }

# await NAME: waits for a background build and records it as a step.
await() {
  local name=$1 log_file=$step_logs/bg-${1// /_}.log rc ms
  log "waiting for the background build: $name"
  wait "${building[$name]}" || true
  unset "building[$name]"
  read -r rc ms <"$log_file.rc" 2>/dev/null || { rc=1; ms=0; }
  cat "$log_file"
  local secs="$((ms / 1000)).$((ms % 1000 / 100))s"
  if ((rc == 0)); then
    passed=$((passed + 1))
    row PASS "$name (background)" "$secs"
  else
    failed=$((failed + 1))
    broken[$name]=1
    row FAIL "$name (background)" "$secs"
    ((rc != 124)) || why+=("  $name: stopped after its time limit")
    explain "$name" "$log_file"
  fi
}

# The Rust build directory (hack/lib.sh) keeps every past build's
# artefacts; on a full disk the linker fails midway through. Below 20 GiB
# free, it starts anew.
mkdir -p "$CARGO_TARGET_DIR"
free_kib=$(df --output=avail "$CARGO_TARGET_DIR" | tail -1)
if ((free_kib < 20 * 1024 * 1024)); then
  log "only $((free_kib / 1024 / 1024)) GiB free: removing the build directories $CARGO_TARGET_DIR and $CLIPPY_TARGET_DIR"
  rm -rf "$CARGO_TARGET_DIR" "$CLIPPY_TARGET_DIR"
  mkdir -p "$CARGO_TARGET_DIR"
fi

hack/install-deps.sh
step "cargo fmt --check" 2 - cargo fmt --check
if ! $quick; then
  # Start from a clean node: no bridge, veths or mounts left by an earlier run.
  hack/local-down.sh >/dev/null 2>&1 || true
  # The Go builds the first cluster needs (the cluster, metrics-server, the
  # CSI sidecars, kind's binaries and kubectl; each from its cache when its
  # inputs are unchanged) run in the background, niced, from now on: the
  # Rust builds take the cpu first, the Go builds what they leave and the
  # module downloads overlap them.
  build_in_background "Go builds" 70 bash -c 'hack/build-cluster.sh all && hack/build-cluster.sh metrics-server &&
    hack/build-cluster.sh csi && hack/build-cluster.sh kind'
fi
# The binaries as `cargo build` makes them too (hack/local-up.sh runs that):
# the tests' dev-dependencies change the features of some build
# dependencies, so the test build alone leaves the agent to be built again
# by the first cluster.
build "cargo build (every target)" 25 bash -c 'cargo build --bins && cargo test --all-targets --no-run'
# The full run checks clippy in the background, beside the end-to-end tests.
if $quick; then
  step "cargo clippy" 15 "cargo build (every target)" cargo clippy --all-targets -- -D warnings
fi
step "unit tests" 15 "cargo build (every target)" cargo test --lib --bins --test cli --test layering
step "conformance-table.py self-test" 2 - python3 hack/conformance-table.py selftest
step "conformance-shards.py self-test" 2 - python3 hack/conformance-shards.py selftest
step "resident-code.py self-test" 2 - python3 hack/resident-code.py selftest
step "startup-trace.py self-test" 2 - python3 hack/startup-trace.py selftest
if ! $quick; then
  step "cluster smoke test (kubelet)" 10 "Go builds" hack/test-cluster-smoke.sh --agent kubelet
  step "the README's path: hack/local-up.sh, examples/busybox-sleep.yaml Running" 10 "Go builds,cargo build (every target)" \
    hack/test-readme.sh
  # What only the later steps need builds while the end-to-end tests wait
  # on pods: the upstream e2e binary (from nothing, several minutes), helm,
  # and clippy's checks (in a build directory of its own, so that it never
  # holds the one the tests' agent restarts build in).
  build_in_background "build e2e.test" 40 hack/build-cluster.sh e2e
  build_in_background "build helm" 20 hack/build-cluster.sh helm
  build_in_background "cargo clippy" 25 env CARGO_TARGET_DIR="$CLIPPY_TARGET_DIR" cargo clippy --all-targets -- -D warnings
  # The one topic that measures the host's free memory waits for them.
  step "end-to-end tests (rustlet)" 45 "cargo build (every target),Go builds" env \
    E2E_QUIET_AFTER="${building[build e2e.test]} ${building[build helm]} ${building[cargo clippy]}" hack/test-e2e.sh
  step "Helm chart: lint, template, schema and RBAC" 10 "build helm" hack/chart-lint.sh
  step "feature gates table: the kubelet's of k8s.io/kubernetes" 5 "Go builds" hack/feature-gates.sh --check
  # kind's cluster lives in containers of its own dockerd (its own network,
  # cgroup namespace and containerd), so it runs beside the local clusters
  # of the steps after it.
  if have "Helm chart on kind" "Go builds,cargo build (every target),build helm"; then
    in_background 0 "Helm chart on kind" 30 hack/kind-e2e.sh
  fi
  step "self-hosted control plane (rustlet)" 10 "Go builds,cargo build (every target)" hack/test-self-hosted.sh
  step "Helm chart on a cluster: install, upgrade, uninstall" 15 "Go builds,cargo build (every target),build helm" hack/test-chart.sh
  step "upstream conformance subset (rustlet)" 20 "Go builds,build e2e.test" hack/conformance.sh --agent rustlet --name ci \
    --procs 4 --focus "$(grep -v '^#' hack/conformance-ci.txt | paste -sd'|')" --expect hack/conformance-ci.txt
  step "upstream storage tests on the CSI test driver (rustlet)" 20 "Go builds,build e2e.test" \
    hack/conformance.sh --suite storage-csi --agent rustlet --name ci-csi --procs 2 \
    --focus "$(grep -v '^#' hack/conformance-ci-csi.txt | paste -sd'|')" --expect hack/conformance-ci-csi.txt
fi
for name in "${!building[@]}"; do await "$name"; done
printf '%s\n' "steps:" "${rows[@]}"
((${#why[@]} == 0)) || printf '%s\n' "why:" "${why[@]}"
echo "$passed passed, $failed failed"
((failed == 0))
