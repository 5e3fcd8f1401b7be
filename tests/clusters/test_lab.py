"""The cluster tier's own check: the seed lab comes up from locally built images on a real
kind cluster, and both workers report their fake GPUs with each plugin."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container
from kubernetes import client
from rich.console import Console

from clusters.labs import actions, features, serving, spec, toolkit
from clusters.labs.lab import RESOURCE, Lab
from clusters.labs.registration import Mark, registrations
from clusters.steps import StepError
from e2e.fixtures import bring_up
from fakenvml.yamlmodel import duration_text

SEED = spec.load("seed")
WORKERS = tuple(n.name for n in SEED.gpu_nodes)
FIRST, SECOND = WORKERS[:2]
N = SEED.gpu_nodes[0].gpu_count  # each worker's GPUs (seed's workers are alike)
CONTROL_PLANE = SEED.control_plane.name


@pytest.fixture(scope="module")
def seed() -> Iterator[Lab]:
    lab = bring_up(Lab("seed", subject="gpulab"))
    yield lab
    # `make test` hands the lab to the cluster tier, which reuses it (as after KEEP=1)
    # instead of creating it again: a minute of the CI budget.
    if os.environ.get("GPULAB_KEEP_SEED") != "1":
        lab.down()


@pytest.mark.parametrize("subject", ["gpulab", "nvidia"])
def test_both_workers_report_their_gpus_as_capacity_and_allocatable(
    seed: Lab, subject: str
) -> None:
    seed.use_subject(subject)
    for worker in WORKERS:
        assert seed.capacity(worker) == (N, N)
    # The control plane has no fake GPUs and must not advertise any.
    assert seed.capacity(CONTROL_PLANE) == (0, 0)


def test_host_side_injection_reaches_the_node(seed: Lab) -> None:
    seed.use_subject("gpulab")
    gpus = seed.fake_gpus(SECOND)
    gpus.inject_xid(7, 79)
    try:
        seed.wait_allocatable(SECOND, N - 1, N, deadline_s=30)
        assert seed.capacity(FIRST) == (N, N)
    finally:
        gpus.recover(7)  # gpulab's plugin returns a recovered GPU to Healthy
    seed.wait_allocatable(SECOND, N, N, deadline_s=30)


def test_a_node_file_reads_through_the_engine(seed: Lab) -> None:
    assert seed.node_read(FIRST, "/etc/hostname") == f"{FIRST}\n"
    checkpoint = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    assert '"Checksum"' in seed.node_read(FIRST, checkpoint)
    # /run is a tmpfs the archive API cannot see into.
    assert seed.node_read(FIRST, "/run/systemd/container") == "docker\n"
    with pytest.raises(StepError, match=rf"^cat /no/such on {FIRST} exited 1: "):
        seed.node_read(FIRST, "/no/such")
    with pytest.raises(StepError, match=rf"^/etc on {FIRST} is not a regular file$"):
        seed.node_read(FIRST, "/etc")


def test_pods_on_two_workers_reach_each_other_and_resolve_services(seed: Lab) -> None:
    """The node image's pod network (gpulab-podnet: a bridge per node and routes to the
    others' pod CIDRs) and CoreDNS: a pod on one worker pings a pod on the other and
    resolves the API server's Service name. No GPU is asked for. (Before the tests that
    make the lab again: the module's `seed` then reaches an API server that is gone.)"""
    from e2e.fixtures import namespaced_pods  # the suites' namespace, emptied afterwards

    gen = namespaced_pods(seed)
    pods = next(gen)
    try:
        for i, worker in enumerate(WORKERS):
            spec = pods.gpu_pod(f"net-{i}", 0, worker)
            del spec["spec"]["containers"][0]["resources"]
            pods.create(spec)
        ip = pods.wait_running("net-1").status.pod_ip
        pods.wait_running("net-0")
        out = pods.exec("net-0", ["busybox", "ping", "-c", "1", "-W", "5", ip],
                        lambda o: "1 packets received" in o)  # fmt: skip
        assert f"from {ip}" in out
        name = "kubernetes.default.svc.cluster.local"
        out = pods.exec("net-0", ["busybox", "nslookup", name], lambda o: "Name:" in o)
        cluster_ip = seed.core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
        assert re.search(rf"Name:\s+{re.escape(name)}\s+Address:\s+{re.escape(cluster_ip)}$",
                         out, re.M), out  # fmt: skip
    finally:
        next(gen, None)


def test_an_idle_lab_writes_no_status_that_changed_nothing(seed: Lab) -> None:
    """Each kubelet runs with the lab's report frequency (a Node written every 2 s was
    1.5 writes a second per lab, each sent to every watcher) and the control plane holds no
    leader-election Lease (renewed every 2 s by each of its two controllers)."""
    for node in (*WORKERS, CONTROL_PLANE):
        raw = seed.core.connect_get_node_proxy_with_path(node, "configz", _preload_content=False)
        config = json.loads(raw.data)["kubeletconfig"]
        assert (config["nodeStatusUpdateFrequency"], config["nodeStatusReportFrequency"]) == (
            duration_text(SEED.spec.node_status_update_frequency), "1m0s"), node  # fmt: skip
    leases = client.CoordinationV1Api(seed.kube.api).list_namespaced_lease("kube-system")
    names = {lease.metadata.name for lease in leases.items}
    assert names.isdisjoint({"kube-controller-manager", "kube-scheduler"}), names


def test_a_stalled_label_wait_says_which_side_and_restarts_nfd_and_gfd(seed: Lab) -> None:
    """nfd-master frozen (SIGSTOP) and a worker's GFD and PCI labels removed: nothing puts
    them back until the wait's stall restarts NFD and GFD; it says so on the console, with
    the worker's NodeFeature still carrying the PCI label (the master's side stalled)."""
    (master,) = seed.kube.pods(features.NAMESPACE, features.MASTER)
    seed.node_exec(master.spec.node_name, "pkill", "-STOP", "-x", "nfd-master")
    gone = {features.LABEL: None, features.PCI_LABEL: None}
    seed.core.patch_node(FIRST, {"metadata": {"labels": gone}})
    out, console = io.StringIO(), seed.console
    seed.console = Console(file=out, width=1000)
    try:
        features.wait_labels(seed.ctx, "none", deadline_s=150, stall_s=10)
    finally:
        seed.console = console
    text = out.getvalue()
    assert f"{FIRST}': None" in text
    assert text.rstrip().endswith("restarting nfd-master, nfd-worker, GFD")
    assert "nfd-node-feature-discovery-master" in text  # the diagnosis names it
    assert f"{FIRST} (PCI label: true)" in text  # the worker's side had done its part
    (now,) = seed.kube.pods(features.NAMESPACE, features.MASTER)
    assert now.metadata.uid != master.metadata.uid
    labels = seed.core.read_node(FIRST).metadata.labels
    assert (labels[features.LABEL], labels[features.PCI_LABEL]) == (str(N), "true")


@pytest.mark.parametrize("subject", ["gpulab", "nvidia"])
def test_a_switched_subject_registers_before_capacity_is_read(seed: Lab, subject: str) -> None:
    """The Node still shows the old plugin's devices for a moment after a switch (CI read
    10/10 there, then 10/0): use_subject returns only once each kubelet counted the new
    plugin's registration, so the capacity read right after it is the new plugin's."""
    seed.use_subject("nvidia" if subject == "gpulab" else "gpulab")
    before = {w: registrations(seed.core, w, RESOURCE) for w in WORKERS}
    seed.use_subject(subject)
    for worker in WORKERS:
        assert registrations(seed.core, worker, RESOURCE) > before[worker]
        assert seed.capacity(worker) == (N, N)
    assert registrations(seed.core, CONTROL_PLANE, RESOURCE) == 0


def test_a_restart_of_the_same_plugin_waits_for_its_registration(seed: Lab) -> None:
    seed.use_subject("gpulab")
    mark = seed.mark_plugin()
    assert sorted(mark.counts) == list(WORKERS) and all(mark.counts.values())
    # Nothing restarted since the mark: no node waits.
    assert mark.pending(seed.core, seed.plugin_pods()) == []
    seed.restart_plugin()
    for worker in WORKERS:
        assert registrations(seed.core, worker, RESOURCE) > mark.counts[worker]


def test_a_registration_that_never_comes_is_reported_with_both_sides_logs(seed: Lab) -> None:
    """A mark no kubelet can pass (a count no registration reaches, every pod new): the
    wait gives up at its bound, prints each node's plugin log and kubelet device-plugin
    lines, and still returns once capacity is whole."""
    seed.use_subject("gpulab")
    real = seed.mark_plugin()
    beyond = {n: m and m._replace(registrations=10**9) for n, m in real.seen.items()}
    impossible = Mark(real.resource, frozenset(), beyond)
    out, console = io.StringIO(), seed.console
    seed.console = Console(file=out, width=1000)
    try:
        seed.wait_capacity(deadline_s=5, since=impossible)
    finally:
        seed.console = console
    text = out.getvalue()
    assert f"not yet registered on {', '.join(WORKERS)}; waiting on capacity alone" in text
    for worker in WORKERS:
        assert f"{worker} plugin: " in text and f"{worker} kubelet: " in text
    assert text.count("Registered device plugin for 'nvidia.com/gpu' with Kubelet") >= 2
    assert text.count("Got registration request from device plugin") >= 2


def test_a_lab_comes_up_with_fake_gpus_and_no_plugin(seed: Lab) -> None:
    """`subject: none`: the fake GPUs (state, driver root, the nodes' /dev) and no plugin
    under test, for a suite that installs its own; the plugin an earlier run left is gone."""
    out = io.StringIO()
    bare = bring_up(Lab("seed", subject="none", console=Console(file=out, width=200)))
    assert "no plugin (subject: none)" in out.getvalue()
    assert bare.apps.list_daemon_set_for_all_namespaces(
        label_selector=serving.SUBJECT_LABEL).items == []  # fmt: skip
    # NFD stays (its PCI label on the GPU nodes); gpulab's GFD goes: a chart brings its own.
    assert bare.kube.pods(features.NAMESPACE, features.GFD) == []
    for worker in WORKERS:
        assert len(bare.fake_gpus(worker).node().gpus) == N
        last = f"/dev/nvidia{N - 1}"
        assert "character special" in bare.node_exec(worker, "stat", "-c", "%F", last)
        labels = bare.core.read_node(worker).metadata.labels
        assert labels.get(features.PCI_LABEL) == "true"
        # The NVIDIA Container Toolkit's CDI spec: every GPU by index and by UUID, and "all".
        spec = json.loads(bare.node_read(worker, toolkit.SPEC))
        names = {d["name"] for d in spec["devices"]}
        uuids = {g.uuid for g in bare.fake_gpus(worker).node().gpus}
        assert names == {str(i) for i in range(N)} | uuids | {"all"}
    assert bare.plugin_pods() == []  # nothing serves the GPUs: no pods to restart or read
    with pytest.raises(ValueError, match="runs no plugin under test"):
        bare.subject  # noqa: B018


def test_a_lab_left_by_an_interrupted_run_comes_back_at_full_capacity(seed: Lab) -> None:
    """What CI finds after a run was killed: the engine restarted every node container and
    a fault was never recovered. Reusing the lab waits for the API server, clears the fault
    and restarts NVIDIA's plugin (it never re-adds a device it marked Unhealthy)."""
    seed.use_subject("nvidia")
    seed.fake_gpus(FIRST).inject_xid(0, 79)
    seed.wait_allocatable(FIRST, N - 1, N, deadline_s=60)
    for node in kind_nodes("seed"):
        node.restart(timeout=0)

    again, log = reuse("seed")
    assert "✓ seed: Clear faults left from an earlier run (and GPUs the spec changed)" in log
    assert "recreating it" not in log
    for worker in WORKERS:
        assert again.capacity(worker) == (N, N)
    assert again.fake_gpus(FIRST).faulted() == set()


def test_a_lab_that_never_answers_is_made_again(seed: Lab) -> None:
    """A reused cluster whose API server does not answer in time (here: its control plane
    paused) is deleted and created again, and the new one is reached on its new port."""
    control_plane = next(n for n in kind_nodes("seed") if n.name == CONTROL_PLANE)
    control_plane.pause()
    again, log = reuse("seed", health_deadline_s=5)
    assert "seed does not recover" in log and "recreating it" in log
    for worker in WORKERS:
        assert again.capacity(worker) == (N, N)


def test_a_cluster_without_its_kubeconfig_is_made_again(
    seed: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed inside `kind create` (or `kind delete`) leaves kind's nodes and no
    kubeconfig: the lab cannot reach them and kind refuses the name, so the next up deletes
    them first (the decision only, as below: the kubeconfig is put back)."""
    kubeconfig = seed.host.kubeconfig
    aside = kubeconfig.with_name("kubeconfig.aside")
    kubeconfig.rename(aside)
    try:
        said, downs = decide(monkeypatch)
    finally:
        aside.rename(kubeconfig)
    assert "seed: kind has the cluster but the lab has no kubeconfig" in said
    assert downs == ["seed"]


def test_a_lab_whose_fake_gpu_state_is_unreadable_is_made_again(
    seed: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """State written by another gpulab version (or damaged): the nodes' libraries and
    plugins would refuse it, so the lab is recreated, not reused. The recreation itself is
    the one the test above watches come back; here only the decision (the last seed test:
    its state is put back afterwards)."""
    state = seed.fake_gpus(FIRST).path / "state.bin"
    good = state.read_bytes()
    state.write_bytes(b"\0" * 64)
    try:
        said, downs = decide(monkeypatch)
    finally:
        state.write_bytes(good)  # the lab stays whole for whoever reuses it
    assert f"seed: fake GPU state of {FIRST}:" in said
    assert "recreating it" in said and downs == ["seed"]


def decide(monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[str]]:
    """What a new run's up decides about the seed cluster there is: what it says, and the
    labs it would delete (not deleted: the test's hand takes the delete)."""
    out = io.StringIO()
    lab = Lab("seed", subject="nvidia", console=Console(file=out, width=200))
    downs: list[str] = []
    monkeypatch.setattr(lab.ctx, "delete", lambda: downs.append(lab.name))
    actions.reuse_or_recreate(lab.ctx)
    return out.getvalue(), downs


def kind_nodes(cluster: str) -> list[Container]:
    nodes = docker.from_env().containers.list(filters={"label": f"io.x-k8s.kind.cluster={cluster}"})
    assert len(nodes) == len(SEED.nodes)
    return nodes


def reuse(name: str, health_deadline_s: float = 120) -> tuple[Lab, str]:
    """Lab(name).up() as a new run would do it; the lab and what it printed."""
    out = io.StringIO()
    lab = Lab(name, subject="nvidia", console=Console(file=out, width=200))
    lab.health_deadline_s = health_deadline_s
    return bring_up(lab), out.getvalue()


@pytest.mark.parametrize("retain", [False, True], ids=["deleted", "kept-with-KEEP"])
def test_a_failed_up_deletes_the_cluster_it_created_unless_retained(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    retain: bool,
) -> None:
    """kind's Retain rule: an action failing after `kind create` (here the first one, the
    image load, refused by the test's hand) leaves no half-made cluster behind, unless
    KEEP=1 asks to keep it."""
    path = tmp_path / "failup.yaml"
    path.write_text(
        "name: failup\nnodes:\n  - role: control-plane\n"
        "    gpus: [{profile: H100-SXM5-80GB, count: 2}]\n"
    )
    lab = Lab(path, subject="gpulab", retain=retain)

    def refuse(images: list[str], nodes: list[str]) -> None:
        raise StepError("image load refused by the test")

    monkeypatch.setattr(lab.host, "load", refuse)
    try:
        with pytest.raises(StepError, match="image load refused by the test"):
            lab.up()
        err = capsys.readouterr().err
        assert "✗ failup: Load images into the nodes" in err
        assert lab.exists() is retain
        assert ("deleting the half-made cluster failup" in err) is not retain
    finally:
        if lab.exists():
            lab.down()
