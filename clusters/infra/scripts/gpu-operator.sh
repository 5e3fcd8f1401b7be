#!/usr/bin/env bash
# Builds NVIDIA's GPU Operator at the pinned version (clusters/versions.env
# GPU_OPERATOR_VERSION) from the Go module proxy, into a cache outside the repository:
#   $GPULAB_CACHE/gpu-operator/<version>/gpu-operator      the operator (cmd/gpu-operator)
#   $GPULAB_CACHE/gpu-operator/<version>/nvidia-validator  the validator and node-status
#                                                          exporter (validator/)
#   $GPULAB_CACHE/gpu-operator/<version>/assets/           its operands' manifests, as its
#                                                          image carries them (/opt/gpu-operator)
#   $GPULAB_CACHE/gpu-operator/<version>/validator/       the validator's workload pod manifests
#   $GPULAB_CACHE/gpu-operator/<version>/chart/            its Helm chart (deployments/gpu-operator,
#                                                          with the CRDs and NFD's subchart)
# Neither binds NVML (CGO off, as the module's Makefile builds them). Idempotent: a version
# whose files exist is not rebuilt. Progress goes to stderr, the directory to stdout.
#
# usage: clusters/infra/scripts/gpu-operator.sh
set -euo pipefail

# The Go caches, toolchain and flags all Go builds here share, log/die, with_ticker.
# shellcheck source=../nodeimage/lib.sh
source "$(dirname "$0")/../nodeimage/lib.sh"
MODULE=github.com/NVIDIA/gpu-operator
version=$GPU_OPERATOR_VERSION
dir=$GPULAB_CACHE/gpu-operator/$version
export CGO_ENABLED=0

command -v go >/dev/null || die "gpu-operator: no Go toolchain on PATH (need go >= 1.26)"
if [[ -x $dir/gpu-operator && -x $dir/nvidia-validator && -f $dir/chart/Chart.yaml && -d $dir/assets && -d $dir/validator ]]; then
  log "gpu-operator $version: cached in $dir"
  echo "$dir"
  exit 0
fi
tmp=$(build_tmp "$dir")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
log "gpu-operator $version: downloading $MODULE@$version"
src=$(moddir "$MODULE@$version") || die "gpu-operator: the Go module proxy does not serve $MODULE@$version"
for p in gpu-operator:./cmd/gpu-operator nvidia-validator:./validator; do
  name=${p%%:*} pkg=${p#*:}
  [[ ! -x $dir/$name ]] || continue
  log "gpu-operator $version: go build $pkg ($(go env GOVERSION))"
  (cd "$src" && with_ticker "$name $version" gobuild -mod=mod -o "$tmp/$name" "$pkg") || die "gpu-operator $version: building $name failed (see above)"
  mv "$tmp/$name" "$dir/$name"
done
# The operator's image lays its operands' manifests out as assets/ holds them, with the
# driver's under manifests/ (docker/Dockerfile); the chart is read as the module ships it.
rm -rf "$dir/assets" "$dir/chart" "$dir/validator"
mkdir "$tmp/validator" && cp "$src/validator/"*-workload-validation.yaml "$tmp/validator/"
cp -r "$src/assets" "$tmp/assets" && cp -r "$src/manifests" "$tmp/assets/manifests"
cp -r "$src/deployments/gpu-operator" "$tmp/chart"
cp "$src/deployments/gpu-operator/crds/"*.yaml "$tmp/assets/"
cp "$src/deployments/gpu-operator/charts/node-feature-discovery/crds/nfd-api-crds.yaml" "$tmp/assets/"
chmod -R u+w "$tmp/assets" "$tmp/chart" "$tmp/validator"
mv "$tmp/assets" "$dir/assets" && mv "$tmp/chart" "$dir/chart" && mv "$tmp/validator" "$dir/validator"
log "gpu-operator $version: built in $((SECONDS - start)) s -> $dir"
echo "$dir"
