#!/usr/bin/env bash
# Prints the path of a kind binary: the one on PATH when it is the pinned release,
# otherwise that release built with `go install` through the Go module proxy and cached under
# $GPULAB_CACHE/bin/kind-<version>/ (outside the repository). Progress goes to stderr,
# so `KIND=$(clusters/infra/scripts/kind.sh)` works.
set -euo pipefail
source "$(dirname "$0")/../nodeimage/lib.sh"

if found=$(command -v kind) && has_output "kind $KIND_VERSION " "$found" version; then
  log "kind: using $found ($KIND_VERSION)"
  echo "$found"
  exit 0
fi

bin=$GPULAB_CACHE/bin/kind-$KIND_VERSION
if [[ ! -x $bin/kind ]]; then
  command -v go >/dev/null || die "kind: not on PATH and no Go toolchain to build $KIND_VERSION"
  log "kind: building sigs.k8s.io/kind@$KIND_VERSION (about 1 min cold)"
  # Into a temporary directory, renamed when done: a killed build leaves no kind binary.
  tmp=$(fresh_tmp "$bin")
  GOBIN=$tmp with_ticker "kind $KIND_VERSION" nice -n 10 go install -trimpath -ldflags=-s \
    "sigs.k8s.io/kind@$KIND_VERSION" || die "kind: go install sigs.k8s.io/kind@$KIND_VERSION failed"
  has_output "kind $KIND_VERSION " "$tmp/kind" version || die "kind: the built binary is not $KIND_VERSION"
  publish_dir "$tmp" "$bin"
fi
log "kind: $bin/kind ($("$bin/kind" version))"
echo "$bin/kind"
