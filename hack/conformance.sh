#!/usr/bin/env bash
# Runs upstream [NodeConformance] tests against a fresh local one-node cluster
# (hack/local-up.sh), then takes the cluster down.
#
#   hack/conformance.sh [--suite e2e|e2e-slow|node|node-protection|node-resources|node-cpu|certificates|storage|storage-csi|dra]
#                       [--agent rustlet|kubelet]
#                       [--focus REGEX] [--skip REGEX] [--shards N] [--resume]
#                       [--procs N] [--timeout DURATION] [--name NAME] [--registry-mirror] [--keep-up]
#                       [--keep DIR]
#
#   --suite    which result set (default e2e):
#                e2e       e2e.test (test/e2e), [NodeConformance] but not
#                          [Slow]
#                e2e-slow  e2e.test, the [NodeConformance] tests that are
#                          [Slow] (pod-level in-place resize, back-off caps:
#                          e2e and e2e-slow together are the whole
#                          [NodeConformance] set)
#                node      e2e_node.test (test/e2e_node, the node's own suite,
#                          what the upstream node conformance image runs),
#                          [NodeConformance] but not [Slow], run against the
#                          existing node (see "The node suite" below)
#                node-protection
#                          e2e_node.test, its tests of garbage collection,
#                          eviction and the summary API that fit a sitting
#                          (most are [Serial] [Disruptive] [Slow] and not
#                          [NodeConformance]; they reconfigure and restart
#                          the agent), as the node suite runs
#                node-resources
#                          e2e_node.test, its tests of pod resources a
#                          kubeadm or managed node configures: podPidsLimit
#                          (PodPidsLimit) and huge pages (HugePages, Pod
#                          Level HugePages Resources), all [Serial]; they
#                          reserve huge pages and restart the agent, as the
#                          node suite runs
#                node-cpu  e2e_node.test, its CPU Manager, Memory Manager and
#                          Topology Manager tests and their metrics (all
#                          [Serial]; they restart the agent with the static
#                          policies), not those of pod-level resource
#                          managers (alpha gate PodLevelResourceManagers),
#                          as the node suite runs; the agent's root
#                          directory is /var/lib/kubelet, where the suite
#                          reads and deletes the managers' checkpoints
#                certificates
#                          e2e.test, its [sig-auth] tests of projected pod
#                          certificates (with the suite's own signer) and
#                          ClusterTrustBundle volumes, and the
#                          PodCertificateRequest API, not [Slow] nor off by
#                          default
#                storage   e2e.test, the [sig-storage] tests of volumes a
#                          one-node cluster has without a storage driver:
#                          the in-tree hostPath, hostPathSymlink and local
#                          volume test suites and PersistentVolumes-local
#                          (claims bound to local PersistentVolumes of each
#                          local volume type, subPaths, fsGroup), not [Slow]
#                storage-csi
#                          e2e.test, the upstream storage test suites
#                          (provisioning, volumes, subPath, multiVolume,
#                          ephemeral, fsGroup, ...) against a CSI driver,
#                          as e2e.test runs them for an installed one
#                          (External Storage, --storage.testdriver
#                          hack/csi-testdriver.yaml): the project's hostpath
#                          test driver with the upstream provisioner and
#                          attacher (hack/csi-stack.sh), not [Slow]
#                dra       e2e_node.test, its dynamic resource allocation
#                          tests (test/e2e_node/dra_test.go, [DRA], every
#                          one [Serial]; the one [Disruptive] runs too):
#                          DRA drivers' registration, claims prepared and
#                          unprepared across agent and driver restarts,
#                          ResourceSlices wiped, device health; the suite
#                          runs upstream's test driver in process, as the
#                          node suite runs (see "DRA" below)
#   --agent    the node agent (default rustlet)
#   --focus    run only the suite's tests that also match REGEX
#   --skip     skip the tests matching REGEX instead of the suite's default
#              ('\[Disruptive\]|\[Flaky\]', plus '\[Slow\]' for e2e and node;
#              only '\[Flaky\]' for node-protection and dra; no
#              [NodeConformance] test of e2e.test is Disruptive or Flaky
#              today). [Serial] tests run, after the others, one at a time.
#   --shards N split the selected tests into N shards, run one after the
#              other on the same cluster (default 1; e2e-slow 4, node 3). Each
#              shard's report is kept as soon as it ends, so a run that is
#              interrupted can be resumed.
#   --resume   keep the shards that already have a report from an earlier run
#              with the same suite, agent, focus, skip and shards; run the rest
#   --procs    parallel ginkgo processes (default 6: the tests mostly wait)
#   --timeout  each shard's limit (default 2h; dra 3h: a DRA test that
#              fails waits for minutes, some up to 5)
#   --name     write to _output/conformance/NAME/<agent>/ instead of
#              _output/conformance/<suite>/<agent>/, leaving the full runs'
#              results (which docs/conformance.md is built from) alone: for
#              subsets, e.g. CI's
#   --expect FILE
#              fail unless every regular expression in FILE (one per line, #
#              comments) matches a test that ran: for a fixed list of tests
#              (CI's hack/conformance-ci.txt), so that a test renamed
#              upstream cannot vanish silently
#   --registry-mirror
#              run the cluster with hack/local-up.sh --registry-mirror: the
#              local test images served as registry.k8s.io from a registry on
#              loopback, so that tests pulling them with imagePullPolicy
#              Always pull through CRI (part of the run's identity)
#   --keep-up  leave the cluster running afterwards (for debugging)
#   --keep DIR keep what the table reads of the run in DIR as it comes: its
#              identity and shard lists at the start, each shard's JUnit
#              report in the kept form (the selected tests, gzipped) as soon
#              as the shard ends, summary.txt at the end (keep_run in
#              hack/lib.sh). A sitting keeps its runs so, under
#              docs/conformance/, and restores them with restore_run.
#
# Writes to _output/conformance/<suite>/<agent>/:
#   shard-<k>/junit_01.xml  the JUnit report of shard k (every spec of the
#                  suite; the ones not selected are "skipped")
#   shard-<k>/e2e.log       ginkgo's output
#   shards/        the shards' test lists (with --shards)
#   summary.txt    counts, run time, versions, the failed tests
#   <agent>.log    the node agent's log
# and ends with one line "N passed, M failed, K skipped" over the selected
# tests (K: selected but skipped by --skip or by the test itself). Exits
# non-zero if a test failed or the run did not complete.
# hack/conformance-table.py turns the result sets of both agents into
# docs/conformance.md.
#
# Builds what is missing (the e2e binaries with hack/build-cluster.sh; the
# cluster's own binaries and images as hack/local-up.sh does). Needs root and
# no local cluster running: it starts its own and stops it.
#
# The node suite: e2e_node.test normally starts its own API server and
# kubelet. Here it runs against the existing node, as the upstream framework
# allows (test/e2e_node/e2e_node_suite_test.go, util.go):
#   --start-services=false --stop-services=false
#              use the running control plane and node agent
#   --host, --bearer-token
#              the suite has no --kubeconfig: it reaches the API server with
#              a bearer token (a cluster-admin ServiceAccount made here)
#   --prepull-images=false
#              prepulling would pull from registries; the images are local
#   --container-runtime-endpoint, --image-service-endpoint
#              containerd's socket
# The suite has no flag for the agent's root directory: the few tests that
# use one take /var/lib/kubelet (e.g. the PodResources socket), which the
# local cluster does not use; local-up.sh --node-e2e links
# /var/lib/kubelet/pod-resources to the agent's.
# It reads the agent's KubeletConfiguration from
# /api/v1/nodes/<node>/proxy/configz (rustlet serves its own) and validates
# this machine's kernel and cgroups against the default system spec. Tests
# that stop and restart the agent do it with `sudo systemctl` on a unit named
# kubelet-*: there is no systemd here, so hack/node-e2e-shim/ puts stand-ins
# for sudo and systemctl first on the suite's PATH, with one unit,
# kubelet-e2e.service, that stops the agent and starts it again with
# hack/local-up.sh. Tests that talk to systemd itself (over D-Bus, e.g. to
# stop the container runtime) fail: this machine has none.
#
# DRA: the dra suite's tests start upstream's DRA test driver inside
# e2e_node.test (test/e2e/dra/test-driver) with the kubelet's default paths:
# its registration socket in /var/lib/kubelet/plugins_registry, its DRA
# socket in /var/lib/kubelet/plugins/<driver>/ (the agent dials the path the
# driver registers, wherever it is) and its CDI specs in /var/run/cdi.
# local-up.sh --node-e2e links /var/lib/kubelet/plugins_registry to the
# agent's <root-dir>/plugins_registry and /var/run/cdi to _output/local/cdi,
# the one directory containerd reads CDI specs from.
set -euo pipefail
PROG=conformance
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; }

suite=e2e
agent=rustlet
focus=''
skip=''
skip_given=false
shards=''
resume=false
procs=6
timeout=''
name=''
expect=''
keep_up=false
mirror=false
keep=''
while (($#)); do
  case $1 in
    --suite) suite=${2:-}; shift 2 || die "--suite needs a value" ;;
    --suite=*) suite=${1#*=}; shift ;;
    --agent) agent=${2:-}; shift 2 || die "--agent needs a value" ;;
    --agent=*) agent=${1#*=}; shift ;;
    --focus) focus=${2:-}; shift 2 || die "--focus needs a value" ;;
    --focus=*) focus=${1#*=}; shift ;;
    --skip) skip=${2:-}; skip_given=true; shift 2 || die "--skip needs a value" ;;
    --skip=*) skip=${1#*=}; skip_given=true; shift ;;
    --shards) shards=${2:-}; shift 2 || die "--shards needs a value" ;;
    --shards=*) shards=${1#*=}; shift ;;
    --resume) resume=true; shift ;;
    --procs) procs=${2:-}; shift 2 || die "--procs needs a value" ;;
    --procs=*) procs=${1#*=}; shift ;;
    --timeout) timeout=${2:-}; shift 2 || die "--timeout needs a value" ;;
    --timeout=*) timeout=${1#*=}; shift ;;
    --name) name=${2:-}; shift 2 || die "--name needs a value" ;;
    --name=*) name=${1#*=}; shift ;;
    --expect) expect=${2:-}; shift 2 || die "--expect needs a value" ;;
    --expect=*) expect=${1#*=}; shift ;;
    --keep-up) keep_up=true; shift ;;
    --registry-mirror) mirror=true; shift ;;
    --keep) keep=${2:-}; shift 2 || die "--keep needs a value" ;;
    --keep=*) keep=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see hack/conformance.sh --help)" ;;
  esac
done
case $agent in
  rustlet | kubelet) ;;
  *) die "unknown agent '$agent' (rustlet|kubelet)" ;;
esac
NC='\[NodeConformance\]'
SLOW='\[Slow\]'
default_timeout=2h
case $suite in
  e2e) test_bin=e2e.test; base_focus=$NC; default_skip="$SLOW|\\[Disruptive\\]|\\[Flaky\\]"; default_shards=1 ;;
  e2e-slow) test_bin=e2e.test; base_focus="$NC.*$SLOW|$SLOW.*$NC"; default_skip='\[Disruptive\]|\[Flaky\]'; default_shards=4 ;;
  node) test_bin=e2e_node.test; base_focus=$NC; default_skip="$SLOW|\\[Disruptive\\]|\\[Flaky\\]"; default_shards=3 ;;
  node-protection)
    test_bin=e2e_node.test; default_skip='\[Flaky\]'; default_shards=1
    base_focus='\[sig-node\] (GarbageCollect Garbage|ImageGarbageCollect when|Summary API when querying /stats/summary should report|LocalStorageCapacityIsolationEviction |LocalStorageEviction |PriorityMemoryEvictionOrdering |PriorityPidEvictionOrdering .*baseline)'
    ;;
  node-resources)
    test_bin=e2e_node.test; default_skip='\[Flaky\]'; default_shards=1; default_timeout=1h
    base_focus='\[sig-node\] (PodPidsLimit |HugePages \[Feature:HugePages\]|Pod Level HugePages Resources )'
    ;;
  node-cpu)
    test_bin=e2e_node.test; default_skip='\[Flaky\]|Pod Level Resources'; default_shards=1; default_timeout=1h
    base_focus='\[sig-node\] (CPU Manager|Memory Manager|Topology Manager)'
    # The suite reads and deletes the managers' checkpoints in
    # /var/lib/kubelet, its fixed path: the agent's root directory is that
    # one, and starts without the checkpoints of an earlier run.
    export AGENT_ROOT_DIR=/var/lib/kubelet
    rm -f /var/lib/kubelet/cpu_manager_state /var/lib/kubelet/memory_manager_state
    ;;
  certificates)
    test_bin=e2e.test; default_shards=1
    base_focus='\[sig-auth\] (Projected PodCertificate |\[FeatureGate:ClusterTrustBundle\] |PodCertificateRequest API )'
    default_skip="$SLOW|\\[Disruptive\\]|\\[Flaky\\]|\\[Feature:OffByDefault\\]"
    ;;
  storage)
    test_bin=e2e.test; default_shards=1
    base_focus='\[sig-storage\].*(\[Driver: (local|hostPath|hostPathSymlink)\]|PersistentVolumes-local)'
    default_skip="$SLOW|\\[Disruptive\\]|\\[Flaky\\]|\\[Feature:"
    ;;
  storage-csi)
    test_bin=e2e.test; default_shards=1
    base_focus='External Storage \[Driver: hostpath\.csi\.rustlet\.io\]'
    default_skip="$SLOW|\\[Disruptive\\]|\\[Flaky\\]|\\[Feature:"
    ;;
  dra)
    # Every context is [Serial]; the one [Disruptive] test (ResourceSlices
    # wiped at the agent's start) stops and starts the agent as the node
    # suite's other restarts do, through the systemctl stand-in.
    test_bin=e2e_node.test; base_focus='\[DRA\]'; default_skip='\[Flaky\]'; default_shards=1
    default_timeout=3h
    ;;
  *) die "unknown suite '$suite' (e2e|e2e-slow|node|node-protection|node-resources|node-cpu|certificates|storage|storage-csi|dra)" ;;
esac
# The node suite's way of running (against the existing node, the agent
# restarted through the systemctl stand-in).
node_suite=false
[[ $test_bin != e2e_node.test ]] || node_suite=true
$skip_given || skip=$default_skip
shards=${shards:-$default_shards}
timeout=${timeout:-$default_timeout}
[[ $procs =~ ^[1-9][0-9]*$ ]] || die "--procs must be a positive number, not '$procs'"
[[ $shards =~ ^[1-9][0-9]*$ ]] || die "--shards must be a positive number, not '$shards'"
[[ -z $name || $name =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "--name must be lowercase letters, digits and dashes, not '$name'"
[[ -z $expect || -r $expect ]] || die "--expect: cannot read '$expect'"
if [[ -n $keep ]]; then
  keep=$(realpath -m "$keep")
  [[ $keep == "$KEPT_CONFORMANCE"/* ]] || die "--keep must name a directory under ${KEPT_CONFORMANCE#"$ROOT"/}/, not '$keep'"
fi

((EUID == 0)) || die "must run as root (the local cluster needs it)"
need_cmd python3 "Debian package python3"
need_cmd kubectl "a kubectl client (hack/install-deps.sh builds one)"
build_if_missing e2e e2e.test ginkgo
! $node_suite || build_if_missing e2e-node e2e_node.test

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

# The focus: the suite's and, if given, the caller's REGEX. Ginkgo ORs
# repeated --focus flags, so "both" is written as one expression.
if [[ -n $focus ]]; then
  effective_focus="(?:$base_focus).*(?:$focus)|(?:$focus).*(?:$base_focus)"
else
  effective_focus=$base_focus
fi

OUT=$ROOT/_output/conformance/${name:-$suite}/$agent
mkdir -p "$OUT"
# A run's identity: what selects its tests. --resume only keeps shards of a
# run with the same identity.
identity="suite=$suite focus=$effective_focus skip=$skip shards=$shards"
! $mirror || identity+=" registry-mirror"
if $resume && [[ -f $OUT/identity && $(<"$OUT/identity") == "$identity" ]]; then
  kept=$(find "$OUT" -path "$OUT/shard-*/junit_01.xml" | wc -l)
  log "resuming: keeping $kept finished shard(s) of $shards"
else
  $resume && warn "--resume: no earlier run with the same suite, focus, skip and shards; starting afresh"
  rm -rf "${OUT:?}"/shard-* "$OUT"/shards "$OUT"/summary.txt "$OUT"/identity "$OUT"/"$agent".log "$OUT"/junit_01.xml \
    "$OUT"/e2e.log "$OUT"/e2e-output
  echo "$identity" >"$OUT/identity"
  [[ -z $keep ]] || rm -rf "${keep:?}"
fi
rm -f "$OUT/summary.txt"

# write_summary: summary.txt from the shards' JUnit reports (also for an
# interrupted run: ginkgo writes the report of what ran when interrupted).
write_summary() {
  local reports=()
  mapfile -t reports < <(find "$OUT" -path "$OUT/shard-*/junit_01.xml" | sort)
  ((${#reports[@]})) || return 1
  {
    echo "agent: $agent"
    echo "suite: $test_bin"
    echo "date: $run_date"
    echo "focus: $effective_focus"
    echo "skip: ${skip:-}"
    echo "shards: $shards"
    echo "procs: $procs"
    echo "cluster up: ${t_up:-?}"
    echo "e2e run: ${t_run:-$(since "$t1") (interrupted)}"
    echo "kubernetes: $(grep -m1 'k8s.io/kubernetes v' "$ROOT/tests/cluster/go.mod" | awk '{print $NF}') ($test_bin, control plane, kubelet)"
    echo "ginkgo: $("$BIN/ginkgo" version 2>/dev/null | awk '{print $NF}' || true)"
    echo "binaries: $bin_id"
    if [[ $agent == rustlet ]]; then
      echo "rustlet: $rustlet_rev (sha256 $rustlet_sha)"
    fi
    if [[ $suite == storage-csi ]]; then
      echo "csi driver: csi-hostpath (sha256 $(sha256sum "$CSI_HOSTPATH_BIN" | cut -c1-12))"
    fi
  } >"$OUT/summary.txt"
  local expect_args=()
  [[ -z $expect ]] || expect_args=(--expect "$expect")
  set +e
  python3 "$ROOT/hack/conformance-table.py" summary --focus "$effective_focus" --skip "$skip" \
    "${expect_args[@]}" "${reports[@]}" >>"$OUT/summary.txt"
  summary_rc=$?
  set -e
  line=$(tail -n 1 "$OUT/summary.txt")
}

cluster_started=false
ginkgo_pid=''
summary_rc=1
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  # Interrupted while the tests run: the test processes (ginkgo's children)
  # run their cleanup and report on SIGINT, and ginkgo then writes the
  # reports; whatever is left after a minute is killed. An interrupted
  # shard's report is moved aside: --resume runs that shard again.
  if [[ -n $ginkgo_pid ]] && alive "$ginkgo_pid"; then
    warn "interrupting ginkgo (pid $ginkgo_pid) and its test processes"
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
    if [[ -n ${shard_dir:-} && -f $shard_dir/junit_01.xml ]]; then
      mv "$shard_dir/junit_01.xml" "$shard_dir/junit_01.xml.interrupted" || true
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

# Static pod manifests an interrupted node suite run left behind, and the
# configuration an earlier node suite run wrote for restarts (the shim
# restarts the agent with it when it is there: it must be this run's).
rm -rf "${LOCAL:?}/kubelet/manifests" "${LOCAL:?}/rustlet/manifests"
rm -f "${BIN:?}/kubelet-config"

# The source local-up.sh builds rustlet from, named now (commits may land
# while the tests run).
# A pinned binary (RUSTLET_BIN, see hack/local-up.sh) names its own source
# in RUSTLET_REV.
if [[ -n ${RUSTLET_BIN:-} ]]; then
  rustlet_rev=${RUSTLET_REV:-unknown}
else
  rustlet_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  git -C "$ROOT" diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || rustlet_rev+=" (modified)"
fi

kubectl_path=$(command -v kubectl)
# Flags of e2e.test (test/e2e/framework/test_context.go) for a one-node,
# provider-less cluster: no cloud, no SSH (skeleton), one node, the admin
# kubeconfig.
e2e_args=(
  --provider=skeleton
  --kubeconfig="$ADMIN_KUBECONFIG"
  --num-nodes=1
  --kubectl-path="$kubectl_path"
  --kubelet-root-dir="${AGENT_ROOT_DIR:-$LOCAL/$agent}"
  --container-runtime-endpoint="unix://$CTRD_SOCK"
  --node-os-distro=debian
  --dns-domain=cluster.local
  --system-pods-startup-timeout=1m
  --node-schedulable-timeout=2m
)
# Flags of e2e_node.test against the existing node (see the header); the
# bearer token is added once the cluster is up.
node_args=(
  --start-services=false
  --stop-services=false
  --host=https://127.0.0.1:6443
  --node-name="$NODE_NAME"
  --prepull-images=false
  --kubectl-path="$kubectl_path"
  --container-runtime-endpoint="unix://$CTRD_SOCK"
  --image-service-endpoint="unix://$CTRD_SOCK"
  --dns-domain=cluster.local
)
[[ $suite != storage-csi ]] || e2e_args+=(--storage.testdriver="$ROOT/hack/csi-testdriver.yaml")
test_env=()
if $node_suite; then
  test_args=("${node_args[@]}")
  # The suite stops and restarts the agent with `sudo systemctl`; there is
  # no systemd (nor sudo) here: hack/node-e2e-shim/ stands in for both.
  test_env=(PATH="$ROOT/hack/node-e2e-shim:$PATH" NODE_E2E_AGENT="$agent")
else
  test_args=("${e2e_args[@]}")
fi

# The shards: each one's --focus names its tests exactly.
if ((shards > 1)) && [[ ! -f $OUT/shards/shard-1.focus ]]; then
  mkdir -p "$OUT/shards"
  dry_args=(--ginkgo.dry-run --ginkgo.no-color --ginkgo.focus="$effective_focus" --ginkgo.json-report="$OUT/shards/dry-run.json")
  [[ -z $skip ]] || dry_args+=(--ginkgo.skip="$skip")
  (cd "$OUT/shards" && "$BIN/$test_bin" "${dry_args[@]}" "${test_args[@]}") \
    >"$OUT/shards/dry-run.log" 2>&1 || die "listing the selected tests failed (see ${OUT#"$ROOT"/}/shards/dry-run.log)"
  n=$(python3 "$ROOT/hack/conformance-shards.py" "$OUT/shards/dry-run.json" "$shards" "$OUT/shards")
  log "$n tests selected, in $shards shards"
fi
[[ -z $keep ]] || keep_run "$OUT" "$keep" "$effective_focus" || die "could not keep the run in $keep"

t0=$(now_ms)
# Each run on a fresh etcd: nothing a failed test of an earlier run left
# (namespaces, RuntimeClasses) is there to collide with this one's objects;
# local-up.sh makes its own objects anew on every start.
log "a fresh etcd for this run"
rm -rf "$LOCAL/etcd"
log "bringing up the local cluster with $agent"
# On failure local-up.sh stops what it started itself; only a cluster that
# came up is taken down here.
# The test images are imported before the registry mirror starts, which
# serves what containerd holds.
local_up_args=(--agent "$agent" --test-images)
! $node_suite || local_up_args+=(--node-e2e)
# The storage tests' hostexec pods enter the mount namespace of the pid 1
# they see (hack/local-up.sh --runtime-pid-ns).
[[ $suite != storage ]] || local_up_args+=(--runtime-pid-ns)
! $mirror || local_up_args+=(--registry-mirror)
"$ROOT/hack/local-up.sh" "${local_up_args[@]}"
cluster_started=true
# Every image the tests need, or stop here (local-up.sh only warns).
"$ROOT/hack/images.sh" --all
# The CSI driver the storage-csi tests use (local-down.sh stops it).
[[ $suite != storage-csi ]] || "$ROOT/hack/csi-stack.sh" up --agent "$agent"

if $node_suite; then
  # A cluster-admin ServiceAccount's token for e2e_node.test (it has no
  # --kubeconfig).
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata:
  name: e2e-node
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e-node
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: cluster-admin
subjects:
- kind: ServiceAccount
  name: e2e-node
  namespace: kube-system
EOF
  token=$(kubectl_admin create token e2e-node -n kube-system --duration=12h) || die "could not create a token for e2e_node.test"
  test_args+=(--bearer-token="$token")
fi
t_up=$(since "$t0")
# What ran: the upstream parts, and the rustlet binary local-up.sh started.
bin_id=$(binaries_id)
rustlet_sha=-
if [[ $agent == rustlet ]]; then
  rustlet_sha=$(sha256sum "${RUSTLET_BIN:-$CARGO_TARGET_DIR/${RUSTLET_PROFILE:-debug}/rustlet}" | cut -c1-12)
fi

run_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t1=$(now_ms)
failed_shards=()
for k in $(seq "$shards"); do
  shard_dir=$OUT/shard-$k
  # A report ginkgo wrote when interrupted from outside this script (its
  # own interrupt moves the report aside) is no finished shard either.
  if [[ -f $shard_dir/junit_01.xml ]] &&
    grep -q 'Interrupted by User' "$shard_dir/junit_01.xml"; then
    warn "shard $k of $shards: the earlier run was interrupted; running it again"
    mv "$shard_dir/junit_01.xml" "$shard_dir/junit_01.xml.interrupted"
  fi
  if [[ -f $shard_dir/junit_01.xml ]]; then
    log "shard $k of $shards: done in an earlier run, kept"
    continue
  fi
  rm -rf "$shard_dir"
  mkdir -p "$shard_dir/e2e-output"
  shard_focus=$effective_focus
  [[ $shards == 1 ]] || shard_focus=$(<"$OUT/shards/shard-$k.focus")
  ginkgo_args=(
    --procs="$procs"
    --timeout="$timeout"
    --focus="$shard_focus"
    --no-color
    --silence-skips
  )
  [[ -z $skip ]] || ginkgo_args+=(--skip="$skip")
  report_args=(--report-dir="$shard_dir")
  $node_suite || report_args+=(--e2e-output-dir="$shard_dir/e2e-output")
  log "running $test_bin, shard $k of $shards: focus '$effective_focus', skip '${skip:-none}', $procs processes (log: ${shard_dir#"$ROOT"/}/e2e.log)"
  t_shard=$(now_ms)
  set +e
  (cd "$shard_dir" && env "${test_env[@]}" "$BIN/ginkgo" "${ginkgo_args[@]}" "$BIN/$test_bin" -- \
    "${test_args[@]}" "${report_args[@]}") >"$shard_dir/e2e.log" 2>&1 &
  ginkgo_pid=$!
  # A progress line every minute: how many specs have reported so far.
  while alive "$ginkgo_pid"; do
    for _ in $(seq 60); do
      alive "$ginkgo_pid" || break
      sleep 1
    done
    alive "$ginkgo_pid" || break
    # Ginkgo prints a "•" for every spec that ran (passed or failed).
    done_specs=$(grep -o '•' "$shard_dir/e2e.log" 2>/dev/null | wc -l || true)
    failed_specs=$(grep -c '\[FAILED\] \[' "$shard_dir/e2e.log" 2>/dev/null || true)
    log "shard $k: running for $(since "$t_shard"): ${done_specs:-0} specs done, ${failed_specs:-0} failed"
  done
  wait "$ginkgo_pid"
  ginkgo_rc=$?
  ginkgo_pid=''
  set -e
  ((ginkgo_rc == 0)) || failed_shards+=("$k")
  log "shard $k finished in $(since "$t_shard") (ginkgo exit code $ginkgo_rc)"
  [[ -f $shard_dir/junit_01.xml ]] || {
    tail -n 40 "$shard_dir/e2e.log" >&2
    die "no JUnit report was written (see ${shard_dir#"$ROOT"/}/e2e.log)"
  }
  [[ -z $keep ]] || keep_run "$OUT" "$keep" "$effective_focus" || die "could not keep shard $k in $keep"
done
t_run=$(since "$t1")
log "$test_bin finished in $t_run"

write_summary || die "no JUnit report to summarize"
[[ -z $keep ]] || keep_run "$OUT" "$keep" "$effective_focus" || die "could not keep the run in $keep"
grep -E '^(FAILED|SUITE|NOT REACHED|MISSING) ' "$OUT/summary.txt" | sed 's/^/    /' || true
log "results in ${OUT#"$ROOT"/}/ (summary.txt, shard-*/junit_01.xml, shard-*/e2e.log)"
echo "$line"
# A shard whose ginkgo failed without a failed test (its BeforeSuite, say)
# fails the run too.
((${#failed_shards[@]} == 0)) || warn "ginkgo failed in shard(s) ${failed_shards[*]}"
[[ $line == *" passed, 0 failed"* ]] && ((summary_rc == 0)) && ((${#failed_shards[@]} == 0)) || exit 1
