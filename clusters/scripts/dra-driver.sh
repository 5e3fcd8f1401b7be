#!/usr/bin/env bash
# Builds NVIDIA's DRA driver for GPUs (sigs.k8s.io/dra-driver-nvidia-gpu, the pinned
# DRA_DRIVER_VERSION) from the Go module proxy into a cache outside the repository:
#   $GPULAB_CACHE/dra-driver/<version>/gpu-kubelet-plugin   the kubelet plugin (the driver)
#   $GPULAB_CACHE/dra-driver/<version>/nvidia-cdi-hook      the CDI hook its specs name, from
#                                                           the nvidia-container-toolkit its go.mod requires
# and prints the directory, then the module's source directory (its Helm chart and the
# init container's prestart script are used from there, as released).
#
# Only gpu-kubelet-plugin: the compute-domain controller and daemons need IMEX (NVLink
# fabric management), which a fake has no use for; labs deploy with computeDomains off.
# `go install` cannot be used (the proxy refuses the version list it asks for; see
# nvidia-plugin.sh): the module version is downloaded and built as the main module.
# Idempotent: a version whose binaries exist is not rebuilt.
set -euo pipefail
# shellcheck source=../nodeimage/lib.sh
source "$(dirname "$0")/../nodeimage/lib.sh"
VERSION=${GPULAB_DRA_DRIVER_VERSION:-$DRA_DRIVER_VERSION}
MODULE=sigs.k8s.io/dra-driver-nvidia-gpu
TOOLKIT=github.com/NVIDIA/nvidia-container-toolkit
export CGO_ENABLED=1
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"
command -v go >/dev/null || die "dra-driver: no Go toolchain on PATH (need go >= 1.26)"
command -v gcc >/dev/null || die "dra-driver: no gcc on PATH (cgo needs it); install gcc"

dir=$GPULAB_CACHE/dra-driver/$VERSION
src=$(moddir "$MODULE@$VERSION") || die "dra-driver: the Go module proxy does not serve $MODULE@$VERSION"
if [[ -x $dir/gpu-kubelet-plugin && -x $dir/nvidia-cdi-hook ]]; then
  log "dra-driver $VERSION: cached in $dir"
else
  mkdir -p "$dir"
  rm -rf "$dir"/.build.*
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  start=$SECONDS
  if [[ ! -x $dir/gpu-kubelet-plugin ]]; then
    log "dra-driver $VERSION: go build ./cmd/gpu-kubelet-plugin ($(go env GOVERSION); about 7 min cold, 1 min warm)"
    # The version the driver reports (upstream's Makefile sets the same variable).
    (cd "$src" && with_ticker "gpu-kubelet-plugin $VERSION" gobuild -mod=mod \
      -ldflags "-s -w -X $MODULE/internal/info.version=$VERSION" \
      -o "$tmp/gpu-kubelet-plugin" ./cmd/gpu-kubelet-plugin) || die "dra-driver $VERSION: go build failed (see above)"
    mv "$tmp/gpu-kubelet-plugin" "$dir/gpu-kubelet-plugin"
  fi
  if [[ ! -x $dir/nvidia-cdi-hook ]]; then
    ctk=$(awk -v m="$TOOLKIT" '$1 == m { print $2; exit }' "$src/go.mod")
    [[ -n $ctk ]] || die "dra-driver $VERSION: its go.mod requires no $TOOLKIT"
    ctk_src=$(moddir "$TOOLKIT@$ctk") || die "dra-driver: the Go module proxy does not serve $TOOLKIT@$ctk"
    log "dra-driver $VERSION: go build $TOOLKIT@$ctk ./cmd/nvidia-cdi-hook"
    (cd "$ctk_src" && with_ticker "nvidia-cdi-hook $ctk" gobuild -mod=mod \
      -o "$tmp/nvidia-cdi-hook" ./cmd/nvidia-cdi-hook) || die "dra-driver $VERSION: building nvidia-cdi-hook failed (see above)"
    mv "$tmp/nvidia-cdi-hook" "$dir/nvidia-cdi-hook"
  fi
  log "dra-driver $VERSION: built in $((SECONDS - start)) s -> $dir"
fi
echo "$dir"
echo "$src"
