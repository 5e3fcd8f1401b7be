#!/usr/bin/env bash
# Builds NVIDIA's DRA driver for GPUs (sigs.k8s.io/dra-driver-nvidia-gpu, the pinned
# DRA_DRIVER_VERSION) from the Go module proxy into a cache outside the repository:
#   $GPULAB_CACHE/dra-driver/<version>/gpu-kubelet-plugin   the GPU kubelet plugin (the driver)
#   $GPULAB_CACHE/dra-driver/<version>/compute-domain-controller, compute-domain-kubelet-plugin
#                                                           the chart's compute-domain parts
#   $GPULAB_CACHE/dra-driver/<version>/nvidia-cdi-hook      the CDI hook its specs name, from
#                                                           the nvidia-container-toolkit its go.mod requires
# and prints the directory, then the module's source directory (its Helm chart and the
# init container's prestart script are used from there, as released).
#
# The compute-domain controller and kubelet plugin are what the chart runs with compute
# domains on (its default, and what the driver's own suite installs in several files); they
# start against a mock NVML (IMEX channels from the driver root's proc/devices). Not
# compute-domain-daemon: it runs NVIDIA's IMEX daemon for a ComputeDomain, which no fake
# host has, and every test that makes one skips under the suite's MOCK_NVML.
# `go install` cannot be used (the proxy refuses the version list it asks for; see
# nvidia-plugin.sh): the module version is downloaded and built as the main module, the
# binaries in one `go build` (they share most packages).
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
BINARIES=(gpu-kubelet-plugin compute-domain-controller compute-domain-kubelet-plugin)
built() { local b; for b in "${BINARIES[@]}" "$@"; do [[ -x $dir/$b ]] || return 1; done; }
if built nvidia-cdi-hook; then
  log "dra-driver $VERSION: cached in $dir"
else
  tmp=$(build_tmp "$dir")
  trap 'rm -rf "$tmp"' EXIT
  start=$SECONDS
  if ! built; then
    log "dra-driver $VERSION: go build ${BINARIES[*]} ($(go env GOVERSION); a minute or two cold, after the Kubernetes builds)"
    # The version the driver reports (upstream's Makefile sets the same variable).
    (cd "$src" && with_ticker "dra-driver $VERSION" gobuild -mod=mod \
      -ldflags "-s -w -X $MODULE/internal/info.version=$VERSION" \
      -o "$tmp/" "${BINARIES[@]/#/./cmd/}") || die "dra-driver $VERSION: go build failed (see above)"
    for b in "${BINARIES[@]}"; do mv "$tmp/$b" "$dir/$b"; done
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
