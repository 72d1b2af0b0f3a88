{{/*
Names, labels and the computed sidecar configuration shared by the templates.
*/}}

{{- define "sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sidecar.fullname" -}}
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

{{- define "sidecar.vllmName" -}}
{{- printf "%s-vllm" (include "sidecar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every resource; "component" tells the sidecar from vLLM. */}}
{{- define "sidecar.labels" -}}
helm.sh/chart: {{ include "sidecar.chart" . }}
app.kubernetes.io/name: {{ include "sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llm-agent-sidecar
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: consumer
{{- end -}}

{{- define "sidecar.vllmSelectorLabels" -}}
app.kubernetes.io/name: {{ include "sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: vllm
{{- end -}}

{{/* An "annotations:" block (commonAnnotations plus the dict "extra"), indented by "indent"; nothing when empty. */}}
{{- define "sidecar.annotations" -}}
{{- $all := merge (deepCopy (.extra | default dict)) (deepCopy (.root.Values.commonAnnotations | default dict)) -}}
{{- with $all -}}
{{- printf "annotations:\n%s" (toYaml . | indent 2) | nindent $.indent -}}
{{- end -}}
{{- end -}}

{{- define "sidecar.image" -}}
{{- $repo := .image.repository -}}
{{- if .image.registry -}}
{{- $repo = printf "%s/%s" .image.registry .image.repository -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (.image.tag | default .appVersion) -}}
{{- end -}}
{{- end -}}

{{- define "sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sidecar.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Secret env vars the chart renders, variable name to value (empty values left out). */}}
{{- define "sidecar.secretEnv" -}}
{{- $s := .Values.secrets -}}
{{- $env := dict -}}
{{- if $s.kafkaSaslPassword }}{{ $_ := set $env "SIDECAR_KAFKA__SASL_PASSWORD" $s.kafkaSaslPassword }}{{ end -}}
{{- if $s.kafkaJournalSigningKeys }}{{ $_ := set $env "SIDECAR_KAFKA__JOURNAL_SIGNING_KEYS" (toJson $s.kafkaJournalSigningKeys) }}{{ end -}}
{{- if $s.vllmApiKey }}{{ $_ := set $env "SIDECAR_SCORING__VLLM__API_KEY" $s.vllmApiKey }}{{ end -}}
{{- if $s.clusteringLlmApiKey }}{{ $_ := set $env "SIDECAR_CLUSTERING__LLM__API_KEY" $s.clusteringLlmApiKey }}{{ end -}}
{{- if $s.clusteringEmbeddingApiKey }}{{ $_ := set $env "SIDECAR_CLUSTERING__EMBEDDING__API_KEY" $s.clusteringEmbeddingApiKey }}{{ end -}}
{{- if $s.judgeLlmApiKey }}{{ $_ := set $env "SIDECAR_JUDGE__LLM__API_KEY" $s.judgeLlmApiKey }}{{ end -}}
{{- if $s.alertingMqttPassword }}{{ $_ := set $env "SIDECAR_ALERTING__SINKS__MQTT__PASSWORD" $s.alertingMqttPassword }}{{ end -}}
{{- if $s.alertingWebhookSecret }}{{ $_ := set $env "SIDECAR_ALERTING__SINKS__WEBHOOK__SECRET" $s.alertingWebhookSecret }}{{ end -}}
{{- if $s.alertingAlertmanagerBearerToken }}{{ $_ := set $env "SIDECAR_ALERTING__SINKS__ALERTMANAGER__BEARER_TOKEN" $s.alertingAlertmanagerBearerToken }}{{ end -}}
{{- if $s.evaluationsOtlpHeaders }}{{ $_ := set $env "SIDECAR_EVALUATIONS__OTLP__HEADERS" (toJson $s.evaluationsOtlpHeaders) }}{{ end -}}
{{- if $s.evaluationsLangfusePublicKey }}{{ $_ := set $env "SIDECAR_EVALUATIONS__LANGFUSE__PUBLIC_KEY" $s.evaluationsLangfusePublicKey }}{{ end -}}
{{- if $s.evaluationsLangfuseSecretKey }}{{ $_ := set $env "SIDECAR_EVALUATIONS__LANGFUSE__SECRET_KEY" $s.evaluationsLangfuseSecretKey }}{{ end -}}
{{- if $s.evaluationsPhoenixApiKey }}{{ $_ := set $env "SIDECAR_EVALUATIONS__PHOENIX__API_KEY" $s.evaluationsPhoenixApiKey }}{{ end -}}
{{- if $s.otelReceiverBearerToken }}{{ $_ := set $env "SIDECAR_OTEL__RECEIVER__BEARER_TOKEN" $s.otelReceiverBearerToken }}{{ end -}}
{{- range $k, $v := $s.extraEnv }}{{ $_ := set $env $k $v }}{{ end -}}
{{- toJson $env -}}
{{- end -}}

{{/* Name of the Secret the pods read SIDECAR_* variables from; empty when there is none. */}}
{{- define "sidecar.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else if ne (include "sidecar.secretEnv" .) "{}" -}}
{{- include "sidecar.fullname" . -}}
{{- end -}}
{{- end -}}

{{/*
The configuration file: values.config, with the chart's vLLM Service as the scoring endpoint when
vllm.enabled and the values name none. Rendered as JSON (valid YAML): toYaml would print large
integers in exponent form, which YAML readers take for strings.
*/}}
{{- define "sidecar.config" -}}
{{- $defaults := dict -}}
{{- if .Values.vllm.enabled -}}
{{- $url := printf "http://%s:%d/v1" (include "sidecar.vllmName" .) (int .Values.vllm.service.port) -}}
{{- $_ := set $defaults "scoring" (dict "vllm" (dict "base_url" $url "base_model" .Values.vllm.servedModelName)) -}}
{{- end -}}
{{- $config := mergeOverwrite $defaults (deepCopy (.Values.config | default dict)) -}}
{{- $listeners := include "sidecar.listenerConfig" . | fromJson -}}
{{- if $listeners -}}
{{- $_ := set $config "http" (mergeOverwrite (deepCopy (dig "http" dict $config)) $listeners) -}}
{{- end -}}
{{- $config | toPrettyJson -}}
{{- end -}}

{{/* Guards that the schema cannot express. */}}
{{- define "sidecar.validate" -}}
{{- $kafka := .Values.config.kafka | default dict -}}
{{- $needed := add (int (ceil (addf (dig "revoke_grace_seconds" 5.0 $kafka) (dig "revoke_flush_timeout_seconds" 10.0 $kafka)))) 10 -}}
{{- if lt (int .Values.terminationGracePeriodSeconds) $needed -}}
{{- fail (printf "terminationGracePeriodSeconds=%d is too short: the sidecar needs config.kafka.revoke_grace_seconds + revoke_flush_timeout_seconds + 10 s = %d s to hand its partitions over cleanly" (int .Values.terminationGracePeriodSeconds) $needed) -}}
{{- end -}}
{{- if and (eq .Values.mode "inPod") (not .Values.inPod.podSelector) -}}
{{- fail "mode=inPod needs inPod.podSelector: the labels of the agent pods that carry the sidecar container" -}}
{{- end -}}
{{- if and .Values.autoscaling.keda.enabled (eq .Values.mode "inPod") -}}
{{- fail "autoscaling.keda.enabled scales the chart's Deployment, which mode=inPod does not render" -}}
{{- end -}}
{{- if gt (int .Values.autoscaling.keda.minReplicas) (int .Values.autoscaling.keda.maxReplicas) -}}
{{- fail "autoscaling.keda.minReplicas must not exceed autoscaling.keda.maxReplicas" -}}
{{- end -}}
{{- include "sidecar.listenersValidate" . -}}
{{- end -}}
