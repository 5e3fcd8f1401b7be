"""A lab: a real kind cluster built from a lab spec, with fake GPUs and a plugin under test.

    with Lab("seed", subject="gpulab") as lab:     # reuses the cluster when it is up
        lab.core.list_node()                        # kubernetes client, lab's kubeconfig
        lab.fake_gpus("seed-worker").inject_xid(3, 79)

`up()` runs the steps in order with one progress line each (✓ or ✗ and seconds); `down()`
deletes the cluster and the host-side state. Used by `make cluster`, the tests and the e2e
fixtures. A lab only *uses* the infrastructure `make infra` built (clusters/infra.py): when
some of it is missing, `up()` fails at once with one line naming that command.

Kind's Retain rule: when `up()` fails after it created the cluster, it deletes the
half-made cluster again, unless KEEP=1 (or retain=True) asks to keep it for a post-mortem.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from rich.console import Console

from clusters import infra, kindconfig, spec, steps, versions
from clusters.subject import Subject
from clusters.subject import load as load_subject
from fakenvml import paths
from fakenvml.node import NodeDir

# Lab state (kind configs, node state dirs): machine-wide where this process may write.
LABS_ROOT = Path(
    os.environ.get("GPULAB_LABS")
    or paths.user_or_system(Path("/var/lib/gpulab/labs"), paths.cache_dir() / "labs")
)
RESOURCE = "nvidia.com/gpu"
SUBJECT_LABEL = f"{kindconfig.LABEL_PREFIX}/subject"  # on every DaemonSet a lab deploys


class Lab:
    def __init__(self, lab: str | Path | spec.Lab, subject: str | Path | Subject | None = None,
                 keep: bool = True, console: Console | None = None,
                 retain: bool | None = None) -> None:  # fmt: skip
        self.lab = lab if isinstance(lab, spec.Lab) else spec.load(lab)
        self.name = self.lab.spec.name
        self.subject = load_subject(subject or self.lab.spec.subject)
        self.keep = keep
        # Keep a cluster that failed to come up (kind's --retain); KEEP=1 by default.
        self.retain = os.environ.get("KEEP", "") not in ("", "0") if retain is None else retain
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.dir = LABS_ROOT / self.name
        self.kubeconfig = self.dir / "kubeconfig"
        self.images: dict[str, str] = {}
        self._kind = ""
        self._api: client.ApiClient | None = None
        # How long a reused cluster may take to answer before it is made again.
        self.health_deadline_s = 120.0

    # -- context manager

    def __enter__(self) -> Lab:
        return self.up()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        if not self.keep:
            self.down()

    # -- steps

    def _step(self, title: str, fn, *args):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        title = f"{self.name}: {title}"  # labs may come up side by side
        self.console.print(f"[bold]•[/] {title} ...", highlight=False)
        try:
            result = fn(*args)
        except BaseException as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.console.print(f"[red]✗[/] {title} [dim]({time.monotonic() - t0:.1f}s)[/]: "
                               f"{why}", highlight=False)  # fmt: skip
            raise
        self.console.print(f"[green]✓[/] {title} [dim]({time.monotonic() - t0:.1f}s)[/]",
                           highlight=False)  # fmt: skip
        return result

    def up(self) -> Lab:
        """The lab running its plugin. Reuses the cluster when it is up; a cluster this call
        created is deleted again if a later step fails (unless retained)."""
        t0 = time.monotonic()
        products = self._step("Infrastructure (built by `make infra`)", infra.require, ())
        self._kind = products.kind
        created = False
        try:
            if self.exists() and not self._step(f"Cluster {self.name} exists: is it healthy?",
                                                self._healthy):  # fmt: skip
                self.console.print(f"[yellow]![/] {self.name} does not recover (left from an "
                                   "earlier run and restarted?): recreating it")  # fmt: skip
                self.down()
            if not self.exists():
                self._step("Fake GPUs on the host", self._write_states)
                created = True
                self._step(f"Cluster {self.name}", self._create, products.node_image)
            elif self._step("Clear faults left from an earlier run", self._clear_faults):
                # A plugin that never re-adds a device it marked Unhealthy: fresh pods.
                self._delete_subjects(keep=None)
            self.use_subject(self.subject)
        except BaseException:
            if created and not self.retain:
                self.console.print(f"[yellow]![/] deleting the half-made cluster {self.name} "
                                   "(KEEP=1 keeps it)")  # fmt: skip
                self.down()
            elif created:
                self.console.print(f"[yellow]![/] keeping the failed cluster {self.name} "
                                   f"(KEEP=1): export KUBECONFIG={self.kubeconfig}")  # fmt: skip
            raise
        self._summary(time.monotonic() - t0)
        return self

    def use_subject(self, subject: str | Path | Subject) -> None:
        """Deploy fakenvml and the plugin under test (removing any other subject's
        DaemonSet) and wait until every GPU node reports its inventory as capacity and
        allocatable."""
        self.subject = load_subject(subject)
        name = self.subject.name
        self.images = self._step("Lab images (built by `make infra`)", self._lab_images)
        self._step("Load images into the nodes", self._load_images)
        self._step(f"Deploy fakenvml and {name}", self._deploy)
        self._step(f"Wait for {name}'s pods", self.wait_daemonset, self.subject.daemonset_name,
                   self.subject.namespace)  # fmt: skip
        self._step("Wait for every GPU node's capacity", self.wait_capacity)

    def _lab_images(self) -> dict[str, str]:
        # The shipped subjects' images too: they share the base layer, so one `kind load`
        # of all costs little more than of one, and a later switch of subjects loads nothing.
        infra_images = ["gpulab", "workload", *(f"nvidia-{v}" for v in
                                                versions.nvidia_plugin_versions()[:1])]  # fmt: skip
        products = infra.require(infra_images)
        images = {k: products.images[k] for k in infra_images}
        images["subject"] = infra.subject_image(self.subject, products)
        return images

    def exists(self) -> bool:
        out = steps.kind(self._kind_bin(), "get", "clusters", capture=True)
        return self.name in out.split() and self.kubeconfig.exists()

    def _write_states(self) -> None:
        for n in self.lab.gpu_nodes:
            d = self.fake_gpus(n.name)
            if d.path.exists():
                shutil.rmtree(d.path)
            assert n.gpu_node is not None
            d.init(n.gpu_node)

    def _healthy(self) -> bool:
        """A reused cluster's API server answers and every node is Ready. Docker restarts
        kind's nodes with the engine; most come back within a minute, some never do."""

        def check() -> tuple[bool, str]:
            try:
                # A timeout: a hung API server (or docker-proxy to a frozen node) never answers.
                nodes = self.core.list_node(_request_timeout=10).items
            except ApiException as e:  # 403 until RBAC is loaded, 5xx while starting
                return False, f"API server answers {e.status} {e.reason}"
            ready = [n for n in nodes if any(c.type == "Ready" and c.status == "True"
                                             for c in n.status.conditions or [])]  # fmt: skip
            return bool(nodes) and len(ready) == len(nodes), f"{len(ready)}/{len(nodes)} Ready"

        try:
            steps.poll("the API server and Ready nodes", check, self.health_deadline_s, 2)
        except steps.StepError as e:
            self.console.print(f"[yellow]![/] {e}", highlight=False)
            return False
        return True

    def _clear_faults(self) -> int:
        """Recover every fake GPU whose last event is a fault: a reused lab starts from its
        spec (an interrupted test never recovered what it injected). Returns how many."""
        cleared = 0
        for n in self.lab.gpu_nodes:
            d = self.fake_gpus(n.name)
            for gpu in sorted(d.faulted()):
                d.recover(gpu)
                cleared += 1
        return cleared

    def _create(self, image: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg_file = self.dir / "kind.yaml"
        cfg_file.write_text(yaml.safe_dump(kindconfig.render(self.lab, image, LABS_ROOT),
                                           sort_keys=False))  # fmt: skip
        steps.kind(self._kind, "create", "cluster", "--name", self.name, "--config",
                   str(cfg_file), "--kubeconfig", str(self.kubeconfig), "--wait", "0s")  # fmt: skip

    def _load_images(self) -> None:
        # Only GPU nodes run lab pods (fakenvml, the plugin, GPU workloads); kind skips nodes
        # that already have an image with the same ID.
        nodes = ",".join(n.name for n in self.lab.gpu_nodes)
        steps.kind(self._kind, "load", "docker-image", "--name", self.name, "--nodes", nodes,
                   *sorted(set(self.images.values())))  # fmt: skip

    def _placeholders(self) -> dict[str, str]:
        return {"GPULAB_IMAGE": self.images["gpulab"], "SUBJECT_IMAGE": self.images["subject"]}

    def _plugin_config(self) -> dict:
        data = {f"{n.name}.yaml": yaml.safe_dump({"extra_resources": n.spec.extra_resources})
                for n in self.lab.gpu_nodes if n.spec.extra_resources}  # fmt: skip
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "gpulab-plugin-config", "namespace": "kube-system"},
                "data": data}  # fmt: skip

    def _deploy(self) -> None:
        self._delete_subjects(keep=self.subject.name)
        docs = [*steps.manifest("fakenvml.yaml", {"gpulab/gpulab:latest": self.images["gpulab"]}),
                self._plugin_config()]  # fmt: skip
        for doc in self.subject.render(self._placeholders()):
            if doc["kind"] == "DaemonSet":
                doc["metadata"].setdefault("labels", {})[SUBJECT_LABEL] = self.subject.name
            docs.append(doc)
        for doc in docs:
            self.apply(doc)

    def _delete_subjects(self, keep: str | None) -> None:
        """Delete the DaemonSets of subjects other than `keep` (None: all of them) and wait
        for their pods to go: one plugin under test at a time."""
        found = self.apps.list_daemon_set_for_all_namespaces(label_selector=SUBJECT_LABEL).items
        for ds in found:
            if ds.metadata.labels.get(SUBJECT_LABEL) != keep:
                self.delete_daemonset(ds.metadata.name, ds.metadata.namespace)

    def _summary(self, seconds: float) -> None:
        gpus = sum(n.gpu_count for n in self.lab.gpu_nodes)
        self.console.print(
            f"[bold green]Lab {self.name} is up[/] in {seconds:.0f}s: {len(self.lab.nodes)} "
            f"nodes, {gpus} fake GPUs, subject {self.subject.name}\n"
            f"  export KUBECONFIG={self.kubeconfig}"
        )

    def _kind_bin(self) -> str:
        if not self._kind:
            self._kind = infra.Products.load().kind
        if not self._kind:
            raise infra.InfraMissing(f"kind is not built; {infra.MAKE_INFRA}")
        return self._kind

    def down(self) -> None:
        steps.kind(self._kind_bin(), "delete", "cluster", "--name", self.name)
        shutil.rmtree(self.dir, ignore_errors=True)
        self._api = None  # a cluster made again listens on another port
        self.console.print(f"[green]✓[/] Lab {self.name} deleted")

    # -- cluster access

    @property
    def api(self) -> client.ApiClient:
        if self._api is None:
            cfg = client.Configuration()
            config.load_kube_config(str(self.kubeconfig), client_configuration=cfg)
            # A busy two-core API server drops a connection now and then (EOF in the TLS
            # handshake): retry those with back-off instead of failing a test.
            cfg.retries = urllib3.Retry(total=6, backoff_factor=0.5, allowed_methods=None,
                                        raise_on_status=False)  # fmt: skip
            self._api = client.ApiClient(cfg)
        return self._api

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    def fake_gpus(self, node: str) -> NodeDir:
        """The host side of a node's fake GPUs: inject here, the node's library sees it."""
        return NodeDir(kindconfig.state_dir(LABS_ROOT, self.lab, node))

    def apply(self, doc: dict) -> None:
        """Create, or replace when it exists: enough for the few kinds labs deploy."""
        kind, meta = doc["kind"], doc["metadata"]
        ns = meta.get("namespace", "default")
        create, replace = {
            "DaemonSet": (self.apps.create_namespaced_daemon_set,
                          self.apps.replace_namespaced_daemon_set),
            "ConfigMap": (self.core.create_namespaced_config_map,
                          self.core.replace_namespaced_config_map),
        }[kind]  # fmt: skip
        try:
            create(ns, doc)
        except ApiException as e:
            if e.status != 409:
                raise
            replace(meta["name"], ns, doc)

    def delete_daemonset(self, name: str, namespace: str = "kube-system") -> None:
        """Delete it and wait until its pods are gone."""
        try:
            ds = self.apps.read_namespaced_daemon_set(name, namespace)
            labels = ds.spec.selector.match_labels or {}
            selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            self.apps.delete_namespaced_daemon_set(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            return

        def gone() -> tuple[bool, str]:
            pods = self.core.list_namespaced_pod(namespace, label_selector=selector).items
            return not pods, f"{len(pods)} {name} pods"

        steps.poll(f"{name} pods to go", gone, 120)

    def ensure_namespace(self, name: str) -> None:
        """Create the namespace unless it exists."""
        try:
            self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        except ApiException as e:
            if e.status != 409:
                raise

    def plugin_pods(self, node: str | None = None) -> list[client.V1Pod]:
        """The subject DaemonSet's pods (on `node` only, if given)."""
        return self.core.list_namespaced_pod(
            self.subject.namespace, label_selector=self.subject.selector,
            field_selector=f"spec.nodeName={node}" if node else None).items  # fmt: skip

    def pod_log(self, pod: client.V1Pod, timestamps: bool = False) -> str:
        """The log of a pod's first container (containerd's timestamps if asked)."""
        return self.core.read_namespaced_pod_log(
            pod.metadata.name, pod.metadata.namespace, container=pod.spec.containers[0].name,
            timestamps=timestamps)  # fmt: skip

    def plugin_log(self, node: str, timestamps: bool = False) -> str | None:
        """The log of the plugin on `node`; None when no plugin pod runs there."""
        pods = self.plugin_pods(node)
        return self.pod_log(pods[0], timestamps) if pods else None

    def set_plugin_on(self, node: str, on: bool, deadline_s: float = 120) -> None:
        """Start or stop the plugin DaemonSet's pod on `node` (its gpulab.dev/plugin label)
        and wait until the pod is there and Ready, or gone."""
        label = f"{kindconfig.LABEL_PREFIX}/plugin"
        self.core.patch_node(node, {"metadata": {"labels": {label: "true" if on else None}}})
        ds = self.subject.daemonset_name

        def check() -> tuple[bool, str]:
            pods = self.plugin_pods(node)
            ready = _ready(pods)
            return (len(ready) == 1) if on else not pods, f"{len(pods)} pods, {len(ready)} ready"

        steps.poll(f"{ds} {'on' if on else 'off'} {node}", check, deadline_s)

    def restart_plugin(self) -> None:
        """Delete the plugin's pods (the DaemonSet recreates them): NVIDIA's plugin only
        forgets an Unhealthy device when it restarts. Waits for the *new* pods to be Ready
        (the DaemonSet's status still counts the old ones for a moment)."""
        ds = self.subject.daemonset_name
        old = {p.metadata.uid for p in self.plugin_pods()}
        self.core.delete_collection_namespaced_pod(
            self.subject.namespace, label_selector=self.subject.selector,
            grace_period_seconds=0)  # fmt: skip

        def new_pods_ready() -> tuple[bool, str]:
            pods = self.plugin_pods()
            fresh = [p for p in pods if p.metadata.uid not in old]
            ready = _ready(fresh)
            done = len(ready) == len(old) and len(pods) == len(fresh)
            return done, f"{len(ready)}/{len(old)} new pods ready, {len(pods)} pods"

        steps.poll(f"{ds} pods restarted", new_pods_ready, 180)
        self.wait_capacity()

    def set_plugin_env(self, env: dict[str, str | None]) -> None:
        """Set (or with None, remove) env vars of the plugin container; waits for the
        rolled-out pods and full capacity."""
        name, ns = self.subject.daemonset_name, self.subject.namespace
        ds = self.apps.read_namespaced_daemon_set(name, ns)
        container = ds.spec.template.spec.containers[0]
        current = {e.name: e for e in container.env or []}
        for key, value in env.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = client.V1EnvVar(name=key, value=value)
        container.env = list(current.values())
        self.apps.replace_namespaced_daemon_set(name, ns, ds)
        self.wait_daemonset(name, ns)
        self.wait_capacity()

    def node_exec(self, node: str, *cmd: str) -> str:
        """Run a command inside a node container (docker SDK); its output, or StepError."""
        import docker

        res = docker.from_env().containers.get(node).exec_run(list(cmd))
        if res.exit_code != 0:
            raise steps.StepError(f"{' '.join(cmd)} on {node} exited {res.exit_code}: "
                                  f"{res.output.decode(errors='replace')[-500:]}")  # fmt: skip
        return res.output.decode()

    def wait_daemonset(self, name: str, namespace: str = "kube-system",
                       deadline_s: float = 180) -> None:  # fmt: skip
        """Every scheduled pod of the DaemonSet is up to date and Ready."""

        def check() -> tuple[bool, str]:
            st = self.apps.read_namespaced_daemon_set(name, namespace).status
            want = st.desired_number_scheduled or 0
            ready, updated = st.number_ready or 0, st.updated_number_scheduled or 0
            current = st.observed_generation == self.apps.read_namespaced_daemon_set(
                name, namespace).metadata.generation  # fmt: skip
            done = current and want > 0 and ready == updated == want
            return done, f"{ready}/{want} ready, {updated} updated"

        steps.poll(f"DaemonSet {name}", check, deadline_s)

    def capacity(self, node: str, resource: str | None = None) -> tuple[int, int]:
        """(capacity, allocatable) of `resource` (the subject's) on `node`, as the API
        server has them."""
        return _gpus(self.core.read_node(node), resource or self.subject.spec.resource)

    def wait_nodes(self, what: str, names: set[str],
                   check: Callable[[dict[str, tuple[int, int]]], bool],
                   deadline_s: float) -> int:  # fmt: skip
        """Watch Node objects until check({name: (capacity, allocatable)}) holds for
        `names`; returns time.time_ns() of the update that satisfied it. A watch sees every
        status write as it lands, so fault latencies are not rounded up to a poll period."""
        end = time.monotonic() + deadline_s
        resource = self.subject.spec.resource
        seen: dict[str, tuple[int, int]] = {}
        while True:
            try:
                listed = self.core.list_node()
                seen = {n.metadata.name: _gpus(n, resource) for n in listed.items
                        if n.metadata.name in names}  # fmt: skip
                if check(seen):
                    return time.time_ns()
                left = max(1, int(end - time.monotonic()))
                # Server-side timeout ends a quiet watch; the client one, a dead connection.
                stream = watch.Watch().stream(
                    self.core.list_node, resource_version=listed.metadata.resource_version,
                    timeout_seconds=left, _request_timeout=left + 5)  # fmt: skip
                for event in stream:
                    node = event["object"]
                    if event["type"] == "ERROR" or not hasattr(node, "metadata"):
                        break  # e.g. 410 Gone: list again
                    if node.metadata.name in names:
                        seen[node.metadata.name] = _gpus(node, resource)
                        if check(seen):
                            return time.time_ns()
            except (ApiException, OSError, urllib3.exceptions.HTTPError):
                time.sleep(0.5)  # API server starting, or the watch dropped: list again
            if time.monotonic() > end:
                shown = ", ".join(f"{n} {c}/{a}" for n, (c, a) in sorted(seen.items()))
                raise steps.StepError(f"waited {deadline_s:.0f}s for {what}; last saw "
                                      f"(capacity/allocatable): {shown or 'nothing'}")  # fmt: skip

    def wait_allocatable(self, node: str, allocatable: int, capacity: int | None = None,
                         deadline_s: float = 60) -> int:  # fmt: skip
        """Until `node` reports that allocatable (and capacity, if given); the time.time_ns()
        at which the API server's update arrived."""

        def check(seen: dict[str, tuple[int, int]]) -> bool:
            cap, alloc = seen.get(node, (-1, -1))
            return alloc == allocatable and (capacity is None or cap == capacity)

        want = f"{allocatable}" + (f" of {capacity}" if capacity is not None else "")
        return self.wait_nodes(f"{node} allocatable {want}", {node}, check, deadline_s)

    def wait_capacity(self, deadline_s: float = 300) -> None:
        """Until every GPU node whose plugin starts shows capacity = allocatable = its
        inventory."""
        want = {n.name: n.gpu_count for n in self.lab.gpu_nodes if n.spec.plugin.start}

        def check(seen: dict[str, tuple[int, int]]) -> bool:
            return all(seen.get(n) == (c, c) for n, c in want.items())

        what = f"{self.subject.spec.resource} capacity = allocatable = inventory on {sorted(want)}"
        self.wait_nodes(what, set(want), check, deadline_s)


def _ready(pods: list[client.V1Pod]) -> list[client.V1Pod]:
    """The pods that run with every container ready."""
    return [p for p in pods if p.status.phase == "Running"
            and all(c.ready for c in p.status.container_statuses or [])]  # fmt: skip


def _gpus(node: client.V1Node, resource: str) -> tuple[int, int]:
    status = node.status
    cap = int((status.capacity or {}).get(resource, 0)) if status else 0
    alloc = int((status.allocatable or {}).get(resource, 0)) if status else 0
    return cap, alloc
