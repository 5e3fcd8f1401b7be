#!/usr/bin/env bash
# Adds what Debian 12 lab machines have and Ubuntu GitHub runners lack, before `make infra`:
# debootstrap with Debian's keyring, and a Debian mirror for the lab images' root
# filesystems (exported to the later steps through $GITHUB_ENV). Everything else — kind,
# the node image (pulled there, built here), NVIDIA's plugin — is chosen by `make infra`
# itself, the same code path as on offline machines.
set -euo pipefail

[[ $(id -u) -eq 0 ]] || { echo "error: run as root (sudo -E $0)" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends debootstrap debian-archive-keyring >/dev/null
# Ubuntu's apt sources name no bookworm mirror to derive one from.
if [[ -n ${GITHUB_ENV:-} ]]; then
  echo "DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >>"$GITHUB_ENV"
fi
echo "runner prepared: debootstrap $(dpkg-query -W -f '${Version}' debootstrap)" >&2
