{{/*
The chart's name: nameOverride or cdc-outbox. It is also the value of
app.kubernetes.io/name, which the ServiceMonitor takes for the job label:
alerts.yml and the dashboard expect job="cdc-outbox".
*/}}
{{- define "cdc-outbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release name when it contains
the chart name, else <release>-<chart>; at most 63 characters (a DNS label).
*/}}
{{- define "cdc-outbox.fullname" -}}
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

{{- define "cdc-outbox.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels of every object. */}}
{{- define "cdc-outbox.labels" -}}
helm.sh/chart: {{ include "cdc-outbox.chart" . }}
{{ include "cdc-outbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: streamer
{{- end }}

{{/* The labels that select the release's pods; never changed by an upgrade. */}}
{{- define "cdc-outbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cdc-outbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cdc-outbox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cdc-outbox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cdc-outbox.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Where the secrets' files are mounted. */}}
{{- define "cdc-outbox.configDir" -}}/etc/cdc-outbox/config{{- end }}
{{- define "cdc-outbox.postgresTLSDir" -}}/etc/cdc-outbox/postgres-tls{{- end }}
{{- define "cdc-outbox.kafkaTLSDir" -}}/etc/cdc-outbox/kafka-tls{{- end }}
{{- define "cdc-outbox.kafkaSASLDir" -}}/etc/cdc-outbox/kafka-sasl{{- end }}

{{/*
The configuration file: .Values.config with the keys the chart owns. Fails
on a key the chart sets itself, so that no value is overridden silently.
*/}}
{{- define "cdc-outbox.config" -}}
{{- $config := deepCopy .Values.config }}
{{- range $key := list "http-addr" "shutdown-timeout" "kafka-sasl-password" "kafka-sasl-password-file" "kafka-tls" "kafka-tls-ca-file" "kafka-tls-cert-file" "kafka-tls-key-file" "config" }}
{{- if hasKey $config $key }}
{{- fail (printf "config.%s: the chart sets it (docs/kubernetes.md, values.yaml); remove it from config" $key) }}
{{- end }}
{{- end }}
{{- if not (get $config "postgres-url") }}
{{- fail "config.postgres-url is required: the PostgreSQL connection URL, without the password (postgres.passwordSecret)" }}
{{- end }}
{{- if not (get $config "kafka-brokers") }}
{{- fail "config.kafka-brokers is required: the Kafka bootstrap brokers, a list of host:port" }}
{{- end }}
{{- $_ := set $config "http-addr" (printf ":%d" (int .Values.port)) }}
{{- $_ := set $config "shutdown-timeout" (printf "%ds" (int .Values.shutdownTimeoutSeconds)) }}
{{- with .Values.kafka.sasl.passwordSecret.name }}
{{- $_ := set $config "kafka-sasl-password-file" (printf "%s/password" (include "cdc-outbox.kafkaSASLDir" $)) }}
{{- end }}
{{- with .Values.kafka.tls }}
{{- if .enabled }}
{{- $_ := set $config "kafka-tls" true }}
{{- if .secretName }}
{{- if .caKey }}
{{- $_ := set $config "kafka-tls-ca-file" (printf "%s/%s" (include "cdc-outbox.kafkaTLSDir" $) .caKey) }}
{{- end }}
{{- if .certKey }}
{{- $_ := set $config "kafka-tls-cert-file" (printf "%s/%s" (include "cdc-outbox.kafkaTLSDir" $) .certKey) }}
{{- $_ := set $config "kafka-tls-key-file" (printf "%s/%s" (include "cdc-outbox.kafkaTLSDir" $) .keyKey) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $config }}
{{- end }}
