#!/usr/bin/env bash
# Checks the Helm chart (charts/rustlet) with the real helm CLI, no cluster
# needed: `helm lint`, `helm template` with the values a user sets, its schema
# refusing bad values, the one required value named when missing, and the
# rendered RBAC: the agent's ServiceAccount granted nothing but the built-in
# role of a node's TLS bootstrap and `get` on its own DaemonSet (no
# `nodeclient` auto-approval), the approver's only the approval of one
# signer's requests, reading a pod and writing its record (and, for the
# NodeConfigurations' status writer, reading Nodes and the resources and
# writing their status), and the uninstall
# hook's Node deletion existing only while the hook runs; the token in the
# agent container only, and the containers' securityContexts.
#
#   hack/chart-lint.sh
#
# Ends with one line "N passed, M failed"; exits non-zero if any check failed.
set -euo pipefail
PROG=chart-lint
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
(($# == 0)) || die "unexpected argument '$1' (usage: hack/chart-lint.sh)"
build_if_missing helm helm
HELM=$BIN/helm
CHART=$ROOT/charts/rustlet

passed=0
failed=0
rendered=$(mktemp)
trap 'rm -f "$rendered"; echo "$passed passed, $failed failed"; ((failed == 0))' EXIT
check "helm lint" "$HELM" lint --strict "$CHART" --set apiServer.host=127.0.0.1
check "helm template" bash -c "'$HELM' template rustlet '$CHART' -n rustlet-system \
  --set apiServer.host=10.1.2.3 >'$rendered'"

# refused NAME WANT ARGS...: helm template with ARGS fails, saying WANT.
refused() {
  local name=$1 want=$2 out
  shift 2
  if out=$("$HELM" template rustlet "$CHART" "$@" 2>&1); then
    fail "$name: rendered"
  elif grep -qF -- "$want" <<<"$out"; then
    pass "$name"
  else
    fail "$name: $out"
  fi
}
refused "no apiServer.host: named" "apiServer.host is required"
refused "a bad taint effect" "/taint/effect" --set apiServer.host=a --set taint.effect=Sometimes
refused "a node name suffix without its dash" "/nodeNameSuffix" --set apiServer.host=a --set nodeNameSuffix=x
refused "a relative hostDir" "/hostDir" --set apiServer.host=a --set hostDir=var/lib/x
# shim.sh moves the shims there and the reset removes it: one cgroup below the root.
refused "a cgroupRoot that climbs" "/cgroupRoot" --set apiServer.host=a --set cgroupRoot=/x/../..
refused "the cgroup hierarchies' root as cgroupRoot" "/cgroupRoot" --set apiServer.host=a --set cgroupRoot=/
refused "an unknown value" "additional properties" --set apiServer.host=a --set rootDir=/x
refused "a host that is not an address" "/apiServer/host" --set 'apiServer.host=a b'
refused "a configuration field the chart sets" "invalid propertyName 'port'" --set apiServer.host=a --set kubeletConfig.port=1
check "kubeletConfig fields reach the agent's configuration" bash -c \
  "'$HELM' template rustlet '$CHART' --set apiServer.host=a --set kubeletConfig.maxPods=7 |
   python3 -c 'import sys, yaml
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
cm = next(d for d in docs if d[\"kind\"] == \"ConfigMap\")
cfg = yaml.safe_load(cm[\"data\"][\"config.yaml\"])
sys.exit(not (cfg[\"maxPods\"] == 7 and cfg[\"port\"] == 10260))'"

# The DaemonSet's ServiceAccount's only permissions: the built-in role
# kubeadm binds bootstrap tokens to (create and read requests; no
# `nodeclient` auto-approval: the release's approver approves), and one Role
# of the chart's own: `get` on its own DaemonSet (the agent tells an
# uninstall from an update by it). The approver's: watch the requests,
# approve (or deny) those of the kubelet client signer, read a pod and write
# its record in the release's namespace. The uninstall hook's
# ServiceAccount may delete Nodes and read and delete the record, and exists
# only while the hook runs.
check "RBAC: the agent bound to the bootstrap role and its own DaemonSet's Role only, no nodeclient" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hook = lambda d: 'helm.sh/hook' in (d['metadata'].get('annotations') or {})
bindings = [d for d in docs if d['kind'].endswith('RoleBinding') and not hook(d)
            and any(s['name'] == 'rustlet' for s in d['subjects'])]
assert all(len(d['subjects']) == 1 for d in bindings)
roles = sorted(d['roleRef']['name'] for d in bindings)
assert roles == ['rustlet-own-daemonset', 'system:node-bootstrapper'], roles
assert not any('nodeclient' in d['roleRef']['name'] for d in docs if d['kind'].endswith('RoleBinding'))
own = [d for d in docs if d['kind'] in ('Role', 'ClusterRole') and d['metadata']['name'] == 'rustlet-own-daemonset']
rules = [{'apiGroups': ['apps'], 'resources': ['daemonsets'], 'resourceNames': ['rustlet'], 'verbs': ['get']}]
assert len(own) == 1 and own[0]['kind'] == 'Role' and own[0]['rules'] == rules
PY"
check "RBAC: the approver may approve kubelet client requests, read pods and write its record, and read Nodes and NodeConfigurations and write their status, nothing else" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hook = lambda d: 'helm.sh/hook' in (d['metadata'].get('annotations') or {})
sa = 'rustlet-csr-approver'
bindings = [d for d in docs if d['kind'].endswith('RoleBinding') and any(s['name'] == sa for s in d['subjects'])]
assert sorted((d['kind'], d['roleRef']['kind'], d['roleRef']['name']) for d in bindings) == [
    ('ClusterRoleBinding', 'ClusterRole', sa), ('RoleBinding', 'Role', sa)], bindings
assert all(d['subjects'] == [{'kind': 'ServiceAccount', 'name': sa, 'namespace': 'rustlet-system'}] for d in bindings)
cluster = next(d for d in docs if d['kind'] == 'ClusterRole' and d['metadata']['name'] == sa)
g = ['certificates.k8s.io']
assert cluster['rules'] == [
    {'apiGroups': g, 'resources': ['certificatesigningrequests'], 'verbs': ['get', 'list', 'watch']},
    {'apiGroups': g, 'resources': ['certificatesigningrequests/approval'], 'verbs': ['update']},
    {'apiGroups': g, 'resources': ['signers'], 'resourceNames': ['kubernetes.io/kube-apiserver-client-kubelet'], 'verbs': ['approve']},
    {'apiGroups': [''], 'resources': ['nodes'], 'verbs': ['list', 'watch']},
    {'apiGroups': ['rustlet.dev'], 'resources': ['nodeconfigurations'], 'verbs': ['list', 'watch']},
    {'apiGroups': ['rustlet.dev'], 'resources': ['nodeconfigurations/status'], 'verbs': ['patch']},
], cluster['rules']
role = next(d for d in docs if d['kind'] == 'Role' and d['metadata']['name'] == sa)
assert role['metadata']['namespace'] == 'rustlet-system'
assert role['rules'] == [
    {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['get']},
    {'apiGroups': [''], 'resources': ['configmaps'], 'verbs': ['create']},
    {'apiGroups': [''], 'resources': ['configmaps'], 'resourceNames': ['rustlet-nodes'], 'verbs': ['patch']},
], role['rules']
dep = next(d for d in docs if d['kind'] == 'Deployment' and d['metadata']['name'] == sa)
spec = dep['spec']['template']['spec']
assert spec['serviceAccountName'] == sa
ds = next(d for d in docs if d['kind'] == 'DaemonSet')
c = spec['containers'][0]
assert c['image'] == ds['spec']['template']['spec']['containers'][1]['image'], 'not the agent image'
assert c['args'] == ['approve-csrs', '--kubeconfig=/etc/rustlet-approver/kubeconfig', '--namespace=rustlet-system',
    '--service-account=rustlet', '--daemonset=rustlet', '--node-name-suffix=-rustlet', '--record=rustlet-nodes'], c['args']
# The second container: the NodeConfigurations' status writer, same image.
w = spec['containers'][1]
assert w['image'] == c['image'] and w['args'] == ['report-node-configurations',
    '--kubeconfig=/etc/rustlet-approver/kubeconfig'], w
assert len(spec['containers']) == 2
# Its pods are not the DaemonSet's.
sel = ds['spec']['selector']['matchLabels']
assert any(dep['spec']['template']['metadata']['labels'].get(k) != v for k, v in sel.items())
PY"
check "RBAC: the uninstall hook may delete Nodes and read and delete the record, while it runs only" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hooks = [d for d in docs if 'helm.sh/hook' in (d['metadata'].get('annotations') or {})]
kinds = sorted(d['kind'] for d in hooks)
assert kinds == ['ClusterRole', 'ClusterRoleBinding', 'ConfigMap', 'Job', 'Role', 'RoleBinding', 'ServiceAccount'], kinds
for d in hooks:
    a = d['metadata']['annotations']
    assert a['helm.sh/hook'] == 'post-delete' and 'hook-succeeded' in a['helm.sh/hook-delete-policy']
role = next(d for d in hooks if d['kind'] == 'ClusterRole')
assert role['rules'] == [{'apiGroups': [''], 'resources': ['nodes'], 'verbs': ['delete']}], role['rules']
role = next(d for d in hooks if d['kind'] == 'Role')
assert role['rules'] == [{'apiGroups': [''], 'resources': ['configmaps'], 'resourceNames': ['rustlet-nodes'], 'verbs': ['get', 'delete']}], role['rules']
job = next(d for d in hooks if d['kind'] == 'Job')
args = job['spec']['template']['spec']['containers'][0]['args']
assert args == ['delete-nodes', '--kubeconfig=/etc/rustlet-uninstall/kubeconfig', '--record=rustlet-system/rustlet-nodes'], args
# No Helm object is the record: helm uninstall leaves it for the hook.
assert not any(d['kind'] == 'ConfigMap' and d['metadata']['name'] == 'rustlet-nodes' for d in docs)
PY"
check "the ServiceAccount token in the agent container only, bound to the pod" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d['kind'] == 'DaemonSet')
spec = ds['spec']['template']['spec']
assert spec['automountServiceAccountToken'] is False
vol = next(v for v in spec['volumes'] if v['name'] == 'agent-token')
assert any('serviceAccountToken' in s for s in vol['projected']['sources'])
token_vols = {v['name'] for v in spec['volumes'] if 'projected' in v or 'secret' in v}
assert token_vols == {'agent-token'}, token_vols
mounts = {c['name']: [m for m in c.get('volumeMounts', []) if m['name'] in token_vols] for c in spec['containers']}
assert mounts['runtime'] == [], mounts
assert mounts['rustlet'] == [{'name': 'agent-token', 'mountPath': '/var/run/secrets/kubernetes.io/serviceaccount', 'readOnly': True}], mounts
assert not any(m['mountPath'].startswith('/var/run/secrets') for m in spec['containers'][0].get('volumeMounts', []))
PY"
check "the approver and the hook run unprivileged: non-root, no capability, read-only root" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
pods = [d['spec']['template']['spec'] for d in docs if d['kind'] in ('Deployment', 'Job')]
assert len(pods) == 2
for spec in pods:
    sc = spec['securityContext']
    assert sc['runAsNonRoot'] and sc['runAsUser'] != 0 and sc['seccompProfile'] == {'type': 'RuntimeDefault'}, sc
    for c in spec['containers']:
        assert c['securityContext'] == {'allowPrivilegeEscalation': False, 'readOnlyRootFilesystem': True,
                                        'capabilities': {'drop': ['ALL']}}, c['securityContext']
PY"
check "the agent resets its node only when its own DaemonSet is gone" bash -c \
  "grep -q -- '--reset-when-gone=rustlet-system/rustlet' '$rendered' && grep -q -- '--reset-cni-bridge=rustletc0' '$rendered'"
check "the agent's API server URL is the value given" grep -q "server: https://10.1.2.3:6443" "$rendered"
# Both DaemonSet containers stay privileged: their host directory mount is
# Bidirectional, which Kubernetes allows privileged containers only
# (docs/security.md says what each needs); nothing else is added to them.
check "both containers privileged (Bidirectional mounts) and nothing more, on the host network, node-critical, never on a companion node" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d['kind'] == 'DaemonSet')
spec = ds['spec']['template']['spec']
ok = spec['hostNetwork'] and spec['priorityClassName'] == 'system-node-critical'
ok = ok and [c['name'] for c in spec['containers']] == ['runtime', 'rustlet']
ok = ok and all(c['securityContext'] == {'privileged': True} for c in spec['containers'])
ok = ok and all(any(m.get('mountPropagation') == 'Bidirectional' for m in c['volumeMounts']) for c in spec['containers'])
ok = ok and all('livenessProbe' in c for c in spec['containers'])
terms = spec['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms']
ok = ok and terms == [{'matchExpressions': [{'key': 'rustlet.dev/companion', 'operator': 'DoesNotExist'}]}]
ok = ok and '--node-labels=rustlet.dev/companion=true,rustlet.dev/release=rustlet' in spec['containers'][1]['args']
sys.exit(not ok)
PY"
