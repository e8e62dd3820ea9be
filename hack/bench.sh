#!/usr/bin/env bash
# Benchmarks rustlet against the physical limit (bare CRI) and the upstream
# kubelet, on the same control plane, containerd and image, in interleaved
# rounds:
#
#   hack/bench.sh [--rounds N] [--count N] [--burst N] [--steady N] [--idle S]
#                 [--hold S] [--publish]
#   hack/bench.sh --quick
#   hack/bench.sh --publish-only
#
#   --quick   the before/after figure of one change, in a few minutes: one
#             round, 10 pods one at a time, a burst of 30, 20 s idle, no
#             steady pods; writes to _output/bench-quick/ and prints the four
#             headline figures (create -> Running p50, the burst's wall time,
#             idle RSS, API writes per pod) of each subject and their ratios
#             within the run; never published
#
#   --rounds  rounds, each running the three subjects once (default 5, at least 1)
#   --count   (a) pods one at a time: create -> Running -> deleted (default 20)
#   --burst   (b) pods created at once (default 30)
#   --steady  (c) pods kept running, the node's maxPods (default 110)
#   --idle    (d) seconds of an idle node (default 60)
#   --hold    seconds of sampling once the steady pods run (default 30)
#   --publish       publish the run once it is done (below)
#   --publish-only  publish the run already in _output/bench; run nothing
#
# In each round every subject gets a cluster of its own (hack/local-up.sh):
# bare CRI (--agent none: bench/bare_cri.rs, workloads a and b), the kubelet
# and rustlet (release build; bench/pod_start.rs, workloads a to d, the
# agent's RSS and CPU sampled from /proc, the API server's audit log of the
# node's requests kept). The order rotates from round to round, so that no
# subject always runs first (in a multiple of 3 rounds each subject runs
# first, second and third equally often):
#   round 1: bare CRI, kubelet, rustlet
#   round 2: kubelet, rustlet, bare CRI
#   round 3: rustlet, bare CRI, kubelet   (round 4 as round 1, and so on)
#
# Writes to _output/bench/ (the last run's files removed first; the plotting
# library's venv is kept):
#   run.json                 measured commit (git rev-parse HEAD) and
#                            uncommitted changes, start time (UTC), rounds,
#                            parameters, host, kubelet and containerd versions
#   round-<k>/round.json     the round's order, start, end, each subject's seconds
#   round-<k>/<subject>-<workload>.json  the raw records (bare-single.json,
#                            kubelet-idle.json, rustlet-steady.json, ...)
#   round-<k>/<agent>-audit.log  the API server's audit logs
#   round-<k>/local-up-<agent>.log  the clusters' start-up logs (agent none: bare CRI)
#   round-<k>/rustlet-resident-code.{txt,json}  rustlet's code in memory after
#                            the idle phase, by crate (hack/resident-code.py;
#                            --quick prints it)
#   round-<k>/rustlet.log    rustlet's log, with its startup trace
#                            (RUST_LOG=info,rustlet::startup=debug)
#   round-<k>/rustlet-startup.{txt,json}  where each workload's pod starts
#                            spent their time, stage by stage, from the
#                            create (hack/startup-trace.py; --quick prints it)
# then hack/bench-report.py (see there how figures are summarised):
#   results.json   every figure per round and its median, min and max over
#                  the rounds, ratios, targets, API request counts, run.json
#   results.md     the table (also printed)
#   latency.png    the latency distributions of every round (matplotlib)
#
# Publishing copies run.json, results.json, results.md, latency.png and every
# round's round.json and records (not the audit logs: megabytes a round;
# results.json keeps the request counts taken from them) to a new directory
# docs/bench/<UTC date>-<short commit>/ (a suffix -2, -3, ... if that name is
# taken; nothing is overwritten), and rewrites the generated part of
# docs/performance.md from it. Only a run whose rounds all completed is
# published. Commit the new directory and docs/performance.md by hand.
# --publish-only needs neither root nor a cluster.
#
# Needs root and no local cluster running; a round takes about 10 minutes.
set -euo pipefail
PROG=bench
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; }

rounds=5
count=20
burst=30
steady=110
idle=60
hold=30
publish=false
publish_only=false
quick=false
run_options=()
while (($#)); do
  case $1 in
    --rounds) rounds=${2:-}; run_options+=("$1"); shift 2 || die "--rounds needs a value" ;;
    --count) count=${2:-}; run_options+=("$1"); shift 2 || die "--count needs a value" ;;
    --burst) burst=${2:-}; run_options+=("$1"); shift 2 || die "--burst needs a value" ;;
    --steady) steady=${2:-}; run_options+=("$1"); shift 2 || die "--steady needs a value" ;;
    --idle) idle=${2:-}; run_options+=("$1"); shift 2 || die "--idle needs a value" ;;
    --hold) hold=${2:-}; run_options+=("$1"); shift 2 || die "--hold needs a value" ;;
    --publish) publish=true; shift ;;
    --quick) quick=true; shift ;;
    --publish-only) publish_only=true; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see hack/bench.sh --help)" ;;
  esac
done
for v in "$rounds" "$count" "$burst" "$steady" "$idle" "$hold"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || die "rounds, counts and seconds must be positive numbers, not '$v'"
done
OUT=$ROOT/_output/bench
if $quick; then
  ((${#run_options[@]} == 0)) && ! $publish && ! $publish_only || die "--quick takes no other option"
  rounds=1 count=10 burst=30 steady=0 idle=20 hold=0
  OUT=$ROOT/_output/bench-quick
fi

VENV=$OUT/venv
# The plotting library, in a virtual environment of its own.
ensure_venv() {
  if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
    log "installing matplotlib into ${VENV#"$ROOT"/}"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet 'matplotlib>=3.8,<4' || die "pip install matplotlib failed"
  fi
}
report() {
  if $quick; then python3 "$ROOT/hack/bench-report.py" --quick "$OUT"; else "$VENV/bin/python" "$ROOT/hack/bench-report.py" "$@" "$OUT"; fi
}
# The generated part of docs/performance.md that publishing rewrites.
MARKER='<!-- BEGIN generated by hack/bench.sh --publish'

need_cmd python3 "Debian package python3"
if $publish_only; then
  if ((${#run_options[@]})) || $publish; then
    die "--publish-only publishes the last run and takes no other option"
  fi
  [[ -f $OUT/run.json ]] || die "no run to publish in ${OUT#"$ROOT"/}"
  ensure_venv
  report --publish
  exit 0
fi

((EUID == 0)) || die "must run as root (the local cluster needs it)"
need_cmd cargo "needed to build rustlet and the benchmarks"
need_cmd git "the measured commit is recorded"
for c in "${COMPONENTS[@]}"; do
  if pid=$(running_pid "$c"); then
    die "a local cluster is already running ($c, pid $pid); stop it with hack/local-down.sh first"
  fi
done
if $publish; then
  grep -qF -- "$MARKER" "$ROOT/docs/performance.md" ||
    die "docs/performance.md has no generated part to rewrite (a line starting '$MARKER')"
fi

mkdir -p "$OUT"
rm -rf "$OUT"/round-*
rm -f "$OUT"/*.json "$OUT"/*.log "$OUT"/results.md "$OUT"/latency.png
export CARGO_TARGET_DIR
# The quick table has no plot.
$quick || ensure_venv

# mod_version BINARY: the version of the Go module BINARY was built from.
mod_version() {
  command -v go >/dev/null 2>&1 || { echo unknown; return; }
  go version -m "$1" 2>/dev/null | awk '$1 == "mod" { print $3; found = 1 } END { if (!found) print "unknown" }'
}

# What was measured, and where: the build below is of this commit plus the
# uncommitted changes listed.
log "recording the commit, parameters and host in ${OUT#"$ROOT"/}/run.json"
RUN_STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ) \
  COMMIT=$(git -C "$ROOT" rev-parse HEAD) \
  COMMIT_SHORT=$(git -C "$ROOT" rev-parse --short HEAD) \
  UNCOMMITTED=$(git -C "$ROOT" status --porcelain --untracked-files=no) \
  ROUNDS=$rounds COUNT=$count BURST=$burst STEADY=$steady IDLE=$idle HOLD=$hold \
  CPUS=$(nproc) \
  CPU_MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo) \
  MEM_KIB=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) \
  KERNEL=$(uname -r) \
  CGROUP=$([[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] && echo v2 || echo v1) \
  KUBELET_VERSION=$(mod_version "$BIN/kubelet") \
  CONTAINERD_VERSION=$(mod_version "$BIN/containerd") \
  RUSTC_VERSION=$(rustc --version 2>/dev/null || echo unknown) \
  python3 - "$OUT/run.json" <<'EOF'
import json, os, sys

e = os.environ
run = {
    "commit": e["COMMIT"],
    "commit_short": e["COMMIT_SHORT"],
    "uncommitted": e["UNCOMMITTED"].splitlines(),
    "started": e["RUN_STARTED"],
    "rounds": int(e["ROUNDS"]),
    "parameters": {"count": int(e["COUNT"]), "burst": int(e["BURST"]), "steady": int(e["STEADY"]),
                   "idle_s": int(e["IDLE"]), "hold_s": int(e["HOLD"])},
    "rustlet_profile": "release",
    "host": {"cpus": int(e["CPUS"]), "cpu_model": e["CPU_MODEL"],
             "memory_mib": int(e["MEM_KIB"]) // 1024, "kernel": e["KERNEL"], "cgroup": e["CGROUP"]},
    "versions": {"kubelet": e["KUBELET_VERSION"], "containerd": e["CONTAINERD_VERSION"],
                 "rustc": e["RUSTC_VERSION"]},
}
with open(sys.argv[1], "w") as f:
    f.write(json.dumps(run, indent=2) + "\n")
EOF

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

# cluster_up AGENT DIR: a cluster with a fresh audit log; its start-up log in DIR.
cluster_up() {
  rm -f "$LOGS"/audit*.log
  up=true
  # rustlet logs its startup trace (src/startup_trace.rs) for
  # hack/startup-trace.py.
  RUST_LOG=info,rustlet::startup=debug RUSTLET_PROFILE=release "$ROOT/hack/local-up.sh" --agent "$1" >"$2/local-up-$1.log" 2>&1 ||
    die "hack/local-up.sh --agent $1 failed (log: ${2#"$ROOT"/}/local-up-$1.log)"
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

# run_bare DIR: the bare CRI workloads, records in DIR.
run_bare() {
  cluster_up none "$1"
  bench bare_cri -- --mode single --count "$count" --json "$1/bare-single.json"
  bench bare_cri -- --mode burst --count "$burst" --json "$1/bare-burst.json"
  cluster_down
}

# run_agent AGENT DIR: the workloads through AGENT, records and audit log in DIR.
run_agent() {
  local agent=$1 dir=$2 pid
  cluster_up "$agent" "$dir"
  pid=$(running_pid "$agent") || die "$agent is not running"
  # Let the agent's start-up work (registration, first status, removing the
  # containers of leftover pods) settle.
  sleep 15
  bench pod_start -- --mode idle --seconds "$idle" --pid "$pid" --json "$dir/$agent-idle.json"
  if [[ $agent == rustlet ]]; then
    # Whose code the idle agent keeps in memory, by crate and module.
    python3 "$ROOT/hack/resident-code.py" "$pid" --top 40 --json "$dir/rustlet-resident-code.json" \
      >"$dir/rustlet-resident-code.txt" || log "hack/resident-code.py failed: no resident code table this round"
  fi
  bench pod_start -- --mode single --count "$count" --pid "$pid" --json "$dir/$agent-single.json"
  bench pod_start -- --mode burst --count "$burst" --pid "$pid" --json "$dir/$agent-burst.json"
  if ((steady > 0)); then
    bench pod_start -- --mode steady --count "$steady" --seconds "$hold" --pid "$pid" --json "$dir/$agent-steady.json"
  fi
  cp "$LOGS/audit.log" "$dir/$agent-audit.log"
  if [[ $agent == rustlet ]]; then
    # Where each pod start's time went, by stage.
    cp "$LOGS/rustlet.log" "$dir/rustlet.log"
    local records=("$dir/rustlet-single.json" "$dir/rustlet-burst.json")
    ((steady == 0)) || records+=("$dir/rustlet-steady.json")
    python3 "$ROOT/hack/startup-trace.py" "$dir/rustlet.log" "${records[@]}" --json "$dir/rustlet-startup.json" \
      >"$dir/rustlet-startup.txt" || log "hack/startup-trace.py failed: no startup table this round"
  fi
  cluster_down
}

# join SEP WORD...: the words with SEP between them.
join() {
  local sep=$1 out=$2
  shift 2
  for w; do out+=$sep$w; done
  printf '%s' "$out"
}

# duration S: S seconds as "9 min 41 s" or "41 s".
duration() {
  if (($1 >= 60)); then printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); else printf '%d s' "$1"; fi
}
# span T0: the time since T0 (now_ms), as duration prints it.
span() { duration $((($(now_ms) - $1 + 500) / 1000)); }

steady_text=''
((steady == 0)) || steady_text=", $steady pods steady"
SUBJECTS=(bare kubelet rustlet)
declare -A NAME=([bare]="bare CRI" [kubelet]=kubelet [rustlet]=rustlet)
declare -A WORK=(
  [bare]="$count pods one at a time, a burst of $burst"
  [kubelet]="idle ${idle}s, $count pods one at a time, a burst of $burst${steady_text:-}"
  [rustlet]="idle ${idle}s, $count pods one at a time, a burst of $burst${steady_text:-}"
)

t_run=$(now_ms)
for ((k = 1; k <= rounds; k++)); do
  dir=$OUT/round-$k
  mkdir -p "$dir"
  # Round k starts with subject k-1 (mod 3) and goes on in the same cycle.
  order=()
  for ((i = 0; i < ${#SUBJECTS[@]}; i++)); do
    order+=("${SUBJECTS[(k - 1 + i) % ${#SUBJECTS[@]}]}")
  done
  names=()
  for s in "${order[@]}"; do names+=("${NAME[$s]}"); done
  log "round $k/$rounds: $(join ", " "${names[@]}")"
  t_round=$(now_ms)
  round_started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  seconds=()
  for s in "${order[@]}"; do
    t=$(now_ms)
    log "round $k/$rounds: ${NAME[$s]}: ${WORK[$s]}"
    if [[ $s == bare ]]; then run_bare "$dir"; else run_agent "$s" "$dir"; fi
    seconds+=("\"$s\": $((($(now_ms) - t + 500) / 1000))")
    log "round $k/$rounds: ${NAME[$s]} done in $(span "$t")"
  done
  # The record that the round is complete: hack/bench-report.py uses only
  # rounds that have one.
  {
    printf '{\n  "round": %d,\n' "$k"
    printf '  "order": ["%s"],\n' "$(join '", "' "${order[@]}")"
    printf '  "started": "%s",\n  "finished": "%s",\n' "$round_started" "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf '  "seconds": {%s}\n}\n' "$(join ", " "${seconds[@]}")"
  } >"$dir/round.json"
  elapsed_ms=$(($(now_ms) - t_run))
  left=""
  if ((k < rounds)); then
    left="; about $(duration $((elapsed_ms * (rounds - k) / k / 1000))) to go"
  fi
  log "round $k/$rounds done in $(span "$t_round"); $(span "$t_run") since the first round$left"
done

log "$rounds rounds done in $(span "$t_run")"
if $quick && [[ -f $OUT/round-1/rustlet-startup.txt ]]; then
  log "rustlet's startup trace (hack/startup-trace.py):"
  cat "$OUT/round-1/rustlet-startup.txt"
fi
if $quick && [[ -f $OUT/round-1/rustlet-resident-code.txt ]]; then
  log "rustlet's resident code at idle (hack/resident-code.py):"
  head -n 25 "$OUT/round-1/rustlet-resident-code.txt"
fi
if $publish; then report --publish; else report; fi
