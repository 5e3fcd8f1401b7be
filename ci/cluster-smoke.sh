#!/usr/bin/env bash
# Proves the node image end to end: a kind cluster (control plane + 2 workers) reaches
# Ready; a workload image built here (busybox: prints its env, sleeps) is loaded with
# `kind load docker-image` and runs on both workers; the two pods reach each other
# across nodes and resolve a Service name through CoreDNS. Prints the time of each
# step. The cluster is deleted at the end, pass or fail (KEEP_CLUSTER=1 keeps it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../clusters/nodeimage/lib.sh"

NAME=${SMOKE_CLUSTER:-gpulab-smoke}
WORKLOAD=gpulab/smoke:busybox

"$here/docker.sh"
KIND=$("$here/kind.sh")
IMAGE=${NODE_IMAGE:-$("$here/node-image.sh")}

# kubectl from inside the control-plane node: no kubectl needed on the host.
k() { docker exec -i "$NAME-control-plane" kubectl --kubeconfig=/etc/kubernetes/admin.conf "$@"; }

timed() {
  local what=$1 t0=$SECONDS; shift
  log "smoke: $what"
  "$@" || die "smoke: $what failed"
  TIMES+=("$what: $((SECONDS - t0)) s")
}
TIMES=()

cleanup() {
  if [[ ${KEEP_CLUSTER:-0} == 1 ]]; then log "smoke: keeping cluster $NAME"; return; fi
  "$KIND" delete cluster --name "$NAME" >/dev/null 2>&1 || true
}

create_cluster() {
  "$KIND" delete cluster --name "$NAME" >/dev/null 2>&1 || true
  "$KIND" create cluster --name "$NAME" --image "$IMAGE" --wait 2m --config - <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
- role: worker
- role: worker
EOF
}

nodes_ready() { k wait --for=condition=Ready node --all --timeout=120s >/dev/null; }

workload_image() {
  if ! docker image inspect "$WORKLOAD" >/dev/null 2>&1; then
    local bb dir a
    bb=$(command -v busybox) || die "smoke: busybox is needed for the workload image (apt-get install busybox-static)"
    has_output 'statically linked' file -L "$bb" || die "smoke: $bb is not static (install busybox-static)"
    dir=$(mktemp -d)
    mkdir -p "$dir/bin"
    cp "$bb" "$dir/bin/busybox"
    for a in sh env sleep ping nslookup wget cat; do ln -s busybox "$dir/bin/$a"; done
    tar_image "$WORKLOAD" "$dir" --change 'CMD ["/bin/sh", "-c", "env; exec sleep 3600"]'
    rm -rf "$dir"
  fi
  "$KIND" load docker-image "$WORKLOAD" --name "$NAME" >/dev/null
}

pods_running() {
  local w
  for w in worker worker2; do
    k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: smoke-$w, labels: {app: gpulab-smoke}}
spec:
  nodeName: $NAME-$w
  containers: [{name: main, image: $WORKLOAD, imagePullPolicy: Never}]
EOF
  done
  k wait --for=condition=Ready pod -l app=gpulab-smoke --timeout=120s >/dev/null
}

pod_network() {
  local ip
  ip=$(k get pod smoke-worker2 -o jsonpath='{.status.podIP}')
  k exec smoke-worker -- ping -c 1 -W 5 "$ip" >/dev/null || die "smoke: pod on worker cannot reach pod $ip on worker2"
  k exec smoke-worker -- nslookup kubernetes.default.svc.cluster.local >/dev/null ||
    die "smoke: kubernetes.default does not resolve through CoreDNS"
}

trap cleanup EXIT
t0=$SECONDS
timed "create cluster $NAME (1 control plane + 2 workers) from $IMAGE" create_cluster
timed "all nodes Ready" nodes_ready
timed "build and kind-load $WORKLOAD" workload_image
timed "workload pods Running on both workers" pods_running
timed "pod-to-pod across nodes and Service DNS" pod_network
k get nodes -o wide >&2
printf '  %s\n' "${TIMES[@]}" >&2
log "smoke: passed in $((SECONDS - t0)) s"
