# shellcheck shell=bash
# Shared helpers for the node-image build (sourced, not run).
# Every product is cached under $GPULAB_CACHE, outside the repository, keyed by
# version, so warm runs only check stamps; nothing here assumes a cache exists.

GPULAB_CACHE=${GPULAB_CACHE:-/var/cache/gpulab}
NODEIMAGE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$NODEIMAGE_DIR/versions.env"

# Go caches live with the other products so `rm -rf $GPULAB_CACHE` is a true cold start.
export GOMODCACHE="$GPULAB_CACHE/go/mod"
export GOCACHE="$GPULAB_CACHE/go/build"
export GOTOOLCHAIN=local
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Go builds share two cores with other work: keep them polite.
gobuild() { nice -n 10 go build -trimpath "$@"; }

# Run a step unless its stamp exists; the stamp is written only on success.
cached_step() {
  local stamp=$1; shift
  if [[ -e $stamp ]]; then return 0; fi
  "$@"
  mkdir -p "$(dirname "$stamp")"
  touch "$stamp"
}

# Run a long command, printing a line every minute so logs show it is alive.
with_ticker() {
  local what=$1; shift
  local start=$SECONDS
  ( while sleep 60; do log "  ... $what: $(( (SECONDS - start) / 60 )) min"; done ) &
  local ticker=$!
  local rc=0
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  return "$rc"
}

# Directory of a module version in the module cache (downloads it if needed).
moddir() { go mod download -json "$1" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p'; }

# The machine's own Debian mirror (from apt's configuration), so no host is written here.
debian_mirror() {
  if [[ -n ${DEBIAN_MIRROR:-} ]]; then echo "$DEBIAN_MIRROR"; return; fi  # e.g. Ubuntu CI
  apt-cache policy | awk '$3 == "bookworm/main" { print $2; exit }'
}

# Short content hash of files and strings, used to key cached products.
inputs_hash() {
  local arg
  for arg in "$@"; do
    if [[ -f $arg ]]; then cat "$arg"; elif [[ -d $arg ]]; then
      (cd "$arg" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
    else printf '%s\n' "$arg"; fi
  done | sha256sum | cut -c1-12
}
