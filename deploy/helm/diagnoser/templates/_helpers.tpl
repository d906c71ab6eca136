{{/* Names and labels, the usual Helm way. */}}
{{- define "diagnoser.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "diagnoser.fullname" -}}
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

{{- define "diagnoser.selectorLabels" -}}
app.kubernetes.io/name: {{ include "diagnoser.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "diagnoser.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "diagnoser.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "diagnoser.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "diagnoser.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "diagnoser.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Leader-elected replicas (a StatefulSet) from two replicas on. */}}
{{- define "diagnoser.ha" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- end }}

{{/* The secret values given inline, as the DIAGNOSER_* variables they become. */}}
{{- define "diagnoser.inlineSecrets" -}}
{{- $s := dict }}
{{- with .Values.prometheus.bearerToken }}{{ $_ := set $s "DIAGNOSER_PROMETHEUS__BEARER_TOKEN" . }}{{ end }}
{{- with .Values.prometheus.basicAuth.username }}{{ $_ := set $s "DIAGNOSER_PROMETHEUS__BASIC_AUTH__USERNAME" . }}{{ end }}
{{- with .Values.prometheus.basicAuth.password }}{{ $_ := set $s "DIAGNOSER_PROMETHEUS__BASIC_AUTH__PASSWORD" . }}{{ end }}
{{- with .Values.slack.webhookUrl }}{{ $_ := set $s "DIAGNOSER_SLACK__WEBHOOK_URL" . }}{{ end }}
{{- with .Values.slack.token }}{{ $_ := set $s "DIAGNOSER_SLACK__TOKEN" . }}{{ end }}
{{- with .Values.alertmanager.token }}{{ $_ := set $s "DIAGNOSER_DAEMON__ALERTMANAGER_TOKEN" . }}{{ end }}
{{- if and $s .Values.credentials.existingSecret }}
{{- fail (printf "credentials.existingSecret (%s) is set: put %s in that Secret rather than in the values" .Values.credentials.existingSecret (keys $s | sortAlpha | join ", ")) }}
{{- end }}
{{- toYaml $s }}
{{- end }}

{{/* The Secret the pods read their DIAGNOSER_* credentials from, if any. */}}
{{- define "diagnoser.credentialsSecret" -}}
{{- if .Values.credentials.existingSecret }}
{{- .Values.credentials.existingSecret }}
{{- else if ne (include "diagnoser.inlineSecrets" .) "{}" }}
{{- printf "%s-credentials" (include "diagnoser.fullname" .) }}
{{- end }}
{{- end }}

{{/* A path in values (pools/orders.yaml) as a ConfigMap key, which cannot hold "/". */}}
{{- define "diagnoser.configMapKey" -}}
{{- replace "/" "__" . }}
{{- end }}

{{/* diagnoser's config file, built from the values; `config` is merged last. */}}
{{- define "diagnoser.config" -}}
{{- $prometheus := dict "url" .Values.prometheus.url "verify_tls" .Values.prometheus.verifyTls "query_timeout_s" .Values.prometheus.queryTimeoutSeconds }}
{{- $kubernetes := dict "enabled" true "in_cluster" true "namespaces" .Values.namespaces }}
{{- $daemon := dict "leader_election" (dict "lease_name" (include "diagnoser.fullname" .)) }}
{{- if .Values.probeDefinitions }}
{{- $files := list }}
{{- range $name, $_ := .Values.probeDefinitions }}
{{- $files = append $files (printf "/etc/diagnoser/probes/%s" $name) }}
{{- end }}
{{- $_ := set $daemon "probe_files" $files }}
{{- end }}
{{- $config := dict "prometheus" $prometheus "kubernetes" $kubernetes "daemon" $daemon }}
{{- $_ := set $config "slo" (dict "p99_ms" .Values.slo.p99Ms "error_ratio" .Values.slo.errorRatio) }}
{{- with .Values.slack.channel }}{{ $_ := set $config "slack" (dict "channel" .) }}{{ end }}
{{- with .Values.signals }}{{ $_ := set $config "signals" . }}{{ end }}
{{- with .Values.contextLabels }}{{ $_ := set $config "context_labels" . }}{{ end }}
{{- with .Values.rules.params }}{{ $_ := set $config "rule_params" . }}{{ end }}
{{- if .Values.rules.extra }}{{ $_ := set $config "rule_dirs" (list "/etc/diagnoser/rules") }}{{ end }}
{{- if .Values.rules.disableBuiltin }}{{ $_ := set $config "disable_builtin_rules" true }}{{ end }}
{{- toYaml (mustMergeOverwrite $config (deepCopy .Values.config)) }}
{{- end }}

{{/* The pod, shared by the Deployment (one replica) and the StatefulSet (leader-elected replicas). */}}
{{- define "diagnoser.podTemplate" -}}
metadata:
  labels:
    {{- include "diagnoser.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # A changed config, rule or probe rolls the pods (diagnoser reads them at start).
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "diagnoser.serviceAccountName" . }}
  automountServiceAccountToken: true
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: diagnoser
      image: {{ include "diagnoser.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - serve
        - --config=/etc/diagnoser/config/config.yaml
        # Explicit: all interfaces, whatever the command's own default.
        - --listen=0.0.0.0:8080
        - --state=/var/lib/diagnoser/state.sqlite3
        - --log-format=json
      {{- with include "diagnoser.credentialsSecret" . }}
      envFrom:
        - secretRef:
            name: {{ . }}
      {{- end }}
      env:
        # The Lease holder's name is the pod's own, so `kubectl get lease` says which pod leads.
        - name: DIAGNOSER_DAEMON__LEADER_ELECTION__IDENTITY
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: DIAGNOSER_DAEMON__LEADER_ELECTION__NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: http
          containerPort: 8080
          protocol: TCP
      {{- with .Values.startupProbe }}
      startupProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.livenessProbe }}
      livenessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.readinessProbe }}
      readinessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        runAsNonRoot: true
        capabilities:
          drop: [ALL]
      volumeMounts:
        - name: config
          mountPath: /etc/diagnoser/config
          readOnly: true
        {{- if .Values.rules.extra }}
        - name: rules
          mountPath: /etc/diagnoser/rules
          readOnly: true
        {{- end }}
        {{- if .Values.probeDefinitions }}
        - name: probes
          mountPath: /etc/diagnoser/probes
          readOnly: true
        {{- end }}
        - name: state
          mountPath: /var/lib/diagnoser
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: config
      configMap:
        name: {{ include "diagnoser.fullname" . }}
        items:
          - key: config.yaml
            path: config.yaml
    {{- if .Values.rules.extra }}
    - name: rules
      configMap:
        name: {{ include "diagnoser.fullname" . }}-rules
        # Keys cannot hold "/": each file goes back to its path, which is its rule id.
        items:
          {{- range $path, $_ := .Values.rules.extra }}
          - key: {{ include "diagnoser.configMapKey" $path }}
            path: {{ $path }}
          {{- end }}
    {{- end }}
    {{- if .Values.probeDefinitions }}
    - name: probes
      configMap:
        name: {{ include "diagnoser.fullname" . }}-probes
    {{- end }}
    {{- if and (not (include "diagnoser.ha" .)) .Values.persistence.enabled }}
    - name: state
      persistentVolumeClaim:
        claimName: {{ include "diagnoser.fullname" . }}-state
    {{- else if not .Values.persistence.enabled }}
    - name: state
      emptyDir: {}
    {{- end }}
    - name: tmp
      emptyDir:
        medium: Memory
        sizeLimit: 16Mi
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml .Values.topologySpreadConstraints | nindent 4 }}
  {{- else if include "diagnoser.ha" . }}
  topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "diagnoser.selectorLabels" . | nindent 10 }}
  {{- end }}
{{- end }}
