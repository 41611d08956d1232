{{/*
The release's full name: the release name, or `<release>-granary` when the release name does not
contain "granary"; at most 63 characters (a DNS label) less room for the `-metrics` suffix.
*/}}
{{- define "granary.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "granary.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels selecting the operator pods (immutable: the Deployment's selector). */}}
{{- define "granary.selectorLabels" -}}
app.kubernetes.io/name: granary
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels of every object of the chart. */}}
{{- define "granary.labels" -}}
{{ include "granary.selectorLabels" . }}
helm.sh/chart: {{ include "granary.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The operator's ServiceAccount. */}}
{{- define "granary.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "granary.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image. */}}
{{- define "granary.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The worker image: `workers.image`, each part defaulting to the operator image's. */}}
{{- define "granary.workerImage" -}}
{{- $repository := .Values.workers.image.repository | default .Values.image.repository -}}
{{- $tag := .Values.workers.image.tag | default .Values.image.tag | default .Chart.AppVersion -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/*
The Python-capable worker image, for pipelines with `python.map` stages: `workers.pythonImage`,
its repository defaulting to the worker image's with `-python` appended, its tag to the worker
image's.
*/}}
{{- define "granary.workerPythonImage" -}}
{{- $workerRepository := .Values.workers.image.repository | default .Values.image.repository -}}
{{- $python := .Values.workers.pythonImage | default dict -}}
{{- $repository := $python.repository | default (printf "%s-python" $workerRepository) -}}
{{- $tag := $python.tag | default .Values.workers.image.tag | default .Values.image.tag | default .Chart.AppVersion -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/*
Name of the cluster-scoped objects (ClusterRole, ClusterRoleBinding): the full name and the
release namespace, so that releases of the same name in two namespaces do not collide.
*/}}
{{- define "granary.clusterScopedName" -}}
{{- printf "%s-%s" (include "granary.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/*
`workers.resources` as JSON for GRANARY_WORKER_RESOURCES, every quantity a string: the operator
reads it as a core/v1 ResourceRequirements, whose quantities are strings in JSON (YAML values
such as `cpu: 2` arrive as numbers).
*/}}
{{- define "granary.workerResourcesJson" -}}
{{- $out := dict -}}
{{- range $section, $quantities := .Values.workers.resources -}}
{{- if kindIs "map" $quantities -}}
{{- $strings := dict -}}
{{- range $name, $quantity := $quantities -}}
{{- $_ := set $strings $name (toString $quantity) -}}
{{- end -}}
{{- $_ := set $out $section $strings -}}
{{- else -}}
{{- $_ := set $out $section $quantities -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
