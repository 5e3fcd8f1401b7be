#!/usr/bin/env bash
# Builds the node's Debian root filesystem with debootstrap and caches it as a tarball
# keyed by suite and package list. Prints the tarball's path.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# What a kind node runs besides the Kubernetes binaries: systemd as PID 1, containerd
# (trixie's, below) and runc, the CNI plugins, and the network tools kubelet and kube-proxy call.
# dbus: the system bus a GPU node has, which NVIDIA's MIG manager connects to (through the
# host's /run/dbus/system_bus_socket) to stop and start host GPU clients.
PACKAGES=(
  systemd systemd-sysv dbus containerd runc containernetworking-plugins
  iptables nftables iproute2 conntrack ethtool kmod mount util-linux procps
  ca-certificates libseccomp2
)

# containerd comes from trixie (1.7; bookworm has 1.6): CDI (the Container Device
# Interface, which NVIDIA's cdi-cri and cdi-annotations strategies hand devices over with)
# arrived in containerd 1.7. It needs only libc6 >= 2.34, so nothing else moves.
FROM_TRIXIE=(containerd)

# Bump when the steps below change what ends up in the tarball.
RECIPE=2
key=$(inputs_hash "$NODE_SUITE" "${PACKAGES[*]}" "trixie: ${FROM_TRIXIE[*]}" "recipe $RECIPE")
out=$GPULAB_CACHE/rootfs/node-$NODE_SUITE-$key.tar
[[ -s $out ]] && { echo "$out"; exit 0; }

[[ $(id -u) -eq 0 ]] || die "rootfs: debootstrap needs root"
mirror=$(debian_mirror)
[[ -n $mirror ]] || die "rootfs: no bookworm/main apt source configured to debootstrap from"

dir=$GPULAB_CACHE/rootfs/node-$NODE_SUITE-$key.d
# A failed debootstrap can leave /proc or /sys mounted in the target: unmount first.
remove_dir() {
  local m mounts
  mounts=$(findmnt -rn -o TARGET)
  for m in $(grep "^$dir/" <<<"$mounts" | sort -r); do umount -l "$m" || true; done
  rm -rf --one-file-system "$dir"
}
remove_dir; mkdir -p "$dir"
log "rootfs: debootstrap $NODE_SUITE minbase + ${#PACKAGES[@]} packages (about 1 min)"
pkgs=${PACKAGES[*]}
logfile=$GPULAB_CACHE/rootfs/debootstrap.log
with_ticker "debootstrap" cached_debootstrap "$logfile" --variant=minbase --include="${pkgs// /,}" \
  "$NODE_SUITE" "$dir" "$mirror" || die "rootfs: debootstrap failed, see $logfile"

log "rootfs: ${FROM_TRIXIE[*]} from trixie"
trixie_sources "$mirror" >"$dir/etc/apt/sources.list.d/trixie.sources"
cp -L /etc/resolv.conf "$dir/etc/resolv.conf"
{
  chroot "$dir" apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive chroot "$dir" apt-get install -y -qq --no-install-recommends \
      "${FROM_TRIXIE[@]/%//trixie}"
} >>"$logfile" 2>&1 || die "rootfs: installing ${FROM_TRIXIE[*]} from trixie failed, see $logfile"
rm -f "$dir/etc/apt/sources.list.d/trixie.sources" "$dir/etc/resolv.conf"
chroot "$dir" containerd --version | grep -q ' v\?1\.7\.' ||
  die "rootfs: containerd in the node is not 1.7: $(chroot "$dir" containerd --version)"

log "rootfs: trimming and packing"
chroot "$dir" apt-get clean
rm -rf "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* "$dir"/usr/share/man/* \
  "$dir"/usr/share/locale/* "$dir"/var/log/*.log "$dir"/var/cache/debconf/*-old
tar -C "$dir" --numeric-owner -cf "$out.tmp.$$" . || die "rootfs: packing failed"
publish_file "$out.tmp.$$" "$out"
remove_dir
# Older recipes' tarballs are never used again.
find "$GPULAB_CACHE/rootfs" -maxdepth 1 -name "node-$NODE_SUITE-*.tar*" ! -path "$out" -delete
echo "$out"
