#!/usr/bin/env bash
# CI entry point for the cluster tier: `make e2e` (engine, kind, images, labs, suites for
# both plugins, experiments), with its JUnit XML and experiment reports under $GPULAB_OUT
# for the workflow to upload. Runs as root, like the lab machines: labs write
# /var/lib/gpulab and /var/cache/gpulab, and the image builds chroot.
#
# On a GitHub runner (GITHUB_ACTIONS=true) it first adds what Debian 12 lab machines have
# and Ubuntu runners lack: debootstrap with Debian's keyring and a Debian mirror for the
# lab images, and the pinned kind release (the runner image ships its own kind version).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=clusters/nodeimage/versions.env
source clusters/nodeimage/versions.env

log() { printf '[%s] e2e: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: e2e: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (on GitHub: sudo -E env PATH=\"\$PATH\" ci/e2e.sh)"

export GPULAB_OUT=${GPULAB_OUT:-$PWD/out}
export GPULAB_REPORTS=${GPULAB_REPORTS:-$GPULAB_OUT/experiments}
mkdir -p "$GPULAB_OUT" "$GPULAB_REPORTS"

prepare_github_runner() {
  log "GitHub runner: debootstrap, Debian keyring"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends debootstrap debian-archive-keyring >/dev/null
  # Ubuntu's apt sources name no bookworm mirror to derive one from.
  export DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  if [[ $(kind version 2>/dev/null | awk '{print $2}') != "$KIND_VERSION" ]]; then
    local dir=/usr/local/lib/gpulab/kind-$KIND_VERSION
    log "GitHub runner: kind $KIND_VERSION (runner has: $(kind version 2>/dev/null || echo none))"
    mkdir -p "$dir"
    curl -fsSL -o "$dir/kind" "https://kind.sigs.k8s.io/dl/$KIND_VERSION/kind-linux-amd64"
    chmod +x "$dir/kind"
    export PATH=$dir:$PATH
  fi
}

summary() {
  # One line per experiment report: its title carries the verdict.
  [[ -n ${GITHUB_STEP_SUMMARY:-} ]] || return 0
  local r
  for r in "$GPULAB_REPORTS"/*/report.md; do
    [[ -e $r ]] && sed -n '1s/^# /- /p' "$r" >>"$GITHUB_STEP_SUMMARY"
  done
  return 0
}

[[ ${GITHUB_ACTIONS:-} == true ]] && prepare_github_runner
trap summary EXIT
log "make e2e (outputs: $GPULAB_OUT)"
make e2e
