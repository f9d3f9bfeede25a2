{{/*
The labels every object carries, the same as manifests/base: app.kubernetes.io/name is the
component (also the selectors' only key, which must never change on an upgrade) and part-of ties
them together. No helm.sh/chart or release labels, so the objects stay identical to the kustomize
ones and the selectors stay valid whatever the release is called.
*/}}
{{- define "gpushare.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: gpushare
{{- end }}

{{/* A container image from an images.<x> entry. */}}
{{- define "gpushare.image" -}}
{{ .repository }}:{{ .tag }}
{{- end }}

{{/*
The identity the API server gives the plugin's ServiceAccount token: the admission policy matches
it, so it follows the release's namespace.
*/}}
{{- define "gpushare.pluginUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpushare-device-plugin
{{- end }}

{{/* The same for the DRA driver's ServiceAccount (dra.admissionPolicy). */}}
{{- define "gpushare.draDriverUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpushare-dra-driver
{{- end }}

{{/* The name of the second scheduler, of either kind; also its Lease and ConfigMap prefix. */}}
{{- define "gpushare.schedulerName" -}}
gpushare-scheduler
{{- end }}

{{/*
Settings no template can honour, refused before anything renders (values.schema.json checks the
types and enums).
*/}}
{{- define "gpushare.validate" -}}
{{- if and .Values.tls.enabled (eq .Values.scheduler.mode "secondScheduler") }}
{{- fail "tls.enabled needs scheduler.mode=extender: the second scheduler's configuration calls the extender over plain HTTP (use manifests/mtls/kube-scheduler-config.yaml with the default scheduler)" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.tls.enabled (not .Values.metrics.serviceMonitor.tlsConfig) }}
{{- fail "metrics.serviceMonitor with tls.enabled needs metrics.serviceMonitor.tlsConfig: the extender requires a client certificate on /metrics" }}
{{- end }}
{{- end }}
