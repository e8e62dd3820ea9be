#!/usr/bin/env bash
# Test of the Helm chart (charts/rustlet) on the local cluster with the
# upstream kubelet as the host's agent: `helm install`s it as a user would
# (the images from hack/image.sh imported into the host's containerd, as a
# registry would serve them), then checks that the companion node registers
# through the TLS bootstrap and is Ready within 60 s, its certificate
# approved by the release's approver and its name recorded, that the chart's
# ServiceAccount is refused a certificate for any other node's name (and for
# its own companion's without a token bound to the DaemonSet's pod), that
# the runtime container holds no ServiceAccount token, that the containers'
# securityContexts are the chart's, that a pod tolerating
# its taint runs there with an address of the companion Node's pod CIDR,
# that `kubectl logs`, `exec` and `port-forward` reach it through the API
# server, that the host kubelet's pod is untouched, and that the chart's
# ServiceAccount may not read Secrets or ConfigMaps, make tokens or list
# pods, and that the approver may approve nothing but kubelet client
# requests. Then `helm upgrade`s it to new images and checks that the pod on
# the companion node runs on, not restarted; then `helm uninstall`s it and checks that the companion node reset
# itself: its Node and pods deleted, no mount, bridge or process left, and
# the record the hook read deleted.
# Brings the cluster down at the end.
#
#   hack/test-chart.sh [--release] [--kind CLUSTER --kubeconfig FILE]
#
# The rustlet image holds the debug build (hack/image.sh --debug), which the
# tests have built already; --release puts the release build in it.
#
# With --kind, the same checks run on the kind cluster CLUSTER, which the
# caller made and removes (hack/kind-e2e.sh): the images are loaded with
# `kind load image-archive`, the chart reaches the API server at the node's
# address, and what the checks read of the host (the runtimes, mounts,
# bridges, cgroups) is read inside the kind node's container.
#
# Ends with one line "N passed, M failed"; exits non-zero if any check failed.
set -euo pipefail
PROG=chart
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
debug=(--debug)
kind_cluster=''
while (($#)); do
  case $1 in
    --release) debug=() ;;
    --kind) (($# > 1)) || die "--kind needs a cluster name"; kind_cluster=$2; shift ;;
    --kubeconfig) (($# > 1)) || die "--kubeconfig needs a file"; ADMIN_KUBECONFIG=$2; shift ;;
    *) die "unexpected argument '$1' (usage: hack/test-chart.sh [--release] [--kind CLUSTER --kubeconfig FILE])" ;;
  esac
  shift
done

passed=0
failed=0
NS=rustlet-system
RELEASE=rustlet
HOST_DIR=$LOCAL/companion
API_HOST=127.0.0.1
HELM=$BIN/helm
TAINT_KEY=rustlet.dev/companion
COMPANION_SOCK=containerd/containerd.sock
if [[ -n $kind_cluster ]]; then
  NODE_NAME=$kind_cluster-control-plane
  HOST_DIR=/var/lib/rustlet-companion
fi
COMPANION=$NODE_NAME-rustlet
# The ConfigMap where the approver records the companion Nodes it approved.
RECORD=$RELEASE-nodes
# The certificate requests the chart's ServiceAccount makes for names that
# are not its companion's (or without its pod's token), which must be refused.
FORGED=(chart-test-other-node chart-test-host-node chart-test-unbound)

# on_host COMMAND...: runs COMMAND where the host agent runs: here, or in the
# kind node's container (stdin passed on).
on_host() {
  if [[ -n $kind_cluster ]]; then docker exec -i "$NODE_NAME" "$@"; else "$@"; fi
}
# host_ctr ARGS...: ctr on the host agent's runtime (k8s.io namespace).
host_ctr() {
  if [[ -n $kind_cluster ]]; then on_host ctr --namespace k8s.io "$@"; else ctr_k8s "$@"; fi
}
# companion_ctr ARGS...: ctr on the companion's runtime (k8s.io namespace).
companion_ctr() {
  if [[ -n $kind_cluster ]]; then
    on_host ctr --address "$HOST_DIR/$COMPANION_SOCK" --namespace k8s.io "$@"
  else
    "$BIN/ctr" --address "$HOST_DIR/$COMPANION_SOCK" --namespace k8s.io "$@"
  fi
}

# The companion agent's node protection, as hack/local-up.sh sets the local
# agents': this machine's disk is shared and often less than 15 % free,
# which the default imagefs.available threshold would call disk pressure
# (the node tainted, the test pod never scheduled).
COMPANION_CONFIG='{"evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%",
  "nodefs.inodesFree": "0%", "imagefs.available": "0%", "imagefs.inodesFree": "0%"},
  "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99}'

# kill_companion_processes: what a companion whose reset did not run leaves
# on the host: its shims and pods' processes, in its cgroups (cgroupRoot
# /rustlet), which are removed after.
kill_companion_processes() {
  on_host bash -c 'for p in $(find /sys/fs/cgroup/memory/rustlet -name cgroup.procs -exec cat {} + 2>/dev/null); do
      kill -9 "$p" 2>/dev/null || true
    done
    sleep 0.5
    find /sys/fs/cgroup/*/rustlet -depth -type d -exec rmdir {} + 2>/dev/null || true'
}

up=false
finish() {
  local rc=$?
  trap - EXIT
  if $up; then
    if ((failed > 0 || rc != 0)); then
      kubectl_admin -n "$NS" logs "ds/$RELEASE" -c rustlet --tail 40 2>&1 | sed 's/^/  rustlet: /' || true
      kubectl_admin -n "$NS" logs "ds/$RELEASE" -c runtime --tail 20 2>&1 | sed 's/^/  runtime: /' || true
      kubectl_admin -n "$NS" logs "deploy/$RELEASE-csr-approver" --tail 20 2>&1 | sed 's/^/  approver: /' || true
    fi
    "$HELM" --kubeconfig "$ADMIN_KUBECONFIG" uninstall -n "$NS" "$RELEASE" --wait >/dev/null 2>&1 || true
    # The cluster's state outlives this script: the next test must find the
    # one node it expects.
    kubectl_admin delete node "$COMPANION" --ignore-not-found >/dev/null 2>&1 || true
    kubectl_admin -n "$NS" delete configmap "$RECORD" --ignore-not-found >/dev/null 2>&1 || true
    kubectl_admin delete csr "${FORGED[@]}" --ignore-not-found >/dev/null 2>&1 || true
    kubectl_admin delete pod --all -n chart-test --grace-period=0 --force >/dev/null 2>&1 || true
    kubectl_admin delete namespace chart-test --ignore-not-found --wait=false >/dev/null 2>&1 || true
    # The kind cluster is its caller's to remove.
    if [[ -z $kind_cluster ]]; then
      "$ROOT/hack/local-down.sh" || fail "local-down.sh"
      # What a companion node leaves on its host: the runtime's mounts under
      # its directory, its bridge and its pods' cgroups.
      local m
      while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
        awk -v d="$HOST_DIR" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
      )
      ip link del rustletc0 2>/dev/null || true
      kill_companion_processes
      rm -rf "$HOST_DIR"
    fi
  fi
  ((rc == 0)) || failed=$((failed + 1))
  echo "$passed passed, $failed failed"
  ((failed == 0))
}
trap finish EXIT

build_if_missing helm helm
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1)
if [[ -n $kind_cluster ]]; then
  [[ -f $ADMIN_KUBECONFIG ]] || die "--kind needs --kubeconfig FILE (the kind cluster's)"
  up=true
  "$ROOT/hack/image.sh" "${debug[@]}" || die "image.sh ${debug[*]} failed"
  for img in rustlet rustlet-node-runtime; do
    "$BIN/kind" load image-archive --name "$kind_cluster" "$ROOT/_output/images/$img.tar" ||
      die "kind load image-archive $img.tar failed"
  done
  # The pods use the host's network, and kind runs no kube-proxy here: the
  # API server's own address.
  API_HOST=$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
  kill_companion_processes
else
  require_no_cluster
  up=true
  "$ROOT/hack/local-up.sh" --agent kubelet --test-images || die "local-up.sh --agent kubelet failed"
  "$ROOT/hack/image.sh" --import "${debug[@]}" || die "image.sh --import ${debug[*]} failed"
  kill_companion_processes
  # Bidirectional mount propagation needs the host directory on a shared
  # mount; on a systemd host `/` is shared (and kind makes its nodes' `/`
  # shared), here it is made so.
  mkdir -p "$HOST_DIR"
  if ! grep -qE " $HOST_DIR .* shared:" /proc/self/mountinfo; then
    mount --bind "$HOST_DIR" "$HOST_DIR"
    mount --make-rshared "$HOST_DIR"
  fi
fi

# What an earlier run that stopped midway left in the cluster's state: its
# test pods and the companion Node.
kubectl_admin delete pod --all -n chart-test --grace-period=0 --force >/dev/null 2>&1 || true
kubectl_admin delete namespace chart-test --ignore-not-found --wait=true >/dev/null
kubectl_admin delete node "$COMPANION" --ignore-not-found >/dev/null
kubectl_admin -n "$NS" delete configmap "$RECORD" --ignore-not-found >/dev/null 2>&1 || true
kubectl_admin delete csr "${FORGED[@]}" --ignore-not-found >/dev/null

# A pod of the host kubelet, to see that the install leaves it alone.
kubectl_admin create namespace chart-test >/dev/null
kubectl_admin -n chart-test run host-pod --image=docker.io/library/busybox:1.36 \
  --image-pull-policy=Never --restart=Never -- sleep 3600 >/dev/null
kubectl_admin -n chart-test wait --for=condition=Ready pod/host-pod --timeout=60s >/dev/null
host_before=$(kubectl_admin -n chart-test get pod host-pod -o jsonpath='{.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}')

t0=$(now_ms)
check "helm install" "$HELM" --kubeconfig "$ADMIN_KUBECONFIG" install "$RELEASE" "$ROOT/charts/rustlet" \
  -n "$NS" --create-namespace \
  --set apiServer.host="$API_HOST" --set hostDir="$HOST_DIR" \
  --set image.tag="$version" --set runtimeImage.tag="$version" \
  --set image.pullPolicy=Never --set runtimeImage.pullPolicy=Never \
  --set-json "kubeletConfig=$COMPANION_CONFIG"

companion_ready() {
  [[ $(kubectl_admin get node "$COMPANION" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
ready_in=""
for _ in $(seq 1 120); do
  if companion_ready; then ready_in=$(since "$t0"); break; fi
  sleep 0.5
done
if [[ -n $ready_in ]]; then pass "companion node $COMPANION Ready ($ready_in after helm install)"; else fail "companion node $COMPANION Ready within 60 s"; fi
check "companion node has the taint $TAINT_KEY:NoSchedule" bash -c \
  "kubectl --kubeconfig '$ADMIN_KUBECONFIG' get node '$COMPANION' -o json |
   jq -e '.spec.taints[] | select(.key == \"$TAINT_KEY\" and .effect == \"NoSchedule\")'"
# Its client certificate was requested by the chart's ServiceAccount.
check "the node's certificate came from the ServiceAccount's request" bash -c \
  "kubectl --kubeconfig '$ADMIN_KUBECONFIG' get csr -o json | jq -e '.items[]
   | select(.spec.username == \"system:serviceaccount:$NS:$RELEASE\")
   | select(.spec.signerName == \"kubernetes.io/kube-apiserver-client-kubelet\")
   | select(.status.certificate != null)'"
check "it was approved by the release's approver" bash -c \
  "kubectl --kubeconfig '$ADMIN_KUBECONFIG' get csr -o json | jq -e '.items[]
   | select(.spec.username == \"system:serviceaccount:$NS:$RELEASE\" and .status.certificate != null)
   | select(any(.status.conditions[]; .type == \"Approved\" and .reason == \"RustletCompanionApproved\"))'"
check "the approver recorded $COMPANION in ConfigMap $NS/$RECORD" bash -c \
  "kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n '$NS' get configmap '$RECORD' -o json | jq -e '.data[\"$COMPANION\"]'"

# The chart's ServiceAccount asks for certificates it must not get: another
# node's companion and the host (control-plane) node itself, with a token
# bound to its own DaemonSet pod as the agent's is, and its own companion's
# name with a token bound to nothing (`kubectl create token`). The approver
# denies each; nothing approves them.
ds_pod=$(kubectl_admin -n "$NS" get pod -l app.kubernetes.io/name=rustlet,app.kubernetes.io/instance="$RELEASE" \
  -o jsonpath='{.items[0].metadata.name} {.items[0].metadata.uid}')
read -r ds_pod_name ds_pod_uid <<<"$ds_pod"
bound_token=$(kubectl_admin -n "$NS" create token "$RELEASE" --duration 10m \
  --bound-object-kind Pod --bound-object-name "$ds_pod_name" --bound-object-uid "$ds_pod_uid")
unbound_token=$(kubectl_admin -n "$NS" create token "$RELEASE" --duration 10m)
api_server=$(kubectl_admin config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
api_ca=$(kubectl_admin config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
# forge_csr NAME TOKEN CN: CertificateSigningRequest NAME for CN (O=system:nodes,
# a new P-256 key) with the usages the agent asks for, created with TOKEN alone.
forge_csr() {
  local kubeconfig request rc=0
  kubeconfig=$(mktemp)
  printf '%s\n' "apiVersion: v1" "kind: Config" \
    "clusters: [{name: c, cluster: {server: \"$api_server\", certificate-authority-data: \"$api_ca\"}}]" \
    "users: [{name: u, user: {token: \"$2\"}}]" \
    "contexts: [{name: x, context: {cluster: c, user: u}}]" "current-context: x" >"$kubeconfig"
  request=$(openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout /dev/null \
    -subj "/O=system:nodes/CN=$3" 2>/dev/null | base64 -w0)
  printf '%s\n' "apiVersion: certificates.k8s.io/v1" "kind: CertificateSigningRequest" \
    "metadata: { name: $1 }" "spec:" "  signerName: kubernetes.io/kube-apiserver-client-kubelet" \
    "  usages: [digital signature, client auth]" "  request: $request" |
    kubectl --kubeconfig "$kubeconfig" create -f - >/dev/null || rc=$?
  rm -f "$kubeconfig"
  return $rc
}
check "the ServiceAccount may create a request for another node's companion" \
  forge_csr chart-test-other-node "$bound_token" "system:node:other-node-rustlet"
check "the ServiceAccount may create a request for the host node $NODE_NAME" \
  forge_csr chart-test-host-node "$bound_token" "system:node:$NODE_NAME"
check "the ServiceAccount may create a request for $COMPANION with an unbound token" \
  forge_csr chart-test-unbound "$unbound_token" "system:node:$COMPANION"
# csr_state NAME: "<Approved or -> <Denied or -> <issued or -> <reason: message; ...>".
csr_state() {
  kubectl_admin get csr "$1" -o json 2>/dev/null | jq -r '[
    (if any(.status.conditions[]?; .type == "Approved") then "Approved" else "-" end),
    (if any(.status.conditions[]?; .type == "Denied") then "Denied" else "-" end),
    (if (.status.certificate // "") != "" then "issued" else "-" end),
    ([.status.conditions[]? | "\(.reason): \(.message)"] | join("; "))] | join(" ")'
}
# Up to 20 s for the approver, or anything else, to act on them.
for _ in $(seq 1 20); do
  all_denied=true
  for csr in "${FORGED[@]}"; do [[ $(csr_state "$csr") == "- Denied"* ]] || all_denied=false; done
  $all_denied && break
  sleep 1
done
for csr in "${FORGED[@]}"; do
  state=$(csr_state "$csr")
  read -r approved _ issued _ <<<"$state"
  check "$csr: refused, neither approved nor issued ($state)" test "$approved $issued" = "- -"
  check "$csr: denied by the approver" bash -c '[[ $1 == "- Denied - RustletCompanionDenied:"* ]]' _ "$state"
done
kubectl_admin delete csr "${FORGED[@]}" --ignore-not-found >/dev/null

# No ServiceAccount token in the runtime container: none mounted (the pod
# mounts none automatically; the agent container's projected volume is its
# own), and none inside it (its image has busybox's sh).
check "the pod mounts no token automatically; only the agent container has the projected one" bash -c \
  "kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n '$NS' get pod '$ds_pod_name' -o json | jq -e '
   .spec.automountServiceAccountToken == false
   and ([.spec.containers[] | select(.name == \"runtime\") | .volumeMounts[]? | select(.mountPath | startswith(\"/var/run/secrets\") or startswith(\"/run/secrets\"))] | length == 0)
   and ([.spec.containers[] | select(.name == \"rustlet\") | .volumeMounts[] | select(.name == \"agent-token\" and .mountPath == \"/var/run/secrets/kubernetes.io/serviceaccount\")] | length == 1)'"
check "no ServiceAccount token inside the runtime container" \
  kubectl_admin -n "$NS" exec "$ds_pod_name" -c runtime -- /bin/sh -c \
  '! test -e /var/run/secrets/kubernetes.io/serviceaccount && ! test -e /run/secrets/kubernetes.io/serviceaccount'
# The securityContexts as the chart sets them: the two DaemonSet containers
# privileged, for their Bidirectional host directory mount, and nothing
# more; the approver non-root, without capabilities, on a read-only root.
check "the agent and runtime containers' securityContext is privileged only" bash -c \
  "kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n '$NS' get pod '$ds_pod_name' -o json |
   jq -e '[.spec.containers[].securityContext] == [{\"privileged\": true}, {\"privileged\": true}]'"
check "the approver runs non-root, without capabilities, on a read-only root" bash -c \
  "kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n '$NS' get pod -l app.kubernetes.io/name=rustlet-csr-approver -o json | jq -e '
   (.items | length == 1) and (.items[0].spec.securityContext.runAsNonRoot == true)
   and (.items[0].spec.containers[0].securityContext == {\"allowPrivilegeEscalation\": false, \"readOnlyRootFilesystem\": true, \"capabilities\": {\"drop\": [\"ALL\"]}})
   and (.items[0].status.phase == \"Running\")'"
pod_cidr=$(kubectl_admin get node "$COMPANION" -o jsonpath='{.spec.podCIDR}')

# The companion runtime pulls from registries; here its images come from
# the host's runtime, as `kind load` would bring them.
archive=$(mktemp)
load_log=$(mktemp)
# copy_image IMAGE: from the host's runtime into the companion's, through a
# file where both run (a `docker exec` stream may lose its last bytes). Both
# ends read and write the content stores themselves (`--local`), not through
# containerd's transfer service, whose streamed archive has come out short
# ("short read: expected 1373446 bytes but got ...") while the blob in the
# host's store was whole.
copy_image() {
  if [[ -n $kind_cluster ]]; then
    on_host bash -c 'ctr -n k8s.io images export --local /tmp/copy.tar "$1" &&
      ctr --address "$2" -n k8s.io images import --local /tmp/copy.tar; rc=$?; rm -f /tmp/copy.tar; exit $rc' \
      _ "$1" "$HOST_DIR/$COMPANION_SOCK"
  else
    ctr_k8s images export --local "$archive" "$1" && companion_ctr images import --local "$archive"
  fi
}
for img in registry.k8s.io/pause:3.10.2 registry.k8s.io/e2e-test-images/agnhost:2.66.1; do
  # A copy that fails is tried once more, with the first error shown.
  if ! copy_image "$img" >"$load_log" 2>&1; then
    warn "copying $img failed, trying again: $(grep -vi deprecat "$load_log" | tail -2 | tr '\n' ' ')"
    sleep 2
  fi
  if ! copy_image "$img" >"$load_log" 2>&1; then
    fail "load $img into the companion runtime: $(grep -vi deprecat "$load_log" | tail -2 | tr '\n' ' ')"
    # What the host's runtime holds of it, and what the companion's said.
    host_ctr images check "name==$img" 2>&1 | grep -vi deprecat | sed 's/^/    host: /' >&2 || true
    kubectl_admin -n "$NS" logs "ds/$RELEASE" -c runtime --tail 5 2>&1 | sed "s/^/    companion: /" >&2 || true
  fi
done
rm -f "$archive" "$load_log"

kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: { name: companion-pod, namespace: chart-test }
spec:
  nodeSelector: { kubernetes.io/hostname: $COMPANION }
  tolerations: [{ key: $TAINT_KEY, operator: Exists }]
  terminationGracePeriodSeconds: 1
  containers:
    - name: web
      image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
      imagePullPolicy: Never
      args: ["netexec", "--http-port=8080"]
EOF
if kubectl_admin -n chart-test wait --for=condition=Ready pod/companion-pod --timeout=90s >/dev/null; then
  pass "a pod tolerating the taint runs on the companion node"
else
  fail "a pod tolerating the taint runs on the companion node"
  kubectl_admin -n chart-test describe pod companion-pod | sed -n '/^Conditions:/,$p' | sed 's/^/    /'
  kubectl_admin get node "$COMPANION" -o json | jq -c '{taints: .spec.taints, unschedulable: .spec.unschedulable,
    allocatable: .status.allocatable, conditions: [.status.conditions[] | {type, status}]}' | sed 's/^/    /'
fi
pod_ip=$(kubectl_admin -n chart-test get pod companion-pod -o jsonpath='{.status.podIP}')
check "its address $pod_ip is in the companion's pod CIDR $pod_cidr" python3 -c \
  "import ipaddress,sys; sys.exit(ipaddress.ip_address('$pod_ip') not in ipaddress.ip_network('$pod_cidr'))"
check "kubectl logs" bash -c \
  "kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n chart-test logs companion-pod | grep -q 'Started HTTP server'"
check "kubectl exec" bash -c \
  "[[ \$(kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n chart-test exec companion-pod -- hostname) == companion-pod ]]"
pf_log=$(mktemp)
# A local port of kubectl's choosing: the run on kind may be forwarding
# beside this one on the same host.
kubectl_admin -n chart-test port-forward pod/companion-pod :8080 >"$pf_log" 2>&1 &
pf=$!
pf_port=''
for _ in $(seq 1 40); do
  pf_port=$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$pf_log" | head -1)
  [[ -z $pf_port ]] || break
  sleep 0.25
done
check "kubectl port-forward${pf_port:+ (local port $pf_port)}" bash -c \
  "[[ -n '$pf_port' && \$(curl -sf --max-time 5 'http://127.0.0.1:$pf_port/hostname') == companion-pod ]]"
kill "$pf" 2>/dev/null || true
rm -f "$pf_log"

host_after=$(kubectl_admin -n chart-test get pod host-pod -o jsonpath='{.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}')
check "the host kubelet's pod is untouched ($host_before)" test "$host_before" = "$host_after"

sa=system:serviceaccount:$NS:$RELEASE
for what in "get secrets" "get configmaps" "create serviceaccounts --subresource=token" "list pods" "create pods" "get nodes" "list daemonsets"; do
  # shellcheck disable=SC2086 # the verb, resource and flags are separate words
  answer=$(kubectl_admin auth can-i $what --all-namespaces --as "$sa" 2>/dev/null || true)
  check "the ServiceAccount may not $what ($answer)" test "$answer" = no
done
answer=$(kubectl_admin auth can-i update certificatesigningrequests --subresource=approval --as "$sa" 2>/dev/null || true)
check "the ServiceAccount may not approve requests ($answer)" test "$answer" = no
approver=system:serviceaccount:$NS:$RELEASE-csr-approver
# may_approve USER SIGNER: whether USER may approve for SIGNER, asked with a
# SubjectAccessReview (kubectl auth can-i cannot name a signer, whose name
# holds a slash, as a resource name).
may_approve() {
  printf '%s\n' "apiVersion: authorization.k8s.io/v1" "kind: SubjectAccessReview" "spec:" \
    "  user: $1" "  groups: [system:serviceaccounts, system:authenticated]" \
    "  resourceAttributes: {group: certificates.k8s.io, resource: signers, name: \"$2\", verb: approve}" |
    kubectl_admin create -f - -o jsonpath='{.status.allowed}'
}
answer=$(may_approve "$approver" kubernetes.io/kube-apiserver-client-kubelet 2>&1 || true)
check "the approver may approve kubelet client requests ($answer)" test "$answer" = true
answer=$(may_approve "$sa" kubernetes.io/kube-apiserver-client-kubelet 2>&1 || true)
check "the ServiceAccount may not approve for the kubelet client signer ($answer)" test "$answer" = false
for signer in kubernetes.io/kube-apiserver-client kubernetes.io/kubelet-serving; do
  answer=$(may_approve "$approver" "$signer" 2>&1 || true)
  check "the approver may not approve for $signer ($answer)" test "$answer" = false
done
for what in "get secrets" "list pods" "patch nodes" "delete nodes" "create serviceaccounts --subresource=token"; do
  # shellcheck disable=SC2086 # the verb, resource and flags are separate words
  answer=$(kubectl_admin auth can-i $what --all-namespaces --as "$approver" 2>/dev/null || true)
  check "the approver may not $what ($answer)" test "$answer" = no
done

# helm upgrade to new images (the same builds under another tag): the
# DaemonSet pod is replaced, runtime and agent both restart, and the
# companion's pod runs on, adopted by the new agent.
pod_state() {
  kubectl_admin -n chart-test get pod companion-pod -o jsonpath='{.status.podIP} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}'
}
before_upgrade=$(pod_state)
ds_pod=$(kubectl_admin -n "$NS" get pod -l app.kubernetes.io/name=rustlet -o jsonpath='{.items[0].metadata.uid}')
for img in rustlet rustlet-node-runtime; do
  host_ctr images tag --force "docker.io/library/$img:$version" "docker.io/library/$img:$version-upgrade" >/dev/null ||
    fail "tag $img:$version-upgrade"
done
check "helm upgrade to new images" "$HELM" --kubeconfig "$ADMIN_KUBECONFIG" upgrade "$RELEASE" "$ROOT/charts/rustlet" \
  -n "$NS" --reuse-values --set image.tag="$version-upgrade" --set runtimeImage.tag="$version-upgrade" --wait --timeout 120s
replaced=$(kubectl_admin -n "$NS" get pod -l app.kubernetes.io/name=rustlet -o jsonpath='{.items[0].metadata.uid}')
check "upgrade: the DaemonSet pod was replaced" test "$ds_pod" != "$replaced"
ready_again=false
for _ in $(seq 1 120); do
  if companion_ready; then ready_again=true; break; fi
  sleep 0.5
done
check "upgrade: the companion node is Ready again" $ready_again
sleep 5
after_upgrade=$(pod_state)
check "upgrade: the companion's pod runs on, not restarted ($before_upgrade -> $after_upgrade)" \
  test "$before_upgrade" = "$after_upgrade"
check "upgrade: kubectl exec still reaches it" bash -c \
  "[[ \$(kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n chart-test exec companion-pod -- hostname) == companion-pod ]]"

# Helm deletes the DaemonSet first: the agent, told to stop, finds it gone
# and resets its node before the runtime stops; then the chart's hook
# deletes the companion Node.
answer=$(kubectl_admin auth can-i get "daemonsets/$RELEASE" -n "$NS" --as "$sa" 2>/dev/null || true)
check "the ServiceAccount may get its own DaemonSet ($answer)" test "$answer" = yes

# The agent's log to its end (the host kubelet removes it with the pod).
agent_log=$(mktemp)
kubectl_admin -n "$NS" logs -f "$(kubectl_admin -n "$NS" get pod -l app.kubernetes.io/name=rustlet -o name)" \
  -c rustlet --tail 1 >"$agent_log" 2>&1 &
follow=$!
runtime_log=$(mktemp)
kubectl_admin -n "$NS" logs -f "$(kubectl_admin -n "$NS" get pod -l app.kubernetes.io/name=rustlet -o name)" \
  -c runtime --tail 1 >"$runtime_log" 2>&1 &
follow_runtime=$!
check "helm uninstall" "$HELM" --kubeconfig "$ADMIN_KUBECONFIG" uninstall -n "$NS" "$RELEASE" --wait
node_gone=false
for _ in $(seq 1 60); do
  if ! kubectl_admin get node "$COMPANION" >/dev/null 2>&1; then node_gone=true; break; fi
  sleep 0.5
done
check "uninstall: the companion Node is deleted" $node_gone
check "uninstall: the companion's pod is deleted" bash -c \
  "! kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n chart-test get pod companion-pod >/dev/null 2>&1"
no_bridge() { ! on_host ip link show rustletc0 >/dev/null 2>&1; }
check "uninstall: the bridge rustletc0 is deleted" no_bridge
mounts=$(on_host cat /proc/self/mountinfo | awk -v d="$HOST_DIR/" 'index($5, d) == 1 { print $5 }')
check "uninstall: no mount left under $HOST_DIR${mounts:+ (}${mounts//$'\n'/, }${mounts:+)}" test -z "$mounts"
procs=$(on_host bash -c 'find /sys/fs/cgroup/memory/rustlet -name cgroup.procs -exec cat {} + 2>/dev/null' || true)
what=""
for p in $procs; do what+=" $p:$(on_host cat "/proc/$p/cmdline" 2>/dev/null | tr '\0' ' ' | cut -c1-80)"; done
check "uninstall: no process left in the companion's cgroups${what:+ (}${what# }${what:+)}" test -z "$procs"
cgroups_left=$({ on_host bash -c 'find /sys/fs/cgroup/*/rustlet -type d 2>/dev/null' || true; } | head -5 | tr '\n' ' ')
check "uninstall: no cgroup left (/rustlet: shims, pods, QoS classes)${cgroups_left:+ ($cgroups_left)}" test -z "$cgroups_left"
check "uninstall: the hook's ServiceAccount and roles are gone" bash -c \
  "! kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n '$NS' get serviceaccount '$RELEASE-uninstall' >/dev/null 2>&1 &&
   ! kubectl --kubeconfig '$ADMIN_KUBECONFIG' get clusterrole '$RELEASE-uninstall' >/dev/null 2>&1 &&
   ! kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n '$NS' get role '$RELEASE-uninstall' >/dev/null 2>&1"
check "uninstall: the record $RECORD is deleted, and the approver's role" bash -c \
  "! kubectl --kubeconfig '$ADMIN_KUBECONFIG' -n '$NS' get configmap '$RECORD' >/dev/null 2>&1 &&
   ! kubectl --kubeconfig '$ADMIN_KUBECONFIG' get clusterrole '$RELEASE-csr-approver' >/dev/null 2>&1"
kill "$follow" "$follow_runtime" 2>/dev/null || true
[[ -z $procs ]] || grep -vi deprecat "$runtime_log" | tail -30 | cut -c1-300 | sed 's/^/  runtime: /'
rm -f "$runtime_log"
grep -E "uninstall|reset|DaemonSet" "$agent_log" | sed 's/^/  agent: /' || log "the agent's log says nothing of the reset"
rm -f "$agent_log"
check "the host kubelet's pod is still untouched" test "$host_before" = \
  "$(kubectl_admin -n chart-test get pod host-pod -o jsonpath='{.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}')"
