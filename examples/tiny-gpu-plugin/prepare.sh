#!/usr/bin/env bash
# Build the plugin binary into this directory (cgo: go-nvml dlopens libnvidia-ml.so.1).
set -euo pipefail
cd "$(dirname "$0")"
[[ -f go.sum ]] || go mod tidy
CGO_ENABLED=1 go build -trimpath -o tiny-gpu-plugin .
