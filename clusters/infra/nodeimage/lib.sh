# shellcheck shell=bash
# Shared helpers for the infrastructure builds (sourced, not run): the node image, kind,
# the lab images. Every product is cached under $GPULAB_CACHE, outside the repository,
# keyed by version or by a hash of its inputs; nothing here assumes a cache exists.
#
# The cache rule: a product appears under its final name only when it is complete. Builds
# write to a temporary sibling (dir.tmp.PID, ref from a gpulab/partial tag) and rename or
# re-tag on success, so a build killed at any point (Ctrl-C, OOM, a CI time-out) leaves
# nothing a later run takes for done; that run deletes the leftovers and resumes from the
# Go module/build caches and the debootstrap package cache, which are themselves atomic.

# The default is fakenvml/paths.py's: machine-wide where writable (root), else per user.
if [[ -z ${GPULAB_CACHE:-} ]]; then
  if [[ -w /var/cache/gpulab ]] || [[ ! -e /var/cache/gpulab && -w /var/cache ]]; then
    GPULAB_CACHE=/var/cache/gpulab
  else
    GPULAB_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/gpulab
  fi
fi
NODEIMAGE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../../versions.env
source "$NODEIMAGE_DIR/../../versions.env"

# Go caches live with the other products so `rm -rf $GPULAB_CACHE` is a true cold start.
export GOMODCACHE="$GPULAB_CACHE/go/mod"
export GOCACHE="$GPULAB_CACHE/go/build"
export GOTOOLCHAIN=local
# -modcacherw: a cache anyone can delete with rm -rf (Go makes module dirs read-only).
# -dwarf=false: no DWARF debug information (most builds strip it at link with -s -w
# anyway; Go's panics print from the symbol table, not DWARF). Not making it took a cold
# CoreDNS build (empty GOCACHE) from 105-107 s to 91-94 s on 2 cores, the stripped binary
# as large as before.
export GOFLAGS="-buildvcs=false -modcacherw -gcflags=all=-dwarf=false"
export CGO_ENABLED=0
# GOGC=400: Go's compiler and linker (Go programs) collect garbage a quarter as often,
# their heap growing to 5x what is live instead of 2x. A CoreDNS build with an empty
# GOCACHE took 97-100 s against 116-119 s (2 cores, 2026-12-06, both orders). Only on a
# machine of 16 GiB or more: the biggest Kubernetes packages' compiles grow by gigabytes.
# GOGC=off (GOMEMLIMIT an eighth of memory) was no cheaper in a whole cold `make infra`:
# its ten Go steps took 2100 CPU-s against 2083 at GOGC=400 (CHANGELOG.md, 2026-12-06).
# An explicit $GOGC wins; dockerd, started from docker.sh, runs without it.
if [[ -z ${GOGC:-} ]] && (( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) >= 16 * 1024 * 1024 )); then
  export GOGC=400
fi
# The Kubernetes version to build or choose: $GPULAB_KUBE_VERSION, else the newest pinned.
KUBE_VERSION=${GPULAB_KUBE_VERSION:-${KUBE_VERSIONS%% *}}
[[ $KUBE_VERSION =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || { echo "error: Kubernetes version '$KUBE_VERSION' is not v1.MINOR.PATCH" >&2; exit 1; }
KUBE_MINOR=${BASH_REMATCH[1]}
# kind's own image for exactly this version, if a kind release made one (else empty).
KIND_NODE_IMAGE=""
for _ref in $KIND_NODE_IMAGES; do
  [[ $_ref == "kindest/node:$KUBE_VERSION@"* ]] && KIND_NODE_IMAGE=$_ref
done
# crictl: the newest pinned cri-tools release whose minor is not above Kubernetes'.
CRI_TOOLS_VERSION="" CRI_TOOLS_SUM=""
for _pin in $CRI_TOOLS; do
  _v=${_pin%%=*} _m=${_pin%%=*}; _m=${_m#v1.}; _m=${_m%%.*}
  if (( _m <= KUBE_MINOR )) && [[ -z $CRI_TOOLS_VERSION ]]; then CRI_TOOLS_VERSION=$_v CRI_TOOLS_SUM=${_pin#*=}; fi
done
unset _ref _pin _v _m
# For the scripts that source this file and the builds they start.
export KUBE_VERSION KIND_NODE_IMAGE CRI_TOOLS_VERSION CRI_TOOLS_SUM
# The node image built here where kind's own cannot be pulled.
NODE_IMAGE=${NODE_IMAGE:-gpulab/kind-node:$KUBE_VERSION}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Go builds share two cores with other work: keep them polite.
gobuild() { nice -n 10 go build -trimpath "$@"; }

# Run a long command, printing a line every minute so logs show it is alive.
with_ticker() {
  local what=$1; shift
  local start=$SECONDS
  # stdout to stderr: a lingering `sleep` must not hold the caller's stdout pipe open. The
  # subshell's own stderr is dropped (its lines go to fd 3): killing its `sleep` below made
  # it print "Terminated" in every build log, which reads as a failure.
  ( exec 3>&2 2>/dev/null
    while sleep 60; do log "  ... $what: $(( (SECONDS - start) / 60 )) min" 2>&3; done ) >&2 &
  local ticker=$!
  local rc=0
  "$@" || rc=$?
  # Its `sleep` first: left running, it held every descriptor it inherited for up to a
  # minute, one_at_a_time's lock among them (a second build of a product waited on it).
  pkill -P "$ticker" sleep 2>/dev/null || true
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  return "$rc"
}

# ---- atomic cache entries ---------------------------------------------------------------

# A fresh, empty temporary sibling of DIR (printed); leftovers of killed builds of DIR are
# removed first. Pair with publish_dir.
fresh_tmp() {
  local dir=$1 old
  mkdir -p "$(dirname "$dir")"
  for old in "$dir".tmp.*; do [[ -e $old ]] && rm -rf --one-file-system "$old"; done
  mkdir "$dir.tmp.$$"
  echo "$dir.tmp.$$"
}

# build_tmp DIR: an empty scratch dir inside DIR (made if missing) for a build whose
# products land in DIR, any left by an interrupted build removed first; the caller traps
# its removal.
build_tmp() {
  mkdir -p "$1"
  rm -rf "$1"/.build.*
  mktemp -d "$1/.build.XXXXXX"
}

# Moves a finished TMP into place as DIR, replacing an older DIR.
publish_dir() {
  local tmp=$1 dir=$2
  rm -rf "$dir"
  mv -T "$tmp" "$dir"
}

# Moves a finished file into place (same file system: rename(2) is atomic).
publish_file() { mv -f "$1" "$2"; }

# import_image REF [docker import options...] < rootfs.tar
# Imports under a temporary tag and tags REF only after the import finished: a tar stream
# cut short ends the import early and would otherwise be tagged REF as if it were whole.
# The image REF named before is removed when nothing else uses it.
import_image() {
  local ref=$1 tmp old new; shift
  tmp=gpulab/partial:$$-$RANDOM
  old=$(docker image inspect -f '{{.Id}}' "$ref" 2>/dev/null || true)
  docker import "$@" - "$tmp" >/dev/null || die "docker import of $ref failed"
  docker tag "$tmp" "$ref" && docker rmi "$tmp" >/dev/null || die "tagging $ref failed"
  new=$(docker image inspect -f '{{.Id}}' "$ref")
  if [[ -n $old && $old != "$new" ]]; then docker rmi "$old" >/dev/null 2>&1 || true; fi
}

# tar_image REF DIR [docker import options...]: DIR as an image, imported atomically.
# The tar is written to a file first: a producer killed mid-stream then fails this
# function, instead of handing docker an archive that merely ends early.
tar_image() {
  local ref=$1 dir=$2 tarfile; shift 2
  tarfile=$(mktemp "$GPULAB_CACHE/.import.XXXXXX.tar")
  tar -C "$dir" --numeric-owner -cf "$tarfile" . || { rm -f "$tarfile"; die "packing $dir failed"; }
  import_image "$ref" "$@" <"$tarfile"
  rm -f "$tarfile"
}

# Removes what killed builds leave behind: gpulab/partial tags, import tars.
clean_partials() {
  # Only partials of builds that are gone: their tag starts with the builder's pid, and
  # `make infra` builds lab images beside the node image (two builders at once).
  local tag pid stale=()
  for tag in $(docker images --format '{{.Tag}}' gpulab/partial 2>/dev/null || true); do
    pid=${tag%%-*}
    [[ $pid =~ ^[0-9]+$ && -d /proc/$pid ]] || stale+=("gpulab/partial:$tag")
  done
  ((${#stale[@]} == 0)) || docker rmi -f "${stale[@]}" >/dev/null 2>&1 || true
  find "$GPULAB_CACHE" -maxdepth 1 -name '.import.*.tar' -mmin +60 -delete 2>/dev/null || true
}

# ---- small readers that never race under pipefail ----------------------------------------
# `cmd | grep -q`, `| head` and awk's `exit` stop reading early; the writer then dies of
# SIGPIPE and `set -o pipefail` fails the pipeline, depending on timing. These capture
# whole outputs first.

# has_output PATTERN CMD...: CMD's output (stdout+stderr) contains PATTERN (a glob).
has_output() {
  local pattern=$1 out; shift
  out=$("$@" 2>&1) || return 1
  [[ $out == *$pattern* ]]
}

# Directory of a module version in the module cache (downloads it if needed).
moddir() {
  local json
  json=$(go mod download -json "$1") || return 1
  sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p' <<<"$json"
}

# An apt source (deb822) for Debian trixie on MIRROR: the host's Docker engine and the
# node's containerd come from trixie, everything else from bookworm.
trixie_sources() {
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
    "$1" /usr/share/keyrings/debian-archive-keyring.gpg
}

# The machine's own Debian mirror (from apt's configuration), so no host is written here.
debian_mirror() {
  if [[ -n ${DEBIAN_MIRROR:-} ]]; then echo "$DEBIAN_MIRROR"; return; fi  # e.g. Ubuntu CI
  local policy
  policy=$(apt-cache policy)
  awk '$3 == "bookworm/main" && !m { m = $2 } END { print m }' <<<"$policy"
}

# debootstrap with a package cache under $GPULAB_CACHE: a killed run's downloads are kept,
# so the next one resumes instead of fetching every .deb again.
# usage: cached_debootstrap LOGFILE debootstrap-args...
cached_debootstrap() {
  local logfile=$1; shift
  local debs=$GPULAB_CACHE/debootstrap-debs
  mkdir -p "$debs"
  command -v debootstrap >/dev/null || {
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
      die "cannot install debootstrap"
  }
  debootstrap --cache-dir="$debs" "$@" >"$logfile" 2>&1
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
