{{/* Chart name, truncated to the 63 characters Kubernetes allows in names. */}}
{{- define "ttft-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ttft-exporter.fullname" -}}
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

{{- define "ttft-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ttft-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The labels every object of the chart carries, besides its name, instance and component. */}}
{{- define "ttft-exporter.chartLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ttft-exporter.labels" -}}
{{ include "ttft-exporter.chartLabels" . }}
{{ include "ttft-exporter.selectorLabels" . }}
app.kubernetes.io/component: aggregator
{{- end -}}

{{- define "ttft-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ttft-exporter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the push token. */}}
{{- define "ttft-exporter.pushTokenSecret" -}}
{{- default (printf "%s-push-token" (include "ttft-exporter.fullname" .)) .Values.pushToken.existingSecret -}}
{{- end -}}

{{- define "ttft-exporter.scheme" -}}
{{- if .Values.tls.enabled -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/*
The exporter's config file: the user's `config` with the chart-managed keys set. Mount paths
below must match the Deployment's volumes.
*/}}
{{- define "ttft-exporter.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- $server := deepCopy (get $cfg "server" | default dict) -}}
{{- $_ := set $server "addr" "0.0.0.0" -}}
{{- $_ := set $server "port" (int .Values.port) -}}
{{- $_ := set $cfg "server" $server -}}
{{- $agg := deepCopy (get $cfg "aggregator" | default dict) -}}
{{- $_ := set $agg "snapshot_path" "/var/lib/ttft-exporter/state" -}}
{{- $_ := set $agg "snapshot_interval_seconds" .Values.snapshotIntervalSeconds -}}
{{- if .Values.pushToken.enabled -}}
{{- $_ := set $agg "push_token_file" (printf "/var/run/secrets/ttft-exporter/push/%s" .Values.pushToken.secretKey) -}}
{{- else -}}
{{- /* the token turned off in the values: said to serve, which refuses an open /push otherwise */ -}}
{{- $_ := set $agg "allow_unauthenticated_push" true -}}
{{- end -}}
{{- if .Values.metricsAuth.bearerToken.existingSecret -}}
{{- $_ := set $agg "metrics_token_file" (printf "/var/run/secrets/ttft-exporter/metrics-token/%s" .Values.metricsAuth.bearerToken.secretKey) -}}
{{- end -}}
{{- if .Values.metricsAuth.basicAuth.username -}}
{{- $_ := set $agg "metrics_username" .Values.metricsAuth.basicAuth.username -}}
{{- $_ := set $agg "metrics_password_file" (printf "/var/run/secrets/ttft-exporter/metrics-password/%s" .Values.metricsAuth.basicAuth.secretKey) -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $agg "tls_cert_file" "/var/run/secrets/ttft-exporter/tls/tls.crt" -}}
{{- $_ := set $agg "tls_key_file" "/var/run/secrets/ttft-exporter/tls/tls.key" -}}
{{- end -}}
{{- $_ := set $cfg "aggregator" $agg -}}
{{- $alerting := deepCopy (get $cfg "alerting" | default dict) -}}
{{- $_ := set $alerting "exporter_job" (include "ttft-exporter.job" .) -}}
{{- $_ := set $cfg "alerting" $alerting -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The Prometheus job of the exporter's scrape target. The Service carries it as the label
ttft-exporter.io/job, which the ServiceMonitor names as its jobLabel; every embedded rule selects
it (the generated files' job="ttft-exporter" matcher is replaced by it).
*/}}
{{- define "ttft-exporter.job" -}}
{{- .Values.serviceMonitor.job | default (include "ttft-exporter.fullname" .) -}}
{{- end -}}

{{/* A file of files/alerts with its job matcher set to this release's job. */}}
{{- define "ttft-exporter.rulesFile" -}}
{{- $job := include "ttft-exporter.job" .root -}}
{{- .root.Files.Get .path | replace "job=~\"ttft-exporter\"" (printf "job=~%q" (regexQuoteMeta $job)) -}}
{{- end -}}

{{/*
The rules and dashboards of files/ were generated from one config (files/generated-config.yaml):
refuse values whose config differs in what they depend on, instead of serving rules and
dashboards that disagree with the exporter (regenerate them with that config).
*/}}
{{- define "ttft-exporter.checkGenerated" -}}
{{- if or .Values.prometheusRule.enabled .Values.dashboards.enabled -}}
{{- $gen := .Files.Get "files/generated-config.yaml" | fromYaml | default dict -}}
{{- $cfg := .Values.config | default dict -}}
{{- $drift := list -}}
{{- range $section := list "slos" "alerting" -}}
{{- $mine := get $cfg $section | default dict -}}
{{- if kindIs "map" $mine -}}{{- $mine = omit $mine "exporter_job" -}}{{- end -}}
{{- if not (deepEqual ($mine | default dict) (get $gen $section | default dict)) -}}
{{- $drift = append $drift (printf "config.%s" $section) -}}
{{- end -}}
{{- end -}}
{{- range $path := list "labels.tenant_policy" "labels.max_tenants" "labels.max_series" "labels.tenant_families" "window.seconds" -}}
{{- $keys := splitList "." $path -}}
{{- $a := get (get $cfg (first $keys) | default dict) (last $keys) -}}
{{- $b := get (get $gen (first $keys) | default dict) (last $keys) -}}
{{- if eq $path "labels.tenant_policy" -}}{{- /* only an allowlist changes the rules */ -}}
{{- $a = eq (toString $a) "allowlist" -}}{{- $b = eq (toString $b) "allowlist" -}}
{{- end -}}
{{- if not (deepEqual $a $b) -}}
{{- $drift = append $drift (printf "config.%s" $path) -}}
{{- end -}}
{{- end -}}
{{- if $drift -}}
{{- fail (printf "%s differ from the config the chart's rules and dashboards were generated from (files/generated-config.yaml), so they would drift from the exporter: write the config to a file, run `ttft-exporter generate --config FILE` at the repository's top (it rewrites files/), or set prometheusRule.enabled and dashboards.enabled to false" (join ", " $drift)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The watch (`ttft-exporter watch`). The aggregator's Deployment selects every pod labeled with
the chart's name and the release (a selector cannot change on upgrade), so the watch's pods
carry the name with "-watch": neither the aggregator's Deployment nor its Service take them.
*/}}
{{- define "ttft-exporter.watchFullname" -}}
{{- printf "%s-watch" (include "ttft-exporter.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}

{{- define "ttft-exporter.watchSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-watch" (include "ttft-exporter.name" . | trunc 57 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ttft-exporter.watchLabels" -}}
{{ include "ttft-exporter.chartLabels" . }}
{{ include "ttft-exporter.watchSelectorLabels" . }}
app.kubernetes.io/component: watch
app.kubernetes.io/part-of: {{ include "ttft-exporter.name" . }}
{{- end -}}

{{/*
The watch's Service: labeled with the chart's name and the release like the aggregator's, as
the ServiceMonitor selects Services by them (one ServiceMonitor scrapes both); its selector
takes the watch's pods only.
*/}}
{{- define "ttft-exporter.watchServiceLabels" -}}
{{ include "ttft-exporter.chartLabels" . }}
{{ include "ttft-exporter.selectorLabels" . }}
app.kubernetes.io/component: watch
{{- end -}}
