#!/usr/bin/env bash
# Benchmarks rustlet against the physical limit (bare CRI) and the upstream
# kubelet, in one run, on the same control plane, containerd and image:
#
#   hack/bench.sh [--count N] [--burst N] [--steady N] [--idle S] [--hold S]
#
#   --count   (a) pods one at a time: create -> Running -> deleted (default 20)
#   --burst   (b) pods created at once (default 30)
#   --steady  (c) pods kept running, the node's maxPods (default 110)
#   --idle    (d) seconds of an idle node (default 60)
#   --hold    seconds of sampling once the steady pods run (default 30)
#
# For each subject it brings up the local cluster (bare CRI: no agent; the
# kubelet; rustlet, release build), runs the workloads of bench/pod_start.rs
# and bench/bare_cri.rs, samples the agent's RSS and CPU from /proc, and keeps
# the API server's audit log of the node's requests. Then
# hack/bench-report.py writes to _output/bench/:
#   results.json   every figure, ratios and targets
#   results.md     the table (also printed)
#   latency.png    the latency distributions (matplotlib)
# and the raw records (<subject>-<workload>.json, <agent>-audit.log).
#
# Needs root and no local cluster running; takes about 10 minutes.
set -euo pipefail
PROG=bench
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; }

count=20
burst=30
steady=110
idle=60
hold=30
while (($#)); do
  case $1 in
    --count) count=${2:-}; shift 2 || die "--count needs a value" ;;
    --burst) burst=${2:-}; shift 2 || die "--burst needs a value" ;;
    --steady) steady=${2:-}; shift 2 || die "--steady needs a value" ;;
    --idle) idle=${2:-}; shift 2 || die "--idle needs a value" ;;
    --hold) hold=${2:-}; shift 2 || die "--hold needs a value" ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see hack/bench.sh --help)" ;;
  esac
done
for v in "$count" "$burst" "$steady" "$idle" "$hold"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || die "counts and seconds must be positive numbers, not '$v'"
done

((EUID == 0)) || die "must run as root (the local cluster needs it)"
need_cmd python3 "Debian package python3"
need_cmd cargo "needed to build rustlet and the benchmarks"
for c in "${COMPONENTS[@]}"; do
  if pid=$(running_pid "$c"); then
    die "a local cluster is already running ($c, pid $pid); stop it with hack/local-down.sh first"
  fi
done

OUT=$ROOT/_output/bench
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*-audit.log "$OUT"/results.md "$OUT"/latency.png
export CARGO_TARGET_DIR

# The plotting library, in a virtual environment of its own.
VENV=$OUT/venv
if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  log "installing matplotlib into ${VENV#"$ROOT"/}"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet 'matplotlib>=3.8,<4' || die "pip install matplotlib failed"
fi

log "building rustlet (release) and the benchmarks"
(cd "$ROOT" && cargo build --release --bin rustlet && cargo bench --no-run --bench pod_start --bench bare_cri) \
  >"$OUT/build.log" 2>&1 || die "build failed (log: ${OUT#"$ROOT"/}/build.log)"

up=false
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if $up; then "$ROOT/hack/local-down.sh" >/dev/null 2>&1 || warn "hack/local-down.sh failed"; fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bench() { (cd "$ROOT" && cargo bench --quiet --bench "$@"); }

# cluster_up AGENT: a cluster with a fresh audit log.
cluster_up() {
  rm -f "$LOGS"/audit*.log
  up=true
  RUSTLET_PROFILE=release "$ROOT/hack/local-up.sh" --agent "$1" >"$OUT/local-up-$1.log" 2>&1 ||
    die "hack/local-up.sh --agent $1 failed (log: ${OUT#"$ROOT"/}/local-up-$1.log)"
  # Pods left in the cluster's state by earlier runs would run beside the
  # workload and count against maxPods.
  if [[ $1 != none ]]; then
    kubectl_admin delete pods --all --all-namespaces --grace-period=0 --force --wait=false --timeout=30s \
      >/dev/null 2>&1 || warn "could not delete leftover pods"
  fi
}
cluster_down() {
  "$ROOT/hack/local-down.sh" >/dev/null
  up=false
}

t0=$(now_ms)
log "bare CRI: $count pods one at a time, a burst of $burst"
cluster_up none
bench bare_cri -- --mode single --count "$count" --json "$OUT/bare-single.json"
bench bare_cri -- --mode burst --count "$burst" --json "$OUT/bare-burst.json"
cluster_down

for agent in kubelet rustlet; do
  log "$agent: idle ${idle}s, $count pods one at a time, a burst of $burst, $steady pods steady"
  cluster_up "$agent"
  pid=$(running_pid "$agent") || die "$agent is not running"
  # Let the agent's start-up work (registration, first status, removing the
  # containers of leftover pods) settle.
  sleep 15
  bench pod_start -- --mode idle --seconds "$idle" --pid "$pid" --json "$OUT/$agent-idle.json"
  bench pod_start -- --mode single --count "$count" --pid "$pid" --json "$OUT/$agent-single.json"
  bench pod_start -- --mode burst --count "$burst" --pid "$pid" --json "$OUT/$agent-burst.json"
  bench pod_start -- --mode steady --count "$steady" --seconds "$hold" --pid "$pid" --json "$OUT/$agent-steady.json"
  cp "$LOGS/audit.log" "$OUT/$agent-audit.log"
  cluster_down
done

log "benchmarks done in $(since "$t0")"
"$VENV/bin/python" "$ROOT/hack/bench-report.py" "$OUT"
