#!/usr/bin/env bash
# Builds NVIDIA's mig-parted at the pinned version (clusters/versions.env MIG_PARTED_VERSION)
# from the Go module proxy, into a cache outside the repository:
#   $GPULAB_CACHE/mig-parted/<version>/nvidia-mig-parted     the MIG partition editor
#   $GPULAB_CACHE/mig-parted/<version>/nvidia-mig-manager    the GPU Operator's MIG manager
#   $GPULAB_CACHE/mig-parted/<version>/config-default.yaml   the module's default MIG
#                                                            configs (all-1g.10gb, ...)
# Both bind NVML through cgo (dlopen at run time; no NVIDIA headers or libraries), so they
# run on fakenvml as on a driver. Idempotent: a version whose files exist is not rebuilt.
# Progress goes to stderr, the directory to stdout.
#
# usage: clusters/infra/scripts/mig-parted.sh
set -euo pipefail

# The Go caches, toolchain and flags all Go builds here share, log/die, with_ticker.
# shellcheck source=../nodeimage/lib.sh
source "$(dirname "$0")/../nodeimage/lib.sh"
MODULE=github.com/NVIDIA/mig-parted
version=$MIG_PARTED_VERSION
dir=$GPULAB_CACHE/mig-parted/$version
programs=(nvidia-mig-parted nvidia-mig-manager)
export CGO_ENABLED=1
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"

command -v go >/dev/null || die "mig-parted: no Go toolchain on PATH (need go >= 1.26)"
command -v gcc >/dev/null || die "mig-parted: no gcc on PATH (cgo needs it); install gcc"

done=1
for p in "${programs[@]}"; do [[ -x $dir/$p ]] || done=0; done
if ((done)) && [[ -f $dir/config-default.yaml ]]; then
  log "mig-parted $version: cached in $dir"
  echo "$dir"
  exit 0
fi
tmp=$(build_tmp "$dir")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
log "mig-parted $version: downloading $MODULE@$version"
src=$(moddir "$MODULE@$version") || die "mig-parted: the Go module proxy does not serve $MODULE@$version"
for p in "${programs[@]}"; do
  [[ ! -x $dir/$p ]] || continue
  log "mig-parted $version: go build ./cmd/$p ($(go env GOVERSION))"
  (cd "$src" && with_ticker "$p $version" gobuild -mod=mod -o "$tmp/$p" "./cmd/$p") || die "mig-parted $version: building $p failed (see above)"
  mv "$tmp/$p" "$dir/$p"
done
install -m 0644 "$src/deployments/systemd/config-default.yaml" "$dir/config-default.yaml"
log "mig-parted $version: built in $((SECONDS - start)) s -> $dir"
echo "$dir"
