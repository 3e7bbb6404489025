{{- define "chronotope.labels" -}}
app.kubernetes.io/name: chronotope
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "chronotope.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{- define "chronotope.kubeSchedulerImage" -}}
{{- if .Values.scheduler.kubeSchedulerImage -}}
{{ .Values.scheduler.kubeSchedulerImage }}
{{- else -}}
registry.k8s.io/kube-scheduler:{{ regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- end -}}
{{- end }}
