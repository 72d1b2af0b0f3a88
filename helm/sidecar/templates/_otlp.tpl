{{/*
The OTLP/HTTP receiver (config.otel.receiver, docs/opentelemetry.md): its port on the container,
its Service, its NetworkPolicy rule, and the guards a render can check.
*/}}

{{/* "true" when config.otel.receiver.enabled, else empty. */}}
{{- define "sidecar.otlpEnabled" -}}
{{- if dig "otel" "receiver" "enabled" false (.Values.config | default dict) }}true{{ end -}}
{{- end -}}

{{/* The receiver's port: config.otel.receiver.port, 4318 (OTLP/HTTP's) by default. */}}
{{- define "sidecar.otlpPort" -}}
{{- dig "otel" "receiver" "port" 4318 (.Values.config | default dict) | int -}}
{{- end -}}

{{/* The sidecar refuses to start an open receiver; the render says so first. */}}
{{- define "sidecar.otlpValidate" -}}
{{- if include "sidecar.otlpEnabled" . -}}
{{- $open := dig "otel" "receiver" "allow_unauthenticated" false .Values.config -}}
{{- if not (or .Values.secrets.otelReceiverBearerToken .Values.secrets.existingSecret $open) -}}
{{- fail "config.otel.receiver.enabled needs a bearer token: set secrets.otelReceiverBearerToken (SIDECAR_OTEL__RECEIVER__BEARER_TOKEN), or config.otel.receiver.allow_unauthenticated: true if a NetworkPolicy or a mesh guards the port" -}}
{{- end -}}
{{- if eq (int (include "sidecar.otlpPort" .)) (int (include "sidecar.httpPort" .)) -}}
{{- fail "config.otel.receiver.port must differ from config.http.port" -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (eq .Values.mode "deployment") (not .Values.networkPolicy.otlpFrom) -}}
{{- fail "networkPolicy.enabled with config.otel.receiver.enabled needs networkPolicy.otlpFrom: the peers that send spans (the Collector, or the agents)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
