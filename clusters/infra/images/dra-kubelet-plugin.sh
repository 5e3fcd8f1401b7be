#!/bin/sh
# gpulab's DRA driver image: what NVIDIA's chart runs as `gpu-kubelet-plugin` (this file,
# first in PATH), before the unchanged binary (/usr/bin/gpu-kubelet-plugin).
#
# On a GPU host the kernel module shows every container /proc/driver/nvidia (the MIG
# capability files a claim's prepare reads at a fixed path) and the nvidia-caps major in
# /proc/devices. A fake host's kernel has neither: fakenvml's driver root has both
# (`fakenvml install-driver`), and a volume cannot put them under /proc (runc refuses any
# mount inside /proc), so the privileged container bind-mounts the root's proc/driver over
# /proc/driver itself and points the driver's own knob for CPU-only nodes,
# ALT_PROC_DEVICES_PATH, at the root's proc/devices.
#
# The same for PCI: the driver publishes a GPU's resource.kubernetes.io/pcieRoot from the
# kernel's link /sys/bus/pci/devices/<bus id> -> ../../../devices/<root complex>/.../<bus id>.
# A fake GPU is no device of the kernel; the root keeps the kernel's tree of its GPUs
# (sys/devices), so the container gets the kernel's sysfs with the fake GPUs added: two
# read-only overlays, the root's tree over /sys/devices and the kernel's links to it over
# /sys/bus/pci/devices. The host's own devices stay as they are.
#
# Where a real driver answers (its /proc/driver/nvidia, its GPUs in /sys) nothing changes.
# Whoever installs the chart gets this: a gpulab lab, NVIDIA's own test suite, a user's
# helm install (docs/dra-driver.md).
set -eu
root=/driver-root  # where the chart mounts nvidiaDriverRoot
if [ ! -e /proc/driver/nvidia ] && [ -d "$root/proc/driver/nvidia" ]; then
  mount --bind "$root/proc/driver" /proc/driver
  if [ -z "${ALT_PROC_DEVICES_PATH:-}" ] && [ -f "$root/proc/devices" ]; then
    export ALT_PROC_DEVICES_PATH="$root/proc/devices"
  fi
fi
tree=$root/sys/devices
if [ -d "$tree" ]; then
  links=$(mktemp -d)
  find "$tree" -path "$tree/pci*" -name vendor -type f | while read -r vendor; do
    dir=${vendor%/vendor}
    [ -e "/sys/bus/pci/devices/${dir##*/}" ] && continue  # the kernel's own device
    ln -s "../../../devices/${dir#"$tree"/}" "$links/${dir##*/}"
  done
  # Where overlays cannot be had (no overlayfs), the driver runs without pcieRoot, as before.
  if [ -n "$(ls "$links")" ] &&
    ! { mount -t overlay -o "lowerdir=$tree:/sys/devices" overlay /sys/devices &&
      mount -t overlay -o "lowerdir=$links:/sys/bus/pci/devices" overlay /sys/bus/pci/devices; }; then
    echo "gpulab: cannot show the fake GPUs in /sys (no pcieRoot attribute)" >&2
  fi
fi
exec /usr/bin/gpu-kubelet-plugin "$@"
