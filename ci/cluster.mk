# Pieces of `make infra` (`gpulab infra` groups), included from the top-level Makefile.
#   make engine         a Docker engine that runs kind's privileged nodes (clusters/infra/scripts/docker.sh)
#   make kind           the pinned kind, on PATH or built with Go (clusters/infra/scripts/kind.sh)
#   make node-image     kind's node image, pulled or built locally (clusters/infra/scripts/node-image.sh)
# Build products are cached under /var/cache/gpulab (override with GPULAB_CACHE).

.PHONY: engine kind node-image
engine: install
	@$(PY) -m gpulab infra engine
kind: install
	@$(PY) -m gpulab infra kind
node-image: install
	@$(PY) -m gpulab infra node-image
