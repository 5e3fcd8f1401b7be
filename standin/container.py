"""The container tier: a subject's *image* — its real entrypoint, its real library lookup
paths — run with testcontainers against the kubelet stand-in, before any cluster starts.

    with SubjectContainer(subject, image, kubelet.dir, node.path) as plugin:
        kubelet.wait_devices(subject.spec.resource, 8)

The container is the subject DaemonSet's main container, as a node would run it: its
command, args and env (a fieldRef to spec.nodeName becomes the node's name), and its
hostPath mounts mapped to what the stand-in provides — /var/lib/kubelet/device-plugins to
the stand-in's directory, /run/fakenvml/driver to a driver root as fakenvml's DaemonSet
fills it (the fake library, the GPUs' device nodes), /var/lib/fakenvml to the node's
fakenvml state, /var/run/cdi to a directory for the CDI specs a plugin writes (`cdi_dir`),
/dev to a node's /dev: the character devices every container has (null, zero, ...) and
the driver root's NVIDIA nodes (nvidia<minor>, nvidiactl, nvidia-uvm ...), which plugins
that hand containers device specs look for (GKE's mounts /dev at /dev).
As on a lab node, the node's state is also at <driver root>/var/lib/fakenvml. Other
hostPaths under /run (/var/run) are empty directories, as on a freshly booted node (/run
is a tmpfs; NVIDIA's chart mounts /run/nvidia/mps). Init containers do not run (they
prepare nodes). Any other hostPath is refused with one line (the lab has nothing to put
there); ConfigMap and emptyDir volumes are empty directories (kubelet's view of an
optional ConfigMap that does not exist). It
waits for the subject's `ready_log` line with testcontainers' log wait strategy; a
container that exits first fails with its exit code and log in the error.

testcontainers' Ryuk reaper is off: it is an image from a registry, and there is none
here. Containers are removed on exit instead (and labelled gpulab.dev/container-tier).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from types import TracebackType

from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from clusters.labs import kindconfig
from clusters.subjects.subject import Subject
from fakenvml import driver
from fakenvml.node import NodeDir

testcontainers_config.ryuk_disabled = True

DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
DRIVER = kindconfig.DRIVER_ROOT
STATE = kindconfig.NODE_STATE_DIR
CDI = "/var/run/cdi"
DEV = "/dev"
# What a container runtime puts in every container's /dev (name, major, minor): a node's
# /dev mounted over it must have them, or the runtime cannot start the container.
RUNTIME_DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8),
                   ("urandom", 1, 9), ("tty", 5, 0))  # fmt: skip
LABEL = "gpulab.dev/container-tier"


class ContainerTierError(Exception):
    """The subject's container cannot run here or did not become ready; one line (plus
    the container's log when it ran)."""


class SubjectContainer:
    def __init__(self, subject: Subject, image: str, kubelet_dir: Path, state_dir: Path,
                 node_name: str = "node-a") -> None:  # fmt: skip
        self.subject, self.image = subject, image
        self.kubelet_dir, self.state_dir, self.node_name = kubelet_dir, state_dir, node_name
        self._tmp = Path(tempfile.mkdtemp(prefix="gpulab-container-tier-"))
        self.container: DockerContainer | None = None

    def __enter__(self) -> SubjectContainer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    def _driver_root(self) -> Path:
        """A driver root as fakenvml's DaemonSet makes it (`fakenvml install-driver`):
        copies, not links, which would point outside the mount."""
        root = self._tmp / "driver"
        state = NodeDir(self.state_dir)
        # No state yet (a tier that fails before it starts anything): the library alone.
        got = driver.install(root, state.node() if state.exists() else None)
        if got.no_device_nodes:
            raise ContainerTierError(f"the driver root has no device nodes: {got.no_device_nodes}")
        # The mount point of the state (build() mounts it there): made here, as a read-only
        # driver root mount leaves Docker no way to create it.
        (root / STATE.lstrip("/")).mkdir(parents=True, exist_ok=True)
        return root

    def _make_dev(self, dev: Path) -> None:
        """A node's /dev, made when a subject mounts it: the runtime's devices, and the
        GPUs' nodes as `fakenvml install-driver --dev` makes them on a lab node."""
        if dev.exists():
            return
        dev.mkdir()
        for name, major, minor in RUNTIME_DEVICES:
            try:
                os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            except PermissionError as e:
                raise ContainerTierError(f"mknod {dev / name}: {e.strerror} (the tier's /dev "
                                         "needs CAP_MKNOD)") from None  # fmt: skip
            os.chmod(dev / name, 0o666)  # mknod's mode is masked by the umask
        _, why = driver.make_device_nodes(dev, NodeDir(self.state_dir).node())
        if why:
            raise ContainerTierError(f"the tier's /dev has no GPU device nodes: {why}")

    @property
    def cdi_dir(self) -> Path:
        """Where the container's /var/run/cdi lands: the CDI specs it wrote."""
        return self._tmp / "cdi"

    def _host_paths(self) -> dict[str, Path]:
        self.cdi_dir.mkdir(exist_ok=True)
        return {DEVICE_PLUGINS: self.kubelet_dir, DRIVER: self._driver_root(),
                STATE: self.state_dir, CDI: self.cdi_dir, DEV: self._tmp / "dev"}  # fmt: skip

    def _volume_dir(self, name: str, volume: dict) -> Path:
        """An emptyDir, or a ConfigMap: its data as files when the subject's manifest has
        it (e.g. a time-slicing config), else an empty directory, as kubelet mounts for an
        optional ConfigMap that does not exist (the lab's per-node configs)."""
        path = self._tmp / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        wanted = volume.get("configMap", {}).get("name")
        for doc in self.subject.manifest:
            if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == wanted:
                for key, text in (doc.get("data") or {}).items():
                    (path / key).write_text(text)
        return path

    def build(self) -> DockerContainer:
        """The DaemonSet's main container as a testcontainers container (not started)."""
        pod = self.subject.daemonset["spec"]["template"]["spec"]
        main = pod["containers"][0]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        c = DockerContainer(self.image)
        host_paths = self._host_paths()
        for m in main.get("volumeMounts", []):
            vol = volumes.get(m["name"], {})
            if "hostPath" not in vol:
                c.with_volume_mapping(str(self._volume_dir(m["name"], vol)), m["mountPath"],
                                      "ro" if m.get("readOnly") else "rw")  # fmt: skip
                continue
            path = vol["hostPath"]["path"]
            mode = "ro" if m.get("readOnly") else "rw"
            if path == DEV:
                self._make_dev(host_paths[DEV])
            if path in host_paths:
                c.with_volume_mapping(str(host_paths[path]), m["mountPath"], mode)
            elif path.startswith(("/run/", "/var/run/")):
                c.with_volume_mapping(str(self._volume_dir(m["name"], {})), m["mountPath"], mode)
            else:
                raise ContainerTierError(
                    f"subject {self.subject.name}: volume {m['name']} mounts host path {path}; "
                    f"the container tier provides {', '.join(sorted(host_paths))} and empty "
                    "directories under /run")  # fmt: skip
            if path == DRIVER:  # the node's state inside its driver root (kindconfig)
                c.with_volume_mapping(str(self.state_dir), m["mountPath"] + STATE, mode)
        for e in main.get("env", []):
            if "value" in e:
                c.with_env(e["name"], str(e["value"]))
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                c.with_env(e["name"], self.node_name)
        for key, value in self.subject.spec.env.items():  # the subject's `env:`, as labs apply it
            c.with_env(key, value)
        kwargs: dict = {"labels": {LABEL: self.subject.name}}
        if (main.get("securityContext") or {}).get("privileged"):
            kwargs["privileged"] = True  # as the DaemonSet asks (NVIDIA's MIG one mounts)
        if main.get("command"):
            kwargs["entrypoint"] = main["command"]
        c.with_kwargs(**kwargs)
        if main.get("args"):
            c.with_command(main["args"])
        return c

    def start(self, timeout_s: float = 60) -> None:
        """Start it and wait (testcontainers' log strategy) for the subject's ready line."""
        ready = LogMessageWaitStrategy(re.compile(self.subject.ready_log))
        self.container = self.build().waiting_for(ready.with_startup_timeout(int(timeout_s)))
        try:
            self.container.start()
        except (RuntimeError, TimeoutError) as e:
            first = str(e).split(". ")[0]  # "Container exited (... exit code: 1) before ..."
            raise ContainerTierError(f"{self.subject.name} ({self.image}): {first}; its log:\n"
                                     f"{self.logs()[-3000:]}") from None  # fmt: skip

    def logs(self) -> str:
        if self.container is None or self.container.get_wrapped_container() is None:
            return ""
        out, err = self.container.get_logs()
        return (out + err).decode(errors="replace")

    def stop(self) -> None:
        if self.container is not None:
            try:
                self.container.stop()  # stops and removes it
            finally:
                self.container = None
        shutil.rmtree(self._tmp, ignore_errors=True)
