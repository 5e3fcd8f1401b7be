{{/* Labels every object of the release carries (Helm's recommended set). */}}
{{- define "fake-gpus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpulab
{{- end }}

{{/* gpulab's image reference. */}}
{{- define "fake-gpus.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* The GPUs a pool's inventory lists: each `gpus:` entry counts `count` (default 1). */}}
{{- define "fake-gpus.count" -}}
{{- $n := 0 }}
{{- range .gpus }}{{ $n = add $n (default 1 .count) }}{{ end }}
{{- $n }}
{{- end }}

{{/* Tolerations of a pool's pods: the pool's, else every taint (a driver's DaemonSet must
     reach tainted GPU nodes). */}}
{{- define "fake-gpus.tolerations" -}}
{{- if hasKey . "tolerations" -}}
{{- toYaml .tolerations -}}
{{- else -}}
- operator: Exists
{{- end -}}
{{- end }}

{{/* Node affinity that matches any pool's nodes: one nodeSelectorTerm per pool (terms
     are ORed, a term's expressions ANDed), so one plugin DaemonSet follows every pool. */}}
{{- define "fake-gpus.poolAffinity" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      {{- range .Values.pools }}
      - matchExpressions:
          {{- range $k, $v := .nodeSelector }}
          - {key: {{ $k | quote }}, operator: In, values: [{{ $v | quote }}]}
          {{- end }}
      {{- end }}
{{- end }}

{{/* The init container that waits for fakenvml's library in the driver root (the
     plugin's DaemonSet may start first). */}}
{{- define "fake-gpus.waitForDriver" -}}
- name: wait-for-driver
  image: {{ include "fake-gpus.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [sh, -c]
  args:
    - |
      for i in $(seq 600); do
        [ -e /driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 ] && exit 0
        sleep 0.2
      done
      echo "no libnvidia-ml.so.1 under /driver-root after 120s: is fakenvml running?" >&2
      exit 1
  volumeMounts:
    - {name: driver, mountPath: /driver-root, readOnly: true}
{{- end }}
