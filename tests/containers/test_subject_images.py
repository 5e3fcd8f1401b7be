"""The container tier: each subject's image (shipped ones and examples/), run as its
DaemonSet would run it (entrypoint, env, hostPath mounts), against the kubelet stand-in
over a fakenvml node. It catches an image that is broken before any cluster starts."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from clusters import built
from clusters.infra import infra
from clusters.subjects import subject as subjects
from clusters.subjects.subject import Subject
from e2e import cdi
from fakenvml import mig
from fakenvml.mig import MigDevice
from fakenvml.model import Gpu
from fakenvml.node import NodeDir
from plugin.api.v1beta1 import api_pb2
from standin import Kubelet
from standin.container import ContainerTierError, SubjectContainer
from standin.kubelet import StandinError

# The shipped subjects, the examples (plugins gpulab did not write) and any other subject
# $GPULAB_SUBJECTS names (`GPULAB_SUBJECTS=path/to/subject.yaml pytest tests/containers`;
# `make infra SUBJECT=...` builds its image).
# Not those that serve only in a cluster (`cluster_only`): tests/conftest.py's header
# says which, and why.
SUBJECTS = subjects.tier_subjects(infra.subjects_tested())


def image_of(s: Subject) -> str:
    try:
        wanted = [s.spec.image.infra] if s.spec.image.infra else []
        return s.image_ref(built.require(wanted))
    except built.InfraMissing as e:
        pytest.fail(str(e), pytrace=False)


def cdi_ids(kind: str, response: object) -> list[str]:
    """The ids of the CDI devices of `kind` (vendor/class) an Allocate response names."""
    names = [d.name for d in response.cdi_devices]  # type: ignore[attr-defined]
    assert names and all(n.startswith(f"{kind}=") for n in names), names
    return [n.split("=", 1)[1] for n in names]


def shown_gpus(subject: Subject, response: object, gpus: list[Gpu],
               slices: Sequence[MigDevice] = ()) -> list[str]:  # fmt: skip
    """The GPUs (UUIDs; MIG devices' own) an Allocate response gives the container, as the
    subject's device_ids say it names them: its env var's ids, its CDI devices' names (the
    ids after `=`), or its device specs' container paths (/dev/nvidia<minor>; the control
    nodes are not GPUs). One that names no GPU stays as `<what> (no GPU)`."""
    ids = subject.spec.device_ids
    if ids.env is not None:
        shown = response.envs[ids.env].split(",")  # type: ignore[attr-defined]
        return [subject.gpu_of(i, gpus, slices) or f"{i} (no GPU)" for i in shown]
    if ids.cdi is not None:
        return [subject.gpu_of(i, gpus) or f"{i} (no GPU)" for i in cdi_ids(ids.cdi, response)]
    form = ids.nodes
    assert form is not None
    paths = [d.container_path for d in response.devices]  # type: ignore[attr-defined]
    assert paths, "Allocate returned no device specs"
    return [form.gpu_of(p, gpus) or f"{p} (no GPU)" for p in paths if form.parse(p)]


def naming(subject: Subject, kubelet: Kubelet, gpus: list[Gpu]) -> Callable[[str], str | None]:
    """How this tier names a device id as its GPU: the id itself says (subject.gpu_of), or,
    for opaque ids, the one device node an Allocate of that id alone answers with."""
    ids = subject.spec.device_ids
    if not ids.opaque:
        return lambda d: subject.gpu_of(d, gpus)
    form = ids.nodes
    assert form is not None  # opaque ids come with device specs
    learned: dict[str, str | None] = {}

    def name(d: str) -> str | None:
        if d not in learned:
            resp = kubelet.allocate(subject.spec.resource, [d])
            paths = [x.container_path for x in resp.devices if form.parse(x.container_path)]
            learned[d] = form.gpu_of(paths[0], gpus) if len(paths) == 1 else None
        return learned[d]

    return name


def faulted(kubelet: Kubelet, resource: str) -> frozenset[str]:
    res = kubelet.resources.get(resource)
    return res.unhealthy if res else frozenset()


def inject_until_faulted(
    kubelet: Kubelet, resource: str, inject: Callable[[], object]
) -> frozenset[str]:
    """The devices reported unhealthy after `inject()`, repeated until the plugin reports
    one: its health loop may not wait on NVML events yet (a fault before that is missed,
    as on hardware)."""
    deadline = time.monotonic() + 30
    while True:
        inject()
        try:
            return kubelet.wait_for(lambda: faulted(kubelet, resource),  # type: ignore[no-any-return]
                                    f"{resource} to report a faulted device",
                                    lambda: "none unhealthy", timeout=2)  # fmt: skip
        except StandinError:
            if time.monotonic() > deadline:
                raise


@pytest.mark.parametrize("subject", SUBJECTS, ids=lambda s: s.name)
def test_the_image_serves_the_nodes_gpus_and_marks_a_faulted_one(
    subject: Subject, kubelet: Kubelet, fake_node: Callable[..., NodeDir]
) -> None:
    """Every id is compared as the GPU it names (the subject's device_ids: env, CDI or
    device specs; {uuid}, {minor}, {index} or opaque ids)."""
    node = fake_node()
    gpus = node.node().gpus
    uuids = [g.uuid for g in gpus]
    resource = subject.spec.resource
    expects = subject.expects
    with SubjectContainer(subject, image_of(subject), kubelet.dir, node.path) as plugin:
        res = kubelet.wait_devices(resource, 8 * expects.replicas, timeout=30)
        assert subject.serves_on(res.endpoint), (res.endpoint, subject.spec.socket)
        gpu_of = naming(subject, kubelet, gpus)
        assert {gpu_of(d) for d in res.devices} == set(uuids), sorted(res.devices)
        got = kubelet.admit(resource, 2)
        if kind := subject.spec.device_ids.cdi:
            # Every GPU has a device in a spec the plugin wrote, named by its id, with its
            # device node; Allocate names devices of those specs.
            specs = cdi.device_nodes((f.read_text() for f in plugin.cdi_dir.glob("*")), kind)
            nodes = {subject.gpu_of(name, gpus): paths for name, paths in specs.items()}
            want = {g.uuid: [f"/dev/nvidia{g.minor if g.minor >= 0 else g.index}"] for g in gpus}
            assert {u: nodes.get(u) for u in want} == want, specs
            assert set(cdi_ids(kind, got.response)) <= set(specs)
        # Time-sliced ids are <uuid>::<k>; the container gets the GPUs behind them.
        behind = {gpu_of(d) for d in got.devices}
        assert sorted(shown_gpus(subject, got.response, gpus)) == sorted(behind)
        unhealthy = inject_until_faulted(kubelet, resource, lambda: node.inject_xid(3, 79))
        assert {gpu_of(d) for d in unhealthy} == {uuids[3]}
        assert len(unhealthy) == expects.out_per_faulted_gpu
        stated_lines_are_logged(subject, plugin, gpu_of, uuids[3])


def stated_lines_are_logged(subject: Subject, plugin: SubjectContainer,
                            gpu_of: Callable[[str], str], faulted: str) -> None:  # fmt: skip
    """Each line the subject's `logs:` states for what just happened is in the plugin's
    log, with the groups the experiments read: its registration (of its resource, where
    the line names one), the Xid it acted on (79, naming the faulted GPU) and its update
    marking that GPU Unhealthy. A line its plugin words otherwise would leave the
    experiments' columns empty without a word."""
    logs = subject.logs
    want = {k: p for k in ("registered", "xid", "unhealthy") if (p := logs.pattern(k))}

    def found(key: str, m: re.Match[str]) -> bool:
        if key == "registered":
            return m.groupdict().get("resource") in (None, subject.spec.resource)
        if key == "xid":
            # A time-sliced plugin names the replica (<uuid>::<k>): the experiments drop it.
            return int(m["xid"]) == 79 and m["dev"].split("::")[0] == faulted
        return gpu_of(m["dev"]) == faulted

    missing: list[str] = list(want)
    deadline = time.monotonic() + 10  # a line logged just after the update it reports
    while missing and time.monotonic() < deadline:
        lines = plugin.logs().splitlines()
        missing = [k for k, p in want.items()
                   if not any((m := p.search(line)) and found(k, m) for line in lines)]  # fmt: skip
        if missing:
            time.sleep(0.2)
    assert not missing, (f"{subject.name}: no line matches logs.{', logs.'.join(missing)} "
                         f"({subject.source}); its log:\n{plugin.logs()[-3000:]}")  # fmt: skip


@pytest.mark.needs("mig")
@pytest.mark.parametrize("subject", SUBJECTS, ids=lambda s: s.name)
def test_a_mig_image_serves_the_slices_and_marks_a_faulted_one(
    subject: Subject, kubelet: Kubelet, fake_node: Callable[..., NodeDir]
) -> None:
    """The MIG subjects' images (NVIDIA's privileged DaemonSet bind-mounts the driver
    root's proc/driver; ours reads NVML alone) on two H100s all-1g.10gb: 14 slices under
    the strategy's resource, MIG UUIDs in the env, and a fault: ours marks the slice an Xid
    names; NVIDIA's keeps one slice per GPU in its event map, so a whole-GPU Xid marks
    exactly one (docs/fakenvml.md, MIG)."""
    node = fake_node({"gpus": [{"profile": "H100-SXM5-80GB", "count": 2}]})
    for gpu in (0, 1):
        mig.configure(node, gpu, "all-1g.10gb")
    slices = mig.devices(node)
    gpus = node.node().gpus
    resource = "nvidia.com/gpu" if subject.expects.mig == "single" else "nvidia.com/mig-1g.10gb"
    with SubjectContainer(subject, image_of(subject), kubelet.dir, node.path):
        kubelet.wait_devices(resource, len(slices), timeout=30)
        got = kubelet.admit(resource, 2)
        shown = shown_gpus(subject, got.response, gpus, slices)
        assert sorted(shown) == sorted(subject.gpu_of(d, gpus, slices) for d in got.devices)
        assert set(shown) <= {d.uuid for d in slices}
        target = slices[9]  # on GPU 1
        slice_only = subject.expects.mig_slice_xid == "that-slice"
        where = (target.gi, target.ci) if slice_only else ()  # else the whole GPU
        unhealthy = inject_until_faulted(
            kubelet, resource, lambda: node.inject_xid(target.gpu, 79, *where)
        )
        named = {subject.gpu_of(d, gpus, slices) for d in unhealthy}
        if slice_only:
            assert named == {target.uuid}
        else:
            assert len(unhealthy) == 1 and named <= {d.uuid for d in slices if d.gpu == 1}


def test_an_image_that_exits_fails_at_once_with_its_log(
    tmp_path: Path, kubelet: Kubelet, fake_node: Callable[..., NodeDir]
) -> None:
    gpulab = subjects.load("gpulab")
    ds = gpulab.daemonset
    ds["spec"]["template"]["spec"]["containers"][0]["args"] = ["plugin.no_such_module"]
    (tmp_path / "ds.yaml").write_text(yaml.safe_dump(ds))
    data = {**gpulab.spec.model_dump(mode="json"), "name": "broken", "daemonset": "ds.yaml",
            "chart": None}  # fmt: skip
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(data))
    broken = subjects.load(tmp_path / "broken.yaml")

    c = SubjectContainer(broken, image_of(gpulab), kubelet.dir, fake_node().path)
    t0 = time.monotonic()
    with pytest.raises(ContainerTierError) as e:
        c.start()
    elapsed = time.monotonic() - t0
    c.stop()  # the exited container too
    assert elapsed < 30  # not the ready timeout: it saw the exit
    assert "exit code: 1" in str(e.value)
    assert "No module named plugin.no_such_module" in str(e.value)


def test_a_host_path_the_tier_cannot_provide_is_one_line(tmp_path: Path) -> None:
    gpulab = subjects.load("gpulab")
    ds = gpulab.daemonset
    pod = ds["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "modules", "hostPath": {"path": "/lib/modules"}})
    pod["containers"][0]["volumeMounts"].append({"name": "modules", "mountPath": "/lib/modules"})
    (tmp_path / "ds.yaml").write_text(yaml.safe_dump(ds))
    data = {**gpulab.spec.model_dump(mode="json"), "name": "modules", "daemonset": "ds.yaml",
            "chart": None}  # fmt: skip
    (tmp_path / "modules.yaml").write_text(yaml.safe_dump(data))
    c = SubjectContainer(subjects.load(tmp_path / "modules.yaml"), "unused", tmp_path, tmp_path)
    with pytest.raises(ContainerTierError, match=r"volume modules mounts host path /lib/modules; "):
        c.build()
    c.stop()


def device_ids_subject(tmp_path: Path, device_ids: dict) -> Subject:
    """gpulab's subject with other device_ids (what a plugin of that kind would state)."""
    gpulab = subjects.load("gpulab")
    (tmp_path / "ds.yaml").write_text(yaml.safe_dump(gpulab.daemonset))
    data = {**gpulab.spec.model_dump(mode="json"), "name": "ids", "daemonset": "ds.yaml",
            "chart": None, "device_ids": device_ids}  # fmt: skip
    (tmp_path / "ids.yaml").write_text(yaml.safe_dump(data))
    return subjects.load(tmp_path / "ids.yaml")


def test_an_allocate_response_names_its_gpus_in_each_form(
    tmp_path: Path, fake_node: Callable[..., NodeDir]
) -> None:
    """The three ways a container learns its GPUs, read as the subject says: its env
    var, its CDI devices, its device specs (GKE's: /dev/nvidia<minor>, ids nvidia<minor>)."""
    pb = api_pb2
    gpus = fake_node().node().gpus
    a, b = gpus[1], gpus[6]
    env = device_ids_subject(tmp_path, {"env": "NVIDIA_VISIBLE_DEVICES"})
    resp = pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": f"{b.uuid},{a.uuid}"})
    assert shown_gpus(env, resp, gpus) == [b.uuid, a.uuid]
    cdi_subject = device_ids_subject(tmp_path, {"cdi": "example.com/gpu", "id": "gpu{index}"})
    resp = pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name="example.com/gpu=gpu6")])
    assert shown_gpus(cdi_subject, resp, gpus) == [b.uuid]
    specs = device_ids_subject(
        tmp_path, {"device_specs": "/dev/nvidia{minor}", "id": "nvidia{minor}"}
    )
    resp = pb.ContainerAllocateResponse(devices=[
        pb.DeviceSpec(container_path=p, host_path=p, permissions="rw")
        for p in (f"/dev/nvidia{a.minor}", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia99")
    ])  # fmt: skip
    assert shown_gpus(specs, resp, gpus) == [a.uuid, "/dev/nvidia99 (no GPU)"]
    assert specs.gpu_of(f"nvidia{a.minor}", gpus) == a.uuid
    with pytest.raises(AssertionError, match="no device specs"):
        shown_gpus(specs, pb.ContainerAllocateResponse(), gpus)


def test_the_tiny_plugins_devices_mode_refuses_a_node_without_the_gpus_device_nodes(
    tmp_path: Path, kubelet: Kubelet, fake_node: Callable[..., NodeDir]
) -> None:
    """Without the node's /dev (here: its mount dropped) the container's own /dev has no
    /dev/nvidia<minor>: the plugin exits at once naming the node it lacks, as GKE's waits
    for nvidiactl, rather than advertise GPUs it cannot hand out."""
    devices = subjects.load(subjects.EXAMPLES_DIR / "tiny-gpu-plugin-devices/subject.yaml")
    ds = devices.daemonset
    pod = ds["spec"]["template"]["spec"]
    pod["containers"][0]["volumeMounts"] = [
        m for m in pod["containers"][0]["volumeMounts"] if m["name"] != "dev"
    ]
    (tmp_path / "ds.yaml").write_text(yaml.safe_dump(ds))
    data = {**devices.spec.model_dump(mode="json"), "daemonset": "ds.yaml",
            "image": {"build": str(devices.path("../tiny-gpu-plugin"))}}  # fmt: skip
    (tmp_path / "no-dev.yaml").write_text(yaml.safe_dump(data))
    no_dev = subjects.load(tmp_path / "no-dev.yaml")

    c = SubjectContainer(no_dev, image_of(devices), kubelet.dir, fake_node().path)
    with pytest.raises(ContainerTierError) as e:
        c.start()
    c.stop()
    assert "exit code: 1" in str(e.value)
    assert "GPU 0 (GPU-" in str(e.value) and "has no device node" in str(e.value)


def test_the_gpulab_image_ships_its_bytecode() -> None:
    """Every module a plugin start imports comes from bytecode compiled into the image (a
    container writes none: PYTHONDONTWRITEBYTECODE), so no start compiles grpc or pydantic
    again (clusters/infra/images/gpulab.Dockerfile)."""
    import docker

    try:
        image = built.require(["gpulab"]).images["gpulab"]
    except built.InfraMissing as e:
        pytest.fail(str(e), pytrace=False)
    script = (
        "import importlib.util, os, sys, plugin.main, fakenvml.cli\n"
        "mods = [m for m in list(sys.modules.values()) if getattr(m, '__file__', '') and "
        "m.__file__.endswith('.py') and '/dist-packages/' in m.__file__]\n"
        "print(len(mods)); print(*[m.__name__ for m in mods "
        "if not os.path.exists(importlib.util.cache_from_source(m.__file__))])"
    )
    out = docker.from_env().containers.run(image, ["python3", "-c", script], entrypoint=[],
                                           remove=True).decode().splitlines()  # fmt: skip
    assert int(out[0]) > 100, out  # grpc, pydantic, protobuf, prometheus_client, ours
    assert out[1:] == [""], f"imported without bytecode in the image: {out[1]}"
