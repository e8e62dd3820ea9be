#!/usr/bin/env bash
# Runs the upstream e2e [NodeConformance] tests (e2e.test from
# k8s.io/kubernetes, built by `hack/build-cluster.sh e2e`) against a fresh
# local one-node cluster, then takes the cluster down.
#
#   hack/conformance.sh [--agent rustlet|kubelet] [--focus REGEX] [--skip REGEX]
#                       [--procs N] [--timeout DURATION] [--name NAME] [--keep-up]
#
#   --agent    the node agent (default rustlet)
#   --focus    run only the [NodeConformance] tests that also match REGEX
#   --skip     skip the tests matching REGEX instead of the default
#              '\[Slow\]|\[Disruptive\]|\[Flaky\]' (the [Slow] tests take
#              hours: 127 pod-level resize tables, a 27-minute back-off test;
#              no [NodeConformance] test is Disruptive or Flaky today).
#              [Serial] tests run, after the others, one at a time.
#   --procs    parallel ginkgo processes (default 6: the tests mostly wait)
#   --timeout  the whole run's limit (default 2h)
#   --name     write to _output/conformance/<agent>-NAME/ instead, leaving the
#              full run's results (which docs/conformance.md is built from)
#              alone: for subsets, e.g. CI's
#   --keep-up  leave the cluster running afterwards (for debugging)
#
# Writes to _output/conformance/<agent>/ (replacing the last run's files):
#   junit_01.xml   the JUnit report (every spec of e2e.test; the ones not
#                  selected are "skipped")
#   e2e.log        ginkgo's output
#   summary.txt    counts, run time, versions, the failed tests
#   <agent>.log    the node agent's log
# and ends with one line "N passed, M failed, K skipped" over the selected
# tests (K: selected but skipped by --skip or by the test itself). Exits
# non-zero if a test failed or the run did not complete.
#
# Needs root, no local cluster running (it starts its own and stops it), and
# _output/bin/e2e.test and _output/bin/ginkgo.
set -euo pipefail
PROG=conformance
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; }

DEFAULT_SKIP='\[Slow\]|\[Disruptive\]|\[Flaky\]'
agent=rustlet
focus=''
skip=$DEFAULT_SKIP
procs=6
timeout=2h
name=''
keep_up=false
while (($#)); do
  case $1 in
    --agent) agent=${2:-}; shift 2 || die "--agent needs a value" ;;
    --agent=*) agent=${1#*=}; shift ;;
    --focus) focus=${2:-}; shift 2 || die "--focus needs a value" ;;
    --focus=*) focus=${1#*=}; shift ;;
    --skip) skip=${2:-}; shift 2 || die "--skip needs a value" ;;
    --skip=*) skip=${1#*=}; shift ;;
    --procs) procs=${2:-}; shift 2 || die "--procs needs a value" ;;
    --procs=*) procs=${1#*=}; shift ;;
    --timeout) timeout=${2:-}; shift 2 || die "--timeout needs a value" ;;
    --timeout=*) timeout=${1#*=}; shift ;;
    --name) name=${2:-}; shift 2 || die "--name needs a value" ;;
    --name=*) name=${1#*=}; shift ;;
    --keep-up) keep_up=true; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see hack/conformance.sh --help)" ;;
  esac
done
case $agent in
  rustlet | kubelet) ;;
  *) die "unknown agent '$agent' (rustlet|kubelet)" ;;
esac
[[ $procs =~ ^[1-9][0-9]*$ ]] || die "--procs must be a positive number, not '$procs'"
[[ -z $name || $name =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "--name must be lowercase letters, digits and dashes, not '$name'"

((EUID == 0)) || die "must run as root (the local cluster needs it)"
need_cmd python3 "Debian package python3"
need_cmd kubectl "a kubectl client (hack/install-deps.sh builds one)"
for b in e2e.test ginkgo; do
  [[ -x $BIN/$b ]] || die "missing $BIN/$b (run hack/build-cluster.sh e2e)"
done

# The run needs a cluster of its own: it starts one and takes it down. Any
# other cluster on this machine (this one's or another checkout's) uses the
# same ports and the same pod bridge: refuse to start rather than disturb it.
for c in "${COMPONENTS[@]}"; do
  if pid=$(running_pid "$c"); then
    die "a local cluster is already running ($c, pid $pid); stop it with hack/local-down.sh first"
  fi
done
for port in 2379 6443 10250 10257 10259; do
  if who=$(port_listeners "$port"); then
    die "port $port is in use by $who (another local cluster?); wait for it to stop"
  fi
done

# The focus: [NodeConformance] and, if given, the caller's REGEX. Ginkgo ORs
# repeated --focus flags, so "both" is written as one expression.
NC='\[NodeConformance\]'
if [[ -n $focus ]]; then
  effective_focus="$NC.*($focus)|($focus).*$NC"
else
  effective_focus=$NC
fi

OUT=$ROOT/_output/conformance/$agent${name:+-$name}
mkdir -p "$OUT"
rm -rf "${OUT:?}"/junit_01.xml "$OUT"/e2e.log "$OUT"/summary.txt "$OUT"/"$agent".log "$OUT"/e2e-output

# write_summary: summary.txt from the JUnit report (also for an interrupted
# run: ginkgo writes the report of what ran when it is interrupted).
write_summary() {
  {
    echo "agent: $agent"
    echo "date: $run_date"
    echo "focus: $effective_focus"
    echo "skip: ${skip:-}"
    echo "procs: $procs"
    echo "cluster up: ${t_up:-?}"
    echo "e2e run: ${t_run:-$(since "$t1") (interrupted)}"
    echo "kubernetes: $(grep -m1 'k8s.io/kubernetes v' "$ROOT/tests/cluster/go.mod" | awk '{print $NF}') (e2e.test, control plane, kubelet)"
    echo "ginkgo: $("$BIN/ginkgo" version 2>/dev/null | awk '{print $NF}' || true)"
    if [[ $agent == rustlet ]]; then
      echo "rustlet: $rustlet_rev"
    fi
  } >"$OUT/summary.txt"
  line=$(python3 "$ROOT/hack/conformance-table.py" summary \
    --focus "$effective_focus" --skip "$skip" "$OUT/junit_01.xml" | tee -a "$OUT/summary.txt" | tail -n 1)
}

cluster_started=false
ginkgo_pid=''
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  # Interrupted while the tests run: the e2e.test processes (ginkgo's
  # children) run their cleanup and report on SIGINT, and ginkgo then writes
  # the reports; whatever is left after a minute is killed.
  if [[ -n $ginkgo_pid ]] && alive "$ginkgo_pid"; then
    warn "interrupting ginkgo (pid $ginkgo_pid) and its e2e.test processes"
    local children
    children=$(pgrep -P "$ginkgo_pid" || true)
    # shellcheck disable=SC2086 # a list of pids
    kill -INT $children "$ginkgo_pid" 2>/dev/null || true
    for _ in $(seq 600); do
      alive "$ginkgo_pid" || break
      sleep 0.1
    done
    # shellcheck disable=SC2086 # a list of pids
    kill -KILL "$ginkgo_pid" $children 2>/dev/null || true
    if [[ -f $OUT/junit_01.xml && ! -f $OUT/summary.txt ]]; then
      write_summary || warn "could not write summary.txt"
    fi
  fi
  if $cluster_started; then
    if [[ -f $LOGS/$agent.log ]]; then
      cp "$LOGS/$agent.log" "$OUT/$agent.log" || true
    fi
    if $keep_up; then
      log "--keep-up: the cluster stays up (stop it with hack/local-down.sh)"
    else
      log "taking the cluster down"
      "$ROOT/hack/local-down.sh" || { warn "hack/local-down.sh failed"; ((rc != 0)) || rc=1; }
    fi
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The kubelet remembers which images it pulled with credentials and makes
# pods without them pull again; records left by an earlier run would turn
# into pulls from registries this machine cannot reach.
if [[ -d $LOCAL/kubelet/image_manager ]]; then
  log "removing the kubelet's image pull records from earlier runs"
  rm -rf "$LOCAL/kubelet/image_manager"
fi

# The source local-up.sh builds rustlet from, named now (commits may land
# while the tests run).
rustlet_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || rustlet_rev+=" (modified)"

t0=$(now_ms)
log "bringing up the local cluster with $agent"
# On failure local-up.sh stops what it started itself; only a cluster that
# came up is taken down here.
"$ROOT/hack/local-up.sh" --agent "$agent"
cluster_started=true
# Every image the tests need, or stop here (local-up.sh only warns).
"$ROOT/hack/images.sh" --all
t_up=$(since "$t0")

kubectl_path=$(command -v kubectl)
ginkgo_args=(
  --procs="$procs"
  --timeout="$timeout"
  --focus="$effective_focus"
  --no-color
  --silence-skips
)
[[ -z $skip ]] || ginkgo_args+=(--skip="$skip")
# Flags of e2e.test (test/e2e/framework/test_context.go) for a one-node,
# provider-less cluster: no cloud, no SSH (skeleton), one node, the admin
# kubeconfig, reports in $OUT.
e2e_args=(
  --provider=skeleton
  --kubeconfig="$ADMIN_KUBECONFIG"
  --num-nodes=1
  --report-dir="$OUT"
  --e2e-output-dir="$OUT/e2e-output"
  --kubectl-path="$kubectl_path"
  --kubelet-root-dir="$LOCAL/$agent"
  --container-runtime-endpoint="unix://$CTRD_SOCK"
  --node-os-distro=debian
  --dns-domain=cluster.local
  --system-pods-startup-timeout=1m
  --node-schedulable-timeout=2m
)
mkdir -p "$OUT/e2e-output"
log "running e2e.test: focus '$effective_focus', skip '${skip:-none}', $procs processes (log: ${OUT#"$ROOT"/}/e2e.log)"
t1=$(now_ms)
run_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
set +e
(cd "$OUT" && "$BIN/ginkgo" "${ginkgo_args[@]}" "$BIN/e2e.test" -- "${e2e_args[@]}") >"$OUT/e2e.log" 2>&1 &
ginkgo_pid=$!
# A progress line every minute: how many specs have reported so far.
while alive "$ginkgo_pid"; do
  for _ in $(seq 60); do
    alive "$ginkgo_pid" || break
    sleep 1
  done
  alive "$ginkgo_pid" || break
  # Ginkgo prints a "•" for every spec that ran (passed or failed).
  done_specs=$(grep -o '•' "$OUT/e2e.log" 2>/dev/null | wc -l || true)
  failed_specs=$(grep -c '\[FAILED\] \[' "$OUT/e2e.log" 2>/dev/null || true)
  log "running for $(since "$t1"): ${done_specs:-0} specs done, ${failed_specs:-0} failed"
done
wait "$ginkgo_pid"
ginkgo_rc=$?
set -e
t_run=$(since "$t1")
log "e2e.test finished in $t_run (ginkgo exit code $ginkgo_rc)"

[[ -f $OUT/junit_01.xml ]] || { tail -n 40 "$OUT/e2e.log" >&2; die "no JUnit report was written (see ${OUT#"$ROOT"/}/e2e.log)"; }

write_summary
grep -E '^(FAILED|SUITE|NOT REACHED) ' "$OUT/summary.txt" | sed 's/^/    /' || true
log "results in ${OUT#"$ROOT"/}/ (summary.txt, junit_01.xml, e2e.log)"
echo "$line"
[[ $line == *" passed, 0 failed"* ]] && ((ginkgo_rc == 0)) || exit 1
