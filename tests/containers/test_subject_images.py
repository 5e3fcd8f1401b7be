"""The container tier: each subject's image (shipped ones and examples/), run as its
DaemonSet would run it (entrypoint, env, hostPath mounts), against the kubelet stand-in
over a fakenvml node. It catches an image that is broken before any cluster starts."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from clusters import infra
from clusters import subject as subjects
from clusters.subject import Subject
from e2e import cdi
from fakenvml import mig
from fakenvml.node import NodeDir
from plugin.standin import Kubelet
from plugin.standin.container import ContainerTierError, SubjectContainer
from plugin.standin.kubelet import StandinError

# The shipped subjects and the examples (plugins gpulab did not write), and any other
# named in $GPULAB_SUBJECTS (names or paths, as `make infra SUBJECT=` builds them).
SUBJECTS = subjects.shipped() + subjects.examples()
SUBJECTS += [s for s in map(subjects.load, subjects.names(os.environ.get("GPULAB_SUBJECTS", "")))
             if s.name not in {t.name for t in SUBJECTS}]  # fmt: skip


def image_of(s: Subject) -> str:
    try:
        wanted = [s.spec.image.infra] if s.spec.image.infra else []
        return infra.subject_image(s, infra.require(wanted))
    except infra.InfraMissing as e:
        pytest.fail(str(e), pytrace=False)


def cdi_ids(kind: str, response: object) -> list[str]:
    """The ids of the CDI devices of `kind` (vendor/class) an Allocate response names."""
    names = [d.name for d in response.cdi_devices]  # type: ignore[attr-defined]
    assert names and all(n.startswith(f"{kind}=") for n in names), names
    return [n.split("=", 1)[1] for n in names]


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
    node = fake_node()
    gpus = node.node().gpus
    uuids = [g.uuid for g in gpus]
    # The UUID behind each device id the subject advertises (time-sliced: <id>::<k>).
    uuid_of = {subject.spec.device_ids.of(g): g.uuid for g in gpus}
    resource = subject.spec.resource
    expects = subject.expects
    with SubjectContainer(subject, image_of(subject), kubelet.dir, node.path) as plugin:
        res = kubelet.wait_devices(resource, 8 * expects.replicas, timeout=30)
        assert res.endpoint == subject.spec.socket
        got = kubelet.admit(resource, 2)
        if subject.spec.device_ids.devices:
            # Device specs: each GPU's /dev/nvidia<minor>, and the control nodes the
            # node's /dev has (the tier's has them all), at the same path in the container.
            specs = {d.container_path: d.host_path for d in got.response.devices}
            assert all(host == path for path, host in specs.items()), specs
            minor = {g.uuid: g.minor if g.minor >= 0 else g.index for g in gpus}
            nodes = {f"/dev/nvidia{minor[uuid_of[d.split('::')[0]]]}" for d in got.devices}
            assert set(specs) - nodes == {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                          "/dev/nvidia-uvm-tools"}  # fmt: skip
            assert not got.response.envs
            ids = [d.split("::")[0] for d in got.devices]
        elif subject.spec.device_ids.cdi:
            ids = cdi_ids(subject.spec.device_ids.cdi, got.response)
            # Every device Allocate names is in a spec the plugin wrote, with its device node.
            specs = cdi.device_nodes((f.read_text() for f in plugin.cdi_dir.glob("*")),
                                     subject.spec.device_ids.cdi)  # fmt: skip
            assert set(uuids) <= set(specs)
            for i in ids:
                assert specs[i] == [f"/dev/nvidia{uuids.index(i)}"]
        else:
            ids = got.response.envs[subject.spec.device_ids.env].split(",")
        # Time-sliced ids are <uuid>::<k>; the env names the GPUs behind them.
        assert sorted(ids) == sorted({d.split("::")[0] for d in got.devices})
        unhealthy = inject_until_faulted(kubelet, resource, lambda: node.inject_xid(3, 79))
        assert {uuid_of[d.split("::")[0]] for d in unhealthy} == {uuids[3]}
        assert len(unhealthy) == expects.out_per_faulted_gpu


@pytest.mark.needs("mig")
@pytest.mark.parametrize("subject", SUBJECTS, ids=lambda s: s.name)
def test_a_mig_image_serves_the_slices_and_marks_a_faulted_one(
    subject: Subject, kubelet: Kubelet, fake_node: Callable[..., NodeDir]
) -> None:
    """The MIG subjects' images (NVIDIA's privileged DaemonSet bind-mounts the driver
    root's proc/driver; ours reads NVML alone) on two H100s all-1g.10gb: 14 slices under
    the strategy's resource, MIG UUIDs in the env, and a fault: ours marks the slice an Xid
    names; NVIDIA's keeps one slice per GPU in its event map, so a whole-GPU Xid marks
    exactly one (README, MIG)."""
    node = fake_node({"gpus": [{"profile": "H100-SXM5-80GB", "count": 2}]})
    for gpu in (0, 1):
        mig.configure(node, gpu, "all-1g.10gb")
    slices = mig.devices(node)
    resource = "nvidia.com/gpu" if subject.expects.mig == "single" else "nvidia.com/mig-1g.10gb"
    with SubjectContainer(subject, image_of(subject), kubelet.dir, node.path):
        kubelet.wait_devices(resource, len(slices), timeout=30)
        got = kubelet.admit(resource, 2)
        env = got.response.envs[subject.spec.device_ids.env].split(",")
        assert sorted(env) == sorted(got.devices) and all(u.startswith("MIG-") for u in env)
        target = slices[9]  # on GPU 1
        slice_only = subject.expects.mig_slice_xid == "that-slice"
        where = (target.gi, target.ci) if slice_only else ()  # else the whole GPU
        unhealthy = inject_until_faulted(
            kubelet, resource, lambda: node.inject_xid(target.gpu, 79, *where)
        )
        if slice_only:
            assert unhealthy == {target.uuid}
        else:
            assert len(unhealthy) == 1 and unhealthy <= {d.uuid for d in slices if d.gpu == 1}


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
