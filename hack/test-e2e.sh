#!/usr/bin/env bash
# The end-to-end tests (tests/e2e, one test binary) against the local cluster
# with rustlet as the node agent: brings the cluster up with metrics-server
# (tests/e2e/stats.rs checks `kubectl top`) and the registry mirror
# (tests/e2e/images.rs pulls with Always), imports the in-cluster CSI
# driver's image (tests/e2e/csi_in_cluster.rs), runs every topic's tests
# together (4 at a time), one topic after another, then the topics of
# tests/e2e/serial one test at a time, and takes the cluster down, also when
# it fails or is stopped.
#
#   hack/test-e2e.sh [TOPIC...]     (default: every topic; e.g. pod serial::restart)
#
# Prints one line per topic with its result and duration as it ends, and the
# whole table at the end. Exits non-zero if a test failed or the cluster did
# not come up.
set -euo pipefail
PROG=test-e2e
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export CARGO_TARGET_DIR
cd "$ROOT"

only=("$@")
up=false
rows=()
finish() {
  local rc=$?
  trap - EXIT
  if $up; then
    ((rc == 0)) || tail_log rustlet 60
    "$ROOT/hack/local-down.sh" || rc=1
  fi
  ((${#rows[@]} == 0)) || printf '%s\n' "e2e topics:" "${rows[@]}"
  exit "$rc"
}
trap finish EXIT

# The test binary first: it builds while nothing else needs the cpu.
log "building the e2e test binary (cargo test --test e2e --no-run)"
cargo test --test e2e --no-run

# Every test's full name (topic::…::test), from the binary itself.
mapfile -t names < <(cargo test -q --test e2e -- --ignored --list --format terse 2>/dev/null | sed -n 's/: test$//p')
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
# The serial topics last, each alone.
ordered=()
for t in "${topics[@]}"; do [[ $t == serial::* ]] || ordered+=("$t"); done
for t in "${topics[@]}"; do [[ $t != serial::* ]] || ordered+=("$t"); done

up=true
"$ROOT/hack/local-up.sh" --agent rustlet --metrics-server --registry-mirror
"$ROOT/hack/image.sh" --import --debug --csi

rc=0
for t in "${ordered[@]}"; do
  threads=4
  [[ $t != serial::* ]] || threads=1
  read -ra group <<<"${tests_of[$t]}"
  log "== $t (${#group[@]} tests, $threads at a time)"
  start=$(now_ms)
  if cargo test -q --test e2e -- --ignored --exact --test-threads "$threads" "${group[@]}"; then
    rows+=("$(printf '  PASS %-28s %3d tests %8s' "$t" "${#group[@]}" "$(since "$start")")")
  else
    rc=1
    rows+=("$(printf '  FAIL %-28s %3d tests %8s' "$t" "${#group[@]}" "$(since "$start")")")
  fi
  log "${rows[-1]# }"
done
exit "$rc"
