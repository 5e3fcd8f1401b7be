#!/usr/bin/env bash
# Builds the lab images locally — no registry is needed — and prints `name=image` lines:
#   base       Debian bookworm minbase + python3 (the glibc userland the others share)
#   gpulab     gpulab's Python package (fakenvml CLI, our plugin) + libnvidia-ml.so.1
#   workload   what the pod specs run: busybox, prints its env, sleeps (a few MB)
#   nvidia-<v> NVIDIA's device plugin binary (ci/nvidia-plugin.sh) on the base image
# Every image is tagged with a hash of its inputs, so a warm run only checks tags.
# usage: clusters/images/build.sh [base|gpulab|workload|nvidia]...   (default: all)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$repo/clusters/nodeimage/lib.sh"
WORK=$GPULAB_CACHE/images
mkdir -p "$WORK"
# One build at a time: two labs coming up together share $WORK (wheels, contexts).
exec 9>"$WORK/.lock"
flock 9

have() { docker image inspect "$1" >/dev/null 2>&1; }

# Build context from a Dockerfile and files; the classic builder uses local images only.
docker_build() {
  local tag=$1 ctx=$2
  DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$ctx" >/dev/null 2>"$WORK/build.log" ||
    die "images: building $tag failed, see $WORK/build.log"
}

image_base() {
  local packages="python3 ca-certificates"
  local tag=gpulab/base:bookworm-$(inputs_hash "$packages" "$NODE_SUITE")
  if ! have "$tag"; then
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    local dir=$WORK/base.d mirror
    mirror=$(debian_mirror)
    rm -rf "$dir"
    log "images: base: debootstrap $NODE_SUITE minbase + $packages (about 1 min)"
    with_ticker debootstrap debootstrap --variant=minbase --include="${packages// /,}" \
      "$NODE_SUITE" "$dir" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
      die "images: debootstrap failed, see $WORK/debootstrap.log"
    chroot "$dir" apt-get clean
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* "$dir"/usr/share/man/* \
      "$dir"/usr/share/locale/*
    tar -C "$dir" --numeric-owner -c . | docker import - "$tag" >/dev/null
    rm -rf "$dir"
  fi
  echo "$tag"
}

image_gpulab() {
  local base lib=$repo/build/release/libnvidia-ml.so.1
  base=$(image_base)
  [[ -f $lib ]] || die "images: $lib missing; run make install first"
  local wheels=$WORK/wheels
  rm -rf "$wheels"; mkdir -p "$wheels"
  log "images: gpulab: building wheels"
  "$repo/.venv/bin/pip" wheel -q --disable-pip-version-check -w "$wheels" "$repo" >/dev/null
  local tag=gpulab/gpulab:$(inputs_hash "$base" "$wheels" "$lib" "$here/gpulab.Dockerfile")
  if ! have "$tag"; then
    local ctx=$WORK/gpulab.ctx
    rm -rf "$ctx"; mkdir -p "$ctx/site" "$ctx/lib"
    # Install on the host into a tree the image copies: the base has no pip, and the
    # wheels are cp311 like the image's python3.
    "$repo/.venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-compile \
      --target "$ctx/site" "$wheels"/*.whl >/dev/null
    cp "$lib" "$ctx/lib/"
    sed "s|@BASE@|$base|" "$here/gpulab.Dockerfile" >"$ctx/Dockerfile"
    log "images: gpulab: docker build $tag"
    docker_build "$tag" "$ctx"
    # Never tag an image that cannot import its own package (a half-written context).
    docker run --rm --entrypoint python3 "$tag" -c 'import fakenvml, plugin.main' ||
      { docker rmi -f "$tag" >/dev/null; die "images: $tag cannot import gpulab"; }
  fi
  echo "$tag"
}

image_workload() {
  local deb_dir=$WORK/busybox
  mkdir -p "$deb_dir"
  if ! ls "$deb_dir"/busybox-static_*.deb >/dev/null 2>&1; then
    log "images: workload: fetching busybox-static"
    (cd "$deb_dir" && apt-get download busybox-static >/dev/null 2>&1) ||
      die "images: apt-get download busybox-static failed"
  fi
  local deb
  deb=$(ls "$deb_dir"/busybox-static_*.deb | head -1)
  local tag=gpulab/workload:$(inputs_hash "$deb" "$here/workload.sh")
  if ! have "$tag"; then
    local root=$WORK/workload.d
    rm -rf "$root"; mkdir -p "$root/x" "$root/rootfs/bin"
    dpkg-deb -x "$deb" "$root/x"
    cp "$root/x/bin/busybox" "$root/rootfs/bin/busybox"
    for app in sh env sleep cat ls; do ln -s busybox "$root/rootfs/bin/$app"; done
    install -m 0755 "$here/workload.sh" "$root/rootfs/bin/workload"
    tar -C "$root/rootfs" --numeric-owner -c . |
      docker import --change 'ENTRYPOINT ["/bin/workload"]' - "$tag" >/dev/null
    rm -rf "$root"
  fi
  echo "$tag"
}

image_nvidia() {
  local base version bin
  base=$(image_base)
  for bin in $("$repo/ci/nvidia-plugin.sh"); do
    version=$(basename "$(dirname "$bin")")
    local tag=gpulab/nvidia-device-plugin:$version-$(inputs_hash "$base" "$bin")
    if ! have "$tag"; then
      local ctx=$WORK/nvidia.ctx
      rm -rf "$ctx"; mkdir -p "$ctx"
      cp "$bin" "$ctx/nvidia-device-plugin"
      printf 'FROM %s\nCOPY nvidia-device-plugin /usr/bin/nvidia-device-plugin\nENTRYPOINT ["/usr/bin/nvidia-device-plugin"]\n' \
        "$base" >"$ctx/Dockerfile"
      log "images: nvidia: docker build $tag"
      docker_build "$tag" "$ctx"
    fi
    echo "nvidia-$version=$tag"
  done
}

[[ $# -gt 0 ]] || set -- base gpulab workload nvidia
for what in "$@"; do
  case $what in
    base) echo "base=$(image_base)" ;;
    gpulab) echo "gpulab=$(image_gpulab)" ;;
    workload) echo "workload=$(image_workload)" ;;
    nvidia) image_nvidia ;;
    *) die "images: unknown image $what (base, gpulab, workload, nvidia)" ;;
  esac
done
