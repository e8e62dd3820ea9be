#!/usr/bin/env bash
# Runs every conformance result set for both node agents in one sitting, with
# the same binaries, images and skip patterns, then writes
# docs/conformance.md.
#
#   hack/conformance-sitting.sh [--fresh | --rustlet-again] [SUITE:AGENT...]
#
# SUITE:AGENT pairs name the runs and their order (default: e2e:kubelet
# e2e:rustlet node:kubelet node:rustlet node-protection:kubelet
# node-protection:rustlet storage:kubelet storage:rustlet e2e-slow:kubelet
# e2e-slow:rustlet);
# each is `hack/conformance.sh --suite SUITE --agent AGENT --resume`.
#
# --fresh begins a sitting: it deletes the results of the named runs, builds
# every upstream part (hack/build-cluster.sh all, e2e, e2e-node) and records
# the digest of _output/bin (binaries_id in hack/lib.sh) in
# _output/conformance/sitting/info. The first rustlet run of the sitting
# builds a release rustlet from the checked-out source and pins it there;
# every later rustlet run uses that binary, so work on the source between
# runs changes nothing. --rustlet-again keeps the sitting (its binaries and
# the kubelet's runs) but pins a new rustlet from the checked-out source:
# the rustlet runs named (all of them when none is) are done anew. Without --fresh the sitting goes on: a run that
# finished (its summary.txt is there) is kept, an interrupted one resumes at
# its first unfinished shard. If _output/bin no longer has the recorded
# digest, the script stops: the runs would not be comparable.
# docs/conformance.md names each run's date and its binaries.
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
again=false
runs=()
while (($#)); do
  case $1 in
    --fresh) fresh=true; shift ;;
    --rustlet-again) again=true; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option '$1' (see hack/conformance-sitting.sh --help)" ;;
    *:*) runs+=("$1"); shift ;;
    *) die "expected SUITE:AGENT, not '$1'" ;;
  esac
done
((${#runs[@]})) || runs=(e2e:kubelet e2e:rustlet node:kubelet node:rustlet node-protection:kubelet
  node-protection:rustlet storage:kubelet storage:rustlet e2e-slow:kubelet e2e-slow:rustlet)
for r in "${runs[@]}"; do
  case ${r%%:*} in
    e2e | e2e-slow | node | node-protection | storage) ;;
    *) die "unknown suite in '$r' (e2e|e2e-slow|node|node-protection|storage)" ;;
  esac
  case ${r#*:} in kubelet | rustlet) ;; *) die "unknown agent in '$r' (kubelet|rustlet)" ;; esac
done

SITTING=$ROOT/_output/conformance/sitting
if $fresh; then
  for r in "${runs[@]}"; do rm -rf "${ROOT:?}/_output/conformance/${r%%:*}/${r#*:}"; done
  rm -rf "$SITTING"
  mkdir -p "$SITTING"
  for target in all e2e e2e-node; do "$ROOT/hack/build-cluster.sh" "$target"; done
  {
    echo "began: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "binaries: $(binaries_id)"
  } >"$SITTING/info"
fi
[[ -f $SITTING/info ]] || die "no sitting has begun here: start one with --fresh"
if $again; then
  ! $fresh || die "--fresh and --rustlet-again do not go together"
  # The rustlet runs to do anew: the named ones, else every rustlet run.
  redo=()
  for r in "${runs[@]}"; do [[ ${r#*:} != rustlet ]] || redo+=("${r%%:*}"); done
  ((${#runs[@]})) || redo=(e2e node node-protection storage e2e-slow)
  for suite in "${redo[@]}"; do rm -rf "${ROOT:?}/_output/conformance/$suite/rustlet"; done
  rm -f "$SITTING/rustlet"
  sed -i '/^rustlet: /d' "$SITTING/info"
  log "a new rustlet for the sitting; rustlet runs to do anew: ${redo[*]}"
fi
pinned=$(sed -n 's/^binaries: //p' "$SITTING/info")
now_id=$(binaries_id)
[[ $now_id == "$pinned" ]] ||
  die "_output/bin changed since the sitting began (binaries $now_id, the sitting's $pinned): begin a new one with --fresh"
log "sitting of $(sed -n 's/^began: //p' "$SITTING/info"): binaries $pinned"

# pin_rustlet: the sitting's rustlet, built (release) from the checked-out
# source when its first rustlet run starts, then used by every rustlet run.
pin_rustlet() {
  if [[ ! -x $SITTING/rustlet ]]; then
    log "building the sitting's rustlet (cargo build --release --bin rustlet)"
    (cd "$ROOT" && CARGO_TARGET_DIR=$CARGO_TARGET_DIR cargo build --release --bin rustlet) >"$SITTING/build.log" 2>&1 ||
      die "cargo build --release --bin rustlet failed (log: ${SITTING#"$ROOT"/}/build.log)"
    local rev
    rev=$(git -C "$ROOT" rev-parse --short HEAD)
    git -C "$ROOT" diff --quiet HEAD -- src Cargo.toml Cargo.lock || rev+=" (modified)"
    cp "$CARGO_TARGET_DIR/release/rustlet" "$SITTING/rustlet.new"
    mv "$SITTING/rustlet.new" "$SITTING/rustlet"
    echo "rustlet: $rev" >>"$SITTING/info"
  fi
  export RUSTLET_BIN=$SITTING/rustlet
  RUSTLET_REV=$(sed -n 's/^rustlet: //p' "$SITTING/info")
  export RUSTLET_REV
  log "rustlet of the sitting: $RUSTLET_REV"
}

t0=$(now_ms)
incomplete=()
for r in "${runs[@]}"; do
  suite=${r%%:*} agent=${r#*:}
  # Done means a summary without tests left unreached (an interrupted run
  # writes one too, and resumes).
  if [[ -f $ROOT/_output/conformance/$suite/$agent/summary.txt ]] &&
    ! grep -q '^NOT REACHED ' "$ROOT/_output/conformance/$suite/$agent/summary.txt"; then
    log "$suite with $agent: done earlier ($(grep -m1 '^date: ' "$ROOT/_output/conformance/$suite/$agent/summary.txt")), kept"
    continue
  fi
  [[ $agent != rustlet ]] || pin_rustlet
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
