#!/usr/bin/env bash
# Test of the self-hosted cluster (hack/local-up.sh --self-hosted): brings it
# up from a bootstrap token, then checks that rustlet joined as `kubeadm
# join` makes a node join (its client certificate came from a request by the
# bootstrap token, approved and issued), that the control plane's four
# static pods have mirror pods in kube-system owned by the Node, that a pod
# scheduled by the self-hosted scheduler runs, and that when the API
# server's container is killed rustlet restarts it while the node stays
# registered and Ready. Brings the cluster down at the end.
#
#   hack/test-self-hosted.sh
#
# Ends with one line "N passed, M failed"; exits non-zero if any check failed.
set -euo pipefail
PROG=self-hosted
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
(($# == 0)) || die "unexpected argument '$1' (usage: hack/test-self-hosted.sh)"

passed=0
failed=0

up=false
finish() {
  local rc=$?
  trap - EXIT
  if $up; then
    ((failed == 0 && rc == 0)) || tail_log rustlet 40
    "$ROOT/hack/local-down.sh" || fail "local-down.sh"
  fi
  ((rc == 0)) || failed=$((failed + 1))
  echo "$passed passed, $failed failed"
  ((failed == 0))
}
trap finish EXIT

# Never another cluster's: local-down at the end would stop it.
require_no_cluster
t0=$(now_ms)
up=true
"$ROOT/hack/local-up.sh" --self-hosted || die "local-up.sh --self-hosted failed"
pass "local-up.sh --self-hosted ($(since "$t0"))"

# The node's client certificate: requested by the bootstrap token's user,
# approved by the controller-manager, issued; the kubeconfig rustlet wrote
# uses it.
bootstrapped() {
  local csrs
  csrs=$(kubectl_admin get csr -o json | jq -r '.items[]
    | select(.spec.signerName == "kubernetes.io/kube-apiserver-client-kubelet")
    | [.spec.username, ((.spec.groups // []) | join(",")),
       ([.status.conditions[]? | select(.type == "Approved")] | length),
       ((.status.certificate // "") | length > 0)] | @tsv')
  echo "$csrs"
  grep -qE '^system:bootstrap:[a-z0-9]{6}	[^	]*system:bootstrappers:kubeadm:default-node-token[^	]*	1	true$' <<<"$csrs"
}
check "rustlet's client certificate was requested with the bootstrap token, approved and issued" bootstrapped
node_credentials() {
  local pem subject
  pem=$(sed -n 's/^ *client-certificate: //p' "$LOCAL/self-hosted/kubelet.conf")
  [[ $pem == "$LOCAL/self-hosted/pki/kubelet-client-current.pem" ]] || { echo "kubelet.conf uses '$pem'"; return 1; }
  subject=$(openssl x509 -in "$pem" -noout -subject -nameopt RFC2253)
  echo "$subject"
  [[ $subject == "subject=CN=system:node:$NODE_NAME,O=system:nodes" ]]
}
check "the node kubeconfig rustlet wrote uses the issued certificate of system:node:$NODE_NAME" node_credentials
no_token() { [[ -s $LOCAL/self-hosted/kubelet.conf ]] && ! grep -q 'token' "$LOCAL/self-hosted/kubelet.conf"; }
check "the node kubeconfig does not keep the bootstrap token" no_token
check "the bootstrap kubeconfig is gone after the join, as kubeadm removes it" \
  test ! -e "$LOCAL/self-hosted/bootstrap.kubeconfig"

mirrors() {
  kubectl_admin get pods -n kube-system -o json | jq -r --arg node "$NODE_NAME" '.items[]
    | select(.metadata.annotations["kubernetes.io/config.mirror"] != null)
    | [.metadata.name, .metadata.ownerReferences[0].kind, .metadata.ownerReferences[0].name, .status.phase] | @tsv' | sort
}
want_mirrors=$(for c in etcd kube-apiserver kube-controller-manager kube-scheduler; do
  printf '%s-%s\tNode\t%s\tRunning\n' "$c" "$NODE_NAME" "$NODE_NAME"
done)
mirrors_ok() { [[ $(mirrors) == "$want_mirrors" ]]; }
if wait_for "the mirror pods Running" 60 mirrors_ok; then
  pass "mirror pods of etcd, kube-apiserver, kube-controller-manager, kube-scheduler, owned by the Node, Running"
else
  fail "mirror pods: want, then got"
  echo "$want_mirrors"
  mirrors
fi

# A pod scheduled by the self-hosted scheduler, on the self-hosted node.
kubectl_admin apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: self-hosted-check
  namespace: default
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: docker.io/library/busybox:1.36
    command: [sh, -c, 'echo scheduled-and-run']
YAML
check "a pod is scheduled and runs to completion" \
  kubectl_admin wait pod/self-hosted-check --for=jsonpath='{.status.phase}'=Succeeded --timeout=90s
logs_read() { [[ $(kubectl_admin logs self-hosted-check) == scheduled-and-run ]]; }
check "its log reads through the self-hosted API server and rustlet" logs_read

# Kill the API server's container: rustlet restarts it (restartPolicy
# Always), the mirror pod's restart count goes up, the node stays.
restarts() {
  kubectl_admin get pod -n kube-system "kube-apiserver-$NODE_NAME" \
    -o jsonpath='{.status.containerStatuses[0].restartCount}'
}
before=$(restarts)
node_uid=$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.metadata.uid}')
# The running one (an earlier one may have exited during bring-up).
mapfile -t ids < <(comm -12 \
  <(ctr_k8s containers list --quiet 'labels."io.kubernetes.container.name"==kube-apiserver' | sort) \
  <(ctr_k8s tasks list | awk '$3 == "RUNNING" { print $1 }' | sort))
if ((${#ids[@]} != 1)); then
  fail "one running kube-apiserver container in containerd (found ${#ids[@]})"
else
  ctr_k8s tasks kill --signal SIGKILL "${ids[0]}" >/dev/null
  curl_api() { curl -sf --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:6443$1"; }
  api_down() { ! curl -sf --max-time 1 -k https://127.0.0.1:6443/livez; }
  check "the killed API server is down" wait_for "the API server to go" 10 api_down
  check "rustlet restarts it: /readyz answers again" wait_for "the API server to come back" 90 curl_api /readyz
  restarted() { local n; n=$(restarts) && ((n > before)); }
  check "the mirror pod reports the restart (restartCount $before -> more)" wait_for "the restart count to rise" 60 restarted
  same_node() {
    [[ $(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.metadata.uid}') == "$node_uid" ]] &&
      kubectl_admin wait "node/$NODE_NAME" --for=condition=Ready --timeout=5s
  }
  check "the node stays registered (same uid) and Ready" wait_for "the node" 60 same_node
fi
