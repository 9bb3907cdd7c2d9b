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

{{/* Name of the ClusterRole the benchmark Jobs' ServiceAccount is bound to in each namespace. */}}
{{- define "specpilot.benchClusterRole" -}}
{{- printf "%s-bench" (include "specpilot.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Rules the operator needs in every namespace it watches: on cluster scope (ClusterRole) when it
watches all namespaces, else as a Role in each watched namespace. Exactly the requests the operator (and
kopf in it) makes, as recorded across the operator test suite (tests/security/test_rbac_grants.py), plus
two documented exceptions that are admission checks rather than requests: update on the finalizers subresources
(ownerReferences with blockOwnerDeletion) and bind on the one benchmark ClusterRole (creating its
RoleBindings). No delete on anything but benchmark Jobs (re-profiling); owned objects go by garbage
collection. */}}
{{- define "specpilot.namespacedRules" -}}
# kopf watches SpeculativeDeployments and patches its finalizer and progress annotations on them.
- apiGroups: ["specpilot.io"]
  resources: ["speculativedeployments"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["specpilot.io"]
  resources: ["speculativedeployments/status", "speculationprofiles/status"]
  verbs: ["patch"]
# Profiles are created, read back, annotated (their current Job) and watched into an index.
- apiGroups: ["specpilot.io"]
  resources: ["speculationprofiles"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Admission (OwnerReferencesPermissionEnforcement), not a request: objects the operator creates name their
# owner with blockOwnerDeletion.
- apiGroups: ["specpilot.io"]
  resources: ["speculativedeployments/finalizers", "speculationprofiles/finalizers"]
  verbs: ["update"]
# Benchmark Jobs: created, watched into an index, deleted to measure again.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "delete"]
# Serving Deployments by server-side apply (create where the API server has no apply), watched into an index
# (specpilot's own only: the watch has a label selector).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch"]
# Which ReplicaSet (hence which Deployment) controls a serving pod before its /metrics is scraped.
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["get"]
# Services and PodMonitors: applied, and read back every 5 minutes to repair a hand edit or deletion.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch"]
# Pods, read-only: serving pods to scrape (metrics.source: pods), and a benchmark Job's pods (by its
# controller-uid label) when it failed for good or has no pod ready, to say why in the profile's status.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# The per-namespace benchmark (and serving) ServiceAccounts: created once, read back when they exist.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
{{ include "specpilot.eventRules" . }}
# The benchmark ServiceAccount's RoleBinding to the chart's bench ClusterRole.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["get", "create"]
# Admission (RBAC escalation check), not a request: a RoleBinding to a ClusterRole needs bind on it.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["clusterroles"]
  verbs: ["bind"]
  resourceNames: [{{ include "specpilot.benchClusterRole" . | quote }}]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "create", "patch"]
# Weighted routing (serving.routing: gateway, inferencePool, auto): the deployment's HTTPRoute and, for
# inferencePool, one InferencePool per GPU pool (list tells whether the CRD is installed; delete when a deployment
# changes mode).
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["list", "create", "patch", "delete"]
{{- if .Values.peering.enabled }}
{{ include "specpilot.kopfPeeringRules" . }}
{{- end }}
{{- end }}

{{/* kopf posts handler progress, failures and the operator's own Events as core Events. */}}
{{- define "specpilot.eventRules" -}}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{- define "specpilot.kopfPeeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}

{{/* Rules that only exist on cluster scope, whatever the operator watches: nodes (GPU SKU detection from
the nvidia.com/gpu.product label), namespaces and CRDs (kopf's resource and namespace discovery). */}}
{{- define "specpilot.clusterRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* The Secret holding the key benchmark results are sealed with. */}}
{{- define "specpilot.resultKeySecret" -}}
{{- .Values.resultKey.existingSecret | default (printf "%s-result-key" (include "specpilot.fullname" .)) }}
{{- end }}
