"""The Kubernetes seam: everything a lab does through the API server, in one place.

Server-side apply for any manifest kind, namespaces, pods by selector and their logs,
DaemonSet roll-outs and restarts, and one wait: `watch_until`, a list followed by a watch
that re-checks on every change (so a measured time is when the change arrived, not the
next tick of a poll) and lists again when the stream drops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config, dynamic, watch
from kubernetes.client.exceptions import ApiException

from clusters.steps import StepError

FIELD_MANAGER = "gpulab"
T = TypeVar("T")
# (done, what was seen) from the objects a watch currently knows, by name.
Check = Callable[[dict[str, Any]], tuple[bool, str]]
# () -> why the awaited state can no longer come, or None: asked between watches.
GiveUp = Callable[[], str | None]
GIVE_UP_EVERY_S = 10


def selector(labels: dict[str, str]) -> str:
    """A label selector string for matchLabels."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def ready(pods: list[client.V1Pod]) -> list[client.V1Pod]:
    """The pods that run with every container ready."""
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
            and all(c.ready for c in p.status.container_statuses or [])]  # fmt: skip


def absent_ok(call: Callable[..., object], *args: object, **kwargs: object) -> bool:
    """call(*args, **kwargs) on an object that may be gone (404: a controller or the garbage
    collector was first), which is what a delete wanted: False then, True where it ran."""
    try:
        call(*args, **kwargs)
    except ApiException as e:
        if e.status != 404:
            raise
        return False
    return True


def or_none(read: Callable[..., T], *args: object, **kwargs: object) -> T | None:
    """read(*args, **kwargs), or None where its object (or its kind) is not there (404)."""
    try:
        return read(*args, **kwargs)
    except ApiException as e:
        if e.status != 404:
            raise
        return None


class TimedApiClient(client.ApiClient):
    """An API client whose calls without a deadline of their own get `timeout` (connect,
    read): the client's default is none, and in CI one call blocked in a TLS read until
    pytest's 300 s limit killed the test. A timed-out read is retried like a dropped
    connection (the Configuration's retries)."""

    timeout: tuple[float, float] = (10, 30)

    def call_api(self, method: str, url: str, header_params: Any = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> Any:  # fmt: skip
        return super().call_api(method, url, header_params, body, post_params,
                                _request_timeout or self.timeout)  # fmt: skip


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._api: client.ApiClient | None = None
        self._dynamic: dynamic.DynamicClient | None = None

    def reset(self) -> None:
        """Forget the connection: a cluster made again listens on another port."""
        self._api = self._dynamic = None

    @property
    def api(self) -> client.ApiClient:
        if self._api is None:
            # A busy two-core API server drops a connection now and then (EOF in the TLS
            # handshake): retry those with back-off instead of failing a test.
            retry = urllib3.Retry(total=6, backoff_factor=0.5, allowed_methods=None,
                                  raise_on_status=False)  # fmt: skip
            self._api = self._client(retry)
        return self._api

    def _client(self, retries: urllib3.Retry | bool) -> TimedApiClient:
        cfg = client.Configuration()
        config.load_kube_config(str(self.kubeconfig), client_configuration=cfg)
        cfg.retries = retries
        return TimedApiClient(cfg)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    # -- objects

    def apply(self, doc: dict, namespace: str = "default") -> None:
        """Server-side apply of one manifest document, whatever its kind (a subject's
        manifest may bring RBAC, ServiceAccounts, ConfigMaps ...): fields gpulab set
        before and no longer sets are removed, fields others own are kept. A namespaced
        object that names no namespace goes to `namespace` (a chart's release namespace)."""
        resource, ns = self._resource(doc, namespace)
        self.dynamic.server_side_apply(resource, body=doc, namespace=ns,
                                       field_manager=FIELD_MANAGER,
                                       force_conflicts=True)  # fmt: skip

    def apply_all(self, docs: list[dict], namespace: str) -> None:
        """A chart's documents applied, its CRDs first and served: an object of a kind
        whose CRD was applied a moment ago is refused until then."""
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        for doc in crds:
            self.apply(doc)
        self.wait_crds_established([d["metadata"]["name"] for d in crds])
        for doc in docs:
            if doc["kind"] != "CustomResourceDefinition":
                self.apply(doc, namespace=namespace)

    def delete(self, doc: dict, namespace: str = "default") -> None:
        """The object of one manifest document deleted (its dependents in the background);
        nothing where it, or its kind, is not there."""
        try:
            resource, ns = self._resource(doc, namespace)
        except dynamic.exceptions.ResourceNotFoundError:  # its CRD went first
            return
        absent_ok(self.dynamic.delete, resource, name=doc["metadata"]["name"], namespace=ns,
                  body={"propagationPolicy": "Background"})  # fmt: skip

    @property
    def dynamic(self) -> dynamic.DynamicClient:
        if self._dynamic is None:
            self._dynamic = dynamic.DynamicClient(self.api)
        return self._dynamic

    def _resource(self, doc: dict, namespace: str) -> tuple[Any, str | None]:
        """The API resource of a manifest document, and its namespace (None: cluster-wide)."""
        resource = self.dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        ns = doc["metadata"].get("namespace", namespace) if resource.namespaced else None
        return resource, ns

    def wait_crds_established(self, names: list[str], deadline_s: float = 60) -> None:
        """Until the API server serves these CustomResourceDefinitions: an object of a CRD
        applied a moment ago is refused (404) until then."""
        api = client.ApiextensionsV1Api(self.api)

        def established(found: dict[str, Any]) -> tuple[bool, str]:
            ok = {n for n, crd in found.items() if any(
                c.type == "Established" and c.status == "True"
                for c in (crd.status.conditions or []))}  # fmt: skip
            return set(names) <= ok, f"established: {sorted(ok & set(names))}"

        self.watch_until(f"CRDs {', '.join(names)} established",
                         api.list_custom_resource_definition, established, deadline_s)  # fmt: skip

    def ensure_namespace(self, name: str) -> None:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def label_node(self, node: str, labels: dict[str, str | None]) -> None:
        """Set (None: remove) labels on a node."""
        self.core.patch_node(node, {"metadata": {"labels": labels}})

    # -- pods

    def pods(self, namespace: str, labels: str, node: str | None = None) -> list[client.V1Pod]:
        """Pods matching the label selector (on `node` only, if given)."""
        return self.core.list_namespaced_pod(
            namespace, label_selector=labels,
            field_selector=f"spec.nodeName={node}" if node else None).items  # fmt: skip

    def pod_log(self, pod: client.V1Pod, timestamps: bool = False) -> str:
        """The log of a pod's first container (containerd's timestamps if asked)."""
        return self.core.read_namespaced_pod_log(
            pod.metadata.name, pod.metadata.namespace, container=pod.spec.containers[0].name,
            timestamps=timestamps)  # fmt: skip

    def log_tail(self, pod: client.V1Pod, lines: int, container: str | None = None,
                 previous: bool = False) -> list[str]:  # fmt: skip
        """The last lines of a pod's `container` (default: its first; `previous`: its run
        before the last restart), for a diagnosis: never raises (a diagnosis must not hide
        the failure it explains)."""
        try:
            text = self.core.read_namespaced_pod_log(
                pod.metadata.name, pod.metadata.namespace, previous=previous,
                container=container or pod.spec.containers[0].name, tail_lines=lines)  # fmt: skip
        except Exception as e:
            return [f"unreadable ({e.__class__.__name__})"]
        return text.strip().splitlines()

    def restart_pods(self, namespace: str, labels: str, what: str, deadline_s: float = 180,
                     nodes: Collection[str] | None = None) -> None:  # fmt: skip
        """Delete the pods (of `nodes` only, if given; their controller recreates them) and
        wait for as many *new* pods, Ready (a DaemonSet's status still counts the old ones
        for a moment). Gracefully, as `kubectl delete pod` does: a force delete lets the
        replacement start while the old container still runs, and a gRPC server shutting
        down unlinks its socket path even when the successor already serves there
        (docs/faults-and-experiments.md, "The suites")."""
        old = [p for p in self.pods(namespace, labels)
               if nodes is None or p.spec.node_name in nodes]  # fmt: skip
        uids, where = {p.metadata.uid for p in old}, {p.spec.node_name for p in old}
        for p in old:
            self.core.delete_namespaced_pod(p.metadata.name, namespace)

        def new_ready(pods: dict[str, client.V1Pod]) -> tuple[bool, str]:
            left = [p for p in pods.values() if p.metadata.uid in uids]
            up = ready([p for p in pods.values()
                        if p.metadata.uid not in uids and p.spec.node_name in where])  # fmt: skip
            return (len(up) == len(old) and not left,
                    f"{len(up)}/{len(old)} new pods ready, {len(left)} old left")  # fmt: skip

        self.watch_until(f"{what} pods restarted", self.core.list_namespaced_pod, new_ready,
                         deadline_s, namespace=namespace, label_selector=labels)  # fmt: skip

    # -- DaemonSets

    def wait_daemonset(self, name: str, namespace: str, deadline_s: float = 180) -> None:
        """Every scheduled pod of the DaemonSet is of its current generation and Ready."""

        def rolled_out(found: dict[str, client.V1DaemonSet]) -> tuple[bool, str]:
            ds = found.get(name)
            if ds is None:
                return False, "no such DaemonSet"
            st = ds.status
            want = st.desired_number_scheduled or 0
            up, updated = st.number_ready or 0, st.updated_number_scheduled or 0
            current = st.observed_generation == ds.metadata.generation
            return current and want > 0 and up == updated == want, (
                f"{up}/{want} ready, {updated} updated")  # fmt: skip

        self.watch_until(f"DaemonSet {name}", self.apps.list_namespaced_daemon_set, rolled_out,
                         deadline_s, namespace=namespace,
                         field_selector=f"metadata.name={name}")  # fmt: skip

    def wait_deployment(self, name: str, namespace: str, deadline_s: float = 180) -> None:
        """Every replica of the Deployment is of its current generation and available."""

        def rolled_out(found: dict[str, client.V1Deployment]) -> tuple[bool, str]:
            d = found.get(name)
            if d is None:
                return False, "no such Deployment"
            st, want = d.status, d.spec.replicas or 0
            up, updated = st.available_replicas or 0, st.updated_replicas or 0
            current = st.observed_generation == d.metadata.generation
            return current and up == updated == want, f"{up}/{want} available"

        self.watch_until(f"Deployment {name}", self.apps.list_namespaced_deployment,
                         rolled_out, deadline_s, namespace=namespace,
                         field_selector=f"metadata.name={name}")  # fmt: skip

    def delete_daemonset(self, name: str, namespace: str) -> None:
        """Delete it and wait until its pods are gone."""
        self._delete_controller("daemon_set", name, namespace)

    def delete_deployment(self, name: str, namespace: str) -> None:
        """Delete it and wait until its pods are gone."""
        self._delete_controller("deployment", name, namespace)

    def delete_webhook_configurations(self, label: str, keep: Callable[[Any], bool]) -> None:
        """The Mutating and ValidatingWebhookConfigurations labelled `label` that `keep`
        does not keep, deleted (cluster-scoped; no pods to wait for)."""
        admission = client.AdmissionregistrationV1Api(self.api)
        for kind in ("mutating", "validating"):
            found = getattr(admission, f"list_{kind}_webhook_configuration")(label_selector=label)
            for w in found.items:
                if not keep(w):
                    getattr(admission, f"delete_{kind}_webhook_configuration")(w.metadata.name)

    def _delete_controller(self, kind: str, name: str, namespace: str) -> None:
        """A DaemonSet or Deployment (`kind` as the apps API spells it) deleted, and its
        pods waited out; nothing where it is not there."""
        found = or_none(getattr(self.apps, f"read_namespaced_{kind}"), name, namespace)
        if found is None:
            return
        labels = selector(found.spec.selector.match_labels or {})
        if absent_ok(getattr(self.apps, f"delete_namespaced_{kind}"), name, namespace):
            self.wait_pods_gone(namespace, labels, name)

    def wait_pods_gone(self, namespace: str, labels: str, what: str,
                       deadline_s: float = 120) -> None:  # fmt: skip
        """Until no pod matches: a deleted controller's pods stop within their grace period."""
        self.watch_until(f"{what} pods to go", self.core.list_namespaced_pod,
                         lambda pods: (not pods, f"{len(pods)} {what} pods"), deadline_s,
                         namespace=namespace, label_selector=labels)  # fmt: skip

    # -- the one wait

    def watch_until(self, what: str, list_fn: Callable[..., Any], check: Check,
                    deadline_s: float, give_up: GiveUp | None = None,
                    **query: Any) -> int:  # fmt: skip
        """List with `query`, then watch, until check({name: object}) says done; returns
        time.time_ns() of the event that satisfied it. A watch the server ends (its
        timeout, 410 Gone) or a dropped connection lists again; at the deadline, StepError
        with what was seen last. `give_up()`, asked every GIVE_UP_EVERY_S, names why what
        is awaited can no longer happen (a plugin that crash-loops): StepError at once."""
        start = time.monotonic()
        end = start + deadline_s
        seen = "nothing yet"
        ask_at = start + GIVE_UP_EVERY_S
        while True:
            if give_up is not None and time.monotonic() >= ask_at:
                ask_at = time.monotonic() + GIVE_UP_EVERY_S
                if why := give_up():
                    raise StepError(f"gave up after {time.monotonic() - start:.0f}s on "
                                    f"{what}: {why}; last saw: {seen}")  # fmt: skip
            try:
                # Never past the deadline by more than a second (a paused API server
                # accepts connections and never answers).
                listed = list_fn(
                    **query, _request_timeout=max(1.0, min(10.0, end - time.monotonic()))
                )
                objects = {o.metadata.name: o for o in listed.items}
                done, seen = check(objects)
                if done:
                    return time.time_ns()
                left = max(1, int(end - time.monotonic()))
                if give_up is not None:  # back to the top (and give_up) that often
                    left = min(left, GIVE_UP_EVERY_S)
                # Server-side timeout ends a quiet watch; the client one, a dead connection.
                for event in watch.Watch().stream(
                    list_fn, resource_version=listed.metadata.resource_version,
                    timeout_seconds=left, _request_timeout=left + 5, **query,
                ):  # fmt: skip
                    obj = event["object"]
                    if event["type"] == "ERROR" or not hasattr(obj, "metadata"):
                        break  # e.g. 410 Gone: list again
                    if event["type"] == "DELETED":
                        objects.pop(obj.metadata.name, None)
                    else:
                        objects[obj.metadata.name] = obj
                    done, seen = check(objects)
                    if done:
                        return time.time_ns()
            except (ApiException, OSError, urllib3.exceptions.HTTPError) as e:
                seen = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                time.sleep(0.5)  # API server starting, or the watch dropped: list again
            if time.monotonic() > end:
                raise StepError(f"waited {deadline_s:.0f}s for {what}; last saw: {seen}")

    def healthy(self, deadline_s: float, nodes: str = "") -> tuple[bool, str]:
        """The API server answers and every node (those of label selector `nodes`) is
        Ready, within the deadline; a reused cluster may still be starting (403 until RBAC
        is loaded, 5xx, refused)."""

        def all_ready(nodes: dict[str, client.V1Node]) -> tuple[bool, str]:
            up = [n for n in nodes.values()
                  if any(c.type == "Ready" and c.status == "True"
                         for c in n.status.conditions or [])]  # fmt: skip
            return bool(nodes) and len(up) == len(nodes), f"{len(up)}/{len(nodes)} Ready"

        # No retries: each attempt's timeout is bounded by the deadline, but 6 retries with
        # back-off made a 5 s health deadline take 100 s against a paused control plane.
        probe = client.CoreV1Api(self._client(False))
        try:
            self.watch_until("the API server and Ready nodes", probe.list_node, all_ready,
                             deadline_s, label_selector=nodes)  # fmt: skip
        except StepError as e:
            return False, str(e)
        return True, ""
