#!/usr/bin/env bash
# Runs every conformance result set for both node agents in one sitting, with
# the same binaries, images and skip patterns, then writes
# docs/conformance.md.
#
#   hack/conformance-sitting.sh [--fresh | --rustlet-again] [SUITE:AGENT...]
#
# SUITE:AGENT pairs name the runs and their order (default: e2e:kubelet
# e2e:rustlet node:kubelet node:rustlet node-protection:kubelet
# node-protection:rustlet node-resources:kubelet node-resources:rustlet
# node-cpu:kubelet node-cpu:rustlet certificates:kubelet certificates:rustlet
# storage:kubelet storage:rustlet storage-csi:kubelet storage-csi:rustlet
# e2e-slow:kubelet e2e-slow:rustlet);
# each is `hack/conformance.sh --suite SUITE --agent AGENT --resume`. The dra
# result set (the node suite's DRA tests, one at a time, each failing one
# waiting minutes) is no part of the default: it runs when named,
# `hack/conformance-sitting.sh dra:kubelet dra:rustlet`, in the same sitting
# as the others.
#
# --fresh begins a sitting: it deletes the results of the named runs (with
# none named, of every run, dra's too), builds
# every upstream part (hack/build-cluster.sh all, e2e, e2e-node, csi) and records
# the digest of _output/bin (binaries_id in hack/lib.sh) in
# _output/conformance/sitting/info, with `registry mirror: yes`: every run of
# the sitting has the local registry mirror (hack/conformance.sh
# --registry-mirror; a sitting recorded without it runs without it). The first rustlet run of the sitting
# builds a release rustlet from the checked-out source, which must be
# committed (the runs name it by its commit), and pins it there; every later
# rustlet run uses that binary, so work on the source between runs changes
# nothing. --rustlet-again keeps the sitting (its binaries and the kubelet's
# runs) but pins a new rustlet from the checked-out source: the rustlet runs
# named (all of them when none is) are done anew; with none named, dra's
# rustlet run is removed too, and done anew when named. Without --fresh the
# sitting goes on: a run that finished (its summary.txt is there) is kept,
# an interrupted one resumes at its first unfinished shard. If _output/bin
# no longer has the recorded digest, the script stops: the runs would not be
# comparable. docs/conformance.md names each run's date and its binaries.
#
# The sitting is kept in the repository as it goes: docs/conformance/
# holds its record (sitting.info) and what the table reads of each run
# (hack/conformance.sh --keep: each shard's report as soon as it ends). A
# checkout with no sitting under _output/ (another machine, a fresh clone)
# goes on with the kept one: it builds the upstream parts, which must come
# out with the recorded digest (the builds are reproducible: -trimpath, no
# dates), puts the kept runs back under _output/conformance/, and builds the
# sitting's rustlet again from its commit (in a worktree when the checkout's
# source differs). Commit docs/conformance/ to keep what has run.
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
# The runs named, else the default ones: every result set but dra, which
# runs only when named (BY_NAME); --fresh and --rustlet-again with none
# named remove its results too, as the default runs'.
BY_NAME=(dra:kubelet dra:rustlet)
named=${#runs[@]}
((named)) || runs=(e2e:kubelet e2e:rustlet node:kubelet node:rustlet node-protection:kubelet
  node-protection:rustlet node-resources:kubelet node-resources:rustlet node-cpu:kubelet node-cpu:rustlet certificates:kubelet certificates:rustlet storage:kubelet storage:rustlet storage-csi:kubelet storage-csi:rustlet
  e2e-slow:kubelet e2e-slow:rustlet)
for r in "${runs[@]}"; do
  case ${r%%:*} in
    e2e | e2e-slow | node | node-protection | node-resources | node-cpu | certificates | storage | storage-csi | dra) ;;
    *) die "unknown suite in '$r' (e2e|e2e-slow|node|node-protection|node-resources|node-cpu|certificates|storage|storage-csi|dra)" ;;
  esac
  case ${r#*:} in kubelet | rustlet) ;; *) die "unknown agent in '$r' (kubelet|rustlet)" ;; esac
done

SITTING=$ROOT/_output/conformance/sitting
KEPT_INFO=$KEPT_CONFORMANCE/sitting.info
# The source a sitting's rustlet is built from.
RUSTLET_SOURCE=(src Cargo.toml Cargo.lock build.rs proto)
# keep_info: the sitting's record, kept beside its runs.
keep_info() {
  mkdir -p "$KEPT_CONFORMANCE"
  cp "$SITTING/info" "$KEPT_INFO"
}
build_upstream() {
  local target
  for target in all e2e e2e-node csi; do "$ROOT/hack/build-cluster.sh" "$target" || die "hack/build-cluster.sh $target failed"; done
}
if $fresh; then
  cleared=("${runs[@]}")
  ((named)) || cleared+=("${BY_NAME[@]}")
  for r in "${cleared[@]}"; do
    rm -rf "${ROOT:?}/_output/conformance/${r%%:*}/${r#*:}" "${KEPT_CONFORMANCE:?}/${r%%:*}/${r#*:}"
  done
  rm -rf "$SITTING"
  mkdir -p "$SITTING"
  build_upstream
  {
    echo "began: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "binaries: $(binaries_id)"
    echo "registry mirror: yes"
  } >"$SITTING/info"
  keep_info
elif [[ -f $KEPT_INFO && ! -f $SITTING/info ]]; then
  # Go on with the sitting kept in the repository.
  log "going on with the kept sitting of $(sed -n 's/^began: //p' "$KEPT_INFO") (${KEPT_INFO#"$ROOT"/})"
  build_upstream
  mkdir -p "$SITTING"
  cp "$KEPT_INFO" "$SITTING/info"
  for kept in "$KEPT_CONFORMANCE"/*/*/; do
    kept=${kept%/}
    [[ -f $kept/identity ]] || continue
    run=${kept#"$KEPT_CONFORMANCE"/}
    restore_run "$kept" "$ROOT/_output/conformance/$run"
    log "$run: put back from ${kept#"$ROOT"/} ($(find "$kept" -name 'junit_01.xml.gz' | wc -l) shard report(s))"
  done
elif [[ -f $KEPT_INFO && -f $SITTING/info ]] && ! cmp -s "$KEPT_INFO" "$SITTING/info"; then
  die "_output/conformance holds another sitting than ${KEPT_INFO#"$ROOT"/}: remove _output/conformance to go on with the kept one, or begin a new one with --fresh"
fi
[[ -f $SITTING/info ]] || die "no sitting has begun here: start one with --fresh"
if $again; then
  ! $fresh || die "--fresh and --rustlet-again do not go together"
  # The rustlet runs to do anew: the named ones, else every rustlet run
  # (the default ones, and dra's, which runs again when named).
  redo=()
  cleared=("${runs[@]}")
  ((named)) || cleared+=("${BY_NAME[@]}")
  for r in "${cleared[@]}"; do [[ ${r#*:} != rustlet ]] || redo+=("${r%%:*}"); done
  for suite in "${redo[@]}"; do rm -rf "${ROOT:?}/_output/conformance/$suite/rustlet" "${KEPT_CONFORMANCE:?}/$suite/rustlet"; done
  rm -f "$SITTING/rustlet"
  sed -i '/^rustlet: /d; /^rustlet sha256: /d' "$SITTING/info"
  keep_info
  log "a new rustlet for the sitting; rustlet runs to do anew: ${redo[*]}"
fi
pinned=$(sed -n 's/^binaries: //p' "$SITTING/info")
now_id=$(binaries_id)
[[ $now_id == "$pinned" ]] ||
  die "_output/bin changed since the sitting began (binaries $now_id, the sitting's $pinned): begin a new one with --fresh"
log "sitting of $(sed -n 's/^began: //p' "$SITTING/info"): binaries $pinned"
# A sitting begun with the registry mirror runs every run with it; an older
# one, without (its runs stay comparable).
mirror_args=()
grep -q '^registry mirror: yes$' "$SITTING/info" && mirror_args=(--registry-mirror)

# build_rustlet REV: a release rustlet from commit REV into
# $SITTING/rustlet, its sha256 (12 digits) in RUSTLET_SHA: from the checkout
# when its source is REV's, else from a worktree of REV (with a build
# directory of its own).
build_rustlet() {
  local rev=$1 dir=$ROOT target=$CARGO_TARGET_DIR
  if ! git -C "$ROOT" diff --quiet "$rev" -- "${RUSTLET_SOURCE[@]}"; then
    dir=$SITTING/src
    target=$ROOT/_output/conformance/sitting/target
    rm -rf "$dir"
    git -C "$ROOT" worktree prune
    git -C "$ROOT" worktree add --detach "$dir" "$rev" >/dev/null || die "git worktree add $rev failed"
  fi
  log "building the sitting's rustlet from $rev (cargo build --release --bin rustlet in ${dir#"$ROOT"/})"
  # The checkout's and the build directory's paths are left out of the
  # binary (panic locations, generated code), so that a build of the same
  # commit in another checkout or worktree is the same.
  local remap="--remap-path-prefix=$dir=/rustlet --remap-path-prefix=$target=/target"
  (cd "$dir" && CARGO_TARGET_DIR=$target RUSTFLAGS="${RUSTFLAGS:-} $remap" cargo build --release --bin rustlet) >"$SITTING/build.log" 2>&1 ||
    die "cargo build --release --bin rustlet failed (log: ${SITTING#"$ROOT"/}/build.log)"
  cp "$target/release/rustlet" "$SITTING/rustlet.new"
  mv "$SITTING/rustlet.new" "$SITTING/rustlet"
  if [[ $dir != "$ROOT" ]]; then
    git -C "$ROOT" worktree remove --force "$dir" || true
  fi
  RUSTLET_SHA=$(sha256sum "$SITTING/rustlet" | cut -c1-12)
}

# pin_rustlet: the sitting's rustlet, built (release) from the checked-out
# source when its first rustlet run starts, then used by every rustlet run;
# in a checkout that goes on with a kept sitting, built again from the
# commit the sitting names.
pin_rustlet() {
  local rev pinned_sha
  rev=$(sed -n 's/^rustlet: //p' "$SITTING/info")
  if [[ -z $rev ]]; then
    git -C "$ROOT" diff --quiet HEAD -- "${RUSTLET_SOURCE[@]}" &&
      git -C "$ROOT" diff --cached --quiet HEAD -- "${RUSTLET_SOURCE[@]}" ||
      die "the rustlet source (${RUSTLET_SOURCE[*]}) has changes not committed: a sitting's rustlet is named by its commit"
    rev=$(git -C "$ROOT" rev-parse --short=12 HEAD)
    build_rustlet "$rev"
    printf 'rustlet: %s\nrustlet sha256: %s\n' "$rev" "$RUSTLET_SHA" >>"$SITTING/info"
    keep_info
  elif [[ ! -x $SITTING/rustlet ]]; then
    [[ $rev != *modified* ]] ||
      die "the sitting's rustlet ($rev) was built from source not committed and cannot be built again: pin a new one with --rustlet-again"
    build_rustlet "$rev"
    pinned_sha=$(sed -n 's/^rustlet sha256: //p' "$SITTING/info")
    [[ $RUSTLET_SHA == "$pinned_sha" ]] ||
      warn "the rustlet built again from $rev has sha256 $RUSTLET_SHA, not the sitting's $pinned_sha: the table shows each run's"
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
    # A run done before the sitting kept its runs in the repository.
    [[ -f $KEPT_CONFORMANCE/$suite/$agent/summary.txt ]] ||
      keep_run "$ROOT/_output/conformance/$suite/$agent" "$KEPT_CONFORMANCE/$suite/$agent" \
        "$(sed -n 's/^focus: //p' "$ROOT/_output/conformance/$suite/$agent/summary.txt")"
    continue
  fi
  [[ $agent != rustlet ]] || pin_rustlet
  log "$suite with $agent"
  rc=0
  "$ROOT/hack/conformance.sh" --suite "$suite" --agent "$agent" --resume "${mirror_args[@]}" \
    --keep "$KEPT_CONFORMANCE/$suite/$agent" || rc=$?
  # conformance.sh exits 1 for failed tests too; only a missing summary
  # means the run did not complete.
  if [[ ! -f $ROOT/_output/conformance/$suite/$agent/summary.txt ]] || grep -q '^NOT REACHED ' "$ROOT/_output/conformance/$suite/$agent/summary.txt"; then
    warn "$suite with $agent did not complete (exit code $rc)"
    incomplete+=("$r")
  fi
done
log "sitting done in $(since "$t0")"
# The table needs the e2e runs of both agents; until the sitting has them,
# docs/conformance.md stays as it is (the kept runs are its record).
if [[ -f $KEPT_CONFORMANCE/e2e/kubelet/summary.txt && -f $KEPT_CONFORMANCE/e2e/rustlet/summary.txt ]]; then
  python3 "$ROOT/hack/conformance-table.py" table --base "$KEPT_CONFORMANCE" --out "$ROOT/docs/conformance.md"
  log "wrote docs/conformance.md"
else
  log "docs/conformance.md not written: the sitting has not run e2e with both agents yet"
fi
((${#incomplete[@]} == 0)) || die "incomplete: ${incomplete[*]}"
