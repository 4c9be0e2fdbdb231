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

{{- define "rtj.leaseName" -}}
{{- default (printf "%s-leader" (include "rtj.fullname" .)) .Values.leaderElection.leaseName | trunc 63 | trimSuffix "-" }}
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
Exactly rtj_operator.runtime.kube.REQUIRED_PERMISSIONS (tests/chart/test_rbac.py compares them);
kopf runs with resource scanning off and without peering, so it needs nothing more.
docs/security.md explains each rule. Secrets are never read.
*/}}
{{- define "rtj.namespacedRules" -}}
# The jobs: kopf watches them and patches its finalizer and annotations; the operator reads one
# fresh before acting and deletes it after ttlSecondsAfterFinished.
- apiGroups: ["resilient.training"]
  resources: ["resilienttrainingjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Status is written through the status subresource.
- apiGroups: ["resilient.training"]
  resources: ["resilienttrainingjobs/status"]
  verbs: ["patch"]
# Worker and spare pods: watched, created and deleted to replace a worker. Never patched: the
# trainers' progress is read from their pods' progress endpoints, not from the API.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# The job's other children; owner references delete them with the job (garbage collection).
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["create"]
# Opt-in children (spec.disruption.podDisruptionBudget, spec.scheduling.gang.coscheduling).
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create"]
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["create"]
# The checkpoint claim; deleted explicitly under retentionPolicy Delete.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["create", "delete"]
# Events on jobs, posted through kopf.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
Cluster-scoped permissions: needed in both modes because these kinds have no namespace.
*/}}
{{- define "rtj.clusterRules" -}}
# Node health drives replacements (NotReady, unreachable, deleted); patch only to taint excluded
# nodes, and only when the install opts in.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: [{{ if .Values.nodeTainting.enabled }}"get", "list", "watch", "patch"{{ else }}"get", "list", "watch"{{ end }}]
{{- if .Values.fsx.allowedFileSystems }}
# Static checkpoint volumes (FSx for Lustre) are PersistentVolumes, which have no namespace; only
# when some namespace may mount a file system (fsx.allowedFileSystems).
- apiGroups: [""]
  resources: ["persistentvolumes"]
  verbs: ["create", "delete"]
{{- end }}
{{- end }}
