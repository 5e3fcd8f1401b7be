"""The NVIDIA Container Toolkit in each lab GPU node's containerd, set up the way NVIDIA
documents it, so stock deployments (NVIDIA's chart at its default values) run unchanged:

- The toolkit's binaries (built by `make infra` from the toolkit module the newest pinned
  plugin requires: clusters/infra/scripts/nvidia-plugin.sh) are bind-mounted read-only at
  /usr/local/nvidia/toolkit, where NVIDIA's GPU Operator installs them on a node.
- `nvidia-ctk runtime configure --runtime=containerd --set-as-default --cdi.enabled`, the
  documented command, run in a throwaway container of the lab's node image (its own
  containerd config, default paths), writes containerd's drop-in (conf.d/99-nvidia.toml, the
  `nvidia` runtime the default) and the main config that imports it; `nvidia-ctk config`
  writes the runtime's config in CDI mode. GPU nodes get the three files as bind mounts
  (clusters/labs/kindconfig.py), so their containerd starts configured: the docs' "restart
  containerd" happens at boot, and nothing restarts under a running control plane.
- CDI mode: NVIDIA_VISIBLE_DEVICES=<uuid|index|all> becomes the CDI device
  nvidia.com/gpu=<id>. The legacy mode needs libnvidia-container (C, in no Go module),
  which is not built here.
- The CDI spec (/var/run/cdi/nvidia.yaml, where NVIDIA's nvidia-cdi-refresh writes it) is
  `nvidia-ctk cdi generate` against fakenvml's driver root, regenerated after the fake
  GPUs are installed and whenever their set changes (a MIG layout: as NVIDIA's
  mig-manager does), plus one edit of gpulab's: the node's fakenvml state dir mounted at
  /var/lib/fakenvml, where the fake library looks when it is loaded from the container's
  /usr/lib (it is what the device nodes are to a real driver: where the GPUs' state lives),
  and a hook that shows the container the driver's procfs entries (PROCFS_HOOK).

Only GPU nodes get the toolkit, as on real clusters; the control plane runs plain runc.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clusters.labs import kindconfig
from clusters.labs.context import Context
from clusters.steps import StepError

NODE_DIR = kindconfig.TOOLKIT_DIR
CTK = f"{NODE_DIR}/nvidia-ctk"
SPEC = "/var/run/cdi/nvidia.yaml"

# NVIDIA's documented steps (install guide: "Configuring containerd", CDI mode), run in the
# node image; only the runtime's path (the GPU Operator's install dir) is added.
CONFIGURE = f"""set -e
{CTK} runtime configure --runtime=containerd --set-as-default --cdi.enabled \
  --nvidia-runtime-path={NODE_DIR}/nvidia-container-runtime
{CTK} config default --output /out/runtime.toml
{CTK} config --in-place --config-file /out/runtime.toml --set nvidia-container-runtime.mode=cdi
cp /etc/containerd/config.toml /etc/containerd/conf.d/99-nvidia.toml /out/
"""


def prepare(out: Path, node_image: str, toolkit: str) -> None:
    """The GPU nodes' containerd and runtime configs (kindconfig.TOOLKIT_FILES) written
    into `out`."""
    import docker
    from docker.errors import ContainerError

    out.mkdir(parents=True, exist_ok=True)
    try:
        volumes = {toolkit: {"bind": NODE_DIR, "mode": "ro"}, str(out): {"bind": "/out"}}
        docker.from_env().containers.run(node_image, ["sh", "-c", CONFIGURE], entrypoint=[],
                                         remove=True, volumes=volumes)  # fmt: skip
    except ContainerError as e:
        raise StepError(f"nvidia-ctk runtime configure in {node_image}: {e}") from None
    for name in kindconfig.TOOLKIT_FILES:
        if not (out / name).is_file():
            raise StepError(f"nvidia-ctk runtime configure in {node_image} wrote no {name}")


def generate_args(root: str = kindconfig.DRIVER_ROOT, dev_root: str = "/",
                  ctk: str = CTK, output: str = "") -> list[str]:  # fmt: skip
    """`nvidia-ctk cdi generate` for fakenvml's driver root, as JSON to stdout or to
    `output` (both name strategies, index and uuid, as its defaults: NVIDIA's plugin hands
    uuids). The toolkit
    reads the MIG capability minors from /proc/driver/nvidia-caps/mig-minors, which a real
    driver's kernel module makes and no kind node has: it runs in a mount namespace of its
    own with the driver root's proc/driver over /proc/driver (the node's stays as it is)."""
    generate = [ctk, "cdi", "generate", "--driver-root", root,
                "--dev-root", dev_root, f"--nvidia-cdi-hook-path={NODE_DIR}/nvidia-cdi-hook",
                "--format", "json", "--quiet",
                *(["--output", output] if output else [])]  # fmt: skip
    proc = 'mount --bind "$1/proc/driver" /proc/driver && shift && exec "$@"'
    return ["unshare", "--mount", "sh", "-c", proc, "sh", root, *generate]


# Where a node's spec is generated before it is read back: on the node's /var (a volume the
# archive API reads), not under its tmpfs /run.
GENERATED = "/var/lib/gpulab-cdi-generated.json"


def with_state_mount(spec: dict) -> dict:
    """The spec with the node's fakenvml state mounted into every container it edits."""
    edits = spec.setdefault("containerEdits", {})
    state = kindconfig.NODE_STATE_DIR
    mounts = [m for m in edits.get("mounts", []) if m.get("containerPath") != state]
    # Read-write: NVML calls that change the GPUs (MIG layouts) write the state's journal.
    mounts.append({"hostPath": state, "containerPath": state,
                   "options": ["rbind", "rw", "nosuid", "nodev"]})  # fmt: skip
    edits["mounts"] = mounts
    return spec


# A GPU host's kernel shows every container the driver's procfs entries: /proc/driver/nvidia
# (each MIG instance's capability files, which NVIDIA's plugin and DRA driver read at fixed
# paths; nvidia-caps' mig-minors) and the driver's majors in /proc/devices (the operator's
# validator makes /dev/char links from them). A fake host's kernel has neither; fakenvml's
# driver root has both. runc refuses a spec's mount under /proc, but a createContainer hook
# runs in the container's mount namespace before pivot_root (OCI runtime spec, "POSIX-
# platform Hooks"), so the hook bind-mounts them into the rootfs the container's bundle
# names. Its input is the container's state (JSON) on stdin. Only containers the nvidia
# runtime gives GPUs get it (the spec's edits), where a real host's kernel shows every one.
PROCFS_HOOK = r"""set -e
root=$1
bundle=$(sed -n 's/.*"bundle": *"\([^"]*\)".*/\1/p')
[ -n "$bundle" ] || { echo "gpulab procfs hook: no bundle in the container's state" >&2; exit 1; }
rootfs=$(tr -d '\n' <"$bundle/config.json" | sed -n 's/.*"root": *{ *"path": *"\([^"]*\)".*/\1/p')
case $rootfs in /*) ;; *) rootfs=$bundle/${rootfs:-rootfs} ;; esac
mount --bind "$root/proc/driver" "$rootfs/proc/driver"
mount --bind "$root/proc/devices" "$rootfs/proc/devices"
"""
PROCFS_HOOK_NAME = "gpulab-driver-procfs"  # $0 of the hook's shell: how the edit finds it again


def with_driver_procfs(spec: dict, root: str = kindconfig.DRIVER_ROOT) -> dict:
    """The spec with PROCFS_HOOK for `root` among its createContainer hooks, once."""
    edits = spec.setdefault("containerEdits", {})
    hooks = [h for h in edits.get("hooks", []) if PROCFS_HOOK_NAME not in h.get("args", [])]
    hooks.append({"hookName": "createContainer", "path": "/bin/sh",
                  "args": ["sh", "-c", PROCFS_HOOK, PROCFS_HOOK_NAME, root],
                  "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]})  # fmt: skip
    edits["hooks"] = hooks
    return spec


def refresh_node(ctx: Context, node: str) -> dict:
    """The node's CDI spec generated again from its fake GPUs as they are now; the spec.
    Written to a file in the node and read back through the engine's archive API: the
    engine once handed an exec's stdout back empty under CI load (exit 0, the spec lost;
    the same loss Host.read works around)."""
    ctx.node_exec(node, *generate_args(output=GENERATED))
    out = ctx.host.read(node, GENERATED)
    try:
        spec = with_driver_procfs(with_state_mount(json.loads(out)))
    except ValueError as e:
        raise StepError(f"nvidia-ctk cdi generate on {node}: no JSON ({e}): {out[-300:]}") from e
    text = json.dumps(spec, indent=1)  # JSON is YAML: one parser for the runtime either way
    # Renamed into place: the runtime never reads half a spec.
    write = 'mkdir -p "${1%/*}" && printf "%s\\n" "$2" >"$1.tmp" && mv "$1.tmp" "$1"'
    ctx.node_exec(node, "sh", "-c", write, "sh", SPEC, text)
    return spec


def refresh(ctx: Context) -> None:
    """Every GPU node's CDI spec, from its fake GPUs as they are now (in parallel)."""
    if not ctx.lab.spec.container_toolkit:
        return
    nodes = [n.name for n in ctx.lab.gpu_nodes]
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        list(pool.map(lambda n: refresh_node(ctx, n), nodes))
