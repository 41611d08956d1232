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

{{/*
The dispatcher's Service: `<full name>-dispatcher`, the full name cut to leave room for the
suffix in a DNS label (63). Every name of a release derives from the release name, so several
releases fit in one namespace.
*/}}
{{- define "granary.dispatcherService" -}}
{{- printf "%s-dispatcher" (include "granary.fullname" . | trunc 52 | trimSuffix "-") -}}
{{- end -}}

{{/* The address workers and trainers dial: the dispatcher Service's name in the namespace. */}}
{{- define "granary.dispatcherAddress" -}}
{{- printf "%s.%s.svc:7070" (include "granary.dispatcherService" .) .Release.Namespace -}}
{{- end -}}

{{/* The leader-election Lease of the release's operator replicas. */}}
{{- define "granary.leaseName" -}}
{{- printf "%s-operator" (include "granary.fullname" .) -}}
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

{{/*
The namespaces the operator watches, as a JSON list (read it with `fromJsonArray`):
`watchNamespaces` and the older `watchNamespace`, each once, in that order. Empty: every
namespace.
*/}}
{{- define "granary.watchNamespaces" -}}
{{- $all := concat (.Values.watchNamespaces | default list) (compact (list .Values.watchNamespace)) -}}
{{- toJson (uniq $all) -}}
{{- end -}}

{{/*
A namespaceSelector for the given namespaces (a list): their `kubernetes.io/metadata.name`
label (set by the API server from Kubernetes 1.21), or every namespace when the list is empty.
*/}}
{{- define "granary.namespaceSelector" -}}
{{- if . -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values:
      {{- toYaml . | nindent 6 }}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/*
The namespaces worker NetworkPolicies are rendered in: the watched namespaces, or, watching every
namespace, the release namespace; plus `networkPolicy.workerNamespaces`; each once.
*/}}
{{- define "granary.workerPolicyNamespaces" -}}
{{- $watched := include "granary.watchNamespaces" . | fromJsonArray -}}
{{- $base := $watched | default (list .Release.Namespace) -}}
{{- toJson (uniq (concat $base (.Values.networkPolicy.workerNamespaces | default list))) -}}
{{- end -}}

{{/* The operator's rules in each watched namespace: the `Watched` rows of rbac::PERMISSIONS. */}}
{{- define "granary.watchedRules" -}}
# InputPipelines: watched; finalizer added and removed; status written.
- apiGroups: ["granary.dev"]
  resources: ["inputpipelines"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["granary.dev"]
  resources: ["inputpipelines/status"]
  verbs: ["patch"]
# The worker Deployment of each pipeline: watched, read, server-side applied, scaled.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "patch", "create"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["get", "patch"]
# The headless worker Service of each pipeline: watched, server-side applied.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "patch", "create"]
# Events about pipelines (scaling and caching decisions).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
# Each pipeline's worker and trainer Secrets (security.enabled): read, server-side applied.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "patch", "create"]
{{- end -}}


{{/*
The Secret holding the CA: made and rotated by the operator, or by cert-manager
(security.certManager.enabled).
*/}}
{{- define "granary.caSecret" -}}
{{- printf "%s-ca" (include "granary.fullname" .) -}}
{{- end -}}
