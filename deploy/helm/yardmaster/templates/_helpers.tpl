{{/* The chart's name. */}}
{{- define "yardmaster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name: the release name, with the chart name unless it is in it already.
     Kept to 40 characters so that "<fullname>-node-NNN" and the headless Service's
     DNS name stay within Kubernetes' limits. */}}
{{- define "yardmaster.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "yardmaster.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every resource carries. */}}
{{- define "yardmaster.labels" -}}
helm.sh/chart: {{ include "yardmaster.chart" . }}
{{ include "yardmaster.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: yardmaster
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "yardmaster.selectorLabels" -}}
app.kubernetes.io/name: {{ include "yardmaster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "yardmaster.controllerSelectorLabels" -}}
{{ include "yardmaster.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "yardmaster.nodeSelectorLabels" -}}
{{ include "yardmaster.selectorLabels" . }}
app.kubernetes.io/component: node
{{- end }}

{{/* Resource names. */}}
{{- define "yardmaster.controllerName" -}}
{{- printf "%s-controller" (include "yardmaster.fullname" .) }}
{{- end }}

{{- define "yardmaster.nodeName" -}}
{{- printf "%s-node" (include "yardmaster.fullname" .) }}
{{- end }}

{{- define "yardmaster.headlessName" -}}
{{- printf "%s-nodes" (include "yardmaster.fullname" .) }}
{{- end }}

{{/* The headless Service's fully qualified name: what `nodes = "dns:…"` resolves and
     the name every node certificate carries (`node_name`). */}}
{{- define "yardmaster.headlessFqdn" -}}
{{- printf "%s.%s.svc.%s" (include "yardmaster.headlessName" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{- define "yardmaster.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "yardmaster.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{- define "yardmaster.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "yardmaster.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "yardmaster.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion (toString .Values.image.tag)) }}
{{- end }}

{{/* Whether the model repository is copied from an image rather than a PVC. */}}
{{- define "yardmaster.repositoryFromImage" -}}
{{- if .Values.modelRepository.initImage.repository }}true{{ end }}
{{- end }}

{{/* The model repository's volume. */}}
{{- define "yardmaster.modelVolume" -}}
- name: models
{{- if include "yardmaster.repositoryFromImage" . }}
  emptyDir:
    {{- with .Values.modelRepository.initImage.sizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
{{- else if .Values.modelRepository.pvc.claimName }}
  persistentVolumeClaim:
    claimName: {{ .Values.modelRepository.pvc.claimName }}
    readOnly: true
{{- else }}
{{- fail "modelRepository: set pvc.claimName (an existing PVC holding the repository) or initImage.repository (an image to copy it from)" }}
{{- end }}
{{- end }}

{{/* Its mount in the main containers. */}}
{{- define "yardmaster.modelMount" -}}
- name: models
  mountPath: {{ .Values.modelRepository.mountPath }}
  readOnly: true
{{- if and (not (include "yardmaster.repositoryFromImage" .)) .Values.modelRepository.pvc.subPath }}
  subPath: {{ .Values.modelRepository.pvc.subPath }}
{{- end }}
{{- end }}

{{/* The init container that copies the repository out of an image, when one is set. */}}
{{- define "yardmaster.modelInit" -}}
{{- if include "yardmaster.repositoryFromImage" . }}
{{- $init := .Values.modelRepository.initImage }}
- name: copy-models
  image: {{ printf "%s:%s" $init.repository (toString $init.tag) | quote }}
  imagePullPolicy: {{ $init.pullPolicy }}
  command:
    {{- toYaml $init.command | nindent 4 }}
  env:
    - name: SRC
      value: {{ $init.path | quote }}
    - name: DST
      value: {{ .Values.modelRepository.mountPath | quote }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: models
      mountPath: {{ .Values.modelRepository.mountPath }}
{{- end }}
{{- end }}

{{/* A number as a TOML float ("5" becomes "5.0"): the server reads these keys as f64. */}}
{{- define "yardmaster.tomlFloat" -}}
{{- $f := float64 . }}
{{- if eq $f (floor $f) }}{{ printf "%.1f" $f }}{{ else }}{{ $f }}{{ end }}
{{- end }}
