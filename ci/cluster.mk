# Cluster tooling (issue 3), included from the top-level Makefile.
#   make engine         a Docker engine that runs kind's privileged nodes (ci/docker.sh)
#   make kind           kind on PATH or the pinned release built with Go (ci/kind.sh)
#   make node-image     kind's node image, pulled or built locally (ci/node-image.sh)
#   make cluster-smoke  3-node kind cluster + workload pods, then deleted (ci/cluster-smoke.sh)
# Build products are cached under /var/cache/gpulab (override with GPULAB_CACHE).

CLUSTER_CI := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

.PHONY: engine kind node-image cluster-smoke
engine:
	@$(CLUSTER_CI)/docker.sh
kind:
	@$(CLUSTER_CI)/kind.sh
node-image: engine
	@$(CLUSTER_CI)/node-image.sh
cluster-smoke: engine
	@$(CLUSTER_CI)/cluster-smoke.sh
