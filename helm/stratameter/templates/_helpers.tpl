{{/* Chart name. */}}
{{- define "stratameter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "stratameter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "stratameter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "stratameter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stratameter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "stratameter.labels" -}}
helm.sh/chart: {{ include "stratameter.chart" . }}
{{ include "stratameter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stratameter
{{- end }}

{{- define "stratameter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "stratameter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "stratameter.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Fail early on settings the service would reject at start. */}}
{{- define "stratameter.validate" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}
{{- if not .Values.kafka.sasl.username }}
{{- fail "kafka.sasl.username is required when kafka.securityProtocol is SASL_*" }}
{{- end }}
{{- if not .Values.kafka.sasl.passwordSecret.name }}
{{- fail "kafka.sasl.passwordSecret.name is required when kafka.securityProtocol is SASL_*" }}
{{- end }}
{{- end }}
{{- if and .Values.kafka.tls.keyKey (not .Values.kafka.tls.certKey) }}
{{- fail "kafka.tls.keyKey needs kafka.tls.certKey" }}
{{- end }}
{{- end }}
