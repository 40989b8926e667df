{{/* The agent's config: .Values.config, with the metrics TLS files of metricsTLSSecret. */}}
{{- define "kubenet.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.metricsTLSSecret -}}
{{- $_ := set $config "metricsTLSCertFile" "/etc/kubenet/metrics-tls/tls.crt" -}}
{{- $_ := set $config "metricsTLSKeyFile" "/etc/kubenet/metrics-tls/tls.key" -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The metrics port: the port of config.metricsAddress (":10266", "HOST:PORT"), or "" when it is "off". */}}
{{- define "kubenet.metricsPort" -}}
{{- $a := .Values.config.metricsAddress | default ":10266" | toString -}}
{{- if ne $a "off" -}}{{ regexFind "[0-9]+$" $a }}{{- end -}}
{{- end -}}

{{/* The metrics port speaks TLS: with metricsAuth kubernetes (self-signed unless given) or a certificate. */}}
{{- define "kubenet.metricsScheme" -}}
{{- if or (eq (.Values.config.metricsAuth | default "none") "kubernetes") .Values.metricsTLSSecret .Values.config.metricsTLSCertFile -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}
