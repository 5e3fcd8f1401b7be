"""The host seam: what a lab does on the machine, outside the API server — kind (create,
delete, load images), commands inside node containers, and the fake GPUs' state dirs that
kind bind-mounts into the nodes."""

from __future__ import annotations

import copy
import fcntl
import io
import os
import shutil
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml

from clusters import built, steps

# Where a failed `kind create`'s node logs go (the e2e tier's other outputs are in build/ too).
FAILED_LOGS = Path("build/kind-logs")


class LabInUse(steps.StepError):
    """Another process drives this lab (one line: who)."""


# Labs this process has claimed: name -> the open lock file (flock is per open file, so a
# second Lab object for the same lab in this process shares the first one's claim).
_CLAIMS: dict[str, int] = {}


ClusterState = Literal["up", "none", "orphaned"]


def lab_wait_s() -> float:
    """$GPULAB_LAB_WAIT_S: how long a claim waits for another process's (0: refused at
    once). StepError, one line, for anything but a number of seconds."""
    raw = os.environ.get("GPULAB_LAB_WAIT_S", "").strip() or "0"
    try:
        wait_s = float(raw)
    except ValueError:
        wait_s = -1.0
    if not 0 <= wait_s < float("inf"):
        raise steps.StepError(f"GPULAB_LAB_WAIT_S={raw!r}: expected seconds, 0 or more")
    return wait_s


class Host:
    def __init__(self, name: str, workdir: Path) -> None:
        self.name, self.dir = name, workdir
        self.kubeconfig = workdir / "kubeconfig"
        self._kind = ""

    @property
    def kind(self) -> str:
        """kind's binary, as `make infra` built it."""
        if not self._kind:
            self._kind = built.Products.load().kind
        if not self._kind:
            raise built.InfraMissing(f"kind is not built; {built.MAKE_INFRA}")
        return self._kind

    @kind.setter
    def kind(self, path: str) -> None:
        self._kind = path

    def claim(self, wait_s: float | None = None) -> bool:
        """This process alone drives the lab, until `release()` or its exit: two processes
        on one machine (two `make e2e`s, a test run beside a lab in use) would switch each
        other's plugins and delete each other's clusters. Refused at once, naming the
        holder; with $GPULAB_LAB_WAIT_S, after waiting up to that long for it to let go
        (`make test`'s skew pass, which follows the platform lane beside the cluster tier,
        takes the seed lab once that tier has deleted it). Whether this call took it (False:
        this process held it already), so a caller releases only what it took."""
        if self.name in _CLAIMS:
            return False
        wait_s = lab_wait_s() if wait_s is None else wait_s
        path = self.dir.parent / f".{self.name}.lock"  # beside the lab dir, which down() removes
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        end, said = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
                if time.monotonic() >= end:
                    os.close(fd)
                    waited = f" after {wait_s:.0f}s" if wait_s else ""
                    raise LabInUse(f"lab {self.name} is in use by another process ({holder})"
                                   f"{waited}; wait for it, or stop it") from None  # fmt: skip
                if not said:
                    print(f"lab {self.name} is in use by another process ({holder}): "
                          f"waiting up to {wait_s:.0f}s for it", flush=True)  # fmt: skip
                    said = True
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {_cmdline()}".encode(), 0)
        _CLAIMS[self.name] = fd
        return True

    def release(self) -> None:
        fd = _CLAIMS.pop(self.name, None)
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock

    def exists(self) -> bool:
        return self.state() == "up"

    def state(self) -> ClusterState:
        """`up`; `none`; or `orphaned`: kind has a cluster of this name but this lab has no
        kubeconfig for it, a create or delete cut short (a killed run), and `kind create`
        refuses the name until it goes. One `kind get clusters`."""
        if self.name not in clusters(self.kind):
            return "none"
        return "up" if self.kubeconfig.exists() else "orphaned"

    def config(self) -> dict | None:
        """The kind config the cluster was created with; None when none was recorded."""
        try:
            return yaml.safe_load((self.dir / "kind.yaml").read_text())
        except (OSError, yaml.YAMLError):
            return None

    def create(self, kind_config: dict, images: Mapping[str, str] | None = None) -> None:
        """`kind create cluster` of `kind_config`, recorded as it is (what config() returns);
        each node starts from `images`' stand-in for its image where there is one (a
        node image with the lab images preloaded: the same node, less to load)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "kind.yaml").write_text(yaml.safe_dump(kind_config, sort_keys=False))
        given = copy.deepcopy(kind_config)
        for node in given.get("nodes", []):
            node["image"] = (images or {}).get(node.get("image", ""), node.get("image"))
        cfg_file = self.dir / "kind-create.yaml"
        cfg_file.write_text(yaml.safe_dump(given, sort_keys=False))
        try:
            steps.kind(self.kind, "create", "cluster", "--name", self.name, "--config",
                       str(cfg_file), "--kubeconfig", str(self.kubeconfig), "--wait", "0s",
                       "--retain")  # fmt: skip
        except steps.StepError as e:
            # Retained for its logs (the nodes' journals, kubelet's, containerd's): what
            # kubeadm's last lines in the error do not say is in there. Whether the
            # half-made cluster then goes is Lab.up's call, as for any failed action
            # (KEEP=1 keeps it).
            logs = FAILED_LOGS / f"{self.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            try:
                steps.kind(self.kind, "export", "logs", str(logs), "--name", self.name)
                where = f"the nodes' logs: {logs}"
            except steps.StepError:
                where = "the nodes' logs could not be exported"
            raise steps.StepError(f"{e}\n({where})") from None

    def delete(self) -> None:
        # Its own kubeconfig: labs deleted beside others being created never share a file
        # (and ~/.kube/config.lock, which two `kind delete`s once raced on).
        steps.kind(self.kind, "delete", "cluster", "--name", self.name,
                   "--kubeconfig", str(self.kubeconfig))  # fmt: skip
        shutil.rmtree(self.dir, ignore_errors=True)

    def load(self, images: list[str], nodes: list[str]) -> None:
        """kind load: it skips nodes that already have an image with the same ID."""
        steps.kind(self.kind, "load", "docker-image", "--name", self.name, "--nodes",
                   ",".join(nodes), *sorted(set(images)))  # fmt: skip

    def exec(self, node: str, *cmd: str) -> str:
        """Run a command inside a node container (docker SDK); its output, or StepError."""
        import docker

        res = docker.from_env().containers.get(node).exec_run(list(cmd))
        if res.exit_code != 0:
            raise steps.StepError(f"{' '.join(cmd)} on {node} exited {res.exit_code}: "
                                  f"{res.output.decode(errors='replace')[-500:]}")  # fmt: skip
        return res.output.decode()

    def read(self, node: str, path: str) -> str:
        """A file inside a node container, through the engine's archive API: an exec of
        `cat` came back empty once under CI load (exit 0, no output) where kubelet's
        checkpoint, written by rename, cannot be empty. The archive API does not see into
        tmpfs mounts (kind's /run, so /var/run/cdi): there, `cat` it is."""
        import docker
        from docker.errors import NotFound

        try:
            chunks, _ = docker.from_env().containers.get(node).get_archive(path)
        except NotFound:
            return self.exec(node, "cat", path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member else None
            if f is None:
                raise steps.StepError(f"{path} on {node} is not a regular file")
            return f.read().decode()


def clusters(kind: str) -> list[str]:
    """The kind clusters on this machine (`kind get clusters`); StepError when kind cannot
    tell (no Docker engine answers)."""
    return steps.kind(kind, "get", "clusters", capture=True).split()


def _cmdline() -> str:
    try:
        raw = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:150]
