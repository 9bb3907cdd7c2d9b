{{/* Name, label and RBAC helpers shared by the specpilot templates. */}}

{{/* Chart name, or nameOverride; 63 characters at most (a DNS label). */}}
{{- define "specpilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every resource name: fullnameOverride, else "<release>-<name>" unless the release name
already contains the chart name. */}}
{{- define "specpilot.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "specpilot.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "specpilot.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator pods; never change them after a release (selectors are immutable). */}}
{{- define "specpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "specpilot.labels" -}}
helm.sh/chart: {{ include "specpilot.chart" . }}
{{ include "specpilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: specpilot
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "specpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specpilot.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Refuses replicas that would act on the same objects at once: without peering every replica is
standalone and they would fight over each SpeculativeDeployment. */}}
{{- define "specpilot.validateValues" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.peering.enabled) }}
{{- fail (printf "replicaCount is %d but peering.enabled is false: set peering.enabled=true to run more than one replica, or set replicaCount=1" (int .Values.replicaCount)) }}
{{- end }}
{{- end }}

{{/* Rules the operator needs in every namespace it watches: on cluster scope (ClusterRole) when it
watches all namespaces, else as a Role in each watched namespace. Every verb is listed on purpose. */}}
{{- define "specpilot.namespacedRules" -}}
- apiGroups: ["specpilot.io"]
  resources: ["speculativedeployments", "speculationprofiles"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# The operator grants get/patch on speculationprofiles/status to each benchmark Job's ServiceAccount,
# and RBAC only lets it grant what it holds.
- apiGroups: ["specpilot.io"]
  resources: ["speculativedeployments/status", "speculationprofiles/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["specpilot.io"]
  resources: ["speculativedeployments/finalizers", "speculationprofiles/finalizers"]
  verbs: ["update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
{{ include "specpilot.eventRules" . }}
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors", "podmonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.peering.enabled }}
{{ include "specpilot.kopfPeeringRules" . }}
{{- end }}
{{- end }}

{{/* kopf posts handler progress and failures as Events on the objects it handles. */}}
{{- define "specpilot.eventRules" -}}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{- define "specpilot.kopfPeeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}

{{/* Rules that only exist on cluster scope, whatever the operator watches: nodes (GPU SKU detection from
the nvidia.com/gpu.product label), namespaces and CRDs (kopf's resource and namespace discovery). */}}
{{- define "specpilot.clusterRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
