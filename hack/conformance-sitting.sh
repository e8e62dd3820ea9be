#!/usr/bin/env bash
# Runs every conformance result set for both node agents in one sitting, with
# the same binaries, images and skip patterns, then writes
# docs/conformance.md.
#
#   hack/conformance-sitting.sh [--fresh] [SUITE:AGENT...]
#
# SUITE:AGENT pairs name the runs and their order (default: e2e:kubelet
# e2e:rustlet node:kubelet node:rustlet e2e-slow:kubelet e2e-slow:rustlet);
# each is `hack/conformance.sh --suite SUITE --agent AGENT --resume`. A run
# that finished earlier (its summary.txt is there) is kept, so an interrupted
# sitting goes on where it stopped, down to the shard; --fresh deletes all
# results first. docs/conformance.md names each run's date: the sitting is
# the span between the first and the last.
#
# Takes hours (about 30 minutes a run on 2 cores); needs what
# hack/conformance.sh needs. Exits non-zero if a run did not complete; failed
# tests do not stop the sitting.
set -euo pipefail
PROG=conformance-sitting
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; }

fresh=false
runs=()
while (($#)); do
  case $1 in
    --fresh) fresh=true; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option '$1' (see hack/conformance-sitting.sh --help)" ;;
    *:*) runs+=("$1"); shift ;;
    *) die "expected SUITE:AGENT, not '$1'" ;;
  esac
done
((${#runs[@]})) || runs=(e2e:kubelet e2e:rustlet node:kubelet node:rustlet e2e-slow:kubelet e2e-slow:rustlet)
for r in "${runs[@]}"; do
  case ${r%%:*} in e2e | e2e-slow | node) ;; *) die "unknown suite in '$r' (e2e|e2e-slow|node)" ;; esac
  case ${r#*:} in kubelet | rustlet) ;; *) die "unknown agent in '$r' (kubelet|rustlet)" ;; esac
done

if $fresh; then
  for r in "${runs[@]}"; do rm -rf "${ROOT:?}/_output/conformance/${r%%:*}/${r#*:}"; done
fi

t0=$(now_ms)
incomplete=()
for r in "${runs[@]}"; do
  suite=${r%%:*} agent=${r#*:}
  if [[ -f $ROOT/_output/conformance/$suite/$agent/summary.txt ]]; then
    log "$suite with $agent: done earlier ($(grep -m1 '^date: ' "$ROOT/_output/conformance/$suite/$agent/summary.txt")), kept"
    continue
  fi
  log "$suite with $agent"
  rc=0
  "$ROOT/hack/conformance.sh" --suite "$suite" --agent "$agent" --resume || rc=$?
  # conformance.sh exits 1 for failed tests too; only a missing summary
  # means the run did not complete.
  if [[ ! -f $ROOT/_output/conformance/$suite/$agent/summary.txt ]] || grep -q '^NOT REACHED ' "$ROOT/_output/conformance/$suite/$agent/summary.txt"; then
    warn "$suite with $agent did not complete (exit code $rc)"
    incomplete+=("$r")
  fi
done
log "sitting done in $(since "$t0")"
python3 "$ROOT/hack/conformance-table.py" table --out "$ROOT/docs/conformance.md"
log "wrote docs/conformance.md"
((${#incomplete[@]} == 0)) || die "incomplete: ${incomplete[*]}"
