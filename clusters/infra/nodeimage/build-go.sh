#!/usr/bin/env bash
# Builds the node's Go binaries from upstream modules through the Go module proxy.
# Usage: build-go.sh kubernetes | kubelet | etcd VERSION | coredns VERSION | crictl | nfd | npd | kwok |
#        scheduler-perf
# Prints the output directory ($GPULAB_CACHE/bin/<name>-<version>).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# Some upstream modules point sibling modules at local paths with `replace` (Kubernetes'
# staging modules, etcd's api/client/pkg), so `go install mod@version` refuses them.
# A throwaway main module requires the module and replaces each such sibling with its
# published twin at $2 (Kubernetes v1.34.4 -> k8s.io/api v0.34.4; etcd: same version).
# Extra "module version" lines in $EXTRA_REQUIRES raise dependencies above what the
# module asks for (MVS keeps the highest).
throwaway_module() {
  local mod=$1 sibling_version=$2 dir=$3 src
  src=$(moddir "$mod") || die "cannot download $mod"
  rm -rf "$dir"; mkdir -p "$dir"
  {
    printf 'module gpulab/build\n\n'
    grep -E '^(go|godebug) ' "$src/go.mod"   # keep upstream's language and GODEBUG defaults
    printf '\nrequire %s %s\n' "${mod%@*}" "${mod#*@}"
    [[ -z ${EXTRA_REQUIRES:-} ]] || sed 's/^/require /' <<<"$EXTRA_REQUIRES"
    # KEEP_REPLACES=1: upstream's own version pins (`m => m2 v`) too, which a dependency's
    # go.mod cannot apply (NFD pins every k8s.io staging module this way).
    if [[ -n ${KEEP_REPLACES:-} ]]; then
      printf '\nreplace (\n'
      sed -n 's#^\s*\([^ ]*\) => \([^ .][^ ]*\) \(v[^ ]*\)$#\t\1 => \2 \3#p' "$src/go.mod"
      printf ')\n'
    fi
    local siblings
    siblings=$(sed -n 's#^\s*\([^ ]*\) => \.\.\{0,1\}/.*#\1#p' "$src/go.mod")
    if [[ -n $siblings ]]; then
      printf '\nreplace (\n'
      while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$sibling_version"; done <<<"$siblings"
      printf ')\n'
    fi
  } >"$dir/go.mod"
}

# build NAME VERSION MODULE@VERSION SIBLING_VERSION LDFLAGS PKG... : go build into $OUT, a
# temporary directory that `finish` publishes as $GPULAB_CACHE/bin/NAME-VERSION.
build() {
  local name=$1 version=$2 mod=$3 sib=$4 ldflags=$5; shift 5
  local src=$GPULAB_CACHE/src/$name-$version
  throwaway_module "$mod" "$sib" "$src"
  OUT=$(fresh_tmp "$GPULAB_CACHE/bin/$name-$version")
  (cd "$src" && with_ticker "$name $version" gobuild -mod=mod -ldflags "-s -w $ldflags" -o "$OUT/" "$@") ||
    die "building $name $version failed"
}

# A product directory counts as built only with its .done (written before the rename, so
# older caches' half-built directories without one are rebuilt too).
done_or() { [[ -e $GPULAB_CACHE/bin/$1/.done ]] && { echo "$GPULAB_CACHE/bin/$1"; exit 0; }; return 0; }
# one_at_a_time NAME: waits while another process builds NAME (two `make infra` at once,
# or `make test`'s background `gpulab infra kubelets` beside a `make infra`), then ends
# this one as done_or does if that build made it. Two builds of one NAME would each remove
# the other's temporary directory (fresh_tmp).
one_at_a_time() {
  local lock
  mkdir -p "$GPULAB_CACHE/bin"
  exec {lock}>"$GPULAB_CACHE/bin/.$1.lock"
  flock -n "$lock" || { log "waiting for another build of $1"; flock "$lock"; }
  done_or "$1"
}
finish() {
  touch "$OUT/.done"
  publish_dir "$OUT" "$GPULAB_CACHE/bin/$1"
  echo "$GPULAB_CACHE/bin/$1"
}

# build_kubernetes NAME CMD...: commands of k8s.io/kubernetes@$KUBE_VERSION into $OUT.
build_kubernetes() {
  local name=$1 v=$KUBE_VERSION major minor patch; shift
  IFS=. read -r major minor patch <<<"${v#v}"
  # Version stamps as hack/lib/version.sh sets them; kubeadm picks image tags from them.
  local date ldflags="" kv
  date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/$v.info" 2>/dev/null || true)
  for kv in "gitVersion=$v" "gitMajor=$major" "gitMinor=$minor" "gitTreeState=archive" "buildDate=${date:-unknown}"; do
    ldflags+=" -X k8s.io/client-go/pkg/version.$kv -X k8s.io/component-base/version.$kv"
  done
  build "$name" "$v" "k8s.io/kubernetes@$v" "v0.$minor.$patch" "$ldflags" \
    -tags providerless,notest "${@/#/k8s.io/kubernetes/cmd/}"
}

kubernetes() {
  local v=$KUBE_VERSION
  done_or "kubernetes-$v"
  one_at_a_time "kubernetes-$v"
  local cmds=(kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
  log "building Kubernetes $v (${cmds[*]}); cold: 5-25 min on 2 cores"
  build_kubernetes kubernetes "${cmds[@]}"
  local got; got=$("$OUT/kubeadm" version -o short)
  [[ $got == "$v" ]] || die "kubeadm reports $got, expected $v (version ldflags not applied)"
  finish "kubernetes-$v"
}

# The kubelet alone, for workers beside a newer control plane (the skew pass): a whole
# build of this version has it already.
kubelet() {
  local v=$KUBE_VERSION
  done_or "kubernetes-$v"
  done_or "kubelet-$v"
  one_at_a_time "kubelet-$v"
  log "building the kubelet $v alone"
  build_kubernetes kubelet kubelet
  has_output "Kubernetes $v" "$OUT/kubelet" --version || die "built kubelet is not $v"
  finish "kubelet-$v"
}

etcd() {
  local v=${1:?etcd version}
  done_or "etcd-$v"
  log "building etcd $v (about 2 min cold)"
  build etcd "$v" "go.etcd.io/etcd/server/v3@$v" "$v" "" go.etcd.io/etcd/server/v3
  mv "$OUT/v3" "$OUT/etcd" 2>/dev/null || mv "$OUT/server" "$OUT/etcd"
  has_output "etcd Version: ${v#v}" "$OUT/etcd" --version || die "built etcd is not $v"
  finish "etcd-$v"
}

coredns() {
  local v=${1:?CoreDNS version}
  done_or "coredns-$v"
  log "building CoreDNS $v (about 2 min cold)"
  build coredns "$v" "github.com/coredns/coredns@$v" "$v" "" github.com/coredns/coredns
  has_output "CoreDNS-${v#v}" "$OUT/coredns" -version || die "built CoreDNS is not $v"
  finish "coredns-$v"
}

crictl() {
  local v=$CRI_TOOLS_VERSION
  done_or "crictl-$v"
  # Not in the checksum database here: fetch without it, then check the pinned hash.
  local sum
  sum=$(GONOSUMDB=sigs.k8s.io/cri-tools go mod download -json "sigs.k8s.io/cri-tools@$v") ||
    die "cannot download sigs.k8s.io/cri-tools@$v"
  sum=$(sed -n 's/^\s*"Sum": "\(.*\)",$/\1/p' <<<"$sum")
  [[ $sum == "$CRI_TOOLS_SUM" ]] || die "sigs.k8s.io/cri-tools@$v hash is '$sum', pinned $CRI_TOOLS_SUM"
  # cri-tools v1.34.0 asks for Kubernetes v0.34.0-rc.2 modules, which the checksum
  # database here lacks: build it against the released staging modules we use anyway.
  local minor patch src; IFS=. read -r _ minor patch <<<"${KUBE_VERSION#v}"
  src=$GOMODCACHE/sigs.k8s.io/cri-tools@$v
  EXTRA_REQUIRES=$(sed -n "s#^\s*\(k8s\.io/[^ ]*\) v0\.$minor\..*#\1 v0.$minor.$patch#p" "$src/go.mod")
  log "building crictl $v (about 1 min cold)"
  EXTRA_REQUIRES=$EXTRA_REQUIRES GONOSUMDB=sigs.k8s.io/cri-tools build crictl "$v" "sigs.k8s.io/cri-tools@$v" "$v" \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=$v" sigs.k8s.io/cri-tools/cmd/crictl
  finish "crictl-$v"
}

# node-feature-discovery: nfd-master, nfd-worker, nfd-gc (what its Helm chart runs), at the
# version NVIDIA's device plugin requires (its go.mod), so GFD and NFD speak one API.
nfd() {
  local v=$NFD_VERSION
  # hostpath.pathPrefix=/host-, as NFD's own image build sets it (its Makefile's
  # CONTAINER_HOSTMOUNT_PREFIX): the worker reads the node's /sys, /proc, /etc ... where the
  # chart mounts them (/host-sys ...), not its container's own. Without it NFD labelled the
  # container's view (the host's real PCI devices, never a node's fake GPUs). The marker
  # names the prefix so caches built without it are rebuilt.
  done_or "nfd-$v-host-prefix"
  log "building node-feature-discovery $v (about 3 min cold)"
  KEEP_REPLACES=1 build nfd "$v" "sigs.k8s.io/node-feature-discovery@$v" "$v" \
    "-X sigs.k8s.io/node-feature-discovery/pkg/version.version=$v -X sigs.k8s.io/node-feature-discovery/pkg/utils/hostpath.pathPrefix=/host-" \
    sigs.k8s.io/node-feature-discovery/cmd/{nfd-master,nfd-worker,nfd-gc}
  has_output "$v" "$OUT/nfd-master" -version || die "built nfd-master is not $v"
  finish "nfd-$v-host-prefix"
}

# node-problem-detector's daemon, without the Stackdriver exporter and the system stats
# monitor (build tags its own Makefile offers): a lab runs its kernel monitor on a log file
# and its reports to the API server, and the two left out are most of its dependencies.
npd() {
  local v=$NPD_VERSION
  done_or "npd-$v"
  log "building node-problem-detector $v (about 1 min cold)"
  build npd "$v" "k8s.io/node-problem-detector@$v" "$v" \
    "-X k8s.io/node-problem-detector/pkg/version.version=$v" \
    -tags disable_stackdriver_exporter,disable_system_stats_monitor \
    k8s.io/node-problem-detector/cmd/nodeproblemdetector
  has_output "$v" "$OUT/nodeproblemdetector" --version || die "built node-problem-detector is not $v"
  finish "npd-$v"
}

kwok() {
  local v=$KWOK_VERSION
  done_or "kwok-$v"
  log "building KWOK $v (about 1 min cold)"
  build kwok "$v" "sigs.k8s.io/kwok@$v" "$v" "-X sigs.k8s.io/kwok/pkg/consts.Version=$v" \
    sigs.k8s.io/kwok/cmd/kwok
  has_output "$v" "$OUT/kwok" --version || die "built KWOK is not $v"
  finish "kwok-$v"
}

# Kueue's controller manager (`/manager` in upstream's image), for `make bench-kueue`; not
# part of `make infra`: its module brings every job framework it integrates (Kubeflow,
# Ray, JobSet, LWS ...), which the binary links whatever the config enables.
kueue() {
  local v=$KUEUE_VERSION
  one_at_a_time "kueue-$v"
  log "building Kueue $v (a bench's; cold: minutes)"
  build kueue "$v" "sigs.k8s.io/kueue@$v" "$v" \
    "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$v" sigs.k8s.io/kueue/cmd/kueue
  finish "kueue-$v"
}

# Kubernetes' own scheduler_perf DRA benchmarks (test/integration/scheduler_perf/dra of
# k8s.io/kubernetes@$KUBE_VERSION) as a test binary, for `make bench-scale` to run beside
# gpulab's fleet; not part of `make infra`. It runs from that package's directory in the
# module cache (its performance-config.yaml and ../templates) with etcd on its PATH.
scheduler_perf() {
  local v=$KUBE_VERSION minor patch
  done_or "scheduler-perf-$v"
  IFS=. read -r _ minor patch <<<"${v#v}"
  local src=$GPULAB_CACHE/src/scheduler-perf-$v
  throwaway_module "k8s.io/kubernetes@$v" "v0.$minor.$patch" "$src"
  OUT=$(fresh_tmp "$GPULAB_CACHE/bin/scheduler-perf-$v")
  log "building scheduler_perf's DRA benchmarks of Kubernetes $v (a test binary; cold: minutes)"
  # No -trimpath: its in-process API server finds its test certificates by the source path
  # compiled into it ("can't construct an absolute path from k8s.io/kubernetes@...").
  (cd "$src" && with_ticker "scheduler_perf $v" nice -n 10 go test -c -mod=mod \
    -o "$OUT/dra.test" k8s.io/kubernetes/test/integration/scheduler_perf/dra) ||
    die "building scheduler_perf $v failed"
  ln -s "$(moddir "k8s.io/kubernetes@$v")/test/integration/scheduler_perf/dra" "$OUT/dra"
  # Its API server's etcd: the one kubeadm $v deploys (the node image's, built the same way).
  local kube etcd_v
  kube=$("$0" kubernetes)
  etcd_v=$("$kube/kubeadm" config images list --kubernetes-version "$v" 2>/dev/null |
    sed -n 's#.*/etcd:\(.*\)-[0-9]*$#v\1#p')
  [[ -n $etcd_v ]] || die "kubeadm $v lists no etcd image"
  ln -s "$("$0" etcd "$etcd_v")/etcd" "$OUT/etcd"
  finish "scheduler-perf-$v"
}

case ${1:-} in
  kubernetes | kubelet | crictl | nfd | npd | kwok | kueue) "$1" ;;
  scheduler-perf) scheduler_perf ;;
  etcd | coredns) "$1" "${2:?usage: $0 $1 VERSION}" ;;
  *) die "usage: $0 kubernetes | kubelet | etcd VERSION | coredns VERSION | crictl | nfd | npd | kwok | kueue | scheduler-perf" ;;
esac
