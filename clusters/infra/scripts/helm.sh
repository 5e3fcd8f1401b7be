#!/usr/bin/env bash
# helm, the pinned v3 release (HELM_VERSION in clusters/versions.env), built with
# `go install` through the Go module proxy and cached under $GPULAB_CACHE/bin/helm-<version>/
# (outside the repository). Subjects deployed from a Helm chart are rendered with it
# (`helm template`, on the host: no cluster, no Tiller). Progress goes to stderr, the path
# to stdout, so `HELM=$(clusters/infra/scripts/helm.sh)` works.
#
# usage: clusters/infra/scripts/helm.sh                  (prints helm's path)
#        clusters/infra/scripts/helm.sh module MOD@VER   (fetches a Go module whose chart a subject
#                                                   uses; prints its directory in the cache)
set -euo pipefail
source "$(dirname "$0")/../nodeimage/lib.sh"

if [[ ${1:-} == module ]]; then
  [[ $# -eq 2 && $2 == *@v* ]] || die "helm: usage: $0 module MODULE@VERSION"
  dir=$(moddir "$2") || die "helm: the Go module proxy does not serve $2"
  [[ -n $dir ]] || die "helm: go mod download printed no directory for $2"
  log "module $2: $dir"
  echo "$dir"
  exit 0
fi
(($# == 0)) || die "helm: usage: $0 | $0 module MODULE@VERSION"

bin=$GPULAB_CACHE/bin/helm-$HELM_VERSION
if [[ ! -x $bin/helm ]]; then
  command -v go >/dev/null || die "helm: no Go toolchain on PATH to build $HELM_VERSION"
  log "helm: building helm.sh/helm/v3/cmd/helm@$HELM_VERSION (about 5 min cold on 2 cores)"
  # The version stamp helm's Makefile sets; without it `helm version` says only "v3.22".
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  # Into a temporary directory, renamed when done: a killed build leaves no helm binary.
  tmp=$(fresh_tmp "$bin")
  GOBIN=$tmp with_ticker "helm $HELM_VERSION" nice -n 10 go install -trimpath -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" || die "helm: go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"
  has_output "$HELM_VERSION" "$tmp/helm" version --short || die "helm: the built binary is not $HELM_VERSION"
  publish_dir "$tmp" "$bin"
fi
log "helm: $bin/helm ($("$bin/helm" version --short))"
echo "$bin/helm"
