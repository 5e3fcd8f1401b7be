"""Fault suites on the `seed` lab, for each plugin: what kubelet and the scheduler see
when GPUs fail, recover, and when kubelet or the plugin restarts.

Each fault records, by its journal sequence number, when it was injected and when the API
server's node allocatable reflected it (record_property: it lands in the JUnit XML).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes.client.exceptions import ApiException

from clusters.lab import Lab
from clusters.steps import poll
from clusters.subject import Subject
from e2e import checkpoint
from e2e.pods import Pods
from e2e.runner import parse_log
from fakenvml.node import NodeDir

NODE = "seed-worker"
N = 10
GPU = "nvidia.com/gpu"
IGNORED = (13, 31, 43, 45, 68, 109)


def plugin_update_ns(lab: Lab, node: str, after_ns: int) -> int | None:
    """When the plugin on `node` logged its first ListAndWatch update after `after_ns`
    (containerd's log timestamps; both plugins log one line per update)."""
    text = lab.plugin_log(node, timestamps=True)
    if text is None:
        return None
    times = [int(line.t * 1e9) for line in parse_log(text, node, 0) if line.event == "update"]
    return min((t for t in times if t >= after_ns), default=None)


def timed(record_property: Callable[[str, object], None], lab: Lab, rec: object,
          allocatable: int, capacity: int = N) -> float:  # fmt: skip
    """Wait for the API to show the fault; record, by the fault's sequence number, when it
    was injected, when the plugin's ListAndWatch update logged it, and when the API's node
    allocatable showed it."""
    api_ns = lab.wait_allocatable(NODE, allocatable, capacity, deadline_s=60)
    injected_ns = rec.realtime_ns  # type: ignore[attr-defined]
    seq = rec.seq  # type: ignore[attr-defined]
    update_ns = plugin_update_ns(lab, NODE, injected_ns)
    if update_ns is not None:
        record_property(f"seq {seq}: injected -> plugin update (ms)",
                        round((update_ns - injected_ns) / 1e6, 1))  # fmt: skip
    latency = (api_ns - injected_ns) / 1e9
    record_property(f"seq {seq}: injected -> API allocatable {allocatable} (s)", round(latency, 3))
    return latency


def gpu_pod(lab: Lab, name: str, gpus: int, selector: str) -> dict:
    """A workload pod asking for `gpus`, scheduled (by the scheduler) onto `selector`."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": selector},
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": lab.images["workload"], "imagePullPolicy": "Never",
                "resources": {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}},
            }],
        },
    }  # fmt: skip


def registrations(lab: Lab, node: str) -> int:
    """How many times the plugin on `node` has logged its registration with kubelet
    (both plugins log "Registered device plugin for 'nvidia.com/gpu' with Kubelet")."""
    log = lab.plugin_log(node)
    assert log is not None, f"no plugin pod on {node}"
    return log.count("Registered device plugin for 'nvidia.com/gpu' with Kubelet")


def test_xid_79_lowers_allocatable_not_capacity_and_spares_running_pods(
    lab: Lab, pods: Pods, fake_gpus: Callable[[str], NodeDir], record_property: Callable
) -> None:
    pods.create(gpu_pod(lab, "bystander", 2, selector=NODE))
    pods.wait_running("bystander")
    before = pods.devices("bystander")
    victim = next(g.index for g in fake_gpus(NODE).node().gpus if g.uuid not in before)
    rec = fake_gpus(NODE).inject_xid(victim, 79)
    timed(record_property, lab, rec, N - 1)
    # A pod asking for all N cannot fit any more; the one using other GPUs keeps running.
    pods.create(gpu_pod(lab, "want-all", N, selector=NODE))
    pods.wait_failed_scheduling("want-all", f"Insufficient {pods.resource}")
    assert pods.get("bystander").status.phase == "Running"
    assert pods.devices("bystander") == before


def test_ignored_xids_change_nothing(
    lab: Lab, fake_gpus: Callable[[str], NodeDir], record_property: Callable
) -> None:
    node = fake_gpus(NODE)
    for code in IGNORED:
        node.inject_xid(1, code)
    rec = node.inject_xid(2, 79)  # sentinel: plugins read events in order
    # The sentinel's update carries the plugin's view after the ignored Xids: one down.
    timed(record_property, lab, rec, N - 1)


@pytest.mark.needs("healthcheck_env")
def test_dp_disable_and_enable_healthchecks(
    lab: Lab, fake_gpus: Callable[[str], NodeDir], record_property: Callable
) -> None:
    """DP_DISABLE_HEALTHCHECKS=79 ignores Xid 79; DP_ENABLE_HEALTHCHECKS=13 checks Xid 13,
    which is ignored by default: NVIDIA's documented semantics, which ours follows."""
    lab.set_plugin_env({"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "13"})
    try:
        node = fake_gpus(NODE)
        node.inject_xid(1, 79)  # now ignored
        rec = node.inject_xid(2, 13)  # now critical
        timed(record_property, lab, rec, N - 1)  # only GPU 2: the Xid 79 came first
        # Clear both before the plugin restarts with the default rules: it reads pending
        # recovery actions at start, and GPU 1's Xid 79 left one.
        node.recover(1)
        node.recover(2)
    finally:
        lab.set_plugin_env({"DP_DISABLE_HEALTHCHECKS": None, "DP_ENABLE_HEALTHCHECKS": None})


def test_gpu_lost(subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir],
                  record_property: Callable) -> None:  # fmt: skip
    """`lost_gpu: every-device` (NVIDIA's: a GPU_IS_LOST wait names no GPU) marks every
    device unhealthy; `that-device` (ours asks NVML) only the lost one."""
    rec = fake_gpus(NODE).lose(4)
    timed(record_property, lab, rec, 0 if subject.expects.lost_gpu == "every-device" else N - 1)


def test_double_bit_ecc(subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir],
                        record_property: Callable) -> None:  # fmt: skip
    """`double_bit_ecc: unhealthy` (ours) marks the GPU unhealthy; `ignored` (NVIDIA's
    registers for the event but acts on Xids only, the driver's Xid 48) does not."""
    node = fake_gpus(NODE)
    node.inject_ecc(5, double=True)
    rec = node.inject_xid(6, 79)  # sentinel
    timed(record_property, lab, rec, N - 2 if subject.expects.double_bit_ecc == "unhealthy"
          else N - 1)  # fmt: skip


def test_recovery(subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir],
                  record_property: Callable) -> None:  # fmt: skip
    node = fake_gpus(NODE)
    timed(record_property, lab, node.inject_xid(3, 79), N - 1)
    rec = node.recover(3)
    if subject.expects.recovers:
        timed(record_property, lab, rec, N)
        return
    # `recovers: false` (NVIDIA's documented behaviour): Unhealthy until its pod restarts.
    # A sentinel read after the recovery shows GPU 3 still counted out.
    timed(record_property, lab, node.inject_xid(6, 79), N - 2)
    lab.restart_plugin()
    assert lab.capacity(NODE) == (N, N)


def test_kubelet_restart_keeps_running_pods_devices(lab: Lab, pods: Pods) -> None:
    pods.create("test-gpu-3")
    pod = pods.wait_running("test-gpu-3")
    node = pod.spec.node_name
    before = checkpoint.allocations(lab, node)[(pod.metadata.uid, "main", pods.resource)]
    lab.set_plugin_on(node, True)  # already on: waits until its pod is Running and Ready
    registered = registrations(lab, node)
    lab.node_exec(node, "systemctl", "restart", "kubelet")

    def reregistered() -> tuple[bool, str]:
        try:
            n = registrations(lab, node)
        except ApiException as e:  # logs come through kubelet, which is restarting
            return False, f"kubelet not answering ({e.status})"
        return n > registered, f"{n} registrations (was {registered})"

    poll("the plugin to register again after kubelet's restart", reregistered, 120)
    lab.wait_allocatable(node, N, N, deadline_s=60)
    assert pods.get("test-gpu-3").status.phase == "Running"
    assert checkpoint.allocations(lab, node)[(pod.metadata.uid, "main", pods.resource)] == before
    assert sorted(pods.devices("test-gpu-3")) == before


def test_plugin_gone_allocatable_zero_then_restored(lab: Lab) -> None:
    """The plugin's pod leaves the node (its DaemonSet label removed, so it stays gone
    long enough to observe): allocatable 0 at once, capacity kept (kubelet's 5-minute
    grace); the DaemonSet's new pod registers again and restores both."""
    lab.set_plugin_on(NODE, False)
    try:
        lab.wait_allocatable(NODE, 0, N, deadline_s=60)
    finally:
        lab.set_plugin_on(NODE, True)
    lab.wait_allocatable(NODE, N, N, deadline_s=120)
