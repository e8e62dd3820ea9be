# Shared helpers for the local one-node cluster scripts. Sourced, not run.
# shellcheck shell=bash disable=SC2034 # the paths are used by the scripts that source this
#
# Layout (all under the repository, never the host's own paths):
#   _output/bin/            binaries from hack/build-cluster.sh
#   _output/local/          the running cluster's state
#     pki/                  CA, serving and client certificates
#     etcd/                 etcd data (kept by local-down.sh unless --clean)
#     containerd/           containerd config, socket, root and state
#     cni/                  CNI config, IPAM state
#     kubelet/ rustlet/     agent root directories
#     cdi/                  CDI specs: containerd's cdi_spec_dirs, where the
#                           DRA test driver writes them (hack/dra-driver.sh)
#     pod-logs/             container logs (/var/log/pods on a real node)
#     logs/<name>.log       one log per daemon
#     run/<name>.pid        one pid file per daemon: pid, then executable path
#     run/metrics-server.apiservice  present while the metrics.k8s.io APIService
#                           is registered (hack/local-up.sh --metrics-server)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# cargo sets CARGO_MANIFEST_DIR for the test binaries it runs, and a test
# that starts one of these scripts passes it on. ring's build script reruns
# whenever that variable changes, and with it every crate above ring: a
# cargo run from here sees the variable as a plain shell does, unset.
unset CARGO_MANIFEST_DIR
BIN=$ROOT/_output/bin
LOCAL=$ROOT/_output/local
LOGS=$LOCAL/logs
RUN=$LOCAL/run
PKI=$LOCAL/pki
CTRD_DIR=$LOCAL/containerd
CTRD_SOCK=$CTRD_DIR/containerd.sock
# The one directory containerd reads CDI specs from (hack/containerd-config.toml).
CDI_DIR=$LOCAL/cdi
CNI_CONF_DIR=$LOCAL/cni/net.d
CNI_BIN_DIR=${CNI_BIN_DIR:-/usr/lib/cni}
CNI_BRIDGE=rustlet0
CNI_NETWORK=rustlet
POD_SUBNET=10.88.0.0/16
POD_GATEWAY=10.88.0.1
# The controller-manager gives each Node a /24 of this range (spec.podCIDR).
# The local node's own pods keep POD_SUBNET (its bridge is made before the
# agent starts); nodes that join, such as the Helm chart's companion nodes,
# take their pod addresses from it.
CLUSTER_CIDR=10.244.0.0/16
NODE_NAME=${NODE_NAME:-local-node}
ADMIN_KUBECONFIG=$LOCAL/admin.kubeconfig
NODE_KUBECONFIG=$LOCAL/node.kubeconfig
# One build directory for every checkout, kept across runs, so that a clean
# clone at a new path (as CI's) reuses the dependencies' builds. Two
# checkouts building at the same time would swap each other's uplifted
# binaries (target/debug/rustlet): give one of them its own CARGO_TARGET_DIR.
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${HOME:-/root}/.cache/rustlet/target}
# hack/test.sh's clippy runs beside the tests, in a build directory of its
# own: cargo holds a build directory's lock for the whole of a command.
CLIPPY_TARGET_DIR=${CLIPPY_TARGET_DIR:-${CARGO_TARGET_DIR%/*}/clippy-target}
# Debian packages unpacked (not installed) for the local images, by
# hack/install-deps.sh: _output/debs/<package>/.
DEBS=$ROOT/_output/debs
IMAGE_DEBS=(nginx nginx-common netcat-openbsd)
# The busybox of the e2e busybox image, built from source by
# `hack/build-cluster.sh busybox` into _output/bin/busybox-<version>.
E2E_BUSYBOX_VERSION=1.37.0

# hack/install-deps.sh builds kubectl into _output/bin when the host has none.
if ! command -v kubectl >/dev/null 2>&1 && [[ -x $BIN/kubectl ]]; then
  PATH=$PATH:$BIN
fi

# Every daemon, in start order (the CSI stack's and the DRA test driver's
# last: hack/csi-stack.sh, hack/dra-driver.sh). local-down.sh stops them in
# reverse.
COMPONENTS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet rustlet metrics-server
  csi-hostpath csi-registrar csi-provisioner csi-attacher dra-test-driver)

PROG=${PROG:-$(basename "$0" .sh)}

log() { printf '%s %s: %s\n' "$(date +%H:%M:%S)" "$PROG" "$*"; }
warn() { printf '%s %s: warning: %s\n' "$(date +%H:%M:%S)" "$PROG" "$*" >&2; }
die() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  exit 1
}

# Milliseconds since the epoch, and a "12.3s" rendering of a difference.
now_ms() { date +%s%3N; }
since() { local d=$(($(now_ms) - $1)); printf '%d.%ds' $((d / 1000)) $((d % 1000 / 100)); }

# alive PID: the process exists and is not a zombie.
alive() {
  [[ -r /proc/$1/stat ]] || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# running_pid NAME: prints the pid of our daemon NAME if it is alive and still
# runs the executable recorded when it was started (guards against pid reuse).
running_pid() {
  local f=$RUN/$1.pid pid exe want
  [[ -f $f ]] || return 1
  { read -r pid && read -r want; } <"$f" || return 1
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ ${exe% (deleted)} == "$want" ]] || return 1
  echo "$pid"
}

# STARTED holds the daemons this run started, so a failing run can stop them.
STARTED=()

# start_daemon NAME [VAR=VALUE...] EXECUTABLE ARGS...: runs EXECUTABLE with
# nohup, detached from the terminal (setsid), appending to $LOGS/NAME.log and
# writing $RUN/NAME.pid. Leading VAR=VALUE words set its environment.
start_daemon() {
  local name=$1
  shift
  local -a envs=()
  while [[ $1 == [A-Za-z_]*=* ]]; do
    envs+=("$1")
    shift
  done
  local exe
  exe=$(readlink -f "$1")
  [[ -x $exe ]] || die "$name: $1 is not an executable"
  mkdir -p "$LOGS" "$RUN"
  printf '\n=== %s: %s\n' "$(date -Is)" "$*" >>"$LOGS/$name.log"
  # No job control here, so the child is not a process-group leader and
  # setsid does not fork: $! is the daemon's own pid (nohup, setsid and env
  # each exec the next).
  # The start time is taken before the daemon runs: what it reports (a
  # node's first heartbeat, whole seconds) is never older than it.
  local started
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  nohup setsid env "${envs[@]}" "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  local pid=$! i
  # Until nohup, setsid and env have exec'd the daemon, /proc/PID/exe names
  # them, and running_pid would take the daemon for gone: wait (up to 5 s on a
  # loaded machine) for the exec, or for an early exit.
  for ((i = 0; i < 250; i++)); do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$exe" ]] && break
    alive "$pid" || break
    sleep 0.02
  done
  printf '%s\n%s\n' "$pid" "$exe" >"$RUN/$name.pid"
  echo "$started" >"$RUN/$name.started"
  STARTED+=("$name")
  log "started $name (pid $pid, log ${LOGS#"$ROOT"/}/$name.log)"
}

# stop_daemon NAME [TIMEOUT]: SIGTERM, then SIGKILL after TIMEOUT seconds.
stop_daemon() {
  local name=$1 timeout=${2:-10} pid i
  if pid=$(running_pid "$name"); then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 10; i++)); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      warn "$name did not stop in ${timeout}s, killing it"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do
        alive "$pid" || break
        sleep 0.1
      done
    fi
    # Reap it if this shell is its parent.
    wait "$pid" 2>/dev/null || true
  fi
  rm -f "$RUN/$name.pid" "$RUN/$name.started"
}

# tail_log NAME [LINES]: the end of a daemon's log, indented, on stderr.
tail_log() {
  local f=$LOGS/$1.log
  [[ -f $f ]] || return 0
  echo "--- last ${2:-20} lines of ${f#"$ROOT"/}:" >&2
  tail -n "${2:-20}" "$f" | sed 's/^/    /' >&2
}

# wait_for WHAT TIMEOUT COMMAND...: retries COMMAND every 0.2 s until it
# succeeds; returns 1 after TIMEOUT seconds.
wait_for() {
  local what=$1 timeout=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      warn "timed out after ${timeout}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}

# wait_daemon NAME WHAT TIMEOUT COMMAND...: like wait_for, but gives up at
# once if daemon NAME exits, and shows its log on failure.
wait_daemon() {
  local name=$1 what=$2 timeout=$3
  shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ! running_pid "$name" >/dev/null; then
      tail_log "$name" 30
      die "$name exited while waiting for $what (see ${LOGS#"$ROOT"/}/$name.log)"
    fi
    if ((SECONDS >= deadline)); then
      tail_log "$name" 30
      die "timed out after ${timeout}s waiting for $what (see ${LOGS#"$ROOT"/}/$name.log)"
    fi
    sleep 0.2
  done
}

# port_listeners PORT: "name(pid)" of every process listening on TCP PORT
# (any address), or "unknown" if the port is taken but ss cannot say by whom.
port_listeners() {
  local out
  out=$(ss -Hltnp "sport = :$1" 2>/dev/null) || return 1
  [[ -n $out ]] || return 1
  local who
  who=$(grep -o '("[^"]*",pid=[0-9]*' <<<"$out" | sed 's/("\(.*\)",pid=\(.*\)/\1(\2)/' | sort -u | paste -sd, -)
  echo "${who:-unknown}"
}

# require_free_ports NAME PORT...: dies if a port is in use; NAME is the
# component that wanted it.
require_free_ports() {
  local name=$1 port who
  shift
  for port in "$@"; do
    if who=$(port_listeners "$port"); then
      die "port $port (for $name) is already in use by $who, which this cluster did not start"
    fi
  done
}

# need_cmd CMD HINT: dies naming CMD if it is not on PATH.
need_cmd() { command -v "$1" >/dev/null 2>&1 || die "missing dependency: $1 ($2)"; }

# ctr_k8s ARGS...: our containerd's ctr in the namespace the CRI plugin uses.
ctr_k8s() { "$BIN/ctr" --address "$CTRD_SOCK" --namespace k8s.io "$@"; }

# build_if_missing TARGET BINARY...: runs `hack/build-cluster.sh TARGET` when
# one of the BINARYs is missing from _output/bin.
build_if_missing() {
  local target=$1 b missing=()
  shift
  for b in "$@"; do [[ -x $BIN/$b ]] || missing+=("$b"); done
  ((${#missing[@]})) || return 0
  need_cmd go "needed to build ${missing[*]}"
  log "building $target (missing: ${missing[*]})"
  "$ROOT/hack/build-cluster.sh" "$target" || die "hack/build-cluster.sh $target failed"
}

# binaries_id: a short digest of every executable in _output/bin (the control
# plane, the kubelet, containerd, the e2e binaries, and what the test images
# are built from, the CSI sidecars of the storage-csi runs) but the tools no
# conformance run uses (NOT_RUN_BINARIES: metrics-server, podresources-client
# and dra-test-driver serve only the project's own tests; e2e.test runs its
# own DRA driver in process). Two runs with the same id ran the same
# upstream parts.
NOT_RUN_BINARIES=(helm kind kubeadm kubectl metrics-server podresources-client dra-test-driver)
binaries_id() {
  local excluded=() b
  for b in "${NOT_RUN_BINARIES[@]}"; do excluded+=(! -name "$b"); done
  (cd "$BIN" && find . -maxdepth 1 -type f -perm -u+x "${excluded[@]}" -printf '%f\n' | LC_ALL=C sort |
    xargs -d '\n' sha256sum) | sha256sum | cut -c1-12
}

# The storage tests' CSI driver (src/bin/csi-hostpath.rs): this checkout's
# debug build unless CSI_HOSTPATH_BIN names another (hack/csi-stack.sh).
CSI_HOSTPATH_BIN=${CSI_HOSTPATH_BIN:-$CARGO_TARGET_DIR/debug/csi-hostpath}

# A conformance sitting keeps its runs in the repository, so that it goes on
# from another checkout or machine with the same binaries (hack/conformance-
# sitting.sh): KEPT_CONFORMANCE/<set>/<agent>/ holds what the table reads of
# one run, KEPT_CONFORMANCE/sitting.info the sitting's record.
KEPT_CONFORMANCE=$ROOT/docs/conformance

# keep_run OUT KEPT FOCUS: copies what the table reads of the conformance run
# in OUT (_output/conformance/<set>/<agent>) to KEPT: its identity, its
# shards' focus files, its summary.txt (or none, while OUT has none) and
# each finished shard's JUnit report in the kept form (conformance-table.py
# keep: the specs FOCUS selects), shard-<k>/junit_01.xml.gz.
keep_run() {
  local out=$1 kept=$2 focus=$3 report k
  mkdir -p "$kept"
  cp "$out/identity" "$kept/identity"
  if compgen -G "$out/shards/shard-*.focus" >/dev/null; then
    mkdir -p "$kept/shards"
    cp "$out"/shards/shard-*.focus "$kept/shards/"
  fi
  for report in "$out"/shard-*/junit_01.xml; do
    [[ -f $report ]] || continue
    k=$(basename "$(dirname "$report")")
    [[ $kept/$k/junit_01.xml.gz -nt $report ]] && continue
    mkdir -p "$kept/$k"
    python3 "$ROOT/hack/conformance-table.py" keep --focus "$focus" "$report" "$kept/$k/junit_01.xml.gz" ||
      return 1
  done
  if [[ -f $out/summary.txt ]]; then
    cp "$out/summary.txt" "$kept/summary.txt"
  else
    rm -f "$kept/summary.txt"
  fi
}

# restore_run KEPT OUT: the run kept in KEPT, put back in OUT for
# hack/conformance.sh --resume (its finished shards are kept, the others
# run) and for the table. OUT's earlier content goes.
restore_run() {
  local kept=$1 out=$2 report k
  rm -rf "${out:?}"
  mkdir -p "$out"
  cp "$kept/identity" "$out/identity"
  [[ ! -d $kept/shards ]] || cp -r "$kept/shards" "$out/shards"
  [[ ! -f $kept/summary.txt ]] || cp "$kept/summary.txt" "$out/summary.txt"
  for report in "$kept"/shard-*/junit_01.xml.gz; do
    [[ -f $report ]] || continue
    k=$(basename "$(dirname "$report")")
    mkdir -p "$out/$k"
    gzip -dc "$report" >"$out/$k/junit_01.xml"
  done
}

# image_libs BINARY...: sets libs to imagebuild arguments (--add SRC=DST)
# that add the shared libraries and the dynamic loader ldd resolves for the
# binaries, each once, at the path ldd names (SRC the file it resolves to).
# A library ldd cannot find: libs_missing names it, and the status is 1.
image_libs() {
  local bin line path seen=" "
  libs=() libs_missing=''
  for bin in "$@"; do
    while IFS= read -r line; do
      if [[ $line == *"not found"* ]]; then
        libs_missing="$bin: shared library ${line%% *} not found"
        return 1
      fi
      path=$(grep -o '/[^ ]*' <<<"$line" | head -1) || continue
      [[ -n $path && $seen != *" $path "* ]] || continue
      seen+="$path "
      libs+=(--add "$(readlink -f "$path")=$path")
    done < <(ldd "$bin" 2>/dev/null | grep -v linux-vdso)
  done
}

# control_plane_image NAME: the image of control-plane component NAME
# (kube-apiserver, kube-controller-manager, kube-scheduler, etcd) that
# hack/images.sh --control-plane builds, tagged as kubeadm names it: the
# versions of the Go modules the binaries are built from.
control_plane_image() {
  local module v
  case $1 in
    etcd) module=go.etcd.io/etcd/server/v3 ;;
    kube-apiserver | kube-controller-manager | kube-scheduler) module=k8s.io/kubernetes ;;
    *) die "no control-plane image for '$1'" ;;
  esac
  v=$(awk -v m="$module" '$1 == m { print $2; exit }' "$ROOT/tests/cluster/go.mod")
  [[ -n $v ]] || die "no version of $module in tests/cluster/go.mod"
  case $1 in
    etcd) echo "registry.k8s.io/etcd:${v#v}-0" ;;
    *) echo "registry.k8s.io/$1:$v" ;;
  esac
}

# Checks of the test scripts: pass NAME and fail NAME count into the
# caller's passed and failed and log the outcome; check NAME COMMAND... runs
# one check and shows the command's output when it fails.
# require_no_cluster: dies when a component of a local cluster runs here; a
# test script that brings its own cluster up (and down at its end) must never
# take over another one.
require_no_cluster() {
  local c
  for c in "${COMPONENTS[@]}"; do
    if running_pid "$c" >/dev/null; then
      die "$c runs here already; stop that cluster with hack/local-down.sh first"
    fi
  done
}

pass() { passed=$((passed + 1)); log "PASS $*"; }
fail() { failed=$((failed + 1)); log "FAIL $*"; }
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    pass "$name"
  else
    fail "$name"
    echo "    ${out//$'\n'/$'\n'    }"
  fi
}

# cluster_role_binding NAME ROLE KIND SUBJECT: a ClusterRoleBinding NAME of
# ClusterRole ROLE to the User or Group SUBJECT, as YAML.
cluster_role_binding() {
  cat <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: $1
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: $2
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: $3
  name: $4
EOF
}

# kubectl_admin ARGS...: kubectl as cluster admin.
kubectl_admin() { kubectl --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

# unregister_metrics_server: deletes the metrics.k8s.io APIService that
# `local-up.sh --metrics-server` registered, so that API discovery (and with
# it namespace deletion) does not wait on a metrics-server that no longer
# runs. Needs the API server; a no-op unless it was registered.
unregister_metrics_server() {
  [[ -f $RUN/metrics-server.apiservice ]] || return 0
  if kubectl_admin delete apiservice v1beta1.metrics.k8s.io --ignore-not-found --request-timeout=10s >/dev/null; then
    rm -f "$RUN/metrics-server.apiservice"
    log "unregistered APIService v1beta1.metrics.k8s.io"
  else
    warn "could not delete APIService v1beta1.metrics.k8s.io"
  fi
}

# cleanup_runtime: removes every container and sandbox of our containerd,
# kills what is left of their processes, and takes down the pod network:
# unmounts under _output/local, deletes network namespaces, veths, the
# bridge, IPAM leases and the portmap rules of our CNI network. Works with
# containerd running (asks it first) or stopped.
cleanup_runtime() {
  local ids=() id
  if running_pid containerd >/dev/null && [[ -S $CTRD_SOCK ]]; then
    mapfile -t ids < <(ctr_k8s containers list --quiet 2>/dev/null || true)
    if ((${#ids[@]})); then
      log "removing ${#ids[@]} containers (pods' sandboxes included) from containerd"
      for id in "${ids[@]}"; do
        ctr_k8s tasks kill --signal SIGKILL "$id" >/dev/null 2>&1 || true
      done
      for id in "${ids[@]}"; do
        ctr_k8s tasks delete --force "$id" >/dev/null 2>&1 || true
        ctr_k8s containers delete "$id" >/dev/null 2>&1 || true
      done
    fi
    local sbs=()
    mapfile -t sbs < <(ctr_k8s sandboxes list 2>/dev/null | awk 'NR > 1 { print $1 }' || true)
    if ((${#sbs[@]})); then
      log "removing ${#sbs[@]} sandbox records from containerd"
      ctr_k8s sandboxes remove --force "${sbs[@]}" >/dev/null 2>&1 || true
    fi
  fi
  # Task bundles name the containers containerd still had when it stopped.
  local bundles=$CTRD_DIR/state/io.containerd.runtime.v2.task/k8s.io
  if [[ -d $bundles ]]; then
    for id in "$bundles"/*; do
      [[ -e $id ]] && ids+=("$(basename "$id")")
    done
  fi
  kill_container_processes "${ids[@]}"
  kill_shims
  unmount_under "$LOCAL"
  # An agent run with AGENT_ROOT_DIR=/var/lib/kubelet (hack/conformance.sh
  # --suite node-cpu) mounts its pods' volumes there.
  [[ -d /var/lib/kubelet/pods ]] && unmount_under /var/lib/kubelet/pods
  cleanup_pod_network
  # libcni caches results under /var/lib/cni (not configurable through
  # containerd); sandboxes removed without a CNI DEL leave theirs behind.
  for id in "${ids[@]}"; do
    if [[ $id =~ ^[0-9a-f]{64}$ ]]; then rm -f /var/lib/cni/results/*-"$id"-*; fi
  done
}

# kill_container_processes ID...: SIGKILL every process in a cgroup named
# after one of the given container ids, then remove those cgroups.
kill_container_processes() {
  (($#)) || return 0
  local id dir pids=()
  for id in "$@"; do
    [[ $id =~ ^[0-9a-f]{64}$ ]] || continue
    while IFS= read -r dir; do
      [[ -f $dir/cgroup.procs ]] && mapfile -t -O "${#pids[@]}" pids <"$dir/cgroup.procs"
    done < <(find /sys/fs/cgroup -mindepth 2 -maxdepth 6 -type d -name "$id" 2>/dev/null)
  done
  if ((${#pids[@]})); then
    log "killing ${#pids[@]} leftover container processes"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
  fi
  for id in "$@"; do
    [[ $id =~ ^[0-9a-f]{64}$ ]] || continue
    find /sys/fs/cgroup -mindepth 2 -maxdepth 6 -depth -type d -name "$id" -exec rmdir {} + 2>/dev/null || true
  done
}

# kill_shims: SIGKILL the runc shims that our containerd started.
kill_shims() {
  local pids
  pids=$(pgrep -f "containerd-shim-runc-v2 .*-address $CTRD_SOCK" || true)
  if [[ -n $pids ]]; then
    log "killing leftover shims: ${pids//$'\n'/ }"
    # shellcheck disable=SC2086 # a list of pids
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  fi
}

# unmount_under DIR: unmounts every mount point below DIR, deepest first.
# (The kubelet bind-mounts its root directory onto itself, so a path can be
# mounted more than once: repeat until nothing is left.)
unmount_under() {
  local dir=$1 mp n=0
  for _ in 1 2 3 4 5; do
    local found=false
    while IFS= read -r mp; do
      found=true
      umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || warn "could not unmount $mp"
      n=$((n + 1))
    done < <(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r -u)
    $found || break
  done
  ((n == 0)) || log "unmounted $n mount points under ${dir#"$ROOT"/}"
}

# cleanup_pod_network: network namespaces, veths, bridge, IPAM leases, CNI
# result cache and portmap rules of our CNI network.
cleanup_pod_network() {
  local ns n=0
  for ns in "$CTRD_DIR"/state/io.containerd.grpc.v1.cri/netns/cni-*; do
    [[ -e $ns ]] || continue
    umount "$ns" 2>/dev/null || true
    rm -f "$ns"
    n=$((n + 1))
  done
  ((n == 0)) || log "removed $n pod network namespaces"
  if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
    local veths
    veths=$(ip -o link show master "$CNI_BRIDGE" 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }')
    for n in $veths; do
      ip link delete "$n" 2>/dev/null || true
    done
    log "deleting bridge $CNI_BRIDGE${veths:+ and its veths: ${veths//$'\n'/ }}"
    ip link delete "$CNI_BRIDGE" 2>/dev/null || true
  fi
  rm -rf "$LOCAL/cni/ipam"
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
  cleanup_portmap_rules
}

# cleanup_portmap_rules: the portmap plugin's per-pod NAT chains for our
# network (their jump rules carry a comment naming the network).
cleanup_portmap_rules() {
  command -v iptables-save >/dev/null || return 0
  local rules chains rule chain
  rules=$(iptables-save -t nat 2>/dev/null | grep -F "name: \\\"$CNI_NETWORK\\\"" | grep '^-A' || true)
  [[ -n $rules ]] || return 0
  chains=$(grep -o -- '-j CNI-DN-[0-9a-f]*' <<<"$rules" | awk '{ print $2 }' | sort -u)
  while IFS= read -r rule; do
    # shellcheck disable=SC2086 # the rule is iptables-save words
    eval "iptables -t nat ${rule/-A/-D}" 2>/dev/null || true
  done <<<"$rules"
  for chain in $chains; do
    iptables -t nat -F "$chain" 2>/dev/null || true
    iptables -t nat -X "$chain" 2>/dev/null || true
  done
  log "removed portmap rules of network $CNI_NETWORK"
}

# The kubelet's own iptables chains: KUBE-FIREWALL (drops non-local traffic
# to 127.0.0.0/8, jumped to from INPUT and OUTPUT), KUBE-KUBELET-CANARY and
# KUBE-IPTABLES-HINT. local-up.sh writes $RUN/kubelet-iptables when they did
# not exist before its kubelet first started; only then are they removed.
cleanup_kubelet_iptables() {
  [[ -f $RUN/kubelet-iptables ]] || return 0
  local ipt table
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    while "$ipt" -t filter -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    while "$ipt" -t filter -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    "$ipt" -t filter -F KUBE-FIREWALL 2>/dev/null || true
    "$ipt" -t filter -X KUBE-FIREWALL 2>/dev/null || true
    for table in mangle nat filter; do
      "$ipt" -t "$table" -X KUBE-KUBELET-CANARY 2>/dev/null || true
    done
    "$ipt" -t mangle -X KUBE-IPTABLES-HINT 2>/dev/null || true
  done
  rm -f "$RUN/kubelet-iptables"
  log "removed the kubelet's iptables chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT)"
}
