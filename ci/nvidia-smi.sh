#!/usr/bin/env bash
# NVIDIA's real driver programs from Debian's non-free packages, into the cache:
#   $GPULAB_CACHE/nvidia-smi/<version>/nvidia-smi, for two pinned versions, both of which
#   tests/fakenvml/test_nvidia_smi.py runs against the fake (a missing one fails its tests):
#     NVIDIA_SMI_VERSION              (bookworm, 535)
#     NVIDIA_SMI_DRIVER_ROOT_VERSION  (trixie, 550) also what the gpulab image installs into
#                                     fake driver roots: NVIDIA's DRA driver runs `nvidia-smi
#                                     --version` there, an option 535 does not have
#   $GPULAB_CACHE/nvidia-cuda-mps/<version>/nvidia-cuda-mps-{control,server}: the MPS
#     control daemon and server of the driver root's version (NVIDIA_CUDA_MPS_VERSION); the
#     driver roots carry them as a real driver install does, and NVIDIA's MPS control
#     daemon runs the control program (the daemon starts without a GPU: it serves its
#     control socket and settings; a server starts only for a CUDA client).
#
# Only the binaries: the packages depend on libnvidia-ml1 and the driver, which we neither
# want nor install; `apt-get download` fetches the one .deb and `dpkg -x` unpacks it. The
# non-free component gets its own sources file, pinned to -1 so that apt never installs
# anything from it (a download by exact version still works). Debian 12 machines only
# (where the tests run); elsewhere (Ubuntu CI runners, which run no unit tests) it says so
# and does nothing. Idempotent; nothing happens once the binaries are in the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
source clusters/infra/nodeimage/lib.sh

SOURCES=/etc/apt/sources.list.d/gpulab-nonfree.sources
PREFS=/etc/apt/preferences.d/gpulab-nonfree
SUITES="bookworm bookworm-updates trixie"

# shellcheck source=/dev/null
. /etc/os-release
if [[ ${ID:-} != debian || ${VERSION_CODENAME:-} != bookworm ]]; then
  log "nvidia-smi: not Debian 12 (${PRETTY_NAME:-unknown}); not fetched, its tests will fail here"
  exit 0
fi

known() { has_output "Version: ${1#*=}" apt-cache show "$1"; }

# The non-free source (and its -1 pin), with every suite a pinned version comes from.
sources() {
  [[ $(id -u) -eq 0 ]] || die "nvidia-smi: adding the non-free source needs root"
  local mirror
  mirror=$(debian_mirror)
  [[ -n $mirror ]] || die "nvidia-smi: no bookworm/main apt source to derive a non-free one from"
  log "nvidia-smi: $SUITES non-free ($mirror) as a download-only apt source"
  printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: non-free\nSigned-By: %s\n' \
    "$mirror" "$SUITES" /usr/share/keyrings/debian-archive-keyring.gpg >"$SOURCES"
  # -1: never a candidate for installation; `apt-get download pkg=version` ignores pins.
  printf 'Package: *\nPin: release c=non-free\nPin-Priority: -1\n' >"$PREFS"
  log "nvidia-smi: apt-get update"
  apt-get update -qq
}

# fetch PACKAGE VERSION SHA256 FILE...: each FILE (its path in the .deb) of PACKAGE=VERSION
# into $GPULAB_CACHE/PACKAGE/VERSION/, the .deb checked against the pinned hash.
fetch() {
  local name=$1 want=$3 pkg=$1=$2 dest=$GPULAB_CACHE/$1/$2 file; shift 3
  [[ -e $dest/${1##*/} ]] && return
  if ! known "$pkg"; then
    grep -qsx "Suites: $SUITES" "$SOURCES" || sources
    known "$pkg" || die "nvidia-smi: apt has no $pkg (a Debian point release may have replaced it)"
  fi
  local tmp deb sum sandbox=()
  tmp=$(fresh_tmp "$dest")
  log "nvidia-smi: downloading $pkg"
  # As root apt drops to _apt for downloads, which cannot write a root-owned temp dir.
  [[ $(id -u) -eq 0 ]] && sandbox=(-o APT::Sandbox::User=root)
  (cd "$tmp" && apt-get download -qq "${sandbox[@]}" "$pkg") || die "nvidia-smi: apt-get download $pkg failed"
  deb=("$tmp/${name}"_*.deb)
  sum=$(sha256sum "${deb[0]}")
  [[ ${sum%% *} == "$want" ]] || die "nvidia-smi: ${deb[0]##*/} has sha256 ${sum%% *}, pinned $want"
  dpkg -x "${deb[0]}" "$tmp/root"
  for file; do mv "$tmp/root/$file" "$tmp/"; done
  rm -rf "$tmp/root" "${deb[0]}"
  publish_dir "$tmp" "$dest"
  log "nvidia-smi: $dest: $(cd "$dest" && echo *)"
}

smi=usr/lib/nvidia/current/nvidia-smi
fetch nvidia-smi "$NVIDIA_SMI_VERSION" "$NVIDIA_SMI_SHA256" $smi
fetch nvidia-smi "$NVIDIA_SMI_DRIVER_ROOT_VERSION" "$NVIDIA_SMI_DRIVER_ROOT_SHA256" $smi
fetch nvidia-cuda-mps "$NVIDIA_SMI_DRIVER_ROOT_VERSION" "$NVIDIA_CUDA_MPS_SHA256" \
  usr/bin/nvidia-cuda-mps-control usr/sbin/nvidia-cuda-mps-server
