#!/usr/bin/env bash
# Checks the Helm chart (charts/rustlet) with the real helm CLI, no cluster
# needed: `helm lint`, `helm template` with the values a user sets, its schema
# refusing bad values, the one required value named when missing, and the
# rendered RBAC granting the ServiceAccount nothing but the two built-in
# roles of a node's TLS bootstrap and `get` on its own DaemonSet, and the
# uninstall hook's Node deletion existing only while the hook runs.
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

# The DaemonSet's ServiceAccount's only permissions: the built-in roles
# kubeadm binds bootstrap tokens to, and one Role of the chart's own: `get`
# on its own DaemonSet (the agent tells an uninstall from an update by it).
# The uninstall hook's ServiceAccount may list and delete Nodes, and exists
# only while the hook runs.
check "RBAC: bound to the two bootstrap roles and its own DaemonSet's Role only" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hook = lambda d: 'helm.sh/hook' in (d['metadata'].get('annotations') or {})
bindings = [d for d in docs if d['kind'].endswith('RoleBinding') and not hook(d)]
assert all(s['name'] == 'rustlet' for d in bindings for s in d['subjects'])
roles = sorted(d['roleRef']['name'] for d in bindings)
want = ['rustlet-own-daemonset', 'system:certificates.k8s.io:certificatesigningrequests:nodeclient', 'system:node-bootstrapper']
own = [d for d in docs if d['kind'] in ('Role', 'ClusterRole') and not hook(d)]
rules = [{'apiGroups': ['apps'], 'resources': ['daemonsets'], 'resourceNames': ['rustlet'], 'verbs': ['get']}]
ok = roles == want and len(own) == 1 and own[0]['kind'] == 'Role' and own[0]['rules'] == rules
sys.exit(not ok)
PY"
check "RBAC: the uninstall hook may list and delete Nodes, while it runs only" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hooks = [d for d in docs if 'helm.sh/hook' in (d['metadata'].get('annotations') or {})]
ok = sorted(d['kind'] for d in hooks) == ['ClusterRole', 'ClusterRoleBinding', 'ConfigMap', 'Job', 'ServiceAccount']
for d in hooks:
    a = d['metadata']['annotations']
    ok = ok and a['helm.sh/hook'] == 'post-delete' and 'hook-succeeded' in a['helm.sh/hook-delete-policy']
role = next(d for d in hooks if d['kind'] == 'ClusterRole')
ok = ok and role['rules'] == [{'apiGroups': [''], 'resources': ['nodes'], 'verbs': ['list', 'delete']}]
job = next(d for d in hooks if d['kind'] == 'Job')
args = job['spec']['template']['spec']['containers'][0]['args']
ok = ok and args[0] == 'delete-nodes' and '--selector=rustlet.dev/companion=true,rustlet.dev/release=rustlet' in args
sys.exit(not ok)
PY"
check "the agent resets its node only when its own DaemonSet is gone" bash -c \
  "grep -q -- '--reset-when-gone=rustlet-system/rustlet' '$rendered' && grep -q -- '--reset-cni-bridge=rustletc0' '$rendered'"
check "the agent's API server URL is the value given" grep -q "server: https://10.1.2.3:6443" "$rendered"
check "both containers privileged on the host network, node-critical, never on a companion node" bash -c \
  "python3 - '$rendered' <<'PY'
import sys, yaml
ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d['kind'] == 'DaemonSet')
spec = ds['spec']['template']['spec']
ok = spec['hostNetwork'] and spec['priorityClassName'] == 'system-node-critical'
ok = ok and [c['name'] for c in spec['containers']] == ['runtime', 'rustlet']
ok = ok and all(c['securityContext']['privileged'] for c in spec['containers'])
ok = ok and all('livenessProbe' in c for c in spec['containers'])
terms = spec['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms']
ok = ok and terms == [{'matchExpressions': [{'key': 'rustlet.dev/companion', 'operator': 'DoesNotExist'}]}]
ok = ok and '--node-labels=rustlet.dev/companion=true,rustlet.dev/release=rustlet' in spec['containers'][1]['args']
sys.exit(not ok)
PY"
