#!/usr/bin/env bash
# Builds the lab images locally — no registry is needed — and prints `name=image` lines:
#   base       Debian bookworm minbase + python3 (the glibc userland the others share)
#   gpulab     gpulab's Python package (fakenvml CLI, our plugin) + libnvidia-ml.so.1
#   workload   what the pod specs run: busybox, prints its env, sleeps (a few MB)
#   nvidia     NVIDIA's device plugin binaries and nvidia-ctk (clusters/infra/scripts/nvidia-plugin.sh) on the base image,
#              one `nvidia-<version>=image` line per pinned version
#   nfd        node-feature-discovery's nfd-master, nfd-worker, nfd-gc ($NFD_VERSION, built from the
#              Go module proxy by clusters/infra/nodeimage/build-go.sh) on the base image
#   dra        NVIDIA's DRA driver for GPUs ($DRA_DRIVER_VERSION: gpu-kubelet-plugin, nvidia-cdi-hook,
#              built by clusters/infra/scripts/dra-driver.sh) on the base image
#   bats       the runner of NVIDIA's DRA driver's own bats suite (e2e/dra_suite.py)
#   npd        node-problem-detector ($NPD_VERSION, built by clusters/infra/nodeimage/build-go.sh)
#              on the base image
#   kwok       KWOK's controller ($KWOK_VERSION, built by clusters/infra/nodeimage/build-go.sh)
#              on the base image
#   kueue      Kueue's controller manager ($KUEUE_VERSION, likewise): not among the defaults,
#              `gpulab infra kueue` builds it (a group of its own: clusters/infra/infra.py)
# Every image is tagged with a hash of its inputs, so a warm run only checks tags. Tags
# appear only on finished, checked images (temporary tags first; see lib.sh).
# usage: clusters/infra/images/build.sh [base|gpulab|workload|nvidia|nfd|dra|bats-base|bats|npd|kwok|kueue]...   (default: all but kueue)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)  # the checkout, or site-packages for an installed gpulab
source "$here/../nodeimage/lib.sh"
WORK=$GPULAB_CACHE/images
mkdir -p "$WORK"
# One build at a time: two labs coming up together share $WORK (wheels, contexts).
exec 9>"$WORK/.lock"
flock 9
clean_partials

have() { docker image inspect "$1" >/dev/null 2>&1; }

# docker_build TAG CONTEXT [CHECK-CMD...]: the classic builder (local images only) builds
# under a temporary tag; TAG is set only when the build and the optional check (run in
# the image) pass.
docker_build() {
  local tag=$1 ctx=$2 tmp=gpulab/partial:$$-$RANDOM; shift 2
  DOCKER_BUILDKIT=0 docker build -q -t "$tmp" "$ctx" >/dev/null 2>"$WORK/build.log" ||
    die "images: building $tag failed, see $WORK/build.log"
  if (($#)) && ! docker run --rm --entrypoint "$1" "$tmp" "${@:2}"; then
    docker rmi -f "$tmp" >/dev/null
    die "images: $tag fails its check: $*"
  fi
  docker tag "$tmp" "$tag" && docker rmi "$tmp" >/dev/null
}

# debootstrap_image NAME PACKAGES: a Debian $NODE_SUITE minbase image with PACKAGES,
# tagged gpulab/NAME:<suite>-<hash>.
debootstrap_image() {
  local name=$1 packages=$2 tag
  tag=gpulab/$name:$NODE_SUITE-$(inputs_hash "$packages" "$NODE_SUITE")
  if ! have "$tag"; then
    local dir mirror
    mirror=$(debian_mirror)
    [[ -n $mirror ]] || die "images: no bookworm/main apt source configured to debootstrap from"
    dir=$(fresh_tmp "$WORK/$name")
    log "images: $name: debootstrap $NODE_SUITE minbase + $packages (about 1 min)"
    with_ticker debootstrap cached_debootstrap "$WORK/debootstrap.log" --variant=minbase \
      --include="${packages// /,}" "$NODE_SUITE" "$dir" "$mirror" ||
      die "images: debootstrap failed, see $WORK/debootstrap.log"
    chroot "$dir" apt-get clean
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* "$dir"/usr/share/man/* \
      "$dir"/usr/share/locale/*
    tar_image "$tag" "$dir"
    rm -rf "$dir"
  fi
  echo "$tag"
}

# kmod and pciutils are the GPU Operator's validator's (lsmod, modprobe; the node-status
# exporter's lspci), 3 MB: one debootstrap fewer than a base of its own (its step 43 CPU-s
# and 88 s shorter on a new machine, 2026-12-06).
image_base() { debootstrap_image base "python3 ca-certificates kmod pciutils"; }

# What clusters/infra/infra.py passes in (image_env); the defaults are a checkout's `make infra`.
PY=${GPULAB_PYTHON:-$repo/.venv/bin/python}

# The gpulab image's key: what `gpulab infra tree-key` hashes (the node's packages, the
# pins, the library, the Dockerfile: clusters/built.py). clusters/infra/infra.py passes it in;
# fixtures compare it with the checkout's to catch a stale image.
tree_key() {
  if [[ -n ${GPULAB_TREE_KEY:-} ]]; then echo "$GPULAB_TREE_KEY"; return; fi
  (cd "$repo" && "$PY" -m gpulab infra tree-key)
}

image_gpulab() {
  local base lib=${GPULAB_LIBRARY:-$repo/build/release/libnvidia-ml.so.1}
  base=$(image_base)
  [[ -f $lib ]] || die "images: $lib missing; run make install (or fakenvml build) first"
  local tag key bin driver_bins=()
  key=$(tree_key) || die "images: cannot compute the gpulab tree key"
  # NVIDIA's nvidia-smi and MPS programs (ci/nvidia-smi.sh, Debian 12 only): the fake-gpus
  # chart installs them into each node's driver root, as real driver roots have them.
  for bin in "nvidia-smi/$NVIDIA_SMI_DRIVER_ROOT_VERSION/nvidia-smi" \
    "nvidia-cuda-mps/$NVIDIA_SMI_DRIVER_ROOT_VERSION/nvidia-cuda-mps-control" \
    "nvidia-cuda-mps/$NVIDIA_SMI_DRIVER_ROOT_VERSION/nvidia-cuda-mps-server"; do
    if [[ -x $GPULAB_CACHE/$bin ]]; then driver_bins+=("$GPULAB_CACHE/$bin")
    else log "images: gpulab: no $GPULAB_CACHE/$bin (ci/nvidia-smi.sh), the image has no ${bin##*/}"; fi
  done
  # Debian's static busybox, the driver root's /sbin/modprobe (fakenvml install-driver
  # --modprobe): chroot'd into the root, it answers from the root's proc/modules.
  local busybox
  busybox=$(busybox_deb)
  tag=gpulab/gpulab:$(inputs_hash "$base" "$key" "$busybox" ${driver_bins[@]+"${driver_bins[@]}"})
  if ! have "$tag"; then
    local wheels=$WORK/wheels ctx
    rm -rf "$wheels"; mkdir -p "$wheels"
    log "images: gpulab: building wheels"
    # gpulab's base dependencies (pyproject.toml's [project] dependencies: what a node
    # runs; the lab's are the `lab` extra); the import check below proves they suffice.
    local reqs=${GPULAB_NODE_REQS:-}
    [[ -n $reqs ]] || reqs=$("$PY" -c 'from clusters.infra import infra; print("\n".join(infra.node_requirements()))') ||
      die "images: cannot read gpulab's dependencies"
    # shellcheck disable=SC2086  # one requirement per word
    "$PY" -m pip wheel -q --disable-pip-version-check -w "$wheels" $reqs >/dev/null ||
      die "images: pip wheel of gpulab's node-side dependencies failed"
    ctx=$(fresh_tmp "$WORK/gpulab.ctx")
    mkdir -p "$ctx/site" "$ctx/lib"
    # Of gpulab, the node's packages (clusters/built.py's NODE_PACKAGES) and its metadata:
    # from an installed gpulab as installed, from a checkout as its wheel installs them.
    local packages=${GPULAB_NODE_PACKAGES:-} site=${GPULAB_SITE:-} item
    [[ -n $packages ]] || packages=$("$PY" -c 'from clusters import built; print(*built.NODE_PACKAGES)') ||
      die "images: cannot read gpulab's node packages"
    if [[ -z $site ]]; then
      local src=${GPULAB_SOURCE:-$repo}
      site=$wheels/gpulab
      "$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$site" "$src" >/dev/null ||
        die "images: pip wheel of $src failed"
      "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-compile \
        --target "$site" "$site"/gpulab-*.whl >/dev/null || die "images: installing the gpulab wheel failed"
    fi
    for item in $packages; do cp -r "$site/$item" "$ctx/site/"; done
    cp -r "$site"/gpulab-*.dist-info "$ctx/site/"
    find "$ctx/site" -name __pycache__ -prune -exec rm -rf {} +
    # The dependencies, installed on the host into the tree the image copies: the base has
    # no pip, and the wheels are cp311 like the image's python3.
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-compile \
      --target "$ctx/site" "$wheels"/*.whl >/dev/null
    cp "$lib" "${lib%/*}/libcuda.so.1" "$ctx/lib/"
    mkdir -p "$ctx/bin"
    [[ ${#driver_bins[@]} == 0 ]] || cp "${driver_bins[@]}" "$ctx/bin/"
    busybox_to "$busybox" "$ctx/bin/busybox"
    sed "s|@BASE@|$base|" "$here/gpulab.Dockerfile" >"$ctx/Dockerfile"
    log "images: gpulab: docker build $tag"
    # Never tag an image that cannot import its own package (a half-written context).
    docker_build "$tag" "$ctx" python3 -c 'import fakenvml, plugin.main'
    rm -rf "$ctx"
  fi
  echo "$tag"
}

# Debian's busybox-static package (downloaded once), for the images that carry busybox.
busybox_deb() {
  local deb_dir=$WORK/busybox debs
  mkdir -p "$deb_dir"
  debs=("$deb_dir"/busybox-static_*.deb)
  if [[ ! -e ${debs[0]} ]]; then
    log "images: fetching busybox-static"
    (cd "$deb_dir" && apt-get download busybox-static >/dev/null 2>&1) ||
      die "images: apt-get download busybox-static failed"
    debs=("$deb_dir"/busybox-static_*.deb)
  fi
  echo "${debs[0]}"
}

# busybox_to DEB FILE: the package's busybox binary as FILE.
busybox_to() {
  local x
  x=$(mktemp -d "$WORK/busybox.x.XXXXXX")
  dpkg-deb -x "$1" "$x" && mv "$x/bin/busybox" "$2"
  rm -rf "$x"
}

image_workload() {
  local deb tag
  deb=$(busybox_deb)
  tag=gpulab/workload:$(inputs_hash "$deb" "$here/workload.sh")
  if ! have "$tag"; then
    local root
    root=$(fresh_tmp "$WORK/workload")
    mkdir -p "$root/rootfs/bin"
    busybox_to "$deb" "$root/rootfs/bin/busybox"
    for app in sh env sleep cat ls; do ln -s busybox "$root/rootfs/bin/$app"; done
    install -m 0755 "$here/workload.sh" "$root/rootfs/bin/workload"
    tar_image "$tag" "$root/rootfs" --change 'ENTRYPOINT ["/bin/workload"]'
    rm -rf "$root"
  fi
  echo "$tag"
}

image_nvidia() {
  local base version bin bins
  base=$(image_base)
  bins=$("$here/../scripts/nvidia-plugin.sh") || die "images: clusters/infra/scripts/nvidia-plugin.sh failed"
  for bin in $bins; do
    version=$(basename "$(dirname "$bin")")
    local tag
    local ctk=${bin%/*}/nvidia-ctk gfd=${bin%/*}/gpu-feature-discovery mps=${bin%/*}/mps-control-daemon
    local cm=${bin%/*}/config-manager
    [[ -x $gfd ]] || gfd=  # a release whose GFD the proxy cannot build (nvidia-plugin.sh)
    # NVIDIA's own Dockerfile (deployments/container) sets this env: on a node whose
    # containerd runs the NVIDIA Container Toolkit, the runtime sees NVIDIA_VISIBLE_DEVICES
    # and injects every GPU and the driver's library, as NVIDIA's chart expects.
    local env='NVIDIA_DISABLE_REQUIRE=true NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility'
    tag=gpulab/nvidia-device-plugin:$version-$(inputs_hash "$base" "$bin" "$ctk" "$mps" "$cm" ${gfd:+"$gfd"} "$env")
    if ! have "$tag"; then
      local ctx
      ctx=$(fresh_tmp "$WORK/nvidia.ctx")
      cp "$bin" "$ctx/nvidia-device-plugin"
      cp "$ctk" "$ctx/nvidia-ctk"
      cp "$mps" "$ctx/mps-control-daemon"
      cp "$cm" "$ctx/config-manager"
      local bins="nvidia-device-plugin nvidia-ctk mps-control-daemon config-manager"
      if [[ -n $gfd ]]; then
        cp "$gfd" "$ctx/gpu-feature-discovery"
        bins+=" gpu-feature-discovery"
      fi
      # nvidia-ctk rides along so the CDI subjects can install it on the node (its hook);
      # gpu-feature-discovery is the same release's label writer and mps-control-daemon its
      # MPS control daemon and config-manager its config sidecar (one image, its commands,
      # as NVIDIA's image has them).
      printf 'FROM %s\nCOPY %s /usr/bin/\nENV %s\nENTRYPOINT ["/usr/bin/nvidia-device-plugin"]\n' \
        "$base" "$bins" "$env" >"$ctx/Dockerfile"
      log "images: nvidia: docker build $tag"
      docker_build "$tag" "$ctx" /usr/bin/test -x /usr/bin/nvidia-device-plugin -a -x /usr/bin/nvidia-ctk
      rm -rf "$ctx"
    fi
    echo "nvidia-$version=$tag"
  done
}

image_nfd() {
  local base bin tag dockerfile
  base=$(image_base)
  bin=$("$here/../nodeimage/build-go.sh" nfd) || die "images: building node-feature-discovery failed"
  # The chart runs NFD with runAsNonRoot, as upstream's image (nobody) allows.
  dockerfile=$(printf 'FROM %s\nCOPY nfd-master nfd-worker nfd-gc /usr/bin/\nUSER 65534:65534\n' "$base")
  tag=gpulab/node-feature-discovery:$NFD_VERSION-$(inputs_hash "$dockerfile" "$bin/nfd-master" "$bin/nfd-worker" "$bin/nfd-gc")
  if ! have "$tag"; then
    local ctx
    ctx=$(fresh_tmp "$WORK/nfd.ctx")
    cp "$bin"/nfd-master "$bin"/nfd-worker "$bin"/nfd-gc "$ctx/"
    printf '%s\n' "$dockerfile" >"$ctx/Dockerfile"
    log "images: nfd: docker build $tag"
    docker_build "$tag" "$ctx" /bin/sh -c "nfd-master -version | grep -qx 'nfd-master $NFD_VERSION'"
    rm -rf "$ctx"
  fi
  echo "$tag"
}

# image_program ROLE FILE PATH VERSION CHECK [NAME [USER]]: the base image with one program
# that build-go.sh ROLE builds (FILE there) at PATH, its entrypoint, as upstream's image
# has it (named as upstream names it); CHECK, a shell line, must pass in the image. NAME:
# the tag's, where the binary's says nothing; USER: the image's, as upstream's.
image_program() {
  local role=$1 file=$2 path=$3 version=$4 check=$5 base bin tag dockerfile name=${3##*/}
  local image=${6:-${3##*/}} user=""
  [[ -z ${7:-} ]] || user="USER $7\n"
  base=$(image_base)
  bin=$("$here/../nodeimage/build-go.sh" "$role") || die "images: building $role failed"
  dockerfile=$(printf "FROM %s\nCOPY %s %s/\n${user}ENTRYPOINT [\"%s\"]\n" "$base" "$name" "${path%/*}" "$path")
  tag=gpulab/$image:$version-$(inputs_hash "$dockerfile" "$bin/$file")
  if ! have "$tag"; then
    local ctx
    ctx=$(fresh_tmp "$WORK/$role.ctx")
    cp "$bin/$file" "$ctx/$name"
    printf '%s\n' "$dockerfile" >"$ctx/Dockerfile"
    log "images: $role: docker build $tag"
    docker_build "$tag" "$ctx" /bin/sh -c "$check"
    rm -rf "$ctx"
  fi
  echo "$tag"
}

image_npd() {
  image_program npd nodeproblemdetector /usr/bin/node-problem-detector "$NPD_VERSION" \
    "node-problem-detector --version | grep -qx '$NPD_VERSION'"
}

# As upstream's image (images/kwok/Dockerfile): the controller alone.
image_kwok() {
  image_program kwok kwok /usr/local/bin/kwok "$KWOK_VERSION" "kwok --version | grep -q '$KWOK_VERSION'"
}

# As upstream's image (its Dockerfile): the manager alone at /manager, which its chart runs,
# as user 65532 (its chart's pods must run as non-root). The binary has no version flag:
# the check is that it starts and prints its usage.
image_kueue() {
  image_program kueue kueue /manager "$KUEUE_VERSION" "/manager --help 2>&1 | grep -q -- -config" \
    kueue 65532:65532
}

image_mig_manager() {
  local gpulab dir tag dockerfile
  gpulab=$(image_gpulab)
  dir=$("$here/../scripts/mig-parted.sh") || die "images: building NVIDIA's mig-parted failed"
  # On the gpulab image. `nvidia-mig-manager` starts NVIDIA's (/usr/lib/gpulab/) in
  # `fakenvml node-view` of the driver root, so it and the nvidia-mig-parted it runs read
  # the driver's /proc/modules and PCI sysfs (fakenvml/nodeview.py): every container gets
  # the host kernel's /proc, which has no nvidia module (here, no /proc/modules at all).
  # The one difference from NVIDIA's image; any manifest that runs `nvidia-mig-manager`
  # (the GPU Operator's entrypoint) runs it unchanged. The module's default configs are
  # its config file unless a ConfigMap replaces it.
  local wrapper='#!/bin/sh\nexec python3 -m fakenvml node-view "${DRIVER_ROOT_CTR_PATH:-/driver-root}" -- /usr/lib/gpulab/nvidia-mig-manager "$@"\n'
  # Its env is NVIDIA's image's (mig-parted's deployments/container/Dockerfile): the
  # nvidia runtime gives the container every GPU and NVML.
  local env='NVIDIA_DISABLE_REQUIRE=true NVIDIA_VISIBLE_DEVICES=all NVIDIA_MIG_CONFIG_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility'
  dockerfile=$(printf 'FROM %s\nCOPY nvidia-mig-manager /usr/lib/gpulab/\nCOPY nvidia-mig-parted /usr/bin/\nCOPY wrapper /usr/bin/nvidia-mig-manager\nCOPY config-default.yaml /etc/nvidia-mig-manager/config.yaml\nENV %s\n' "$gpulab" "$env")
  tag=gpulab/nvidia-mig-manager:$MIG_PARTED_VERSION-$(inputs_hash "$dockerfile" "$wrapper" "$dir/nvidia-mig-manager" "$dir/nvidia-mig-parted" "$dir/config-default.yaml")
  if ! have "$tag"; then
    local ctx
    ctx=$(fresh_tmp "$WORK/mig-manager.ctx")
    cp "$dir/nvidia-mig-manager" "$dir/nvidia-mig-parted" "$dir/config-default.yaml" "$ctx/"
    printf '%b' "$wrapper" >"$ctx/wrapper" && chmod 0755 "$ctx/wrapper"
    printf '%s\n' "$dockerfile" >"$ctx/Dockerfile"
    log "images: mig-manager: docker build $tag"
    docker_build "$tag" "$ctx" /bin/sh -c '/usr/lib/gpulab/nvidia-mig-manager --version && nvidia-mig-parted --version && test -x /usr/bin/nvidia-mig-manager && python3 -c "import fakenvml.nodeview"' >/dev/null
    rm -rf "$ctx"
  fi
  echo "$tag"
}

image_gpu_operator() {
  local base dir kube=${KUBE_VERSIONS%% *} kubectl tag dockerfile ctx
  base=$(image_base)
  dir=$("$here/../scripts/gpu-operator.sh") || die "images: building NVIDIA's GPU Operator failed"
  kubectl=$GPULAB_CACHE/bin/kubernetes-$kube/kubectl
  [[ -x $kubectl ]] || kubectl=$(command -v kubectl) || die "images: gpu-operator: no kubectl (neither $GPULAB_CACHE/bin/kubernetes-$kube/kubectl nor on PATH)"
  # As its docker/Dockerfile lays it out: the operator, its operands' manifests and CRDs
  # under /opt/gpu-operator, kubectl for the chart's CRD-upgrade hook, a user of its own.
  dockerfile=$(printf '%s\n' "FROM $base" "COPY gpu-operator kubectl /usr/local/bin/" \
    "COPY assets /opt/gpu-operator/" "RUN useradd gpu-operator" "USER gpu-operator" \
    'ENTRYPOINT ["/usr/local/bin/gpu-operator"]')
  tag=gpulab/gpu-operator:$GPU_OPERATOR_VERSION-$(inputs_hash "$dockerfile" "$dir/gpu-operator" "$kubectl" "$dir/assets")
  if ! have "$tag"; then
    ctx=$(fresh_tmp "$WORK/gpu-operator.ctx")
    cp -r "$dir/gpu-operator" "$dir/assets" "$kubectl" "$ctx/"
    printf '%s\n' "$dockerfile" >"$ctx/Dockerfile"
    log "images: gpu-operator: docker build $tag"
    docker_build "$tag" "$ctx" /bin/sh -c 'test -f /opt/gpu-operator/state-device-plugin/0500_daemonset.yaml && kubectl version --client >/dev/null' >/dev/null
    rm -rf "$ctx"
  fi
  echo "gpu-operator=$tag"
  # The validator (and node-status exporter): its binary and workload manifests where its
  # Dockerfile puts them, on the lab base, which has the packages it installs (kmod,
  # pciutils). Not its vectorAdd: a CUDA sample, built with CUDA, which no package here
  # serves (docs/operator.md: the CUDA workload is off).
  local vbase
  vbase=$(image_base)
  dockerfile=$(printf '%s\n' "FROM $vbase" "COPY nvidia-validator /usr/bin/" \
    "COPY plugin-workload-validation.yaml cuda-workload-validation.yaml /var/nvidia/manifests/" \
    "ENV NVIDIA_DISABLE_REQUIRE=true NVIDIA_VISIBLE_DEVICES=void NVIDIA_DRIVER_CAPABILITIES=utility,compute" \
    'ENTRYPOINT ["/bin/bash"]')
  local src=$dir/validator
  tag=gpulab/gpu-operator-validator:$GPU_OPERATOR_VERSION-$(inputs_hash "$dockerfile" "$dir/nvidia-validator" "$src/plugin-workload-validation.yaml" "$src/cuda-workload-validation.yaml")
  if ! have "$tag"; then
    ctx=$(fresh_tmp "$WORK/gpu-operator-validator.ctx")
    cp "$dir/nvidia-validator" "$src/"*.yaml "$ctx/"
    printf '%s\n' "$dockerfile" >"$ctx/Dockerfile"
    log "images: gpu-operator-validator: docker build $tag"
    docker_build "$tag" "$ctx" /bin/sh -c 'nvidia-validator --version' >/dev/null
    rm -rf "$ctx"
  fi
  echo "gpu-operator-validator=$tag"
}

image_dra() {
  local base out dir src tag dockerfile
  base=$(image_base)
  out=$("$here/../scripts/dra-driver.sh") || die "images: building NVIDIA's DRA driver failed"
  dir=$(sed -n 1p <<<"$out") src=$(sed -n 2p <<<"$out")
  # As upstream's image: the plugin, the compute-domain controller and kubelet plugin, the
  # CDI hook it copies to the host, and the init container's driver check (from the
  # release's source), on a glibc base with bash; and
  # busybox's wget, as its distroless `debug` base has (the driver's own suite fetches the
  # plugin's metrics with it from inside the container). First in PATH under the plugin's
  # name, dra-kubelet-plugin.sh: the kernel's /proc/driver/nvidia from the fake driver root
  # (MIG claims), then the unchanged binary.
  local deb wrapper=$here/dra-kubelet-plugin.sh
  deb=$(busybox_deb)
  dockerfile=$(printf 'FROM %s\nCOPY gpu-kubelet-plugin compute-domain-controller compute-domain-kubelet-plugin nvidia-cdi-hook kubelet-plugin-prestart.sh /usr/bin/\nCOPY busybox /usr/local/bin/\nRUN ln -s busybox /usr/local/bin/wget\nCOPY dra-kubelet-plugin.sh /usr/local/bin/gpu-kubelet-plugin\n' "$base")
  tag=gpulab/dra-driver-nvidia-gpu:$DRA_DRIVER_VERSION-$(inputs_hash "$dockerfile" "$dir/gpu-kubelet-plugin" "$dir/compute-domain-controller" "$dir/compute-domain-kubelet-plugin" "$dir/nvidia-cdi-hook" "$src/hack/kubelet-plugin-prestart.sh" "$deb" "$wrapper")
  if ! have "$tag"; then
    local ctx
    ctx=$(fresh_tmp "$WORK/dra.ctx")
    cp "$dir/gpu-kubelet-plugin" "$dir/compute-domain-controller" "$dir/compute-domain-kubelet-plugin" "$dir/nvidia-cdi-hook" "$src/hack/kubelet-plugin-prestart.sh" "$wrapper" "$ctx/"
    busybox_to "$deb" "$ctx/busybox"
    printf '%s\n' "$dockerfile" >"$ctx/Dockerfile"
    log "images: dra: docker build $tag"
    docker_build "$tag" "$ctx" /bin/sh -c "/usr/bin/gpu-kubelet-plugin --version | grep -q '$DRA_DRIVER_VERSION' && command -v gpu-kubelet-plugin | grep -qx /usr/local/bin/gpu-kubelet-plugin"
    rm -rf "$ctx"
  fi
  echo "$tag"
}

# The runner of the DRA driver's own bats suite (e2e/dra_suite.py), as its tests/bats/
# Dockerfile makes it, from what this machine reaches: bats-core from npm ($BATS_VERSION;
# Debian's 1.8 lacks the hooks the suite uses), bats-support/-assert/-file, jq, yq, bc,
# envsubst and GNU parallel from Debian, at /bats-libraries where the suite loads them;
# kubectl and helm are the lab's own builds.
image_bats_base() {
  debootstrap_image bats-base "bash ca-certificates jq yq bc gettext-base parallel procps bats-support bats-assert bats-file"
}

image_bats() {
  local rootfs kube=${KUBE_VERSIONS%% *} tgz tag dockerfile
  rootfs=$(image_bats_base)
  # kubectl: the node image's own build, else (kind's upstream node image chosen) the host's.
  local kubectl=$GPULAB_CACHE/bin/kubernetes-$kube/kubectl helm=$GPULAB_CACHE/bin/helm-$HELM_VERSION/helm
  [[ -x $kubectl ]] || kubectl=$(command -v kubectl) || die "images: bats: no kubectl (neither $GPULAB_CACHE/bin/kubernetes-$kube/kubectl nor on PATH)"
  [[ -x $helm ]] || die "images: bats: no $helm (clusters/infra/scripts/helm.sh)"
  local npm=$GPULAB_CACHE/npm
  tgz=$npm/bats-${BATS_VERSION#v}.tgz
  if [[ ! -f $tgz ]]; then
    command -v npm >/dev/null || die "images: bats: no npm on PATH to fetch bats-core $BATS_VERSION"
    mkdir -p "$npm"
    (cd "$npm" && npm pack -q "bats@${BATS_VERSION#v}" >/dev/null 2>"$WORK/npm.log") ||
      die "images: bats: npm pack bats@${BATS_VERSION#v} failed, see $WORK/npm.log"
  fi
  dockerfile=$(printf '%s\n' "FROM $rootfs" "COPY bats.tgz kubectl helm /tmp/in/" \
    "RUN tar -C /tmp/in -xzf /tmp/in/bats.tgz && /tmp/in/package/install.sh /usr/local && mv /tmp/in/kubectl /tmp/in/helm /usr/local/bin/ && rm -rf /tmp/in && mkdir /bats-libraries && for l in support assert file; do ln -s /usr/lib/bats/bats-\$l /bats-libraries/bats-\$l; done")
  tag=gpulab/bats:${BATS_VERSION#v}-$(inputs_hash "$dockerfile" "$tgz" "$kubectl" "$helm")
  if ! have "$tag"; then
    local ctx
    ctx=$(fresh_tmp "$WORK/bats.ctx")
    cp "$tgz" "$ctx/bats.tgz"; cp "$kubectl" "$helm" "$ctx/"
    printf '%s\n' "$dockerfile" >"$ctx/Dockerfile"
    log "images: bats: docker build $tag"
    docker_build "$tag" "$ctx" /bin/sh -c "bats --version | grep -q '${BATS_VERSION#v}' && test -f /bats-libraries/bats-assert/load.bash"
    rm -rf "$ctx"
  fi
  echo "$tag"
}

[[ $# -gt 0 ]] || set -- base gpulab workload nvidia nfd dra bats npd kwok mig-manager gpu-operator
for what in "$@"; do
  case $what in
    base) echo "base=$(image_base)" ;;
    gpulab) echo "gpulab=$(image_gpulab)" ;;
    workload) echo "workload=$(image_workload)" ;;
    nvidia) image_nvidia ;;
    nfd) echo "nfd=$(image_nfd)" ;;
    dra) echo "dra=$(image_dra)" ;;
    bats-base) echo "bats-base=$(image_bats_base)" ;;
    bats) echo "bats=$(image_bats)" ;;
    npd) echo "npd=$(image_npd)" ;;
    kwok) echo "kwok=$(image_kwok)" ;;
    kueue) echo "kueue=$(image_kueue)" ;;
    mig-manager) echo "mig-manager=$(image_mig_manager)" ;;
    gpu-operator) image_gpu_operator ;;
    *) die "images: unknown image $what (base, gpulab, workload, nvidia, nfd, dra, bats-base, bats, npd, kwok, kueue, mig-manager, gpu-operator)" ;;
  esac
done
