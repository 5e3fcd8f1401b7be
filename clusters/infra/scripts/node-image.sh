#!/usr/bin/env bash
# Prints the name of a kind node image present in the local Docker engine
# (`--choose`: only where it comes from, "upstream REF" or "local").
# For $GPULAB_KUBE_VERSION, else the newest pinned Kubernetes (clusters/versions.env).
#   NODE_IMAGE_SOURCE=auto (default): kind's own image of that version ($KIND_NODE_IMAGE, where
#     a kind release made one) when it is already here or can be pulled (GitHub runners), else
#     the local build below.
#   NODE_IMAGE_SOURCE=local: always the local build; =upstream: never.
# The local build uses package registries only (Debian packages + Go modules), since no
# container registry is reachable on these machines; see clusters/infra/nodeimage/build.sh.
# Products are cached under /var/cache/gpulab (GPULAB_CACHE); a cold build works too.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../nodeimage/lib.sh"

source=${NODE_IMAGE_SOURCE:-auto}
case $source in auto | local | upstream) ;; *) die "NODE_IMAGE_SOURCE is '$source', expected auto, local or upstream" ;; esac

# Prints "upstream REF" or "local": the one place that decides where the image comes from.
choose() {
  [[ $source == local ]] && { echo local; return; }
  if [[ -z $KIND_NODE_IMAGE ]]; then
    [[ $source == auto ]] || die "no kind release made an image of Kubernetes $KUBE_VERSION (KIND_NODE_IMAGES)"
    echo local; return
  fi
  if docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1; then
    echo "upstream $KIND_NODE_IMAGE"; return
  fi
  # A local image means a pull failed here before: don't wait on the registry again.
  if [[ $source == auto ]] && docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
    echo local; return
  fi
  log "node image: pulling $KIND_NODE_IMAGE"
  local pull_err
  if pull_err=$(timeout 600 docker pull -q "$KIND_NODE_IMAGE" 2>&1); then
    echo "upstream $KIND_NODE_IMAGE"; return
  fi
  [[ $source == auto ]] || die "cannot pull $KIND_NODE_IMAGE: ${pull_err##*$'\n'}"
  log "node image: cannot pull (${pull_err##*$'\n'}); it is built locally"
  echo local
}

docker info >/dev/null 2>&1 || die "no Docker engine answers; run clusters/infra/scripts/docker.sh first"
choice=$(choose)
if [[ ${1:-} == --choose ]]; then echo "$choice"; exit 0; fi
if [[ $choice == upstream* ]]; then echo "${choice#upstream }"; exit 0; fi
exec "$here/../nodeimage/build.sh"
