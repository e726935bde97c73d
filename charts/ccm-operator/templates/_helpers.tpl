{{/* Chart name, overridable. */}}
{{- define "ccm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every namespaced object; a release called like the chart is not repeated. */}}
{{- define "ccm-operator.fullname" -}}
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

{{/* Labels of every object. */}}
{{- define "ccm-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ccm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ccm-operator
{{- end }}

{{/* Labels that select the operator pods; never change them, Deployment selectors are immutable. */}}
{{- define "ccm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ccm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "ccm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ccm-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag, digest}; the tag defaults to appVersion. */}}
{{- define "ccm-operator.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding the operator's serving certificate; empty: the self-signed default. */}}
{{- define "ccm-operator.tlsSecretName" -}}
{{- if .Values.http.tls.secretName }}
{{- .Values.http.tls.secretName }}
{{- else if .Values.http.tls.certManager.enabled }}
{{- include "ccm-operator.fullname" . }}-tls
{{- end }}
{{- end }}

{{/* Whether the operator replicas elect a leader: always with more than one replica. */}}
{{- define "ccm-operator.leaderElection" -}}
{{- if or (gt (int .Values.replicas) 1) .Values.leaderElection.enabled }}true{{ else }}false{{ end }}
{{- end }}

{{/* The Lease the operator replicas elect a leader on. */}}
{{- define "ccm-operator.leaseName" -}}
ccm-operator
{{- end }}

{{/* The name of the operator's own CRD in crds/, read from the generated file, quoted. */}}
{{- define "ccm-operator.crdNames" -}}
{{- $names := list }}
{{- /* Every CRD the chart ships: the operator keeps them at the version it was built with (helm upgrade never touches crds/). */}}
{{- range $path, $_ := .Files.Glob "crds/*.yaml" }}
{{- $names = append $names (($.Files.Get $path | fromYaml).metadata.name | quote) }}
{{- end }}
{{- required "the chart's crds/ folder holds no CRD" (join ", " $names) }}
{{- end }}

{{/* The namespaces where managers run (cloudConfig.namespaces), as a JSON list. */}}
{{- define "ccm-operator.managedNamespaces" -}}
{{- .Values.cloudConfig.namespaces | toJson }}
{{- end }}

{{/* The namespaces where announcers may run: announcer.namespaces, else every managed one; a JSON list. */}}
{{- define "ccm-operator.announcerNamespaces" -}}
{{- default .Values.cloudConfig.namespaces .Values.announcer.namespaces | toJson }}
{{- end }}

{{/* The image allow-list (admissionPolicy.allowedImages; empty: the manager repository, any tag or digest), a JSON list. */}}
{{- define "ccm-operator.allowedImages" -}}
{{- $images := .Values.admissionPolicy.allowedImages }}
{{- if not $images }}
{{- $images = list (printf "%s:" .Values.manager.image.repository) (printf "%s@" .Values.manager.image.repository) }}
{{- end }}
{{- $images | toJson }}
{{- end }}

{{/*
The allow-list on repository boundaries, as the operator reads it (operator/src/validate/policy.rs
image_entry_allows), a JSON object {"exact": [...], "prefixes": [...]}: an entry ending in ":", "@"
or "/" is a prefix; one with a tag or digest is exact; a repository is exact and the prefixes
"<repo>:" and "<repo>@", so that "registry/repo" never admits "registry/repo-evil".
*/}}
{{- define "ccm-operator.imageMatch" -}}
{{- $exact := list }}
{{- $prefixes := list }}
{{- range $e := (include "ccm-operator.allowedImages" . | fromJsonArray) }}
{{- if or (hasSuffix ":" $e) (hasSuffix "@" $e) (hasSuffix "/" $e) }}
{{- $prefixes = append $prefixes $e }}
{{- else if or (contains "@" $e) (contains ":" (splitList "/" $e | last)) }}
{{- $exact = append $exact $e }}
{{- else }}
{{- $exact = append $exact $e }}
{{- $prefixes = append $prefixes (printf "%s:" $e) }}
{{- $prefixes = append $prefixes (printf "%s@" $e) }}
{{- end }}
{{- end }}
{{- dict "exact" $exact "prefixes" $prefixes | toJson }}
{{- end }}

{{/* Lease names no manager may take and the operator may not write (operator/src/validate/conflicts.rs, plus manager.reservedLeaseNames), a JSON object {"names": [...], "prefixes": [...]}. */}}
{{- define "ccm-operator.reservedLeases" -}}
{{- $names := list "kube-controller-manager" "kube-scheduler" "cloud-controller-manager" "ccm-operator" }}
{{- $prefixes := list "kube-" "apiserver-" "l2-announcer-" }}
{{- range $e := .Values.manager.reservedLeaseNames }}
{{- if hasSuffix "*" $e }}
{{- $prefixes = append $prefixes (trimSuffix "*" $e) }}
{{- else }}
{{- $names = append $names $e }}
{{- end }}
{{- end }}
{{- dict "names" $names "prefixes" $prefixes | toJson }}
{{- end }}

{{/* The BIRD sidecar's two fixed commands (operator/src/announcer.rs bird_command: without and with
graceful-restart recovery), as a CEL list of commands. */}}
{{- /* The commands of the upstream profiles' containers (operator/src/profiles.rs PROFILES;
its test `the_charts_upstream_commands_are_the_profiles`), as a CEL list of commands. */ -}}
{{- define "ccm-operator.upstreamCommands" -}}
[['/bin/aws-cloud-controller-manager'], ['/cloud-controller-manager'], ['cloud-controller-manager'], ['/bin/openstack-cloud-controller-manager'], ['/bin/hcloud-cloud-controller-manager'], ['/bin/vsphere-cloud-controller-manager'], ['/bin/digitalocean-cloud-controller-manager'], ['/usr/local/bin/oci-cloud-controller-manager']]
{{- end }}

{{- define "ccm-operator.nodeManagerCommands" -}}
[['cloud-node-manager']]
{{- end }}

{{- define "ccm-operator.birdCommands" -}}
[['sh', '-c', 'until [ -s /run/bird/bird.conf ]; do sleep 1; done; exec bird -f -c /run/bird/bird.conf -s /run/bird/bird.ctl'], ['sh', '-c', 'until [ -s /run/bird/bird.conf ]; do sleep 1; done; exec bird -f -R -c /run/bird/bird.conf -s /run/bird/bird.ctl']]
{{- end }}

{{/* The BIRD sidecar's preStop command with spec.announcer.gracefulRestart (operator/src/announcer.rs bird_pre_stop). */}}
{{- define "ccm-operator.birdPreStop" -}}
['birdc', '-s', '/run/bird/bird.ctl', 'graceful', 'restart']
{{- end }}
