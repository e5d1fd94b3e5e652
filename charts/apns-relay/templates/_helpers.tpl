{{- define "apns-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "apns-relay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "apns-relay.labels" -}}
app.kubernetes.io/name: {{ include "apns-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "apns-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "apns-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The image: repository@digest when image.digest is set, else repository:tag, the tag defaulting
to the chart's appVersion.
*/}}
{{- define "apns-relay.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "apns-relay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "apns-relay.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The pod's affinity: the default anti-affinity (relays on different nodes, preferred) unless
defaultAntiAffinity is false, merged key by key with .Values.affinity, whose keys win: a
nodeAffinity or podAffinity is added beside it; a podAntiAffinity rule list of the same kind
(preferred… or required…) replaces the default one, a rule list of the other kind is added.
*/}}
{{- define "apns-relay.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- if .Values.defaultAntiAffinity -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "apns-relay.selectorLabels" . | fromYaml)) -}}
{{- $default := dict "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) -}}
{{- $affinity = merge $affinity $default -}}
{{- end -}}
{{- toYaml $affinity -}}
{{- end -}}

{{/*
A probe from the values (dict "name" "livenessProbe" "probe" .Values.livenessProbe), refused
when it names more than one handler: values merge over the defaults, so a tcpSocket given
without nulling the default httpGet would otherwise reach Kubernetes with both.
*/}}
{{- define "apns-relay.probe" -}}
{{- $handlers := list -}}
{{- range $handler := list "httpGet" "tcpSocket" "grpc" "exec" -}}
{{- if hasKey $.probe $handler -}}{{- $handlers = append $handlers $handler -}}{{- end -}}
{{- end -}}
{{- if gt (len $handlers) 1 -}}
{{- fail (printf "%s names %s: one handler only; null the default one (e.g. %s: null)" .name (join " and " $handlers) (first $handlers)) -}}
{{- end -}}
{{- toYaml .probe -}}
{{- end -}}

{{/*
An alert's labels (dict "rule" .Values.prometheusRule.rules.<alert> "root" $): its severity and
prometheusRule.alertLabels.
*/}}
{{- define "apns-relay.alertLabels" -}}
severity: {{ .rule.severity | quote }}
{{- with .root.Values.prometheusRule.alertLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}
