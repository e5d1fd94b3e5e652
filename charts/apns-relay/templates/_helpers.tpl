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

{{/*
The relay's configuration file: .Values.config with apns.credentials written from
.Values.credentials (the key and certificate files under the keys mount). The release's ConfigMap
and the configuration check's hold the same text.
*/}}
{{- define "apns-relay.configFile" -}}
{{- $config := deepCopy .Values.config }}
{{- $apns := get $config "apns" | default dict }}
{{- $credentials := list }}
{{- range .Values.credentials.keys }}
{{- $credentials = append $credentials (dict "team_id" .teamId "key_id" .keyId "key_file" (printf "/etc/apns-relay/keys/%s" .file) "topics" .topics) }}
{{- end }}
{{- range $index, $certificate := .Values.credentials.certificates }}
{{- $entry := dict "cert_file" (printf "/etc/apns-relay/keys/%s" $certificate.file) }}
{{- with $certificate.keyFile }}{{- $_ := set $entry "key_file" (printf "/etc/apns-relay/keys/%s" .) }}{{- end }}
{{- if $certificate.passphraseSecret }}{{- $_ := set $entry "passphrase_env" (printf "APNS_RELAY_CERTIFICATE_PASSPHRASE_%d" $index) }}{{- end }}
{{- with $certificate.topics }}{{- $_ := set $entry "topics" . }}{{- end }}
{{- $credentials = append $credentials $entry }}
{{- end }}
{{- $_ := set $apns "credentials" $credentials }}
{{- $_ := set $config "apns" $apns }}
{{- toYaml $config }}
{{- end -}}

{{/*
The relay's environment (a list of EnvVar, empty when there is none): the Secrets passed as
variables, the log format and level, then extraEnv. The relay's container and the configuration
check's read the same.
*/}}
{{- define "apns-relay.env" -}}
{{- with .Values.redisUrlSecret }}
- name: APNS_RELAY_REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
{{- end }}
{{- with .Values.kafkaSaslPasswordSecret }}
- name: APNS_RELAY_KAFKA_CONFIG_SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
{{- end }}
{{- with .Values.apnsProxySecret }}
- name: APNS_RELAY_APNS_PROXY
  valueFrom:
    secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
{{- end }}
{{- range $index, $certificate := .Values.credentials.certificates }}
{{- with $certificate.passphraseSecret }}
- name: APNS_RELAY_CERTIFICATE_PASSPHRASE_{{ $index }}
  valueFrom:
    secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
{{- end }}
{{- end }}
{{- include "apns-relay.logEnv" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
APNS_RELAY_LOG_FORMAT and APNS_RELAY_LOG_LEVEL from logFormat and logLevel, each only when it
differs from the relay's own default (text, info): the default values render no variable, so an
APNS_RELAY_LOG_* of extraEnv or extraEnvFrom still counts then. Another value here and the
same variable in extraEnv is refused: a container with two definitions of one variable keeps
whichever comes last, a matter of order rather than of intent.
*/}}
{{- define "apns-relay.logEnv" -}}
{{- $extraNames := list }}
{{- range .Values.extraEnv }}{{- $extraNames = append $extraNames .name }}{{- end }}
{{- $format := .Values.logFormat | default "text" }}
{{- if ne $format "text" }}
{{- if has "APNS_RELAY_LOG_FORMAT" $extraNames }}
{{- fail (printf "logFormat %s and extraEnv both set APNS_RELAY_LOG_FORMAT: drop it from extraEnv" $format) }}
{{- end }}
- name: APNS_RELAY_LOG_FORMAT
  value: {{ $format | quote }}
{{- end }}
{{- $level := .Values.logLevel | default "info" }}
{{- if ne $level "info" }}
{{- if has "APNS_RELAY_LOG_LEVEL" $extraNames }}
{{- fail (printf "logLevel %s and extraEnv both set APNS_RELAY_LOG_LEVEL: drop it from extraEnv" $level) }}
{{- end }}
- name: APNS_RELAY_LOG_LEVEL
  value: {{ $level | quote }}
{{- end }}
{{- end -}}

{{/*
The relay's mounts: the configuration as a directory (no subPath: the kubelet swaps its ..data
link on a change and the relay's reload sees the new file), the keys, then extraVolumeMounts.
*/}}
{{- define "apns-relay.volumeMounts" -}}
- name: config
  mountPath: /etc/apns-relay/config
  readOnly: true
- name: keys
  mountPath: /etc/apns-relay/keys
  readOnly: true
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The volumes behind those mounts (dict "root" $ "configMap" <the ConfigMap's name>).
*/}}
{{- define "apns-relay.volumes" -}}
- name: config
  configMap:
    name: {{ .configMap }}
- name: keys
  secret:
    secretName: {{ .root.Values.credentials.existingSecret }}
    # Owned by root, group podSecurityContext.fsGroup: readable by the owner and group only.
    defaultMode: 0440
{{- with .root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The configuration check's objects' name (a Job's name is at most 63 characters).
*/}}
{{- define "apns-relay.configCheckName" -}}
{{- printf "%s-config-check" (include "apns-relay.fullname" . | trunc 50 | trimSuffix "-") -}}
{{- end -}}
