#!/usr/bin/env bash
# Ensures a Docker engine that can run kind's privileged node containers.
#
# Does nothing when `docker info` already answers (GitHub runners). Otherwise:
#  - installs docker.io and containerd from Debian trixie (Docker >= 23). On these
#    VMs the capability bounding set lacks CAP_SYS_RESOURCE; Docker 20.10 (bookworm) asks
#    for every capability under --privileged and fails with "unable to apply caps", while
#    Docker >= 23 grants only the bounding set. An apt pin keeps the rest of the system
#    (runc included) on bookworm: only these two packages come from trixie;
#  - starts dockerd in the background (no systemd here), logging to /var/log/dockerd.log;
#  - checks `docker run --privileged` with a busybox image built locally (no registry).
# Idempotent: every step checks before it acts.
set -euo pipefail

# debian_mirror, trixie_sources (its log/die are replaced below).
# shellcheck source=../nodeimage/lib.sh
source "$(dirname "$0")/../nodeimage/lib.sh"

LOG=/var/log/dockerd.log
PROBE_IMAGE=gpulab/probe:busybox
MIN_MAJOR=23

log() { printf '[%s] docker: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: docker: %s\n' "$*" >&2; exit 1; }

# Major version of the installed dockerd, empty when there is none.
engine_major() {
  command -v dockerd >/dev/null || return 0
  dockerd --version | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p'
}

install_engine() {
  [[ $(id -u) -eq 0 ]] || die "no working engine and not root; run as root or start Docker yourself"
  command -v apt-get >/dev/null || die "no working engine and no apt-get to install one"
  local mirror
  mirror=$(debian_mirror)
  [[ -n $mirror ]] || die "no bookworm/main apt source found to derive a trixie source from"
  if [[ ! -e /etc/apt/sources.list.d/gpulab-trixie.sources ]]; then
    log "adding the trixie apt suite ($mirror), pinned below bookworm"
    trixie_sources "$mirror" >/etc/apt/sources.list.d/gpulab-trixie.sources
    # Priority 100: nothing moves to trixie unless asked for by name (pkg/trixie below).
    cat >/etc/apt/preferences.d/gpulab-trixie <<'EOF'
Package: *
Pin: release n=trixie
Pin-Priority: 100
EOF
  fi
  log "apt-get update"
  apt-get update -qq
  log "installing docker.io and containerd from trixie, runc from bookworm (+ busybox-static)"
  # trixie's docker.io and containerd need only libc6 >= 2.34, which bookworm has; its
  # runc and tini need libc6 2.38 (a libc/base-files upgrade), so they stay on bookworm.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    docker.io/trixie containerd/trixie runc tini busybox-static iptables >/dev/null
  [[ $(engine_major) -ge $MIN_MAJOR ]] || die "installed dockerd is $(dockerd --version), need >= $MIN_MAJOR"
}

start_engine() {
  if pgrep -x dockerd >/dev/null; then
    log "dockerd already running (pid $(pgrep -x dockerd)); waiting for it"
  else
    # Never configure "bridge": "none": such a daemon deletes the host's docker0.
    log "starting dockerd (log: $LOG)"
    # Without lib.sh's GOGC: that is for the Go toolchain, not a daemon that runs for days.
    nohup env -u GOGC dockerd >>"$LOG" 2>&1 </dev/null &
  fi
  local i
  for i in $(seq 1 60); do
    docker info >/dev/null 2>&1 && { log "engine answers after ${i}s"; return 0; }
    sleep 1
  done
  tail -n 20 "$LOG" >&2 || true
  die "dockerd did not answer 'docker info' within 60s (see $LOG)"
}

# A busybox rootfs imported as an image: proves the engine runs privileged containers.
check_privileged() {
  if ! docker image inspect "$PROBE_IMAGE" >/dev/null 2>&1; then
    local bb; bb=$(command -v busybox) || die "busybox not found to build $PROBE_IMAGE"
    local dir; dir=$(mktemp -d)
    mkdir -p "$dir/bin"
    cp "$bb" "$dir/bin/busybox"
    ln -s busybox "$dir/bin/sh"
    ln -s busybox "$dir/bin/true"
    tar -C "$dir" -c . | docker import - "$PROBE_IMAGE" >/dev/null
    rm -rf "$dir"
  fi
  docker run --rm --privileged "$PROBE_IMAGE" /bin/true ||
    die "docker run --privileged failed; see $LOG"
  log "docker run --privileged works ($(docker version -f '{{.Server.Version}}'))"
}

# Every kind node's kubelet, containerd (its CDI spec watch too), systemd and the plugins
# hold inotify instances of the host's root user; two labs pass the kernel's default of 128
# and the next one fails with "too many open files" (kind's known issue; these are the
# values its docs give). Raised only, never lowered.
raise_inotify_limits() {
  local key want have
  for key in fs.inotify.max_user_instances=512 fs.inotify.max_user_watches=524288; do
    want=${key#*=}
    have=$(sysctl -n "${key%=*}" 2>/dev/null) || continue
    ((have >= want)) && continue
    if sysctl -qw "$key" 2>/dev/null; then
      log "raised ${key%=*} from $have to $want (kind nodes share the host's inotify limits)"
    else
      log "warning: ${key%=*} is $have and cannot be raised here (not root?); labs beyond one may fail with 'too many open files'"
    fi
  done
}

main() {
  raise_inotify_limits
  if docker info >/dev/null 2>&1; then
    log "engine already answers ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
    return 0
  fi
  local major; major=$(engine_major)
  if [[ -z $major || $major -lt $MIN_MAJOR ]]; then install_engine; fi
  start_engine
  check_privileged
}

main "$@"
