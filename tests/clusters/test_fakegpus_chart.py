"""gpulab's fake-gpus Helm chart (clusters/charts/fake-gpus), rendered by the helm `make
infra` built: lint, what a lab's values make of it, the plugin choice, and values it must
refuse with one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rich.console import Console

from clusters import built, versions
from clusters.charts import chart
from clusters.labs import fakegpus, spec
from clusters.labs.context import Context
from clusters.subjects import subject
from fakenvml import inventory
from fakenvml.errors import FakeNvmlError

IMAGE = "gpulab/gpulab:abc123"
T4 = {"gpus": [{"profile": "T4"}]}


def render(values: dict, release: str = "fake-gpus", namespace: str = "gpu") -> list[dict]:
    text = chart.template(built.helm(), fakegpus.CHART, release, namespace, values,
                          versions.kube_version())  # fmt: skip
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_helm_lint_strict_passes() -> None:
    out = chart.run(built.helm(), ["lint", "--strict", str(fakegpus.CHART)])
    assert "0 chart(s) failed" in out


def test_default_values_one_pool_a_gpulab_plugin_and_a_test_pod() -> None:
    docs = render({})
    ds = by_kind(docs, "DaemonSet")
    assert set(ds) == {"fakenvml-default", "gpulab-device-plugin"}
    pod = ds["fakenvml-default"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpulab.dev/fake-gpus": "true"}
    assert pod["containers"][0]["securityContext"] == {"privileged": True}  # mknod /dev/nvidia*
    # The GPUs' device nodes in the node's own /dev too (values: nodeDevices).
    assert "--dev /host-dev" in pod["containers"][0]["args"][0]
    assert {"name": "dev", "hostPath": {"path": "/dev", "type": "Directory"}} in pod["volumes"]
    off = by_kind(render({"nodeDevices": False}), "DaemonSet")["fakenvml-default"]
    assert "--dev" not in off["spec"]["template"]["spec"]["containers"][0]["args"][0]
    tests = [d for d in docs if d["kind"] == "Pod"]
    assert [t["metadata"]["annotations"]["helm.sh/hook"] for t in tests] == ["test"]
    env = {e["name"]: e.get("value") for e in tests[0]["spec"]["containers"][0]["env"]}
    assert env["EXPECT_GPUS"] == "8" and env["EXPECT_ALLOCATION"] == "true"
    assert tests[0]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert all(d["metadata"].get("namespace") == "gpu" for d in docs)


def test_no_container_runs_an_exec_probe_for_its_whole_life() -> None:
    """Exec probes only until started: a periodic one is a runc exec on every GPU node each
    period for as long as the pod lives (two a second cost a node ~7 % of a core)."""
    nvidia = {"kind": "nvidia", "image": {"repository": "nvidia/k8s-device-plugin", "tag": "v"}}
    for values in ({}, {"plugin": nvidia}):
        for ds in by_kind(render(values), "DaemonSet").values():
            for c in ds["spec"]["template"]["spec"]["containers"]:
                for probe in ("readinessProbe", "livenessProbe"):
                    assert "exec" not in c.get(probe, {}), (ds["metadata"]["name"], c["name"])
    fakenvml = by_kind(render({}), "DaemonSet")["fakenvml-default"]["spec"]["template"]["spec"]
    started = {c["name"]: c["startupProbe"]["exec"]["command"] for c in fakenvml["containers"]}
    assert started == {"fakenvml": ["test", "-e", "/tmp/driver-installed"],
                       "persistenced": ["test", "-e", "/tmp/listening"]}  # fmt: skip


def test_a_labs_values_give_each_gpu_node_its_own_pool_and_inventory() -> None:
    lab = spec.load("hetero")
    docs = render(fakegpus.lab_values(lab, IMAGE), namespace=fakegpus.NAMESPACE)
    ds = by_kind(docs, "DaemonSet")
    assert set(ds) == {f"fakenvml-{n.name}" for n in lab.gpu_nodes}  # plugin: the subject's
    inventories = by_kind(docs, "ConfigMap")["fakenvml-inventories"]["data"]
    for n in lab.gpu_nodes:
        pod = ds[f"fakenvml-{n.name}"]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": n.name}
        assert pod["containers"][0]["image"] == IMAGE
        # What the DaemonSet writes on the node is the lab spec's GPUs, driver and all.
        got = inventory.from_dict(yaml.safe_load(inventories[f"{n.name}.yaml"]), n.name)
        assert got == n.gpu_node
    tests = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pod"}
    counts = {k: next(e["value"] for e in t["spec"]["containers"][0]["env"]
                      if e["name"] == "EXPECT_GPUS") for k, t in tests.items()}  # fmt: skip
    assert counts == {f"fake-gpus-test-{n.name}": str(n.gpu_count) for n in lab.gpu_nodes}


def test_a_changed_inventory_changes_the_pod_template() -> None:
    """Helm rolls the pool's pods only when its inventory changes (checksum annotation)."""

    def checksum(count: int) -> str:
        inv = {"gpus": [{"profile": "T4", "count": count}]}
        values = {"pools": [{"name": "a", "nodeSelector": {"pool": "a"}, "inventory": inv}]}
        ds = by_kind(render(values), "DaemonSet")["fakenvml-a"]
        return ds["spec"]["template"]["metadata"]["annotations"]["checksum/inventory"]

    assert checksum(2) == checksum(2) != checksum(3)


def test_the_plugin_follows_every_pool() -> None:
    values = {"pools": [
        {"name": "a", "nodeSelector": {"pool": "a"}, "inventory": T4},
        {"name": "b", "nodeSelector": {"pool": "b", "zone": "z"}, "inventory": T4},
    ]}  # fmt: skip
    plugin = by_kind(render(values), "DaemonSet")["gpulab-device-plugin"]["spec"]["template"]
    terms = plugin["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
    assert terms == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]},
                              {"key": "zone", "operator": "In", "values": ["z"]}]},
    ]  # fmt: skip


def test_nvidias_plugin_gets_the_settings_a_fake_driver_root_needs() -> None:
    values = {"plugin": {"kind": "nvidia", "image": {"repository": "n/dp", "tag": "v1"},
                         "env": {"MIG_STRATEGY": "mixed"}}}  # fmt: skip
    ds = by_kind(render(values), "DaemonSet")
    assert "gpulab-device-plugin" not in ds
    c = ds["nvidia-device-plugin"]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "n/dp:v1"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "envvar" and env["PASS_DEVICE_SPECS"] == "false"
    assert env["MIG_STRATEGY"] == "mixed"  # plugin.env overrides the defaults
    assert env["FAKENVML_STATE_DIR"] == "/var/lib/fakenvml"


def test_no_plugin_and_no_pools_render_nothing_but_what_is_asked() -> None:
    assert render({"pools": [], "plugin": {"kind": "none"}}) == []


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"plugin": {"kind": "amd"}}, "kind"),
        ({"plugin": {"kind": "nvidia"}}, "plugin.image.repository"),
        ({"pools": [{"name": "Bad_Pool", "nodeSelector": {"a": "b"}, "inventory": T4}]}, "name"),
        ({"pools": [{"name": "a", "nodeSelector": {"a": "b"}, "inventory": {}}]}, "gpus"),
        ({"pools": [{"name": "a", "nodeSelector": {}, "inventory": T4}]}, "nodeSelector"),
        ({"pools": [{"name": "a", "nodeSelector": {"a": True}, "inventory": T4}]}, "want string"),
        ({"stateDir": "relative/dir"}, "stateDir"),
        ({"pool": []}, "pool"),  # a misspelt key
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_key(values: dict, says: str) -> None:
    with pytest.raises(chart.ChartError) as e:
        render(values)
    assert "\n" not in str(e.value)
    assert says in str(e.value)


@pytest.mark.parametrize("name", ["gpulab", "gpulab-mig", "nvidia", "nvidia-v0.17.4"])
def test_the_main_subjects_render_their_plugin_from_the_chart(name: str) -> None:
    s = subject.load(name)
    docs = s.render({"GPULAB_IMAGE": IMAGE, "SUBJECT_IMAGE": "gpulab/subject:v1"})
    assert "${" not in yaml.safe_dump_all(docs)
    assert [d["kind"] for d in docs] == ["DaemonSet"]  # no pools: the lab's release has them
    pod = docs[0]["spec"]["template"]["spec"]
    assert (s.namespace, pod["nodeSelector"]) == ("kube-system", {"gpulab.dev/plugin": "true"})
    if pod["containers"][0]["name"] == "gpulab-device-plugin":  # it waits for the library
        assert "initContainers" not in pod
        assert pod["containers"][0]["args"][-2:] == ["--wait-for-nvml", "120"]
    else:
        assert pod["initContainers"][0]["image"] == IMAGE  # waits for fakenvml's library
    assert pod["containers"][0]["image"] == "gpulab/subject:v1"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["MIG_STRATEGY" if s.expects.mig != "none" else "FAKENVML_STATE_DIR"] == (
        s.expects.mig if s.expects.mig != "none" else "/var/lib/fakenvml"
    )


def test_a_nodes_inventory_can_stand_in_for_its_specs() -> None:
    """deploy(ctx, {node: inventory}): that node's pool writes the wider inventory, the
    others keep the spec's (e2e/test_dra_width.py's wide nodes)."""
    lab = spec.load("hetero")
    first, *rest = lab.gpu_nodes
    wide = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 16}]}
    values = fakegpus.lab_values(lab, IMAGE, {first.name: wide})
    pools = {p["name"]: p["inventory"] for p in values["pools"]}
    assert pools == {first.name: wide, **{n.name: n.inventory for n in rest}}


@pytest.mark.parametrize(("inventories", "error"), [
    ({"hetero-worker9": {"gpus": [{"profile": "T4"}]}}, "lab hetero has no GPU node hetero-w"),
    ({"hetero-worker": {"gpus": [{"profile": "no-such-board"}]}}, "no-such-board"),
])  # fmt: skip
def test_a_bad_stand_in_inventory_is_refused_before_the_cluster_is_touched(
    inventories: dict, error: str
) -> None:
    class Untouchable:
        def __getattr__(self, name: str) -> None:
            raise AssertionError(f"the cluster was touched: {name}")

    ctx = Context(spec.load("hetero"), Path("/nonexistent"), Console(), Untouchable(),  # type: ignore[arg-type]
                  Untouchable())  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises((ValueError, FakeNvmlError), match=error):
        fakegpus.deploy(ctx, inventories)
