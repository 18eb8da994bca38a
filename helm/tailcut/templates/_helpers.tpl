{{- /* Labels of every object. Pod templates get tailcut.podLabels instead: no chart
or app version there, so a chart upgrade that changes nothing a pod runs (same image
tag, same settings) leaves the pods alone; a running job's links live in the agent. */ -}}
{{- define "tailcut.podLabels" -}}
app.kubernetes.io/name: tailcut
app.kubernetes.io/part-of: tailcut
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tailcut.labels" -}}
{{ include "tailcut.podLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tailcut.image" -}}
{{ .root.Values.image.registry }}/{{ .name }}:{{ .root.Values.image.tag }}
{{- end -}}

{{- /* The agent needs Pod Security's privileged level (host network and PID, host
paths, SYS_ADMIN). Helm cannot label the namespace it installs into (it must exist
first, to hold the release), so docs/kubernetes.md labels it before `helm install`;
this refuses, at once and naming the label, a namespace whose enforced level would
make the DaemonSet's pods be refused and `helm install --wait` time out. */ -}}
{{- define "tailcut.checkNamespace" -}}
{{- if .Values.agent.enabled }}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace }}
{{- $level := "" }}
{{- if $ns }}{{ $level = index ($ns.metadata.labels | default dict) "pod-security.kubernetes.io/enforce" | default "" }}{{ end }}
{{- if and $level (ne $level "privileged") }}
{{- fail (printf "namespace %s enforces Pod Security level %q, which refuses the node agent (host network and PID, host paths, SYS_ADMIN): label it with `kubectl label namespace %s pod-security.kubernetes.io/enforce=privileged --overwrite` (docs/kubernetes.md, Pod Security), or set agent.enabled=false" .Release.Namespace $level .Release.Namespace) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Where the node's container runtime records each container's first process:
containerd's runc shim tasks of the CRI's namespace, or CRI-O's storage run root. */}}
{{- define "tailcut.runtimeRecords" -}}
{{- if eq .Values.agent.containerRuntime "containerd" -}}
{{ .Values.agent.hostPaths.runtimeState }}/io.containerd.runtime.v2.task/k8s.io
{{- else -}}
{{ .Values.agent.hostPaths.runtimeState }}
{{- end -}}
{{- end -}}
