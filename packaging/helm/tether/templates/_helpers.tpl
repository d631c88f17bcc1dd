{{/*
The labels Helm's conventions add to every object's metadata. The objects
are otherwise those of packaging/kubernetes/, and packaging/helm_test.go
compares them without these keys.
*/}}
{{- define "tether.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: tether
{{- end }}

{{/*
tether.namespace is the release's namespace, which must be tether-system:
tether-gateway and tether-edge keep the pools' election records there
(poolstore.RecordNamespace), and the RBAC grants them access there.
*/}}
{{- define "tether.namespace" -}}
{{- if ne .Release.Namespace "tether-system" -}}
{{- fail (printf "install Tether into the namespace tether-system (helm install -n tether-system --create-namespace ...), not %q: tether-gateway and tether-edge keep the pools' election records there" .Release.Namespace) -}}
{{- end -}}
{{ .Release.Namespace }}
{{- end }}

{{/*
tether.gatewaySubjects: who the gateway's bindings name. The
ServiceAccount when it runs in the cluster, the user tether-gateway (a
client certificate with CN=tether-gateway) when it runs on a VPC host from
the packages or the image.
*/}}
{{- define "tether.gatewaySubjects" -}}
subjects:
  - kind: ServiceAccount
    name: tether-gateway
    namespace: {{ include "tether.namespace" . }}
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: tether-gateway
{{- end }}

{{- define "tether.image" -}}
{{ .repository }}:{{ .tag }}
{{- end }}

{{/*
tether.hostsConfigMap splits gateway.hostsConfigMap (namespace/name) into
a list of the two, failing on anything else.
*/}}
{{- define "tether.hostsConfigMap" -}}
{{- $parts := splitList "/" .Values.gateway.hostsConfigMap -}}
{{- if or (ne (len $parts) 2) (not (index $parts 0)) (not (index $parts 1)) -}}
{{- fail (printf "gateway.hostsConfigMap must be namespace/name (as tether-gateway's --hosts-configmap), not %q" .Values.gateway.hostsConfigMap) -}}
{{- end -}}
{{ toJson $parts }}
{{- end }}
