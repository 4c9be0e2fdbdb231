{{/*
Names, labels and the RBAC rules shared by the chart's templates. The rules are defined once here
and used by both RBAC modes (cluster-wide and per watched namespace), so the two cannot drift;
tests/chart checks them against the operator's own list of API calls.
*/}}

{{- define "rtj.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rtj.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rtj.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rtj.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rtj.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rtj.labels" -}}
helm.sh/chart: {{ include "rtj.chart" . }}
{{ include "rtj.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: resilient-training-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rtj.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rtj.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rtj.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "rtj.imagePullPolicy" -}}
{{- if .Values.image.pullPolicy }}
{{- .Values.image.pullPolicy }}
{{- else if .Values.image.digest }}
{{- "IfNotPresent" }}
{{- else }}
{{- "Always" }}
{{- end }}
{{- end }}

{{/*
Namespaced permissions: what the operator does inside a namespace whose jobs it reconciles.
Every verb is used by the operator (rtj_operator.kube.REQUIRED_PERMISSIONS) or by kopf itself;
docs/security.md explains each rule. Secrets are never read.
*/}}
{{- define "rtj.namespacedRules" -}}
# The jobs: kopf watches them and patches finalizers and its progress annotations.
- apiGroups: ["resilient.training"]
  resources: ["resilienttrainingjobs"]
  verbs: ["get", "list", "watch", "patch"]
# Status is written through the status subresource.
- apiGroups: ["resilient.training"]
  resources: ["resilienttrainingjobs/status"]
  verbs: ["get", "patch"]
# Worker and spare pods: created, replaced, deleted; get/patch also let the operator create the
# trainer's Role (RBAC escalation checks require holding what a Role grants).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The headless rendezvous Service and the checkpoint PVC of each job.
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "delete"]
# The trainer's ServiceAccount, Role and RoleBinding (progress reports on its own pods).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Events on jobs (kopf posts core/v1 events; events.k8s.io is the same storage).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
Cluster-scoped permissions: needed in both modes because these kinds have no namespace.
*/}}
{{- define "rtj.clusterRules" -}}
# kopf scans CRDs at start-up and watches them to notice the API appearing or changing.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
# Node health drives replacements (NotReady, unreachable, deleted).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: [{{ if .Values.nodeTainting.enabled }}"get", "list", "watch", "patch"{{ else }}"get", "list", "watch"{{ end }}]
# Static checkpoint volumes (FSx for Lustre) are PersistentVolumes, which have no namespace.
- apiGroups: [""]
  resources: ["persistentvolumes"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- if .Values.watchNamespaces }}
# kopf follows the watched namespaces appearing and disappearing.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}
