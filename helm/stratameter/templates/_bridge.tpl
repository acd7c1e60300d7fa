{{/* The Label Studio bridge (templates/bridge.yaml): names and labels of its own, so the service's
Service, PodDisruptionBudget and ServiceMonitor never select the bridge's pods. */}}
{{- define "stratameter.bridge.fullname" -}}
{{- printf "%s-bridge" (include "stratameter.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{- define "stratameter.bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stratameter.name" . }}-bridge
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: label-studio-bridge
{{- end }}

{{- define "stratameter.bridge.labels" -}}
helm.sh/chart: {{ include "stratameter.chart" . }}
{{ include "stratameter.bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stratameter
{{- end }}
