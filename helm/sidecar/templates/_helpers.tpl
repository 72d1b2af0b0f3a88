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
vllm.enabled and the values name none, and scoring.routing.enabled true when the adapter loop and
scoring are enabled and the values do not set it. Rendered as JSON (valid YAML): toYaml would print large
integers in exponent form, which YAML readers take for strings.
*/}}
{{- define "sidecar.config" -}}
{{- $defaults := dict -}}
{{- if .Values.vllm.enabled -}}
{{- $url := printf "http://%s:%d/v1" (include "sidecar.vllmName" .) (int .Values.vllm.service.port) -}}
{{- $_ := set $defaults "scoring" (dict "vllm" (dict "base_url" $url "base_model" .Values.vllm.servedModelName)) -}}
{{- end -}}
{{- $config := mergeOverwrite $defaults (deepCopy (.Values.config | default dict)) -}}
{{- /* Live adapter routing (scoring.routing, docs/adapter-loop.md) is on with the adapter loop, unless
       the values say otherwise: its job writes the routing topic the replicas follow. */ -}}
{{- $scoring := dig "scoring" dict $config -}}
{{- if and .Values.adapterLoop.enabled (dig "enabled" false $scoring) (kindIs "invalid" (dig "routing" "enabled" nil $scoring)) -}}
{{- $_ := set $scoring "routing" (merge (dict "enabled" true) (dig "routing" dict $scoring)) -}}
{{- end -}}
{{- $listeners := include "sidecar.listenerConfig" . | fromJson -}}
{{- if $listeners -}}
{{- $_ := set $config "http" (mergeOverwrite (deepCopy (dig "http" dict $config)) $listeners) -}}
{{- end -}}
{{- $otlp := include "sidecar.otlpListenerConfig" . | fromJson -}}
{{- if $otlp -}}
{{- $otel := deepCopy (dig "otel" dict $config) -}}
{{- $_ := set $otel "receiver" (mergeOverwrite (deepCopy (dig "receiver" dict $otel)) $otlp) -}}
{{- $_ := set $config "otel" $otel -}}
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
{{- include "sidecar.adapterLoopValidate" . -}}
{{- end -}}

{{/* Labels of the adapter loop's pods (not the consumer's: the Service and the PDB must not select them). */}}
{{- define "sidecar.adapterLoopSelectorLabels" -}}
app.kubernetes.io/name: {{ include "sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: adapter-loop
{{- end -}}

{{/* The /metrics URLs the adapter loop reads (JSON list): adapterLoop.metricsUrls, else the chart's
metrics Service, which answers from one replica per request. */}}
{{- define "sidecar.adapterLoopMetricsUrls" -}}
{{- if .Values.adapterLoop.metricsUrls -}}
{{- toJson .Values.adapterLoop.metricsUrls -}}
{{- else -}}
{{- list (printf "http://%s.%s.svc:%d/metrics" (include "sidecar.fullname" .) .Release.Namespace (include "sidecar.httpPort" . | int)) | toJson -}}
{{- end -}}
{{- end -}}

{{/* The vLLM servers the adapter loop loads promoted adapters into (JSON list): adapterLoop.vllmUrls,
else the chart's vLLM Service when vllm.enabled. */}}
{{- define "sidecar.adapterLoopVllmUrls" -}}
{{- if .Values.adapterLoop.vllmUrls -}}
{{- toJson .Values.adapterLoop.vllmUrls -}}
{{- else if .Values.vllm.enabled -}}
{{- list (printf "http://%s.%s.svc:%d" (include "sidecar.vllmName" .) .Release.Namespace (int .Values.vllm.service.port)) | toJson -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/* What the adapter loop needs from the rest of the values. */}}
{{- define "sidecar.adapterLoopValidate" -}}
{{- $a := .Values.adapterLoop -}}
{{- if $a.enabled -}}
{{- $scoring := dig "scoring" dict (.Values.config | default dict) -}}
{{- if not (dig "enabled" false $scoring) -}}
{{- fail "adapterLoop.enabled needs config.scoring.enabled: the job re-onboards agents from the scorers' metrics and writes the routes the scorers follow" -}}
{{- end -}}
{{- if not (dig "routing" "enabled" true $scoring) -}}
{{- fail "adapterLoop.enabled needs config.scoring.routing.enabled (leave it unset): the replicas must follow the routing topic the job writes" -}}
{{- end -}}
{{- if and .Values.vllm.enabled (not .Values.vllm.adapters.runtimeLoading) -}}
{{- fail "adapterLoop.enabled with vllm.enabled needs vllm.adapters.runtimeLoading: the job loads each promoted adapter into vLLM at run time (POST /v1/load_lora_adapter)" -}}
{{- end -}}
{{- if and .Values.vllm.enabled (gt (int .Values.vllm.replicaCount) 1) (not $a.vllmUrls) -}}
{{- fail "adapterLoop.enabled with vllm.replicaCount > 1: the vLLM Service would load a promoted adapter into one pod only; list every server in adapterLoop.vllmUrls" -}}
{{- end -}}
{{- if not (include "sidecar.adapterLoopVllmUrls" . | fromJsonArray) -}}
{{- fail "adapterLoop.enabled needs a vLLM to load promoted adapters into: vllm.enabled, or the servers in adapterLoop.vllmUrls" -}}
{{- end -}}
{{- if not .Values.vllm.adapters.volume -}}
{{- fail "adapterLoop.enabled needs vllm.adapters.volume: the job writes its onboardings under /adapters/onboarding, where vLLM loads them from" -}}
{{- end -}}
{{- if .Values.webConfig.scrape.enabled -}}
{{- fail "adapterLoop.enabled: the job reads /metrics in plain HTTP without credentials, which webConfig.scrape.enabled refuses" -}}
{{- end -}}
{{- end -}}
{{- end -}}
