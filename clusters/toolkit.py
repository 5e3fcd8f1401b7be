"""The NVIDIA Container Toolkit in each lab GPU node's containerd, set up the way NVIDIA
documents it, so stock deployments (NVIDIA's chart at its default values) run unchanged:

- The toolkit's binaries (built by `make infra` from the toolkit module the newest pinned
  plugin requires: clusters/scripts/nvidia-plugin.sh) are bind-mounted read-only at
  /usr/local/nvidia/toolkit, where NVIDIA's GPU Operator installs them on a node
  (clusters/kindconfig.py).
- `nvidia-ctk runtime configure --runtime=containerd --set-as-default --cdi.enabled`, the
  documented command, writes containerd's drop-in (/etc/containerd/conf.d/99-nvidia.toml,
  imported by the main config) with the `nvidia` runtime as the default; containerd is
  restarted, as the docs say. Running containers keep running (their shims stay).
- The runtime runs in CDI mode (`nvidia-ctk config --set nvidia-container-runtime.mode=cdi`):
  NVIDIA_VISIBLE_DEVICES=<uuid|index|all> becomes the CDI device nvidia.com/gpu=<id>. The
  legacy mode needs libnvidia-container (C, not in any Go module), which is not built here.
- The CDI spec (/var/run/cdi/nvidia.yaml, where NVIDIA's nvidia-cdi-refresh writes it) is
  `nvidia-ctk cdi generate` against fakenvml's driver root, regenerated after the fake
  GPUs are installed and whenever their set changes (a MIG layout: as NVIDIA's
  mig-manager does), plus one edit of gpulab's: the node's fakenvml state dir mounted at
  /var/lib/fakenvml, where the fake library looks when it is loaded from the container's
  /usr/lib (it is what the device nodes are to a real driver: where the GPUs' state lives).

Only GPU nodes get the toolkit, as on real clusters; the control plane runs plain runc.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from clusters import kindconfig
from clusters.steps import StepError, poll

if TYPE_CHECKING:
    from clusters.lab import Lab

NODE_DIR = kindconfig.TOOLKIT_DIR
CTK = f"{NODE_DIR}/nvidia-ctk"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"  # nvidia-ctk's default for containerd
SPEC = "/var/run/cdi/nvidia.yaml"
RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"

# NVIDIA's documented steps (install guide, "Configuring containerd" and "CDI"), in one shell
# run inside the node; only the paths of the GPU Operator's install dir are added.
CONFIGURE = f"""set -e
{CTK} runtime configure --runtime=containerd --set-as-default --cdi.enabled \
  --nvidia-runtime-path={NODE_DIR}/nvidia-container-runtime
mkdir -p {RUNTIME_CONFIG.rsplit("/", 1)[0]}
{CTK} config default --output {RUNTIME_CONFIG}
{CTK} config --in-place --config-file {RUNTIME_CONFIG} --set nvidia-container-runtime.mode=cdi
systemctl restart containerd
"""


def generate_args() -> list[str]:
    """`nvidia-ctk cdi generate` for fakenvml's driver root, to stdout as JSON (both name
    strategies, index and uuid, as its defaults: NVIDIA's plugin hands uuids)."""
    return [CTK, "cdi", "generate", "--driver-root", kindconfig.DRIVER_ROOT, "--dev-root", "/",
            f"--nvidia-cdi-hook-path={NODE_DIR}/nvidia-cdi-hook", "--format", "json",
            "--quiet"]  # fmt: skip


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


def configured(lab: Lab, node: str) -> bool:
    try:
        lab.node_exec(node, "test", "-s", DROP_IN)
    except StepError:
        return False
    return True


def configure_node(lab: Lab, node: str, deadline_s: float = 60) -> None:
    lab.node_exec(node, "sh", "-c", CONFIGURE)

    def answers() -> tuple[bool, str]:
        try:
            info = json.loads(lab.node_exec(node, "crictl", "info"))
            default = info["config"]["containerd"]["defaultRuntimeName"]
        except (StepError, ValueError, KeyError) as e:
            return False, f"crictl info: {e}"
        return default == "nvidia", f"default runtime {default}"

    poll(f"containerd on {node} back with the nvidia runtime", answers, deadline_s)


def refresh_node(lab: Lab, node: str) -> dict:
    """The node's CDI spec generated again from its fake GPUs as they are now; the spec."""
    out = lab.node_exec(node, *generate_args())
    try:
        spec = with_state_mount(json.loads(out))
    except ValueError as e:
        raise StepError(f"nvidia-ctk cdi generate on {node}: no JSON ({e}): {out[-300:]}") from e
    text = json.dumps(spec, indent=1)  # JSON is YAML: one parser for the runtime either way
    # Renamed into place: the runtime never reads half a spec.
    write = 'mkdir -p "${1%/*}" && printf "%s\\n" "$2" >"$1.tmp" && mv "$1.tmp" "$1"'
    lab.node_exec(node, "sh", "-c", write, "sh", SPEC, text)
    return spec


def _each_gpu_node(lab: Lab, fn: Callable[[Lab, str], object]) -> None:
    if not lab.lab.spec.container_toolkit:
        return
    nodes = [n.name for n in lab.lab.gpu_nodes]
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        list(pool.map(lambda n: fn(lab, n), nodes))


def configure(lab: Lab) -> None:
    """Every toolkit GPU node's containerd with the nvidia runtime as its default (a node of
    a reused cluster that already has it is left alone: no second restart)."""
    _each_gpu_node(lab, lambda lab, n: configured(lab, n) or configure_node(lab, n))


def refresh(lab: Lab) -> None:
    """Every toolkit GPU node's CDI spec, from its fake GPUs as they are now."""
    _each_gpu_node(lab, refresh_node)
