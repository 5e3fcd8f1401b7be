"""NVIDIA's MIG manager changing a node's MIG layout by label, on the `mig-manager` lab (one
node, two H100s, MIG off), beside NVIDIA's device plugin and GFD, all deployed as the GPU
Operator deploys them (clusters/labs/migmanager.py), once per MIG strategy. Each change goes
through the MIG manager alone: `nvidia.com/mig.config=<name>` (a config of mig-parted's
default file) on the node, then the manager pauses the plugin and GFD, partitions the GPUs
through NVML and sets `nvidia.com/mig.config.state`. What each test asserts comes from the
node's fake state (what NVML was told), its allocatable (what the restarted plugin serves)
and its labels (what the restarted GFD wrote).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime

import pytest

from clusters import built, steps
from clusters.labs import capacity, migmanager, spec, toolkit
from clusters.labs.lab import Lab
from e2e.fixtures import NAMESPACE, lab_fixture
from e2e.pods import DEVICE_ENV, Pods, restarts
from e2e.verdict import Verdict
from fakenvml import mig

# The platform above the node: `make test` runs it in a lane of its own, beside the rest.
pytestmark = pytest.mark.platform

LAB = spec.load("mig-manager")
NODE = LAB.gpu_nodes[0].name
GPUS = LAB.gpu_nodes[0].gpu_count
# mig-parted's default configs (deployments/systemd/config-default.yaml) on an H100 80GB:
# each GPU's instances.
LAYOUTS = {
    "all-1g.10gb": Counter({"1g.10gb": 7}),
    "all-balanced": Counter({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
}
OFF = [(False, Counter())] * GPUS
STRATEGY_LABEL = "nvidia.com/mig.strategy"


@pytest.fixture(scope="module", params=["mixed", "single"])
def strategy(request: pytest.FixtureRequest) -> str:
    return request.param


@lab_fixture(LAB.name, scope="module")
def managed(labs: Callable[..., Lab], strategy: str) -> Iterator[Lab]:
    """The lab with the MIG manager, the plugin and GFD up (MIG strategy `strategy`), MIG
    off; removed afterwards, the GPUs back to MIG off."""
    lab = labs(LAB.name)
    image = built.require(["mig-manager"], lab.lab.kubernetes).images["mig-manager"]
    lab.host.load([image], [NODE])
    migmanager.deploy(lab.ctx, NODE, image, strategy)
    yield lab
    try:
        if layout(lab) != OFF:
            change(lab, migmanager.DISABLED)
    finally:
        migmanager.remove(lab.ctx, NODE)


def change(lab: Lab, config: str) -> float:
    """The MIG manager through `config`; the seconds it took. Then the node's CDI spec made
    again (clusters/labs/toolkit.py): the lab's runtime resolves a container's MIG UUIDs
    through it, where a node's legacy runtime (libnvidia-container, not built here) asks
    the driver; the MIG manager itself writes only the management spec."""
    t0 = time.monotonic()
    migmanager.reconfigure(lab.ctx, NODE, config)
    took = time.monotonic() - t0
    toolkit.refresh(lab.ctx)
    return took


def layout(lab: Lab) -> list[tuple[bool, Counter[str]]]:
    """Each GPU's MIG mode and its GPU instances by profile, from the node's fake state."""
    return mig.instances(lab.fake_gpus(NODE))


def served(lab: Lab) -> dict[str, int]:
    """Allocatable nvidia.com resources of the node, those above zero (a resource whose
    plugin went away keeps its name with nothing allocatable, as the kubelet keeps it)."""
    status = lab.core.read_node(NODE).status
    got = {k: int(v) for k, v in (status.allocatable or {}).items() if k.startswith("nvidia.com/")}
    return {k: v for k, v in got.items() if v}


def labels(lab: Lab, keys: dict[str, str]) -> dict[str, str | None]:
    found = lab.core.read_node(NODE).metadata.labels or {}
    return {k: found.get(k) for k in keys}


def story(lab: Lab) -> str:
    """What a failed wait on the plugin's allocatable saw: the node's Ready condition and
    its heartbeat's age (a kubelet that stops posting status freezes allocatable), and each
    plugin pod's containers, their restarts and how they last ended. A CI run with this
    suite beside other labs' saw allocatable held at the whole GPUs for minutes, after a
    label and after a layout (CHANGELOG.md, 2026-12-06). Never raises: it explains a failure."""
    try:
        node = lab.core.read_node(NODE)
        ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
        beat = (f"Ready={ready.status}, heartbeat "
                f"{(datetime.now(UTC) - ready.last_heartbeat_time).total_seconds():.0f}s ago"
                if ready and ready.last_heartbeat_time else "no Ready heartbeat")  # fmt: skip
        pods = []
        for p in lab.kube.pods(migmanager.NAMESPACE, f"app={migmanager.PLUGIN}", NODE):
            states = []
            for c in [*(p.status.init_container_statuses or []),
                      *(p.status.container_statuses or [])]:  # fmt: skip
                st = c.state
                now = "running" if st.running else "?"
                if st.waiting or st.terminated:
                    now = f"{'waiting' if st.waiting else 'terminated'} "
                    now += (st.waiting or st.terminated).reason or ""
                states.append(f"{c.name} {now}")
            pods.append(f"{p.metadata.name} {p.status.phase} ({', '.join(states)}; "
                        f"{restarts(p)[1]}); its plugin's last lines: "
                        + " | ".join(lab.kube.log_tail(p, 12, "nvidia-device-plugin")))  # fmt: skip
        # Capacity beside allocatable: devices the kubelet holds unhealthy (capacity kept)
        # or a resource it never heard of again; and its device manager's own lines (CI of
        # 122ef2b: allocatable 0 for 108 s after the plugin said it registered ts-4).
        held = {k: f"{v} of {(node.status.capacity or {}).get(k)}"
                for k, v in (node.status.allocatable or {}).items()
                if k.startswith("nvidia.com/")}  # fmt: skip
        kubelet = capacity.kubelet_plugin_lines(lab.ctx, NODE, 8)
        return (f"node {beat}; allocatable {held}; plugin pods: {'; '.join(pods) or 'none'}; "
                f"kubelet: {' | '.join(kubelet)}")  # fmt: skip
    except Exception as e:
        return f"node and plugin unreadable ({e.__class__.__name__}: {e})"


def operand_pods(lab: Lab) -> dict[str, str]:
    """The plugin's and GFD's pod on NODE, by the operator's app label: their uids."""
    found = {}
    for app in migmanager.OPERANDS:
        pods = lab.kube.pods(migmanager.NAMESPACE, f"app={app}", NODE)
        assert len(pods) == 1, f"{app} pods on {NODE}: {len(pods)}"
        found[app] = pods[0].metadata.uid
    return found


def expected(instances: Counter[str], strategy: str) -> tuple[dict[str, int], dict[str, str]]:
    """What NVIDIA's plugin serves and GFD labels for this layout on every GPU: mixed, a
    resource and a count label per profile; single, nvidia.com/gpu and gpu.count as the
    number of MIG devices."""
    if strategy == "mixed":
        res = {f"nvidia.com/mig-{p}": n * GPUS for p, n in instances.items()}
        return res, {**{f"{r}.count": str(n) for r, n in res.items()}, STRATEGY_LABEL: strategy}
    total = sum(instances.values()) * GPUS
    return {"nvidia.com/gpu": total}, {"nvidia.com/gpu.count": str(total),
                                      STRATEGY_LABEL: strategy}  # fmt: skip


def words(resources: Mapping[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(resources.items()))


def layouts_for(strategy: str) -> list[str]:
    # single: one profile on every GPU (NVIDIA's plugin refuses a mixed layout with it)
    return [c for c, i in LAYOUTS.items() if strategy == "mixed" or len(i) == 1]


def test_layouts_by_label(managed: Lab, strategy: str, verdict: Verdict) -> None:
    """Each layout: the label set, the state `success`; every GPU in MIG mode with the
    config's instances (the fake state: what mig-parted told NVML), the plugin's and GFD's
    pods replaced (the manager paused them), what the plugin serves and GFD's labels the
    layout's, nvidia.com/gpu gone (mixed) or counting MIG devices (single)."""
    configs = layouts_for(strategy)
    verdict.expect(
        f"{strategy}: "
        + "; ".join(f"{c} success, " + words(expected(LAYOUTS[c], strategy)[0]) for c in configs)
    )
    saw = []
    for config in configs:
        want, want_labels = expected(LAYOUTS[config], strategy)
        before = operand_pods(managed)
        took = change(managed, config)
        assert layout(managed) == [(True, LAYOUTS[config])] * GPUS, config
        after = operand_pods(managed)
        assert all(after[a] != before[a] for a in before), f"{config}: not restarted: {after}"
        got = steps.settle(lambda: served(managed), want)
        got_labels = steps.settle(lambda w=want_labels: labels(managed, w), want_labels)
        saw.append(f"{config} success in {took:.1f}s, {words(got)}")
        assert got == want, f"{config}: {story(managed)}"
        assert got_labels == want_labels, config
    verdict.saw(f"{strategy}: " + "; ".join(saw))


def test_a_pod_gets_a_slice_of_the_new_layout(managed: Lab, strategy: str,
                                              verdict: Verdict) -> None:  # fmt: skip
    """After all-1g.10gb, a pod asking for one of what the plugin serves runs with one MIG
    device of the node's state in its env."""
    if layout(managed) != [(True, LAYOUTS["all-1g.10gb"])] * GPUS:
        change(managed, "all-1g.10gb")
    want = expected(LAYOUTS["all-1g.10gb"], strategy)[0]
    steps.settle(lambda: served(managed), want)
    (resource,) = want
    slices = {d.uuid for d in mig.devices(managed.fake_gpus(NODE))}
    verdict.expect(f"{resource}: 1 of the {len(slices)} MIG UUIDs in {DEVICE_ENV}")
    managed.ensure_namespace(NAMESPACE)
    pods = Pods(managed.core, NAMESPACE, managed.images["workload"], resource)
    got = pods.visible_devices("mig-slice", 1, NODE)
    verdict.saw(f"{DEVICE_ENV}={','.join(got)}")
    assert len(got) == 1 and got[0] in slices, got


def test_back_to_mig_off(managed: Lab, strategy: str, verdict: Verdict) -> None:
    """all-disabled: MIG mode off on every GPU, no instance left, nvidia.com/gpu served
    again (whole GPUs) and no MIG resource allocatable."""
    if layout(managed) == OFF:
        change(managed, "all-1g.10gb")
    verdict.expect(f"MIG off; nvidia.com/gpu {GPUS}")
    change(managed, migmanager.DISABLED)
    assert layout(managed) == OFF
    got = steps.settle(lambda: served(managed), {"nvidia.com/gpu": GPUS})
    verdict.saw(words(got))
    assert got == {"nvidia.com/gpu": GPUS}, story(managed)


# What follows does not depend on the plugin's MIG strategy: asked once.
@pytest.mark.parametrize("strategy", ["mixed"], indirect=True)
def test_time_slicing_by_the_plugin_config_label(managed: Lab, verdict: Verdict) -> None:
    """MIG off, `nvidia.com/device-plugin.config=ts-4` on the node: NVIDIA's config manager
    writes that config and sends the plugin SIGHUP, and the node serves every GPU 4 times
    from the same plugin pod (no restart); `default` back: each GPU once."""
    if layout(managed) != OFF:
        change(managed, migmanager.DISABLED)
    replicas = migmanager.TIME_SLICED["ts-4"]
    verdict.expect(f"ts-4: nvidia.com/gpu {GPUS * replicas}, same pod; default: {GPUS}")
    (pod,) = managed.kube.pods(migmanager.NAMESPACE, f"app={migmanager.PLUGIN}", NODE)
    want = {"nvidia.com/gpu": GPUS * replicas}
    try:
        sliced, dropped = migmanager.switch_config(managed.ctx, NODE, "ts-4",
                                                   lambda: served(managed), want)  # fmt: skip
        (after,) = managed.kube.pods(migmanager.NAMESPACE, f"app={migmanager.PLUGIN}", NODE)
        restarted, said = restarts(after)
        seen = story(managed) if sliced != want else ""
    finally:
        back, dropped_back = migmanager.switch_config(managed.ctx, NODE, None,
                                                      lambda: served(managed),
                                                      {"nvidia.com/gpu": GPUS})  # fmt: skip
    verdict.saw(f"ts-4: {words(sliced)}, pod {after.metadata.name} (was {pod.metadata.name}), "
                f"{said}; default: {words(back)}"
                + "".join(f"; {n}" for n in (dropped, dropped_back) if n))  # fmt: skip
    assert sliced == want, seen
    assert (after.metadata.uid, restarted) == (pod.metadata.uid, 0), said
    assert back == {"nvidia.com/gpu": GPUS}


# The MIG manager's answers do not depend on it either.
@pytest.mark.parametrize("strategy", ["mixed"], indirect=True)
def test_a_config_the_file_lacks_fails_and_changes_nothing(managed: Lab,
                                                           verdict: Verdict) -> None:  # fmt: skip
    """A config name its file does not have: state `failed` (its `assert --valid-config`
    refuses it), the layout as it was, the plugin's deploy label still `true` and the plugin
    serving what it served."""
    before, serving = layout(managed), served(managed)
    verdict.expect("failed; layout, deploy label and allocatable unchanged")
    migmanager.label(managed.ctx, NODE, "no-such-config")
    migmanager.wait_state(managed.ctx, NODE, "failed", 120)
    deploy = labels(managed, {migmanager.OPERANDS[migmanager.PLUGIN]: ""})
    got = steps.settle(lambda: served(managed), serving, 30)
    verdict.saw(f"failed; {deploy}; {words(got)}")
    assert layout(managed) == before
    assert set(deploy.values()) == {"true"}
    assert got == serving


@pytest.mark.parametrize("strategy", ["mixed"], indirect=True)
def test_a_profile_the_gpus_lack_is_reported_as_success(managed: Lab, verdict: Verdict) -> None:
    """all-3g.71gb (an H200's profile, `devices: all` in the file) on H100s: NVIDIA's
    v0.13.1 says `success` with MIG mode on and no instance on any GPU, so nothing is
    served. mig-parted drops a layout whose profile no GPU of the node has
    (pkg/types/mig_config.go: Flatten returns nothing when a profile does not parse against
    the node's GPUs) and applies the empty rest: the state label alone does not tell a
    platform team its layout was not made."""
    verdict.expect("success; MIG on, no instance; nothing allocatable")
    # No CDI spec to make: with no GPU and no MIG device, `nvidia-ctk cdi generate` refuses
    # ("empty device edits"), and there is nothing a pod could get.
    migmanager.reconfigure(managed.ctx, NODE, "all-3g.71gb")
    got = steps.settle(lambda: served(managed), {})
    verdict.saw(f"success; {layout(managed)}; {got or 'nothing allocatable'}")
    assert layout(managed) == [(True, Counter())] * GPUS
    assert got == {}, story(managed)
