#!/usr/bin/env bash
# Builds NVIDIA's k8s-device-plugin (cmd/nvidia-device-plugin) at pinned versions from the
# Go module proxy, into a cache outside the repository:
#   $GPULAB_CACHE/nvidia-device-plugin/<version>/nvidia-device-plugin
# and, beside it, the NVIDIA Container Toolkit version that release's go.mod requires, built
# once per toolkit version into $GPULAB_CACHE/nvidia-container-toolkit/<toolkit version>/
# and linked from the plugin's dir:
#   nvidia-ctk                every pinned release: its CDI specs name it as the hook that
#                             runs in every GPU container, so the CDI subjects install it on
#                             the node (as the GPU operator's toolkit does)
#   nvidia-container-runtime  the newest pinned release only (what lab GPU nodes run,
#   nvidia-cdi-hook           clusters/labs/toolkit.py): the OCI runtime containerd runs instead
#                             of runc, which turns NVIDIA_VISIBLE_DEVICES into CDI devices,
#                             and the hook the specs `nvidia-ctk cdi generate` writes name
# Not the legacy pieces (nvidia-container-runtime-hook, nvidia-container-cli): they need
# libnvidia-container, a C library no Go module provides; the runtime's CDI mode does
# without them. And gpu-feature-discovery (cmd/gpu-feature-discovery, the same module and version: GFD
# ships from this repository since v0.15), which writes the nvidia.com/* node labels, and
# mps-control-daemon (cmd/mps-control-daemon), which runs NVIDIA's MPS control daemon for
# the plugin's sharing.mps config, and config-manager (cmd/config-manager), the sidecar that
# picks the plugin's config by node label.
# Idempotent: a version whose binary exists is not rebuilt. Progress goes to stderr and
# the binary paths to stdout, so `BIN=$(clusters/infra/scripts/nvidia-plugin.sh v0.17.4)` works.
#
# usage: clusters/infra/scripts/nvidia-plugin.sh [VERSION...]            (default: every pinned version)
#
# Why not `go install <pkg>@<version>`: it also asks the proxy for the module's version
# list (to check for deprecation), and the proxy this lab uses answers 403 for that list,
# which go install treats as fatal. Downloading the one module version and building it as
# the main module gives the same build (its own go.mod and go.sum) without the list.
#
# Only what the module proxy serves is built (v0.20.0 answers 403 there): gpulab keeps no
# build of another project's checked-out source.
set -euo pipefail

# The Go caches, toolchain and flags all Go builds here share, log/die, with_ticker.
# shellcheck source=../nodeimage/lib.sh
source "$(dirname "$0")/../nodeimage/lib.sh"
# The pinned versions (clusters/versions.env), or $GPULAB_NVIDIA_PLUGIN_VERSIONS.
versions=${GPULAB_NVIDIA_PLUGIN_VERSIONS:-$NVIDIA_PLUGIN_VERSIONS}
read -ra VERSIONS <<<"${versions//,/ }"
MODULE=github.com/NVIDIA/k8s-device-plugin
TOOLKIT=github.com/NVIDIA/nvidia-container-toolkit

# The installed go (>= 1.26) is newer than every pinned release needs (v0.17.4: 1.23,
# v0.19.3: 1.25, v0.20.0: 1.26). The plugin binds NVML through cgo (dlopen at run time;
# no NVIDIA headers or libraries).
export CGO_ENABLED=1
# go-nvml calls NVML functions that nvml.h marks deprecated: hundreds of warnings, no news.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"

command -v go >/dev/null || die "nvidia-plugin: no Go toolchain on PATH (need go >= 1.26)"
command -v gcc >/dev/null || die "nvidia-plugin: no gcc on PATH (cgo needs it); install gcc"

# Prints the directory of a module version's source (MODULE VERSION), downloading it
# through the proxy.
module_source() {
  local json
  json=$(go mod download -json "$1@$2") || {
    die "nvidia-plugin: the Go module proxy does not serve $1@$2:
  $(sed -n 's/^\s*"Error": "\(.*\)"$/\1/p' <<<"$json" | sed 's/\\n\\t/ /g')"
  }
  sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p' <<<"$json"
}

build() {
  local version=$1 dir=$GPULAB_CACHE/nvidia-device-plugin/$1
  local bin=$dir/nvidia-device-plugin
  local gfd=$dir/gpu-feature-discovery mps=$dir/mps-control-daemon cm=$dir/config-manager
  local toolkit=(nvidia-ctk) cmd
  [[ $version != "${VERSIONS[0]}" ]] || toolkit+=(nvidia-container-runtime nvidia-cdi-hook)
  local missing=0
  for cmd in "${toolkit[@]}"; do [[ -x $dir/$cmd ]] || missing=1; done
  if [[ -x $bin && -x $mps && -x $cm && $missing == 0 && (-x $gfd || -f $gfd.refused) ]]; then
    log "nvidia-plugin $version: cached at $bin"
    echo "$bin"
    return
  fi
  mkdir -p "$dir"
  local src mode start=$SECONDS
  # Build into a scratch dir and move the binary in whole, so a killed build never leaves
  # a half-written binary that later runs would take as cached; scratch dirs of killed
  # builds go first.
  rm -rf "$dir"/.build.*
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  log "nvidia-plugin $version: downloading $MODULE@$version"
  src=$(module_source "$MODULE" "$version")
  # The module zip carries vendor/modules.txt but not the vendored packages.
  mode=mod
  if [[ ! -x $bin ]]; then
    log "nvidia-plugin $version: go build ./cmd/nvidia-device-plugin ($(go env GOVERSION); about 2 min cold, under 1 min warm)"
    (cd "$src" && with_ticker "$version" nice -n 10 go build -mod=$mode -trimpath \
      -o "$tmp/nvidia-device-plugin" ./cmd/nvidia-device-plugin) || die "nvidia-plugin $version: go build failed (see above)"
    mv "$tmp/nvidia-device-plugin" "$bin"
  fi
  if [[ ! -x $mps ]]; then
    # The MPS control daemon (sharing.mps): the same module, so its build is mostly cached.
    log "nvidia-plugin $version: go build ./cmd/mps-control-daemon (shares the plugin's build cache)"
    (cd "$src" && with_ticker "mps-control-daemon $version" nice -n 10 go build -mod=$mode \
      -trimpath -o "$tmp/mps-control-daemon" ./cmd/mps-control-daemon) ||
      die "nvidia-plugin $version: building mps-control-daemon failed (see above)"
    mv "$tmp/mps-control-daemon" "$mps"
  fi
  if [[ ! -x $cm ]]; then
    # The config manager (the GPU Operator's and the chart's sidecar: a node label picks
    # the plugin's config from a ConfigMap, then SIGHUP): the same module.
    log "nvidia-plugin $version: go build ./cmd/config-manager (shares the plugin's build cache)"
    (cd "$src" && with_ticker "config-manager $version" nice -n 10 go build -mod=$mode \
      -trimpath -o "$tmp/config-manager" ./cmd/config-manager) ||
      die "nvidia-plugin $version: building config-manager failed (see above)"
    mv "$tmp/config-manager" "$cm"
  fi
  if [[ ! -x $gfd && ! -f $gfd.refused ]]; then
    log "nvidia-plugin $version: go build ./cmd/gpu-feature-discovery (shares the plugin's build cache)"
    if (cd "$src" && with_ticker "gfd $version" nice -n 10 go build -mod=$mode -trimpath \
      -o "$tmp/gpu-feature-discovery" ./cmd/gpu-feature-discovery) 2> >(tee "$tmp/gfd.err" >&2); then
      mv "$tmp/gpu-feature-discovery" "$gfd"
    elif grep -q '403 Forbidden' "$tmp/gfd.err"; then
      # The proxy refuses a dependency (v0.17.4 needs node-feature-discovery v0.15.7: 403):
      # a fact about this proxy, kept so later runs do not retry; that image has no GFD.
      grep -m1 '403 Forbidden' "$tmp/gfd.err" | sed 's/^[^ ]* //' >"$gfd.refused"
      log "nvidia-plugin $version: gpu-feature-discovery not built, the Go module proxy refuses a dependency: $(cat "$gfd.refused")"
    else
      die "nvidia-plugin $version: building gpu-feature-discovery failed (see above)"
    fi
  fi
  if ((missing)); then
    local tk tk_src tkdir
    tk=$(awk -v m="$TOOLKIT" '$1 == m { print $2; exit }' "$src/go.mod")
    [[ -n $tk ]] || die "nvidia-plugin $version: its go.mod requires no $TOOLKIT"
    tkdir=$GPULAB_CACHE/nvidia-container-toolkit/$tk
    mkdir -p "$tkdir"
    for cmd in "${toolkit[@]}"; do
      if [[ ! -x $tkdir/$cmd ]]; then
        log "nvidia-plugin $version: go build $TOOLKIT@$tk ./cmd/$cmd"
        tk_src=$(module_source "$TOOLKIT" "$tk")
        # The version string upstream's Makefile sets (its LIB_VERSION: no leading v).
        (cd "$tk_src" && with_ticker "$cmd $tk" nice -n 10 go build -mod=mod -trimpath \
          -ldflags "-s -w -X $TOOLKIT/internal/info.version=${tk#v}" \
          -o "$tmp/$cmd" "./cmd/$cmd") || die "nvidia-plugin $version: building $cmd $tk failed (see above)"
        mv "$tmp/$cmd" "$tkdir/$cmd"
      fi
      # Relative, so an infra cache exported and imported elsewhere keeps it.
      ln -sfn "../../nvidia-container-toolkit/$tk/$cmd" "$dir/$cmd"
    done
  fi
  rm -rf "$tmp"
  log "nvidia-plugin $version: built in $((SECONDS - start)) s -> $bin"
  echo "$bin"
}

tmp=
trap '[[ -z $tmp ]] || rm -rf "$tmp"' EXIT

(($#)) || set -- "${VERSIONS[@]}"
for v in "$@"; do
  build "$v"
done
