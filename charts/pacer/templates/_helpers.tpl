{{/* Names and labels of the operator's objects. */}}

{{/* The chart name (nameOverride wins). */}}
{{- define "pacer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The operator's full name: `<release>-operator` for a release named like the chart
     (`pacer` → `pacer-operator`), else `<release>-<chart>-operator`. */}}
{{- define "pacer.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "pacer.name" . -}}
{{- if contains $name .Release.Name -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s-operator" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "pacer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: `app.kubernetes.io/name=pacer-operator` is also what the plain
     Prometheus scrape config (config/prometheus/prometheus.yaml) keeps. */}}
{{- define "pacer.selectorLabels" -}}
app.kubernetes.io/name: pacer-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "pacer.labels" -}}
helm.sh/chart: {{ include "pacer.chart" . }}
{{ include "pacer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pacer
{{- end -}}

{{/* The ServiceAccount's name. */}}
{{- define "pacer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pacer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image. */}}
{{- define "pacer.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The engine profiles shipped with the chart (config/profiles/*.json). */}}
{{- define "pacer.profiles" -}}
{{- .Files.Glob "files/config/profiles/*.json" | toYaml -}}
{{- end -}}

{{/* Whether the profiles ConfigMap exists (enabled and at least one profile shipped). */}}
{{- define "pacer.hasProfiles" -}}
{{- if and .Values.profiles.enabled (.Files.Glob "files/config/profiles/*.json") -}}true{{- end -}}
{{- end -}}
