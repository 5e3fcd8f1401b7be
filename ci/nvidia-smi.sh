#!/usr/bin/env bash
# NVIDIA's real nvidia-smi (Debian's non-free package, the pinned NVIDIA_SMI_VERSION) into
# $GPULAB_CACHE/nvidia-smi/<version>/nvidia-smi, for tests/fakenvml/test_nvidia_smi.py.
#
# Only the binary: the package depends on libnvidia-ml1 and the driver, which we neither
# want nor install; `apt-get download` fetches the one .deb and `dpkg -x` unpacks it. The
# non-free component gets its own sources file, pinned to -1 so that apt never installs
# anything from it (a download by exact version still works). Debian 12 machines only
# (where the tests run); elsewhere (Ubuntu CI runners, which run no unit tests) it says so
# and does nothing. Idempotent; nothing happens once the binary is in the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
source clusters/nodeimage/lib.sh

SOURCES=/etc/apt/sources.list.d/gpulab-nonfree.sources
PREFS=/etc/apt/preferences.d/gpulab-nonfree
PKG=nvidia-smi=$NVIDIA_SMI_VERSION
dest=$GPULAB_CACHE/nvidia-smi/$NVIDIA_SMI_VERSION

[[ -x $dest/nvidia-smi ]] && exit 0

# shellcheck source=/dev/null
. /etc/os-release
if [[ ${ID:-} != debian || ${VERSION_CODENAME:-} != bookworm ]]; then
  log "nvidia-smi: not Debian 12 (${PRETTY_NAME:-unknown}); not fetched, its tests will fail here"
  exit 0
fi

known() { has_output "Version: $NVIDIA_SMI_VERSION" apt-cache show "$PKG"; }

if ! known; then
  [[ $(id -u) -eq 0 ]] || die "nvidia-smi: apt knows no $PKG and adding the non-free source needs root"
  if [[ ! -e $SOURCES ]]; then
    mirror=$(debian_mirror)
    [[ -n $mirror ]] || die "nvidia-smi: no bookworm/main apt source to derive a non-free one from"
    log "nvidia-smi: adding bookworm non-free ($mirror) as a download-only apt source"
    cat >"$SOURCES" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # -1: never a candidate for installation; `apt-get download pkg=version` ignores pins.
    cat >"$PREFS" <<'EOF'
Package: *
Pin: release c=non-free
Pin-Priority: -1
EOF
  fi
  log "nvidia-smi: apt-get update"
  apt-get update -qq
  known || die "nvidia-smi: apt has no $PKG (a Debian point release may have replaced it)"
fi

tmp=$(fresh_tmp "$dest")
log "nvidia-smi: downloading $PKG"
# As root apt drops to _apt for downloads, which cannot write a root-owned temp dir.
sandbox=()
[[ $(id -u) -eq 0 ]] && sandbox=(-o APT::Sandbox::User=root)
(cd "$tmp" && apt-get download -qq "${sandbox[@]}" "$PKG") || die "nvidia-smi: apt-get download $PKG failed"
deb=("$tmp"/nvidia-smi_*.deb)
sum=$(sha256sum "${deb[0]}")
[[ ${sum%% *} == "$NVIDIA_SMI_SHA256" ]] ||
  die "nvidia-smi: ${deb[0]##*/} has sha256 ${sum%% *}, pinned $NVIDIA_SMI_SHA256"
dpkg -x "${deb[0]}" "$tmp/root"
mv "$tmp/root/usr/lib/nvidia/current/nvidia-smi" "$tmp/nvidia-smi"
rm -rf "$tmp/root" "${deb[0]}"
publish_dir "$tmp" "$dest"
log "nvidia-smi: $dest/nvidia-smi"
