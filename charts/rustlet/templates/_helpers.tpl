{{/* Labels of every object of the release. */}}
{{- define "rustlet.labels" -}}
app.kubernetes.io/name: rustlet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The DaemonSet's selector. */}}
{{- define "rustlet.selector" -}}
app.kubernetes.io/name: rustlet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The companion runtime's CRI socket on the host. */}}
{{- define "rustlet.socket" -}}
{{ .Values.hostDir }}/containerd/containerd.sock
{{- end }}

{{/* The API server's URL, from apiServer (required). */}}
{{- define "rustlet.apiServer" -}}
{{- $host := required "apiServer.host is required: the API server's address as the host network reaches it" .Values.apiServer.host -}}
{{- if contains ":" $host -}}
https://[{{ trimAll "[]" $host }}]:{{ .Values.apiServer.port }}
{{- else -}}
https://{{ $host }}:{{ .Values.apiServer.port }}
{{- end -}}
{{- end }}

{{/* A kubeconfig of the pod's ServiceAccount token at the API server's
address as the host network reaches it. */}}
{{- define "rustlet.serviceAccountKubeconfig" -}}
apiVersion: v1
kind: Config
clusters:
  - name: cluster
    cluster:
      server: {{ include "rustlet.apiServer" . }}
      certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
users:
  - name: serviceaccount
    user:
      tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
  - name: serviceaccount
    context:
      cluster: cluster
      user: serviceaccount
current-context: serviceaccount
{{- end }}

{{/* The labels every companion Node registers with. */}}
{{- define "rustlet.companionSelector" -}}
rustlet.dev/companion=true,rustlet.dev/release={{ .Release.Name }}
{{- end }}

{{/* The ConfigMap where the approver records the companion Nodes it
approved; not Helm's: the uninstall hook deletes those Nodes, then it. */}}
{{- define "rustlet.record" -}}
{{ .Release.Name }}-nodes
{{- end }}

{{/* The securityContext of the approver's and the uninstall hook's pods:
API clients only, nothing of the host. */}}
{{- define "rustlet.restrictedPod" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- define "rustlet.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}
