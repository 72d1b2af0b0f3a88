{{/*
The sidecar's two HTTP listeners (config.http, docs/security.md): the scrape listener's and the
operator listener's ports, the web-config Secret mounted for them and for the OTLP receiver
(webConfig.otlp), and the guards a render can check.
*/}}

{{/* The scrape listener's port (/metrics, /healthz, /readyz): config.http.scrape.port, else config.http.port. */}}
{{- define "sidecar.httpPort" -}}
{{- $http := dig "http" dict (.Values.config | default dict) -}}
{{- $own := dig "scrape" "port" nil $http -}}
{{- if kindIs "invalid" $own -}}
{{- dig "port" 9108 $http | int -}}
{{- else -}}
{{- $own | int -}}
{{- end -}}
{{- end -}}

{{/* The operator listener's own port (config.http.operator.port); empty when its routes share the scrape listener or are off. */}}
{{- define "sidecar.operatorPort" -}}
{{- $operator := dig "http" "operator" dict (.Values.config | default dict) -}}
{{- if and (dig "enabled" true $operator) (not (kindIs "invalid" (dig "port" nil $operator))) -}}
{{- $operator.port | int -}}
{{- end -}}
{{- end -}}

{{/* "true" when the scrape listener serves TLS, else empty. */}}
{{- define "sidecar.scrapeTls" -}}
{{- $w := .Values.webConfig.scrape -}}
{{- if and $w.enabled (or $w.tls (dig "tls_server_config" "cert_file" "" ($w.config | default dict))) }}true{{ end -}}
{{- end -}}

{{/* Name of the Secret holding the web-config files; empty when no listener has one. */}}
{{- define "sidecar.webConfigSecret" -}}
{{- if or .Values.webConfig.scrape.enabled .Values.webConfig.operator.enabled .Values.webConfig.otlp.enabled -}}
{{- .Values.webConfig.existingSecret | default (printf "%s-web-config" (include "sidecar.fullname" .) | trunc 63 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{/* The web-config files the chart renders, file name to content (JSON); "{}" with an existing Secret. */}}
{{- define "sidecar.webConfigFiles" -}}
{{- $files := dict -}}
{{- if not .Values.webConfig.existingSecret -}}
{{- range $name := list "scrape" "operator" "otlp" -}}
{{- $w := index $.Values.webConfig $name -}}
{{- if $w.enabled }}{{ $_ := set $files (printf "%s.yml" $name) (toYaml ($w.config | default dict)) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/* config.http entries the chart sets: each protected listener's web_config_file. */}}
{{- define "sidecar.listenerConfig" -}}
{{- $http := dict -}}
{{- range $name := list "scrape" "operator" -}}
{{- if (index $.Values.webConfig $name).enabled -}}
{{- $_ := set $http $name (dict "web_config_file" (printf "%s/%s.yml" (trimSuffix "/" $.Values.webConfig.mountPath) $name)) -}}
{{- end -}}
{{- end -}}
{{- toJson $http -}}
{{- end -}}

{{/* config.otel.receiver entries the chart sets: the OTLP receiver's web_config_file (TLS; its
authentication stays the bearer token, basic_auth_users are refused there). */}}
{{- define "sidecar.otlpListenerConfig" -}}
{{- if .Values.webConfig.otlp.enabled -}}
{{- toJson (dict "web_config_file" (printf "%s/otlp.yml" (trimSuffix "/" .Values.webConfig.mountPath))) -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/* The probes' and the ServiceMonitor's view of the listeners must match the sidecar's. */}}
{{- define "sidecar.listenersValidate" -}}
{{- $w := .Values.webConfig -}}
{{- $http := dig "http" dict (.Values.config | default dict) -}}
{{- if not (dig "scrape" "enabled" true $http) -}}
{{- fail "config.http.scrape.enabled: false leaves the probes and Prometheus nothing to reach; the chart needs the scrape listener" -}}
{{- end -}}
{{- range $name := list "scrape" "operator" -}}
{{- if and (index $w $name).enabled (dig $name "web_config_file" "" $http) -}}
{{- fail (printf "webConfig.%s.enabled sets config.http.%s.web_config_file: leave that one unset" $name $name) -}}
{{- end -}}
{{- end -}}
{{- if $w.otlp.enabled -}}
{{- if not (include "sidecar.otlpEnabled" .) -}}
{{- fail "webConfig.otlp.enabled needs config.otel.receiver.enabled: otlp.yml is the OTLP receiver's web-config file" -}}
{{- end -}}
{{- if dig "otel" "receiver" "web_config_file" "" (.Values.config | default dict) -}}
{{- fail "webConfig.otlp.enabled sets config.otel.receiver.web_config_file: leave that one unset" -}}
{{- end -}}
{{- if dig "basic_auth_users" nil ($w.otlp.config | default dict) -}}
{{- fail "webConfig.otlp.config.basic_auth_users: the OTLP receiver authenticates by bearer token (secrets.otelReceiverBearerToken), not by basic-auth users" -}}
{{- end -}}
{{- end -}}
{{- if and $w.operator.enabled (not (include "sidecar.operatorPort" .)) -}}
{{- fail "webConfig.operator.enabled needs config.http.operator.port: without it the operator routes share the scrape listener and webConfig.scrape protects them" -}}
{{- end -}}
{{- if and $w.scrape.tls (not $w.scrape.enabled) -}}
{{- fail "webConfig.scrape.tls needs webConfig.scrape.enabled: the scrape listener serves TLS only from its web-config file" -}}
{{- end -}}
{{- $operatorPort := include "sidecar.operatorPort" . -}}
{{- if and $operatorPort (eq (int $operatorPort) (int (include "sidecar.httpPort" .))) -}}
{{- fail "config.http.operator.port must differ from the scrape listener's port (config.http.port)" -}}
{{- end -}}
{{- if and .Values.helmTest.enabled $w.scrape.enabled -}}
{{- fail "helmTest.enabled: the test pod reads /metrics in plain HTTP without credentials, which webConfig.scrape.enabled refuses; set helmTest.enabled: false" -}}
{{- end -}}
{{- end -}}
