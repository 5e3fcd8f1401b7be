"""NVIDIA's MIG manager changing a node's MIG layout by label, on the `mig-manager` lab (one
node, two H100s, MIG off), beside NVIDIA's device plugin, both deployed as the GPU Operator
deploys them (clusters/labs/migmanager.py). Each change goes through the MIG manager alone:
`nvidia.com/mig.config=<name>` (a config of mig-parted's default file) on the node, then
the manager pauses the plugin, partitions the GPUs through NVML and sets
`nvidia.com/mig.config.state`. What each test asserts comes from the node's fake state
(what NVML was told) and from the node's capacity (what the restarted plugin serves).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from clusters import built
from clusters.labs import migmanager, spec, toolkit
from clusters.labs.lab import Lab
from e2e.fixtures import NAMESPACE, lab_fixture
from e2e.pods import DEVICE_ENV, Pods
from e2e.verdict import Verdict
from fakenvml import mig

LAB = spec.load("mig-manager")
NODE = LAB.gpu_nodes[0].name
GPUS = LAB.gpu_nodes[0].gpu_count
# mig-parted's default configs (deployments/systemd/config-default.yaml) on an H100 80GB:
# each GPU's instances.
LAYOUTS = {
    "all-1g.10gb": Counter({"1g.10gb": 7}),
    "all-balanced": Counter({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
}


@lab_fixture(LAB.name, scope="module")
def managed(labs: Callable[..., Lab]) -> Iterator[Lab]:
    """The lab with the MIG manager and the plugin up, MIG off; removed afterwards, the
    GPUs back to MIG off."""
    lab = labs(LAB.name)
    image = built.require(["mig-manager"], lab.lab.kubernetes).images["mig-manager"]
    lab.host.load([image], [NODE])
    migmanager.deploy(lab.kube, {**lab.images, "mig-manager": image}, NODE)
    yield lab
    try:
        if layout(lab) != [(False, Counter())] * GPUS:
            change(lab, migmanager.DISABLED)
    finally:
        migmanager.remove(lab.kube, NODE)


def change(lab: Lab, config: str) -> float:
    """The MIG manager through `config`; the seconds it took. Then the node's CDI spec made
    again (clusters/labs/toolkit.py): the lab's runtime resolves a container's MIG UUIDs
    through it, where a node's legacy runtime (libnvidia-container, not built here) asks
    the driver; the MIG manager itself writes only the management spec."""
    t0 = time.monotonic()
    migmanager.reconfigure(lab.kube, NODE, config)
    took = time.monotonic() - t0
    toolkit.refresh(lab.ctx)
    return took


def layout(lab: Lab) -> list[tuple[bool, Counter[str]]]:
    """Each GPU's MIG mode and its GPU instances by profile, from the node's fake state."""
    return [(m.current, Counter(mig.short(gi.prof.name) for gi in m.gis.values()))
            for m in mig.layout(lab.fake_gpus(NODE))]  # fmt: skip


def served(lab: Lab) -> dict[str, int]:
    """Allocatable nvidia.com resources of the node, those above zero (a resource whose
    plugin went away keeps its name with nothing allocatable, as the kubelet keeps it)."""
    status = lab.core.read_node(NODE).status
    got = {k: int(v) for k, v in (status.allocatable or {}).items() if k.startswith("nvidia.com/")}
    return {k: v for k, v in got.items() if v}


def wait_served(lab: Lab, want: dict[str, int], deadline_s: float = 120) -> dict[str, int]:
    """Until the node's allocatable is `want` (the restarted plugin registered)."""
    end = time.monotonic() + deadline_s
    while (got := served(lab)) != want and time.monotonic() < end:
        time.sleep(0.5)
    return got


def plugin_pod(lab: Lab) -> str:
    found = lab.kube.pods(migmanager.NAMESPACE, f"app={migmanager.PLUGIN_APP}", NODE)
    assert len(found) == 1, f"{migmanager.PLUGIN_APP} pods on {NODE}: {len(found)}"
    return found[0].metadata.uid


def resources(instances: Counter[str]) -> dict[str, int]:
    """What NVIDIA's plugin serves for this layout on every GPU (mixed strategy)."""
    return {f"nvidia.com/mig-{p}": n * GPUS for p, n in instances.items()}


@pytest.mark.parametrize("config", list(LAYOUTS))
def test_a_layout_by_label(managed: Lab, config: str, verdict: Verdict) -> None:
    """The label set, the state `success`; every GPU in MIG mode with the config's
    instances (the fake state: what mig-parted told NVML), the plugin pod replaced (the
    manager paused it) and each profile allocatable, nvidia.com/gpu gone."""
    want = resources(LAYOUTS[config])
    verdict.expect(f"success; {GPUS} GPUs {dict(LAYOUTS[config])}; " + ", ".join(
        f"{k} {v}" for k, v in sorted(want.items())))  # fmt: skip
    before = plugin_pod(managed)
    took = change(managed, config)
    assert layout(managed) == [(True, LAYOUTS[config])] * GPUS
    assert plugin_pod(managed) != before, "the MIG manager did not restart the plugin"
    got = wait_served(managed, want)
    verdict.saw(f"success in {took:.1f}s; " + ", ".join(f"{k} {v}" for k, v in sorted(got.items())))
    assert got == want


def test_a_pod_gets_a_slice_of_the_new_layout(managed: Lab, verdict: Verdict) -> None:
    """After all-1g.10gb, a pod asking for nvidia.com/mig-1g.10gb runs with one MIG
    device of the node's state in its env."""
    resource = "nvidia.com/mig-1g.10gb"
    if layout(managed) != [(True, LAYOUTS["all-1g.10gb"])] * GPUS:
        change(managed, "all-1g.10gb")
    wait_served(managed, resources(LAYOUTS["all-1g.10gb"]))
    slices = {d.uuid for d in mig.devices(managed.fake_gpus(NODE))}
    verdict.expect(f"1 of the {len(slices)} MIG UUIDs in {DEVICE_ENV}")
    managed.ensure_namespace(NAMESPACE)
    pods = Pods(managed.core, NAMESPACE, managed.images["workload"], resource)
    pods.delete_all()
    try:
        pods.create(pods.gpu_pod("mig-slice", 1, NODE))
        pods.wait_running("mig-slice")
        got = pods.env("mig-slice").get(DEVICE_ENV, "")
        verdict.saw(f"{DEVICE_ENV}={got}")
        assert got.split(",") and set(got.split(",")) <= slices and len(got.split(",")) == 1
    finally:
        pods.delete_all()


def test_back_to_mig_off(managed: Lab, verdict: Verdict) -> None:
    """all-disabled: MIG mode off on every GPU, no instance left, nvidia.com/gpu served
    again and no MIG resource allocatable."""
    if layout(managed) == [(False, Counter())] * GPUS:
        change(managed, "all-1g.10gb")
    verdict.expect(f"MIG off; nvidia.com/gpu {GPUS}")
    change(managed, migmanager.DISABLED)
    assert layout(managed) == [(False, Counter())] * GPUS
    got = wait_served(managed, {"nvidia.com/gpu": GPUS})
    verdict.saw(", ".join(f"{k} {v}" for k, v in sorted(got.items())))
    assert got == {"nvidia.com/gpu": GPUS}


def test_a_config_the_file_lacks_fails_and_changes_nothing(managed: Lab, verdict: Verdict) -> None:
    """A config name its file does not have: state `failed` (its `assert --valid-config`
    refuses it), the layout as it was, the plugin's deploy label still `true` and the plugin
    serving what it served."""
    before, serving = layout(managed), served(managed)
    verdict.expect("failed; layout, deploy label and allocatable unchanged")
    managed.kube.label_node(NODE, {migmanager.STATE_LABEL: None})
    managed.kube.label_node(NODE, {migmanager.CONFIG_LABEL: "no-such-config"})
    migmanager.wait_state(managed.kube, NODE, "failed", 120)
    deploy = managed.core.read_node(NODE).metadata.labels.get(migmanager.DEPLOY_LABELS[0])
    got = wait_served(managed, serving, 30)
    verdict.saw(f"failed; {migmanager.DEPLOY_LABELS[0]}={deploy}; "
                + ", ".join(f"{k} {v}" for k, v in sorted(got.items())))  # fmt: skip
    assert layout(managed) == before
    assert deploy == "true"
    assert got == serving


def test_a_profile_the_gpu_lacks_is_reported_as_success(managed: Lab, verdict: Verdict) -> None:
    """all-3g.71gb (an H200's profile, `devices: all` in the file) on H100s: NVIDIA's
    v0.13.1 says `success` with MIG mode on and no instance on any GPU, so nothing is
    served. mig-parted drops a layout whose profile no GPU of the node has
    (pkg/types/mig_config.go: Flatten returns nothing when a profile does not parse against
    the node's GPUs) and applies the empty rest: the state label alone does not tell a
    platform team its layout was not made."""
    verdict.expect("success; MIG on, no instance; nothing allocatable")
    # No CDI spec to make: with no GPU and no MIG device, `nvidia-ctk cdi generate` refuses
    # ("empty device edits"), and there is nothing a pod could get.
    migmanager.reconfigure(managed.kube, NODE, "all-3g.71gb")
    got = wait_served(managed, {})
    verdict.saw(f"success; {layout(managed)}; {got or 'nothing allocatable'}")
    assert layout(managed) == [(True, Counter())] * GPUS
    assert got == {}
