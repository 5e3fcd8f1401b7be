"""Lab specs validate into labs, and labs render into kind configs."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml

from clusters import built, versions
from clusters.labs import actions, capacity, kindconfig, spec
from clusters.labs.lab import Lab
from clusters.labs.serving import NoPlugin
from clusters.steps import StepError


@pytest.mark.parametrize("name", ["seed", "hetero"])
def test_shipped_labs_load(name: str) -> None:
    """Each GPU node has the GPUs its file gives it (each entry's count, 1 unsaid)."""
    lab = spec.load(name)
    assert lab.source is not None
    nodes = yaml.safe_load(lab.source.read_text())["nodes"]
    written = [sum(g.get("count", 1) for g in n["gpus"]) for n in nodes if n.get("gpus")]
    assert [n.gpu_count for n in lab.gpu_nodes] == written


def test_kind_names_follow_role_and_order() -> None:
    # hetero's shape, in a spec of the test's own: the rule, whatever the shipped lab holds.
    profiles = ("A100-SXM4-80GB", "H100-SXM5-80GB", "T4")
    lab = spec.from_dict({"name": "hetero", "nodes": [CP, *({"gpus": [{"profile": p}]}
                                                             for p in profiles)]})  # fmt: skip
    assert [n.name for n in lab.nodes] == [
        "hetero-control-plane", "hetero-worker", "hetero-worker2", "hetero-worker3",
    ]  # fmt: skip
    assert [n.gpu_product for n in lab.gpu_nodes] == [
        "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-T4",
    ]  # fmt: skip


def test_gpu_nodes_get_state_mounts_labels_and_fast_status_updates() -> None:
    # The seed lab as it was written when this config was: a spec of the test's own.
    worker = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 10}],
              "extra_resources": {"example.com/rdma": 10}}  # fmt: skip
    lab = spec.from_dict({"name": "seed", "nodes": [CP, worker, worker]})
    cfg = kindconfig.render(lab, "node:img", Path("/labs"), "/cache/toolkit")
    cp, w1, w2 = cfg["nodes"]
    assert cp == {"role": "control-plane", "image": "node:img"}
    # The driver root on a mount of its own (kind's /run is noexec); the state a second
    # time inside it, for plugins that mount only that (a chart's).
    assert w1["extraMounts"] == [
        {"hostPath": "/labs/seed/seed-worker.driver", "containerPath": "/run/fakenvml/driver"},
        {"hostPath": "/labs/seed/seed-worker", "containerPath": "/var/lib/fakenvml"},
        {"hostPath": "/labs/seed/seed-worker",
         "containerPath": "/run/fakenvml/driver/var/lib/fakenvml"},
        # The fake GPUs' PCI sysfs where NFD reads the node's (the node's own namespace).
        {"hostPath": "/labs/seed/seed-worker.driver/sys/bus/pci/devices",
         "containerPath": "/sys/bus/pci/devices"},
        # The NVIDIA Container Toolkit where the GPU Operator installs it, and the configs
        # `nvidia-ctk runtime configure` wrote for the lab (containerd starts with them).
        {"hostPath": "/cache/toolkit", "containerPath": "/usr/local/nvidia/toolkit",
         "readOnly": True},
        {"hostPath": "/labs/seed/toolkit/config.toml",
         "containerPath": "/etc/containerd/config.toml", "readOnly": True},
        {"hostPath": "/labs/seed/toolkit/99-nvidia.toml",
         "containerPath": "/etc/containerd/conf.d/99-nvidia.toml", "readOnly": True},
        {"hostPath": "/labs/seed/toolkit/runtime.toml",
         "containerPath": "/etc/nvidia-container-runtime/config.toml", "readOnly": True},
    ]  # fmt: skip
    # GPU product/count labels are GFD's (clusters/labs/features.py), not the kind config's.
    assert w2["labels"] == {"gpulab.dev/fake-gpus": "true", "gpulab.dev/plugin": "true"}
    assert w2["labels"]["gpulab.dev/plugin"] == "true"
    assert "nodeStatusUpdateFrequency: 1s" in cfg["kubeadmConfigPatches"][0]


def test_a_lab_without_the_toolkit_gets_none_of_its_mounts_and_one_with_needs_its_dir() -> None:
    data = {"name": "x", "nodes": [{"role": "control-plane", "gpus": [{"profile": "T4"}]}]}
    plain = kindconfig.render(spec.from_dict({**data, "container_toolkit": False}), "i", Path("/l"))
    paths = [m["containerPath"] for m in plain["nodes"][0]["extraMounts"]]
    assert not [p for p in paths if "nvidia-container" in p or p.startswith("/etc/containerd")]
    with pytest.raises(ValueError, match="NVIDIA Container Toolkit"):
        kindconfig.render(spec.from_dict(data), "i", Path("/l"))


def test_status_update_frequency_reaches_kubelet_in_go_duration_text() -> None:
    lab = spec.from_dict({"name": "x", "node_status_update_frequency": "1.5s",
                          "nodes": [{"role": "control-plane"}]})  # fmt: skip
    assert lab.spec.node_status_update_frequency == 1.5
    cfg = kindconfig.render(lab, "i", Path("/l"))
    assert "nodeStatusUpdateFrequency: 1500ms\n" in cfg["kubeadmConfigPatches"][0]


@pytest.mark.parametrize(
    ("kube", "v1_host", "fails_on_v1"),
    [("v1.37.0", True, False), ("v1.35.4", True, False), ("v1.34.0", True, None),
     ("v1.37.0", False, None)],
)  # fmt: skip
def test_kubelets_from_1_35_on_a_cgroup_v1_host_are_told_not_to_refuse_it(
    monkeypatch: pytest.MonkeyPatch, kube: str, v1_host: bool, fails_on_v1: bool | None
) -> None:
    """kubelet 1.35+ exits on cgroup v1 unless failCgroupV1: false; older ones do not know
    the setting, and cgroup v2 hosts need none."""
    monkeypatch.setattr(kindconfig, "cgroup_v1", lambda: v1_host)
    lab = spec.from_dict({"name": "x", "kubernetes": kube, "nodes": [CP]})
    patch = yaml.safe_load(kindconfig.render(lab, "i", Path("/l"))["kubeadmConfigPatches"][0])
    assert patch.get("failCgroupV1") is fails_on_v1


def test_a_lab_runs_its_spec_version_else_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULAB_KUBE_VERSION", raising=False)
    newest = versions.kube_versions()[0]
    assert spec.load("seed").kubernetes == newest == versions.kube_version()
    monkeypatch.setenv("GPULAB_KUBE_VERSION", "v1.36.1")
    assert spec.load("seed").kubernetes == "v1.36.1"
    assert versions.kube_versions() == ("v1.36.1", *versions.listed("KUBE_VERSIONS"))
    pinned = spec.from_dict({"name": "x", "kubernetes": "v1.35.4", "nodes": [CP]})
    assert pinned.kubernetes == "v1.35.4"


def test_workers_run_an_older_kubelet_within_the_skew_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KUBELET=v1.34.0: the control plane keeps its image, every worker gets the worker
    image (the same Kubernetes with that kubelet), and the lab says both versions."""
    monkeypatch.setenv("GPULAB_KUBELET_VERSION", "v1.34.0")
    lab = spec.from_dict({"name": "x", "kubernetes": "v1.37.0", "nodes": [
        CP, {"gpus": [{"profile": "T4", "count": 1}]}, {"role": "worker"}]})  # fmt: skip
    assert (lab.kubernetes, lab.kubelet) == ("v1.37.0", "v1.34.0")
    assert lab.versions_text == "v1.37.0 (kubelet v1.34.0)"
    cfg = kindconfig.render(lab, "cp:img", Path("/l"), "/tk", worker_image="w:img")
    assert [n["image"] for n in cfg["nodes"]] == ["cp:img", "w:img", "w:img"]
    assert versions.node_image_key("v1.37.0", "v1.34.0") == "v1.37.0+kubelet-v1.34.0"
    assert versions.node_image_key("v1.37.0", "v1.37.0") == "v1.37.0"
    monkeypatch.delenv("GPULAB_KUBELET_VERSION")
    assert (lab.kubelet, lab.versions_text) == ("v1.37.0", "v1.37.0")


def test_a_lab_spec_pins_its_kubelet_over_the_runs_and_on_a_gpu_control_plane(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kubelet: v1.34.0` in a spec wins over KUBELET=...; a control plane holding the GPUs
    gets the older kubelet too (its device plugins meet it there), one without stays."""
    monkeypatch.setenv("GPULAB_KUBELET_VERSION", "v1.35.4")
    lab = spec.from_dict({"name": "x", "kubernetes": "v1.37.0", "kubelet": "v1.34.0", "nodes": [
        {**CP, "gpus": [{"profile": "T4", "count": 1}]}]})  # fmt: skip
    assert (lab.kubelet, lab.versions_text) == ("v1.34.0", "v1.37.0 (kubelet v1.34.0)")
    cfg = kindconfig.render(lab, "cp:img", Path("/l"), "/tk", worker_image="w:img")
    assert [n["image"] for n in cfg["nodes"]] == ["w:img"]
    with pytest.raises(spec.SpecError, match=r"'1.34': expected a Kubernetes version"):
        spec.from_dict({"name": "x", "kubelet": "1.34", "nodes": [CP]})


def test_every_kubelet_a_shipped_lab_pins_is_one_make_infra_builds() -> None:
    """A lab's `kubelet` names a worker image `make infra` builds (KUBELET_VERSIONS): a
    pin bumped there without the labs fails here, not at a lab's bring-up."""
    pinned = {lab.name: lab.spec.kubelet for lab in spec.shipped() if lab.spec.kubelet}
    assert pinned, "no shipped lab pins its kubelet (the platform labs do: docs/labs.md)"
    assert set(pinned.values()) <= set(versions.listed("KUBELET_VERSIONS")), pinned


@pytest.mark.parametrize("kubelet", ["v1.33.0", "v1.38.0"])
def test_a_kubelet_the_skew_policy_refuses_is_one_line(
    monkeypatch: pytest.MonkeyPatch, kubelet: str
) -> None:
    """Four minors older, or newer than the API server: refused, naming the policy."""
    monkeypatch.setenv("GPULAB_KUBELET_VERSION", kubelet)
    lab = spec.from_dict({"name": "x", "kubernetes": "v1.37.0", "nodes": [CP]})
    with pytest.raises(
        ValueError,
        match=rf"^kubelet {kubelet} beside a v1.37.0 control "
        r"plane: the version-skew policy allows a kubelet 0 to 3 minors older",
    ):
        _ = lab.kubelet


def test_the_pinned_older_kubelets_are_within_the_policy_beside_the_newest() -> None:
    """What `make infra` builds worker images of must be usable beside the newest pin."""
    newest = versions.listed("KUBE_VERSIONS")[0]
    for kubelet in versions.listed("KUBELET_VERSIONS"):
        assert 0 < versions.kube_minor(newest) - versions.kube_minor(kubelet) <= 3, kubelet


def test_plugin_start_false_leaves_the_plugin_label_off() -> None:
    lab = spec.from_dict({"name": "x", "nodes": [
        {"role": "control-plane"},
        {"gpus": [{"profile": "T4", "count": 1}], "plugin": {"start": False}},
    ]})  # fmt: skip
    labels = kindconfig.render(lab, "i", Path("/l"), "/tk")["nodes"][1]["labels"]
    assert "gpulab.dev/plugin" not in labels and labels["gpulab.dev/fake-gpus"] == "true"


CP = {"role": "control-plane"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodes": [{"role": "control-plane"}]}, "name: required key missing"),
        ({"name": "Bad_Name", "nodes": [{"role": "control-plane"}]}, "name: 'Bad_Name'"),
        ({"name": "x", "nodes": [{"role": "worker"}]}, "exactly one control-plane"),
        ({"name": "x", "kubernetes": "1.20", "nodes": [{"role": "control-plane"}]}, "v1.33.x"),
        ({"name": "x", "nodes": [{"role": "control-plane", "gpus": [{"profile": "H900"}]}]},
         "GPU inventory: "),
        ({"name": "x", "nodes": [{"role": "control-plane", "colour": "red"}]},
         "nodes[0].colour: unknown key (expected one of: role, gpus, "),
        ({"name": "x", "node_status_update_frequency": "soon", "nodes": [CP]},
         "node_status_update_frequency: 'soon': expected a duration such as 500ms"),
        ({"name": "x", "node_status_update_frequency": 0, "nodes": [CP]},
         "node_status_update_frequency: expected a number > 0, found 0"),
        ({"name": "x", "nodes": [CP, {"fleet": {"copies": 2}}]},
         "nodes[1].fleet: copies of a node without gpus: only a GPU node has a fleet"),
        ({"name": "x", "nodes": [CP, {"gpus": [{"profile": "T4"}], "fleet": {"copies": 2,
                                                                              "live": 1}}]},
         "nodes[1].fleet.live: a live copy runs NVIDIA's DRA driver: a dra: lab's"),
        ({"name": "x", "dra": {}, "nodes": [CP, {"gpus": [{"profile": "T4"}],
                                                 "fleet": {"copies": 2, "live": 3}}]},
         "nodes[1].fleet: live: 3, more than its 2 copies"),
        ({"name": "x", "nodes": [CP, {"gpus": [{"profile": "T4"}], "fleet": {"copies": 0}}]},
         "nodes[1].fleet.copies: expected a number >= 1, found 0"),
    ],
)  # fmt: skip
def test_bad_specs_are_refused_with_one_line(data: dict, message: str) -> None:
    with pytest.raises(spec.SpecError) as e:
        spec.from_dict(data)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_fleet_is_read_from_its_spec_by_node_name() -> None:
    """A GPU node's `fleet:` is that node's copies: the lab's fleet by kind's node name."""
    lab = spec.from_dict({"name": "f", "dra": {}, "nodes": [
        CP, {"gpus": [{"profile": "T4"}]}, {"gpus": [{"profile": "T4"}],
                                            "fleet": {"copies": 5, "live": 2}}]})  # fmt: skip
    assert {n: (f.copies, f.live) for n, f in lab.fleet.items()} == {"f-worker2": (5, 2)}
    assert spec.from_dict({"name": "g", "nodes": [CP]}).fleet == {}


def test_a_lab_comes_up_with_its_fleet_last_and_the_suites_labs_without(tmp_path: Path) -> None:
    """`gpulab lab up` makes the fleet its spec declares once its GPUs are served; the
    suites' labs (e2e/fixtures.py bring_up) leave it to the fleet suite."""
    path = tmp_path / "fl.yaml"
    path.write_text("name: fl\ndra: {}\nnodes:\n  - role: control-plane\n"
                    "  - {gpus: [{profile: T4}], fleet: {copies: 4}}\n"
                    "  - {gpus: [{profile: T4}], fleet: {copies: 2, live: 1}}\n")  # fmt: skip
    lab = Lab(path)
    titles = [a.title for a in lab.actions()]
    assert titles[-1] == "Make its fleet: KWOK copies, 4 of fl-worker, 2 of fl-worker2 (1 live)"
    assert [a.title for a in lab.actions(with_fleet=False)] == titles[:-1]


def test_unknown_lab_names_the_known_ones() -> None:
    shipped = ", ".join(sorted(p.stem for p in spec.LABS_DIR.glob("*.yaml")))
    with pytest.raises(spec.SpecError, match=rf"no lab 'nope' \(shipped: {shipped}\)"):
        spec.load("nope")


def test_a_lab_made_with_another_kind_config_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kind cannot add a mount to a running node: a lab made before a config change (the
    driver root's state mount) is made again, one made with this config is reused."""
    monkeypatch.setattr(
        built,
        "require",
        lambda images=(), kube=None, kubelet=None: built.Products(
            node_images={versions.kube_version(): "node:img"}, toolkit="/tk"
        ),
    )
    lab = Lab("seed", subject="gpulab")
    lab.ctx.labs_root, lab.host.dir = tmp_path, tmp_path / "seed"
    assert actions.changed_config(lab.ctx) == "its kind config was not recorded"
    cfg = kindconfig.render(lab.lab, "node:img", tmp_path, "/tk")
    lab.host.dir.mkdir()
    (lab.host.dir / "kind.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert actions.changed_config(lab.ctx) == ""
    for n in cfg["nodes"]:  # as labs were made before the second mount
        if "extraMounts" in n:
            n["extraMounts"] = n["extraMounts"][:1]
    (lab.host.dir / "kind.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert actions.changed_config(lab.ctx) == "its kind config differs from this checkout's"


def test_a_lab_with_subject_none_brings_up_fake_gpus_and_no_plugin(tmp_path: Path) -> None:
    path = tmp_path / "bare.yaml"
    path.write_text("name: bare\nsubject: none\nnodes:\n  - role: control-plane\n"
                    "  - gpus: [{profile: T4, count: 2}]\n")  # fmt: skip
    lab = Lab(path)
    assert not lab.serves_plugin and lab.serves == "no plugin (subject: none)"
    assert isinstance(lab.serving, NoPlugin)
    titles = [a.title for a in lab.actions()]
    assert not any("Deploy {subject}" in t or "capacity" in t for t in titles)
    with pytest.raises(ValueError, match="lab bare runs no plugin under test"):
        lab.subject  # noqa: B018


def test_a_wait_for_allocatable_stops_at_once_when_capacity_exceeds_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fault adds a device: capacity 11 on a 10-GPU node (a plugin that advertised an
    id it could not read) fails the wait now, not at its deadline."""
    path = tmp_path / "l.yaml"
    path.write_text("name: l\nnodes:\n  - role: control-plane\n"
                    "  - gpus: [{profile: T4, count: 10}]\n")  # fmt: skip
    lab = Lab(path)
    seen = iter([{"l-worker": (10, 10)}, {"l-worker": (11, 9)}])

    def fake_wait(ctx, what, names, check, deadline_s, resource):  # type: ignore[no-untyped-def]
        while not check(next(seen)):
            pass
        return 0

    monkeypatch.setattr(capacity, "wait_nodes", fake_wait)
    with pytest.raises(StepError, match=r"capacity 11, more devices than the node has \(10\)"):
        lab.wait_allocatable("l-worker", 9, 10)


def test_what_a_lab_is_given_reaches_the_context_its_actions_read() -> None:
    """The Lab hands its actions a Context: a setting made on the Lab must reach it (a reuse
    with a 5 s health deadline waited the default 120 s when it did not)."""
    lab = Lab("seed", subject="gpulab")
    lab.health_deadline_s = 5
    lab.images = {"gpulab": "gpulab/gpulab:1"}
    assert (lab.ctx.health_deadline_s, lab.ctx.images) == (5, {"gpulab": "gpulab/gpulab:1"})


def test_a_reused_clusters_gpus_follow_a_spec_edited_since(tmp_path: Path) -> None:
    """A GPU count edited in a lab's YAML reaches the nodes of the cluster it reuses: the
    state is rewritten from the spec and only those nodes are named (what serves the GPUs
    then forgets them); a second look finds nothing to change."""
    from types import SimpleNamespace

    from clusters.labs.serving import respec
    from fakenvml.node import NodeDir

    seed = spec.load("seed")
    assert seed.source is not None
    doc = yaml.safe_load(seed.source.read_text())
    doc["nodes"][1]["gpus"][0]["count"] = 9  # the first GPU worker only
    edited = tmp_path / "seed.yaml"
    edited.write_text(yaml.safe_dump(doc))
    nine = spec.load(edited)
    ctx = SimpleNamespace(lab=nine, fake_gpus=lambda node: NodeDir(tmp_path / node))
    for n in seed.gpu_nodes:  # the cluster as the 10-GPU spec made it
        NodeDir(tmp_path / n.name).init(n.gpu_node)
    first, second = (n.name for n in nine.gpu_nodes)
    assert respec(ctx) == [first]  # type: ignore[arg-type]
    assert len(NodeDir(tmp_path / first).node().gpus) == 9
    assert len(NodeDir(tmp_path / second).node().gpus) == 10
    assert respec(ctx) == []  # type: ignore[arg-type]


def test_control_plane_args_reach_kubeadm_over_kinds_own() -> None:
    lab = spec.from_dict({"name": "x", "nodes": [CP], "control_plane_args": {
        "scheduler": {"kube-api-qps": "1000", "leader-elect": "true"},
        "api_server": {"max-requests-inflight": "800"}}})  # fmt: skip
    patch = yaml.safe_load(kindconfig.render(lab, "i", Path("/l"))["kubeadmConfigPatches"][1])

    def args(part: str) -> dict[str, str]:
        return {a["name"]: a["value"] for a in patch[part]["extraArgs"]}

    assert args("scheduler") == {"leader-elect": "true", "kube-api-qps": "1000"}
    assert args("controllerManager") == {"enable-hostpath-provisioner": "true",
                                         "leader-elect": "false"}  # fmt: skip
    assert args("apiServer") == {"max-requests-inflight": "800"}
    plain = spec.from_dict({"name": "x", "nodes": [CP]})
    assert "apiServer" not in yaml.safe_load(
        kindconfig.render(plain, "i", Path("/l"))["kubeadmConfigPatches"][1])  # fmt: skip


@pytest.mark.parametrize("args", [{"scheduler": {"--kube-api-qps": "9"}},
                                  {"kubelet": {"v": "4"}}])  # fmt: skip
def test_bad_control_plane_args_are_one_line(args: dict) -> None:
    with pytest.raises(spec.SpecError) as e:
        spec.from_dict({"name": "x", "nodes": [CP], "control_plane_args": args})
    assert "control_plane_args" in str(e.value) and "\n" not in str(e.value)


def test_a_longer_fleet_lease_lengthens_the_controller_managers_grace_alone() -> None:
    def manager(data: dict) -> dict[str, str]:
        lab = spec.from_dict({"name": "x", "nodes": [CP], **data})
        patch = yaml.safe_load(kindconfig.render(lab, "i", Path("/l"))["kubeadmConfigPatches"][1])
        return {a["name"]: a["value"] for a in patch["controllerManager"]["extraArgs"]}

    # A kubelet's 40 s: kubeadm's default grace (50 s) stands, the config as before.
    assert "node-monitor-grace-period" not in manager({})
    assert "node-monitor-grace-period" not in manager({"fleet_node_lease": "40s"})
    assert manager({"fleet_node_lease": "4m"})["node-monitor-grace-period"] == "250s"
    # A lab's own flag wins, as with every other.
    mine = {"controller_manager": {"node-monitor-grace-period": "1h"}}
    assert manager({"fleet_node_lease": 240, "control_plane_args": mine})[
        "node-monitor-grace-period"] == "1h"  # fmt: skip


@pytest.mark.parametrize("lease", ["2s", "40.5s", "soon"])
def test_a_bad_fleet_lease_is_one_line(lease: str) -> None:
    with pytest.raises(spec.SpecError) as e:
        spec.from_dict({"name": "x", "nodes": [CP], "fleet_node_lease": lease})
    assert "fleet_node_lease" in str(e.value) and "\n" not in str(e.value)


def test_the_pod_network_gives_a_fleet_of_thousands_a_pod_cidr_each() -> None:
    lab = spec.from_dict({"name": "x", "nodes": [CP]})
    subnet = ipaddress.ip_network(
        kindconfig.render(lab, "i", Path("/l"))["networking"]["podSubnet"]
    )
    assert subnet.num_addresses // 256 >= 5000 + 16  # a /24 a node (kubeadm's IPv4 default)
    assert not subnet.overlaps(ipaddress.ip_network("10.96.0.0/16"))  # kind's Services
