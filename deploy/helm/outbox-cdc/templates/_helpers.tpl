{{/* Names and labels. */}}
{{- define "outbox-cdc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "outbox-cdc.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "outbox-cdc.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "outbox-cdc.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "outbox-cdc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-cdc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "outbox-cdc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "outbox-cdc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "outbox-cdc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outbox-cdc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Where the secrets are mounted: one directory per secret. */}}
{{- define "outbox-cdc.secretDir" -}}
/var/run/secrets/outbox-cdc/{{ . }}
{{- end }}

{{/*
The connector's configuration file: .Values.config with the keys the chart
owns set by it (http.listen, and the *_file keys of the mounted secrets).
Refuses what cannot work in this deployment.
*/}}
{{- define "outbox-cdc.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $s := .Values.secrets }}
{{- $pg := dig "postgres" dict $cfg }}
{{- $kafka := dig "kafka" dict $cfg }}
{{- if not (or (dig "dsn" "" $pg) $s.postgresDSN.existingSecret) }}
{{- fail "config.postgres.dsn is required: set it (without a password; see secrets.postgresPassword) or name a Secret in secrets.postgresDSN.existingSecret" }}
{{- end }}
{{- if not (dig "brokers" list $kafka) }}
{{- fail "config.kafka.brokers is required: a list of host:port" }}
{{- end }}
{{- if and (dig "http" "listen" "" $cfg) (ne (dig "http" "listen" "" $cfg) (printf "0.0.0.0:%v" .Values.service.port)) }}
{{- fail "config.http.listen is set by the chart (0.0.0.0:<service.port>, where the probes and Prometheus connect): remove it and set service.port" }}
{{- end }}
{{- range .Values.env }}
{{- if eq .name "OUTBOX_CDC_HTTP_LISTEN" }}
{{- fail "env OUTBOX_CDC_HTTP_LISTEN: the chart sets http.listen (0.0.0.0:<service.port>, where the probes and Prometheus connect): remove it and set service.port" }}
{{- end }}
{{- end }}
{{- if eq (dig "checkpoint" "store" "table" $cfg) "file" }}
{{- fail "config.checkpoint.store file: the replicas cannot share a file, the root filesystem is read-only and a pod's files go with it; use table (the default, in the database)" }}
{{- end }}
{{- if and (dig "http" "pprof" false $cfg) (not (and .Values.networkPolicy.enabled (dig "http" "pprof_any_address" false $cfg))) }}
{{- fail (printf "config.http.pprof: the chart listens on 0.0.0.0:%v, so the profiler (heap contents, secrets included) would be served to every pod that reaches it: set networkPolicy.enabled (networkPolicy.ingressFrom names who may connect) and config.http.pprof_any_address: true, or leave http.pprof off" .Values.service.port) }}
{{- end }}
{{- $_ := set $cfg "http" (merge (dict "listen" (printf "0.0.0.0:%v" .Values.service.port)) (dig "http" dict $cfg)) }}
{{- if $s.postgresPassword.existingSecret }}
{{- $_ := set $pg "password_file" (printf "%s/%s" (include "outbox-cdc.secretDir" "postgres-password") $s.postgresPassword.key) }}
{{- end }}
{{- if $s.kafkaSASLPassword.existingSecret }}
{{- $sasl := dig "sasl" dict $kafka }}
{{- $_ := set $sasl "password_file" (printf "%s/%s" (include "outbox-cdc.secretDir" "kafka-sasl-password") $s.kafkaSASLPassword.key) }}
{{- $_ := set $kafka "sasl" $sasl }}
{{- end }}
{{- with $s.kafkaTLS }}
{{- if .existingSecret }}
{{- $dir := include "outbox-cdc.secretDir" "kafka-tls" }}
{{- $tls := dig "tls" dict $kafka }}
{{- $_ := set $tls "enabled" true }}
{{- if .caKey }}{{ $_ := set $tls "ca_file" (printf "%s/%s" $dir .caKey) }}{{ end }}
{{- if .certKey }}{{ $_ := set $tls "cert_file" (printf "%s/%s" $dir .certKey) }}{{ end }}
{{- if .keyKey }}{{ $_ := set $tls "key_file" (printf "%s/%s" $dir .keyKey) }}{{ end }}
{{- $_ := set $kafka "tls" $tls }}
{{- end }}
{{- end }}
{{- if or $s.kafkaOAuthClientSecret.existingSecret $s.kafkaOAuthToken.existingSecret }}
{{- $sasl := dig "sasl" dict $kafka }}
{{- $oauth := dig "oauth" dict $sasl }}
{{- if $s.kafkaOAuthClientSecret.existingSecret }}
{{- $_ := set $oauth "client_secret_file" (printf "%s/%s" (include "outbox-cdc.secretDir" "kafka-oauth-client-secret") $s.kafkaOAuthClientSecret.key) }}
{{- end }}
{{- if $s.kafkaOAuthToken.existingSecret }}
{{- $_ := set $oauth "token_file" (printf "%s/%s" (include "outbox-cdc.secretDir" "kafka-oauth-token") $s.kafkaOAuthToken.key) }}
{{- end }}
{{- $_ := set $sasl "oauth" $oauth }}
{{- $_ := set $kafka "sasl" $sasl }}
{{- end }}
{{- $_ := set $cfg "postgres" $pg }}
{{- $_ := set $cfg "kafka" $kafka }}
{{- toYaml $cfg }}
{{- end }}

{{/* The series of this release, as the monitors label them (job). */}}
{{- define "outbox-cdc.alertSelector" -}}
job="{{ include "outbox-cdc.fullname" . }}", namespace="{{ .Release.Namespace }}"
{{- end }}

{{/*
Both monitors label the series job=<fullname>, so the alert rules select the
same series whichever scrapes them.
*/}}
{{- define "outbox-cdc.jobRelabeling" -}}
- action: replace
  targetLabel: job
  replacement: {{ include "outbox-cdc.fullname" . }}
{{- end }}

{{- define "outbox-cdc.checkMonitors" -}}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor and metrics.podMonitor both scrape the same pods (every series twice): enable one" }}
{{- end }}
{{- end }}
