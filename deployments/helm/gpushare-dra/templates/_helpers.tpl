{{/* The name every object of the release carries (one plugin per cluster and driver). */}}
{{- define "gpushare-dra.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels of every object. */}}
{{- define "gpushare-dra.labels" -}}
app.kubernetes.io/name: gpushare-dra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The pods' selector: stable across upgrades (a DaemonSet's selector cannot change). */}}
{{- define "gpushare-dra.selector" -}}
app.kubernetes.io/name: gpushare-dra
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The user the plugin's pods authenticate as: the admission policy matches it. */}}
{{- define "gpushare-dra.serviceAccountUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "gpushare-dra.name" . }}
{{- end -}}

{{/*
The resource.k8s.io version for DeviceClasses: v1 from Kubernetes 1.34 (where it is served),
v1beta2 on 1.33. An install asks the cluster; `helm template` takes --kube-version (its own
default is a current release, so v1), since helm's built-in API list already names v1.
*/}}
{{- define "gpushare-dra.resourceApi" -}}
{{- if semverCompare "<1.34-0" .Capabilities.KubeVersion.Version -}}
resource.k8s.io/v1beta2
{{- else -}}
resource.k8s.io/v1
{{- end -}}
{{- end -}}
