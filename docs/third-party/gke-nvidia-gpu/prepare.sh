#!/usr/bin/env bash
# Build GKE's NVIDIA device plugin (cmd/nvidia_gpu) from a checkout of
# GoogleCloudPlatform/container-engine-accelerators into this directory. GKE_SRC names the
# checkout; it ships its vendor/ (the Go module proxy does not serve this module), so the
# build is offline. cgo: go-nvml and gpu-monitoring-tools dlopen libnvidia-ml.so.1 and
# bring their own nvml.h, so no NVIDIA headers or libraries are needed here.
set -euo pipefail
: "${GKE_SRC:?set GKE_SRC to a checkout of GoogleCloudPlatform/container-engine-accelerators}"
[[ -f "$GKE_SRC/cmd/nvidia_gpu/nvidia_gpu.go" ]] || {
    echo "prepare.sh: GKE_SRC=$GKE_SRC has no cmd/nvidia_gpu/nvidia_gpu.go" >&2; exit 1; }
out="$(cd "$(dirname "$0")" && pwd)/nvidia-gpu-device-plugin"
cd "$GKE_SRC"
GOTOOLCHAIN=local CGO_ENABLED=1 go build -mod=vendor -trimpath -buildvcs=false -o "$out" ./cmd/nvidia_gpu
