#!/usr/bin/env bash
# Builds a kind-compatible node image for $KUBE_VERSION from package registries only
# (Debian packages + Go modules), for machines that cannot pull kindest/node.
# Every step caches its product under $GPULAB_CACHE (atomically: see lib.sh); a warm run
# only checks keys. Steps, in order (`build.sh STEP...` runs some; the default is all):
#   kubernetes  kubelet, kubeadm, kube-* from the k8s.io/kubernetes module (the long one)
#   components  etcd, CoreDNS, crictl from their Go modules, pause from C
#   rootfs      Debian root filesystem with systemd, containerd, runc, CNI plugins
#   images      control-plane images (kube-*, etcd, CoreDNS, pause) as one image tar
#   node        rootfs + binaries + node files + images pre-loaded into containerd,
#               imported into Docker as $NODE_IMAGE (printed)
#   worker      (alone, not in the default) $BASE_NODE_IMAGE with $KUBELET_VERSION's
#               kubelet: the workers' image of the skew pass (printed)
#   preload     (alone) $BASE_NODE_IMAGE with $PRELOAD_IMAGES already in its containerd:
#               what labs create their nodes from (printed)
# clusters/infra/infra.py runs them as separate steps, each with its own status line and log.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

WORK=$GPULAB_CACHE/work
BIN=$GPULAB_CACHE/bin

# ---- kubernetes, components ----------------------------------------------------------
declare -A IMAGE   # component -> image reference kubeadm will ask for
step_kubernetes() {
  KUBE_BIN=$("$NODEIMAGE_DIR/build-go.sh" kubernetes)
}

# kubeadm decides which images (and so which etcd/CoreDNS/pause versions) a cluster uses;
# build exactly those.
read_image_list() {
  local ref name list
  list=$("$KUBE_BIN/kubeadm" config images list --kubernetes-version "$KUBE_VERSION" 2>/dev/null) ||
    die "kubeadm config images list failed"
  while read -r ref; do
    name=${ref##*/}; name=${name%%:*}
    IMAGE[$name]=$ref
  done <<<"$list"
  for name in kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd coredns pause; do
    [[ -n ${IMAGE[$name]:-} ]] || die "kubeadm $KUBE_VERSION lists no $name image"
  done
  ETCD_VERSION=v${IMAGE[etcd]##*:}; ETCD_VERSION=${ETCD_VERSION%-*}   # 3.6.5-0 -> v3.6.5
  COREDNS_VERSION=${IMAGE[coredns]##*:}
  PAUSE_VERSION=${IMAGE[pause]##*:}
}

step_components() {
  ETCD_BIN=$("$NODEIMAGE_DIR/build-go.sh" etcd "$ETCD_VERSION")
  COREDNS_BIN=$("$NODEIMAGE_DIR/build-go.sh" coredns "$COREDNS_VERSION")
  CRICTL_BIN=$("$NODEIMAGE_DIR/build-go.sh" crictl)
  # pause is C; its source ships in the k8s.io/kubernetes module. Static, like upstream.
  PAUSE_BIN=$BIN/pause-$PAUSE_VERSION
  if [[ ! -x $PAUSE_BIN/pause ]]; then
    if ! command -v gcc >/dev/null || [[ ! -e /usr/lib/x86_64-linux-gnu/libc.a ]]; then
      log "installing gcc and libc6-dev (static libc) for pause"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null ||
        die "cannot install gcc/libc6-dev to build pause"
    fi
    local src; src=$(moddir "k8s.io/kubernetes@$KUBE_VERSION") || die "cannot download k8s.io/kubernetes@$KUBE_VERSION"
    mkdir -p "$PAUSE_BIN"
    gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION" -o "$PAUSE_BIN/pause.tmp.$$" \
      "$src/build/pause/linux/pause.c" || die "building pause failed"
    publish_file "$PAUSE_BIN/pause.tmp.$$" "$PAUSE_BIN/pause"
  fi
}

# ---- rootfs -----------------------------------------------------------------------------
step_rootfs() {
  ROOTFS_TAR=$("$NODEIMAGE_DIR/rootfs.sh")
  ROOT=$WORK/node-root
}

# The rootfs extracted under $ROOT (only when a later step needs it). The stamp names the
# tarball it came from and is removed before anything changes the tree.
ensure_root() {
  local stamp=$WORK/node-root.from
  [[ -d $ROOT && $(cat "$stamp" 2>/dev/null) == "$ROOTFS_TAR" ]] && return 0
  clear_root
  rm -f "$stamp"
  mkdir -p "$ROOT"
  tar -C "$ROOT" --numeric-owner -xf "$ROOTFS_TAR" || die "extracting $ROOTFS_TAR failed"
  echo "$ROOTFS_TAR" >"$stamp"
}

# Removes $ROOT, first unmounting whatever an interrupted preload left mounted in it.
clear_root() {
  local m mounts
  mounts=$(findmnt -rn -o TARGET)
  for m in $(grep "^$ROOT/" <<<"$mounts" | sort -r); do umount -l "$m" || true; done
  rm -rf --one-file-system "$ROOT"
}

# ---- images -----------------------------------------------------------------------------
# Files every image gets: users, name resolution order, CA bundle, a writable /tmp.
image_base() {
  local dir=$1
  mkdir -p "$dir"/{etc/ssl/certs,tmp,usr/local/bin}
  chmod 1777 "$dir/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$dir/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir/etc/group"
  printf 'hosts: files dns\n' >"$dir/etc/nsswitch.conf"
  cp "$ROOT/etc/ssl/certs/ca-certificates.crt" "$dir/etc/ssl/certs/"
}

# Copies files (programs, plugins) from the node rootfs with the shared libraries they
# load, as the rootfs's own dynamic loader resolves them.
copy_with_libs() {
  local dir=$1 file lib; shift
  for file in "$@"; do
    (cd "$ROOT" && cp -a --parents ".$file" "$dir/")
    chroot "$ROOT" /lib64/ld-linux-x86-64.so.2 --list "$file" |
      awk '$2 == "=>" { print $3 } $1 ~ /^\// { print $1 }' |
      while read -r lib; do
        [[ -e $dir$lib ]] || (cd "$ROOT" && cp -aL --parents ".$lib" "$dir/")
      done
  done
}

# make_image REF DIR DOCKERFILE_CHANGE...
make_image() {
  local ref=$1 dir=$2 c changes=(); shift 2
  for c in 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' "$@"; do changes+=(--change "$c"); done
  tar_image "$ref" "$dir" "${changes[@]}"
}

step_images() {
  local key
  # Cache keys name their inputs by file name (each already carries a version or key).
  key=$(inputs_hash "${IMAGE[@]}" "rootfs=${ROOTFS_TAR##*/}" "$(declare -f image_base copy_with_libs make_image step_images)")
  IMAGES_TAR=$GPULAB_CACHE/images/control-plane-$KUBE_VERSION-$key.tar
  [[ -s $IMAGES_TAR ]] && return 0
  ensure_root
  local dir=$WORK/images name
  rm -rf "$dir"
  for name in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
    image_base "$dir/$name"
    cp "$KUBE_BIN/$name" "$dir/$name/usr/local/bin/"
  done
  # kube-proxy programs iptables (nft backend, as on the node) and cleans conntrack
  # entries; iptables loads its match/target extensions (and their libraries) at run time.
  local extensions
  extensions=$(cd "$ROOT" && find ./usr/lib/x86_64-linux-gnu/xtables -name '*.so' | sed 's/^\.//' | sort)
  # shellcheck disable=SC2086
  copy_with_libs "$dir/kube-proxy" /usr/sbin/xtables-nft-multi /usr/sbin/conntrack $extensions
  for name in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sf xtables-nft-multi "$dir/kube-proxy/usr/sbin/$name"
  done
  image_base "$dir/etcd"
  cp "$ETCD_BIN/etcd" "$dir/etcd/usr/local/bin/"
  mkdir -p "$dir/etcd/var/lib/etcd"
  image_base "$dir/coredns"
  cp "$COREDNS_BIN/coredns" "$dir/coredns/coredns"
  mkdir -p "$dir/pause"
  cp "$PAUSE_BIN/pause" "$dir/pause/pause"

  for name in kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd; do
    make_image "${IMAGE[$name]}" "$dir/$name"
  done
  make_image "${IMAGE[coredns]}" "$dir/coredns" 'ENTRYPOINT ["/coredns"]'
  make_image "${IMAGE[pause]}" "$dir/pause" 'ENTRYPOINT ["/pause"]' 'USER 65535:65535'
  mkdir -p "$(dirname "$IMAGES_TAR")"
  docker save -o "$IMAGES_TAR.tmp.$$" "${IMAGE[@]}" || die "docker save of the control-plane images failed"
  publish_file "$IMAGES_TAR.tmp.$$" "$IMAGES_TAR"
  rm -rf "$dir"
  find "$(dirname "$IMAGES_TAR")" -maxdepth 1 -name "control-plane-$KUBE_VERSION-*.tar" ! -path "$IMAGES_TAR" -delete
}

# ---- node ---------------------------------------------------------------------------------
# Loads the image tar into the node's containerd at build time, as kind's own node images
# do: the rootfs's containerd runs chrooted on a private socket, `ctr import --no-unpack`
# stores content and metadata only (containerd unpacks on first use inside the node).
preload_images() {
  local state=/run/gpulab-preload
  mkdir -p "$ROOT/proc" "$ROOT/mnt/preload" "$ROOT$state"
  mount -t proc proc "$ROOT/proc"
  mount --bind -o ro "$(dirname "$IMAGES_TAR")" "$ROOT/mnt/preload"
  cat >"$ROOT/tmp/preload.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "$state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$state/containerd.sock"
EOF
  chroot "$ROOT" containerd --config /tmp/preload.toml >"$WORK/preload.log" 2>&1 &
  local pid=$! rc=0 _
  for _ in $(seq 1 50); do [[ -S $ROOT$state/containerd.sock ]] && break; sleep 0.2; done
  chroot "$ROOT" ctr --address "$state/containerd.sock" --namespace k8s.io images import \
    --no-unpack "/mnt/preload/$(basename "$IMAGES_TAR")" >>"$WORK/preload.log" 2>&1 || rc=$?
  kill "$pid"; wait "$pid" 2>/dev/null || true
  umount "$ROOT/mnt/preload" "$ROOT/proc"
  rm -rf "$ROOT$state" "$ROOT/tmp/preload.toml" "$ROOT/mnt/preload"
  [[ $rc -eq 0 ]] || die "importing images into the node's containerd failed (see $WORK/preload.log)"
}

step_node() {
  local key
  key=$(inputs_hash "rootfs=${ROOTFS_TAR##*/}" "images=${IMAGES_TAR##*/}" "kube=${KUBE_BIN##*/}" \
    "crictl=${CRICTL_BIN##*/}" "$NODEIMAGE_DIR/files" \
    "$(declare -f preload_images step_node)")
  if [[ $(docker image inspect -f '{{index .Config.Labels "gpulab.node.inputs"}}' "$NODE_IMAGE" 2>/dev/null) == "$key" ]]; then
    log "  $NODE_IMAGE is up to date"
    return 0
  fi
  ensure_root
  rm -f "$WORK/node-root.from"   # the tree is changed from here on

  install -m 0755 "$KUBE_BIN"/{kubelet,kubeadm,kubectl} "$ROOT/usr/bin/"
  install -m 0755 "$CRICTL_BIN/crictl" "$ROOT/usr/local/bin/"
  cp -a "$NODEIMAGE_DIR/files/." "$ROOT/"
  sed -i "s|@SANDBOX_IMAGE@|${IMAGE[pause]}|" "$ROOT/etc/containerd/config.toml"
  # Debian installs CNI plugins in /usr/lib/cni; kubelet and containerd look in /opt/cni/bin.
  mkdir -p "$ROOT/opt/cni" "$ROOT/etc/cni/net.d" "$ROOT/etc/kubernetes/manifests"
  ln -sfn /usr/lib/cni "$ROOT/opt/cni/bin"
  printf '%s' "$KUBE_VERSION" >"$ROOT/kind/version"

  # systemd in a container: only what a node needs starts. binfmt is host-global and
  # journald must not read the host's kernel log.
  rm -f "$ROOT"/etc/systemd/system/*.wants/* "$ROOT"/lib/systemd/system/multi-user.target.wants/*
  chroot "$ROOT" systemctl enable containerd.service kubelet.service gpulab-podnet.service >/dev/null 2>&1 ||
    die "systemctl enable in the node rootfs failed"
  chroot "$ROOT" systemctl mask systemd-binfmt.service proc-sys-fs-binfmt_misc.automount >/dev/null 2>&1 ||
    die "systemctl mask in the node rootfs failed"
  grep -q '^ReadKMsg=no' "$ROOT/etc/systemd/journald.conf" || echo 'ReadKMsg=no' >>"$ROOT/etc/systemd/journald.conf"
  : >"$ROOT/etc/machine-id"

  log "  pre-loading ${#IMAGE[@]} images into the node's containerd"
  preload_images

  log "  docker import"
  tar_image "$NODE_IMAGE" "$ROOT" \
    --change 'ENV container=docker' \
    --change 'STOPSIGNAL SIGRTMIN+3' \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    --change "LABEL gpulab.node.inputs=$key"
  # The assembled tree is not reused (the next assembly starts clean); free the disk.
  clear_root
}

# ---- worker image with an older kubelet ---------------------------------------------------
# $BASE_NODE_IMAGE (the node image of $KUBE_VERSION, kind's or ours) with the kubelet of
# $KUBELET_VERSION: what workers run in the skew pass. Only the kubelet differs; kubeadm,
# containerd and the pre-loaded control-plane images stay the control plane's.
step_worker() {
  local base=${BASE_NODE_IMAGE:?the node image of $KUBE_VERSION} kubelet=${KUBELET_VERSION:?}
  local bin ref key id
  bin=$(GPULAB_KUBE_VERSION=$kubelet "$NODEIMAGE_DIR/build-go.sh" kubelet)
  ref=gpulab/kind-node:$KUBE_VERSION-kubelet-$kubelet
  id=$(docker image inspect -f '{{.Id}}' "$base") || die "no image $base in the Docker engine"
  key=$(inputs_hash "base=$id" "kubelet=${bin##*/}" "$(declare -f step_worker)")
  if [[ $(docker image inspect -f '{{index .Config.Labels "gpulab.node.inputs"}}' "$ref" 2>/dev/null) == "$key" ]]; then
    log "  $ref is up to date"
    echo "$ref"; return 0
  fi
  local dir=$WORK/worker-$kubelet
  rm -rf "$dir"; mkdir -p "$dir"
  cp "$bin/kubelet" "$dir/kubelet"
  printf 'FROM %s\nCOPY kubelet /usr/bin/kubelet\nLABEL gpulab.node.inputs=%s\n' "$base" "$key" >"$dir/Dockerfile"
  # The classic builder (local images only), under a temporary tag until the image's own
  # kubelet says it is $kubelet.
  local tmp=gpulab/partial:$$-$RANDOM
  DOCKER_BUILDKIT=0 docker build -q -t "$tmp" "$dir" >&2 || die "building $ref failed"
  has_output "Kubernetes $kubelet" docker run --rm --entrypoint /usr/bin/kubelet "$tmp" --version ||
    { docker rmi -f "$tmp" >/dev/null; die "$ref: its kubelet is not $kubelet"; }
  docker tag "$tmp" "$ref" && docker rmi "$tmp" >/dev/null
  rm -rf "$dir"
  echo "$ref"
}

# ---- the lab images preloaded ---------------------------------------------------------------
# $BASE_NODE_IMAGE with $PRELOAD_IMAGES (the lab images, from the Docker engine) in its
# containerd, as the control-plane images are: a lab's `kind load` then finds them on every
# node and sends nothing. kind gives each node a fresh /var volume, which Docker fills from
# the image: a copy of files, where a load per lab was a `docker save`, a digest of every
# layer and a write per node (31.6 s of the seed lab's 86 s, measured alone). Unpacked on
# first use, like the control-plane images, so a node copies only the layers' tars.
step_preload() {
  local base=${BASE_NODE_IMAGE:?the node image to preload} images=${PRELOAD_IMAGES:?the images}
  local id ids key ref old c
  id=$(docker image inspect -f '{{.Id}}' "$base") || die "no image $base in the Docker engine"
  # shellcheck disable=SC2086  # a list of references
  ids=$(docker image inspect -f '{{.Id}}' $images) || die "a lab image is not in the Docker engine"
  key=$(inputs_hash "base=$id" "images=$images" "ids=$ids" "$(declare -f step_preload)")
  ref=gpulab/lab-node:$(printf '%s' "${base##*/}" | sed 's/@.*//; s/:/-/g')
  old=$(docker image inspect -f '{{.Id}}|{{index .Config.Labels "gpulab.node.inputs"}}' "$ref" 2>/dev/null || true)
  if [[ ${old#*|} == "$key" ]]; then
    log "  $ref is up to date"
    echo "$ref"; return 0
  fi
  c=gpulab-preload-$$
  docker rm -f "$c" >/dev/null 2>&1 || true
  # containerd alone, with its state (socket, tasks) outside what the image keeps.
  # shellcheck disable=SC2016,SC2086
  docker save $images | docker run -i --name "$c" --privileged --entrypoint /bin/sh "$base" -c '
    s=/tmp/preload; containerd --state $s --address $s/sock >/dev/null 2>&1 & pid=$!
    for _ in $(seq 1 100); do [ -S $s/sock ] && break; sleep 0.1; done
    ctr --address $s/sock --namespace k8s.io images import --no-unpack -; rc=$?
    kill $pid; wait $pid; rm -rf $s; exit $rc' >&2 ||
    { docker rm -f "$c" >/dev/null 2>&1; die "importing the lab images into $base failed"; }
  docker commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    --change 'CMD []' --change "LABEL gpulab.node.inputs=$key" "$c" "$ref" >/dev/null ||
    { docker rm -f "$c" >/dev/null 2>&1; die "docker commit of $ref failed"; }
  docker rm "$c" >/dev/null
  # The one it replaces, unless a node still runs it (then it stays, untagged, for
  # `docker image prune`).
  [[ -n $old ]] && docker rmi "${old%%|*}" >/dev/null 2>&1 || true
  echo "$ref"
}

[[ $(id -u) -eq 0 ]] || die "the node image build needs root (debootstrap, chroot, mounts)"
docker info >/dev/null 2>&1 || die "no Docker engine answers; run clusters/infra/scripts/docker.sh first"
# One build at a time per cache: steps share $WORK and the Docker tags.
mkdir -p "$GPULAB_CACHE"
exec 9>"$GPULAB_CACHE/.node-image.lock"
flock -n 9 || { log "another node-image build holds $GPULAB_CACHE/.node-image.lock; waiting"; flock 9; }
clean_partials

# Each step re-derives what it needs from the earlier ones' cached products (a warm
# lookup is a stamp check), so steps run alone or together alike.
[[ $# -gt 0 ]] || set -- kubernetes components rootfs images node
for step in "$@"; do
  case $step in
    kubernetes) step_kubernetes ;;
    components) step_kubernetes; read_image_list; step_components ;;
    rootfs) step_rootfs ;;
    images) step_kubernetes; read_image_list; step_components; step_rootfs; step_images ;;
    node)
      step_kubernetes; read_image_list; step_components; step_rootfs; step_images; step_node
      echo "$NODE_IMAGE" ;;
    worker) step_worker ;;
    preload) step_preload ;;
    *) die "unknown step '$step' (kubernetes, components, rootfs, images, node, worker, preload)" ;;
  esac
done
