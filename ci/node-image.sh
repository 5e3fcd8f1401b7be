#!/usr/bin/env bash
# Prints the name of a kind node image present in the local Docker engine.
#   NODE_IMAGE_SOURCE=auto (default): kind's own pinned image ($KIND_NODE_IMAGE) when it
#     is already here or can be pulled (GitHub runners), else the local build below.
#   NODE_IMAGE_SOURCE=local: always the local build; =upstream: never.
# The local build uses package registries only (Debian packages + Go modules), since no
# container registry is reachable on these machines; see clusters/nodeimage/build.sh.
# Products are cached under /var/cache/gpulab (GPULAB_CACHE); a cold build works too.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../clusters/nodeimage/lib.sh"

source=${NODE_IMAGE_SOURCE:-auto}
case $source in auto | local | upstream) ;; *) die "NODE_IMAGE_SOURCE is '$source', expected auto, local or upstream" ;; esac

"$here/docker.sh"

if [[ $source != local ]]; then
  if docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1; then
    echo "$KIND_NODE_IMAGE"; exit 0
  fi
  log "node image: pulling $KIND_NODE_IMAGE"
  if pull_err=$(timeout 600 docker pull -q "$KIND_NODE_IMAGE" 2>&1); then
    echo "$KIND_NODE_IMAGE"; exit 0
  fi
  [[ $source == auto ]] || die "cannot pull $KIND_NODE_IMAGE: ${pull_err##*$'\n'}"
  log "node image: cannot pull (${pull_err##*$'\n'}); building it locally"
fi
exec "$here/../clusters/nodeimage/build.sh"
