#!/usr/bin/env bash
# The end-to-end tests (tests/e2e, one test binary) against the local cluster
# with rustlet as the node agent: brings the cluster up with metrics-server
# (tests/e2e/stats.rs checks `kubectl top`) and the registry mirror
# (tests/e2e/images.rs pulls with Always), imports the in-cluster CSI
# driver's image (tests/e2e/serial/csi_in_cluster.rs), runs the topics side by side
# (E2E_JOBS topics at a time, default 3, each running E2E_THREADS of its
# tests at a time, default 3; the longest of the last run first), then the
# topics of tests/e2e/serial alone, one test at a time (serial::eviction,
# which measures the host's free memory, last, once the processes named in
# E2E_QUIET_AFTER have ended), and takes the cluster down, also when it
# fails or is stopped.
#
#   hack/test-e2e.sh [TOPIC...]     (default: every topic; e.g. pod serial::restart)
#
# Prints each topic's output and its row (result, tests, duration) as it
# ends, and the whole table at the end. Exits non-zero if a test failed or
# the cluster did not come up. The durations are kept (in
# ~/.cache/rustlet/e2e-topics) to order the next run.
set -euo pipefail
PROG=test-e2e
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export CARGO_TARGET_DIR
cd "$ROOT"

only=("$@")
up=false
out=''
declare -A topic_of_pid=()
rows=()
failures=()
finish() {
  local rc=$?
  trap - EXIT
  local pid t
  # Topics still running (a time limit, an interrupt): what they printed so
  # far, then their process groups go.
  for pid in "${!topic_of_pid[@]}"; do
    t=${topic_of_pid[$pid]}
    log "== $t: stopped before it ended; its output so far:"
    tail -n 200 "$out/${t//:/_}.log" 2>/dev/null || true
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  done
  [[ -z $out ]] || rm -rf "$out"
  if $up; then
    ((rc == 0)) || tail_log rustlet 60
    "$ROOT/hack/local-down.sh" || rc=1
  fi
  ((${#rows[@]} == 0)) || printf '%s\n' "e2e topics:" "${rows[@]}"
  ((${#failures[@]} == 0)) || printf '%s\n' "failed tests:" "${failures[@]}"
  exit "$rc"
}
trap finish EXIT

# The test binary first: it builds while nothing else needs the cpu. The
# topics run it directly, several at once (cargo would serialise them on
# its build directory's lock), from the package root as cargo test does.
log "building the e2e test binary (cargo test --test e2e --no-run)"
e2e=$(cargo test --test e2e --no-run --message-format=json-render-diagnostics |
  jq -r 'select(.reason == "compiler-artifact" and .target.name == "e2e" and .executable != null) | .executable' | tail -1)
[[ -x $e2e ]] || die "cargo built no e2e test binary"
# The tests find the repository here, as under cargo test (set only now:
# the build above runs without it, as hack/lib.sh explains).
export CARGO_MANIFEST_DIR=$ROOT

# Every test's full name (topic::…::test), from the binary itself.
mapfile -t names < <("$e2e" --ignored --list --format terse 2>/dev/null | sed -n 's/: test$//p')
((${#names[@]} > 0)) || die "the e2e test binary lists no test"

# topic_of NAME: the first module of a test's name, or the first two under serial.
topic_of() {
  local n=$1
  if [[ $n == serial::* ]]; then
    n=${n#serial::}
    echo "serial::${n%%::*}"
  else
    echo "${n%%::*}"
  fi
}
declare -A tests_of=()
topics=()
for n in "${names[@]}"; do
  t=$(topic_of "$n")
  if ((${#only[@]})) && [[ " ${only[*]} " != *" $t "* ]]; then continue; fi
  [[ -n ${tests_of[$t]:-} ]] || topics+=("$t")
  tests_of[$t]+="$n "
done
((${#topics[@]} > 0)) || die "no e2e topic matches: ${only[*]}"
# The topics that run side by side, longest (in the last run) first, so
# that a long one does not start last; then the serial ones, each alone.
times_file=${RUSTLET_CACHE:-${HOME:-/root}/.cache/rustlet}/e2e-topics
declare -A took=()
if [[ -f $times_file ]]; then
  while read -r t secs; do took[$t]=$secs; done <"$times_file"
fi
mapfile -t parallel < <(for t in "${topics[@]}"; do
  [[ $t == serial::* ]] || printf '%s %s\n' "${took[$t]:-9999}" "$t"
done | sort -k1,1nr -k2 | cut -d' ' -f2)
# The serial topics that measure the host's free memory (serial::eviction
# sets its threshold from it) run last, and not before the processes whose
# IDs E2E_QUIET_AFTER names (the caller's background builds) have ended.
quiet=(serial::eviction)
serial=()
for t in "${topics[@]}"; do
  [[ $t == serial::* && " ${quiet[*]} " != *" $t "* ]] && serial+=("$t")
done
for t in "${quiet[@]}"; do [[ -z ${tests_of[$t]:-} ]] || serial+=("$t"); done

up=true
"$ROOT/hack/local-up.sh" --agent rustlet --metrics-server --registry-mirror --test-images
"$ROOT/hack/image.sh" --import --debug --csi

jobs=${E2E_JOBS:-3}
threads=${E2E_THREADS:-3}
[[ $jobs =~ ^[1-9][0-9]*$ && $threads =~ ^[1-9][0-9]*$ ]] || die "E2E_JOBS and E2E_THREADS must be positive numbers"
out=$(mktemp -d)
rc=0
# start TOPIC THREADS: runs TOPIC's tests in the background, output to its log.
declare -A started=()
start() {
  local t=$1 n=$2 group
  read -ra group <<<"${tests_of[$t]}"
  log "== $t (${#group[@]} tests, $n at a time)"
  started[$t]=$(now_ms)
  # A process group of its own: stopping the run stops what the tests
  # started too (kubectl, a second agent).
  setsid "$e2e" --ignored --exact --test-threads "$n" "${group[@]}" >"$out/${t//:/_}.log" 2>&1 &
  topic_of_pid[$!]=$t
}
# finish PID STATUS: prints the topic's output and its row.
finish_topic() {
  local t=${topic_of_pid[$1]} status=$2 result=PASS count secs
  last_status=$status
  unset "topic_of_pid[$1]"
  read -ra count <<<"${tests_of[$t]}"
  cat "$out/${t//:/_}.log"
  if ((status != 0)); then
    result=FAIL rc=1
    # Each failed test with the first line of its panic, for the summary.
    mapfile -t -O "${#failures[@]}" failures < <(awk '
      /^thread .* panicked at/ { name = $2; gsub(/\x27/, "", name); getline msg; print "  FAILED " name ": " substr(msg, 1, 200) }
    ' "$out/${t//:/_}.log")
  fi
  secs=$(since "${started[$t]}")
  took[$t]=${secs%s}
  rows+=("$(printf '  %s %-28s %3d tests %8s' "$result" "$t" "${#count[@]}" "$secs")")
  log "${rows[-1]# }"
}
# await_one: waits for any running topic and finishes it.
await_one() {
  local pid='' status=0 p
  wait -n -p pid "${!topic_of_pid[@]}" || status=$?
  if [[ -z $pid ]]; then
    # `wait -n` can miss a job whose end was reported with another's: find
    # one that has ended and collect its status.
    status=0
    for p in "${!topic_of_pid[@]}"; do
      if ! kill -0 "$p" 2>/dev/null; then
        pid=$p
        wait "$p" || status=$?
        break
      fi
    done
    [[ -n $pid ]] || return 0
  fi
  finish_topic "$pid" "$status"
}

# clear_leftovers: deletes the namespaces failed tests left (a test drops
# its namespace only when it passes), and waits until they are gone: their
# pods would count in the node-wide figures the serial tests check (pods
# admitted at a restart, CPUs held, memory used).
clear_leftovers() {
  local left
  mapfile -t left < <(kubectl_admin get namespaces -o name | grep '^namespace/e2e-')
  ((${#left[@]})) || return 0
  log "deleting what failed tests left: ${left[*]#namespace/}"
  kubectl_admin delete --wait=true --timeout=180s "${left[@]}" >/dev/null ||
    log "the namespaces failed tests left are not gone after 180s"
}

for t in "${parallel[@]}"; do
  while ((${#topic_of_pid[@]} >= jobs)); do await_one; done
  start "$t" "$threads"
done
while ((${#topic_of_pid[@]})); do await_one; done
((rc == 0)) || clear_leftovers
for t in "${serial[@]}"; do
  if [[ " ${quiet[*]} " == *" $t "* ]]; then
    for pid in ${E2E_QUIET_AFTER:-}; do
      if kill -0 "$pid" 2>/dev/null; then
        log "$t: waiting for process $pid to end (a build beside the tests)"
        while kill -0 "$pid" 2>/dev/null; do sleep 2; done
      fi
    done
  fi
  last_status=0
  start "$t" 1
  await_one
  ((last_status == 0)) || clear_leftovers
done

mkdir -p "$(dirname "$times_file")"
for t in "${!took[@]}"; do printf '%s %s\n' "$t" "${took[$t]}"; done | sort >"$times_file"
exit "$rc"
