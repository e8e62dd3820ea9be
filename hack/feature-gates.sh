#!/usr/bin/env bash
# The kubelet's feature gates as src/feature_gates.tsv holds them: built
# from the k8s.io/kubernetes module of tests/cluster (tests/cluster/cmd/
# kubelet-gates lists what the kubelet binary registers, at its version).
#
#   hack/feature-gates.sh           rewrites src/feature_gates.tsv
#   hack/feature-gates.sh --check   exits non-zero, with the difference,
#                                   when the table is not the module's
set -euo pipefail
PROG=feature-gates
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

check=false
case ${1:-} in
  --check) check=true ;;
  '') ;;
  *) die "unknown argument '$1' (usage: hack/feature-gates.sh [--check])" ;;
esac
table=src/feature_gates.tsv
mkdir -p "$BIN"
(cd tests/cluster && go build -trimpath -o "$BIN/kubelet-gates" ./cmd/kubelet-gates)
new=$(mktemp "${TMPDIR:-/tmp}/rustlet-gates.XXXXXX")
trap 'rm -f "$new"' EXIT
"$BIN/kubelet-gates" >"$new"
if $check; then
  if ! diff -u "$table" "$new"; then
    die "$table is not the gates of k8s.io/kubernetes $(grep -m1 'k8s.io/kubernetes v' tests/cluster/go.mod | awk '{print $NF}'): run hack/feature-gates.sh"
  fi
  log "$table: $(grep -vc '^#' "$table") gates, as the module's"
else
  cp "$new" "$table"
  log "wrote $table: $(grep -vc '^#' "$table") gates"
fi
