"""What a lab's actions work with, below them: kind keeps a narrow action context (logger,
status, config, provider) under its create actions, so an action never reaches back into
the cluster object that runs it. Here: the lab's spec, its host seam (kind, images, exec in
nodes), its API server seam, the images it loaded, and the console. clusters/labs/lab.py (the
Lab a user holds) builds one and runs the actions of clusters/labs/actions.py and of what
serves its GPUs (clusters/labs/serving.py, clusters/labs/dra.py) over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client
from rich.console import Console

from clusters.kube import Kube
from clusters.labs import kindconfig, spec
from clusters.labs.host import Host
from fakenvml.node import NodeDir


@dataclass
class Context:
    lab: spec.Lab
    labs_root: Path
    console: Console
    host: Host
    kube: Kube
    images: dict[str, str] = field(default_factory=dict)  # role -> tag, set by lab_images
    created: bool = False  # by this up(): a failure deletes it again
    # How long a reused cluster may take to answer before it is made again.
    health_deadline_s: float = 120.0

    @classmethod
    def of(cls, lab: spec.Lab, labs_root: Path, console: Console) -> Context:
        host = Host(lab.spec.name, labs_root / lab.spec.name)
        return cls(lab, labs_root, console, host, Kube(host.kubeconfig))

    @property
    def name(self) -> str:
        return self.lab.spec.name

    @property
    def kubeconfig(self) -> Path:
        return self.host.kubeconfig

    @property
    def core(self) -> client.CoreV1Api:
        return self.kube.core

    @property
    def apps(self) -> client.AppsV1Api:
        return self.kube.apps

    def fake_gpus(self, node: str) -> NodeDir:
        """The host side of a node's fake GPUs: inject here, the node's library sees it."""
        return NodeDir(kindconfig.state_dir(self.labs_root, self.lab, node))

    def node_exec(self, node: str, *cmd: str) -> str:
        return self.host.exec(node, *cmd)

    def delete(self) -> None:
        """The cluster and its host-side state gone (the caller holds the lab's claim)."""
        self.host.delete()
        self.kube.reset()  # a cluster made again listens on another port
        self.console.print(f"[green]✓[/] Lab {self.name} deleted")
