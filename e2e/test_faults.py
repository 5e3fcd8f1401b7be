"""Fault suites on the `seed` lab, for each plugin: what kubelet and the scheduler see
when GPUs fail and recover, and when the plugin leaves the node (restart suites:
e2e/test_restarts.py).

Each fault records, by its journal sequence number, when it was injected and when the API
server's node allocatable reflected it (test properties: they land in the JUnit XML); each
scenario states what it expects of the subject and what it saw (the summary table).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes.client import V1Pod

from clusters import versions
from clusters.labs import capacity, spec
from clusters.labs.lab import Lab
from clusters.subjects.subject import Subject
from e2e.pods import Pods
from e2e.timing import fault_seen, pod_health_seen
from e2e.verdict import Verdict
from fakenvml.journal import Record
from fakenvml.node import NodeDir
from plugin.config import DEFAULT_IGNORED_XIDS

SEED = spec.load("seed")  # the --lab default: its first GPU worker
NODE, N = SEED.gpu_nodes[0].name, SEED.gpu_nodes[0].gpu_count
# Whole GPUs: the numbers below count GPUs (time-sliced subjects: test_sharing.py).
# nvidia-cdi runs nvidia's binary: its faults are nvidia's (only how a pod gets its
# devices differs, which the pod-status scenario reads).
pytestmark = [pytest.mark.needs("replicas=1"), pytest.mark.varies_with("plugin")]


def timed(verdict: Verdict, lab: Lab, rec: Record, allocatable: int,
          capacity: int = N) -> float:  # fmt: skip
    return fault_seen(verdict, lab, NODE, rec, allocatable, capacity)


@pytest.mark.smoke
def test_xid_79_lowers_allocatable_not_capacity_and_spares_running_pods(
    lab: Lab, pods: Pods, fake_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    verdict.expect(f"{N - 1}/{N}; bystander keeps its devices")
    pods.create(pods.gpu_pod("bystander", 2, NODE))
    pods.wait_running("bystander")
    before = pods.devices("bystander")
    victim = next(g.index for g in fake_gpus(NODE).node().gpus if g.uuid not in before)
    rec = fake_gpus(NODE).inject_xid(victim, 79)
    timed(verdict, lab, rec, N - 1)
    # A pod asking for all N cannot fit any more; the one using other GPUs keeps running.
    pods.create(pods.gpu_pod("want-all", N, NODE))
    pods.wait_failed_scheduling("want-all", f"Insufficient {pods.resource}")
    bystander = pods.get("bystander").status.phase
    kept = pods.devices("bystander") == before
    verdict.saw(f"bystander {bystander}, {'same' if kept else 'other'} devices")
    assert bystander == "Running"
    assert kept


@pytest.mark.varies_with("device_ids")  # and the plugin (the module's): ids, how pods get them
@pytest.mark.smoke  # the kubelet writes it from 1.36 on; the smoke pass checks 1.34 does not
def test_xid_79_shows_in_the_pod_status_of_the_pod_holding_the_gpu(
    subject: Subject,
    lab: Lab,
    pods: Pods,
    fake_gpus: Callable[[str], NodeDir],
    verdict: Verdict,
) -> None:
    """KEP-4680 (ResourceHealthStatus, beta and on from Kubernetes 1.36): the kubelet writes
    each allocated device's health into status.containerStatuses[].allocatedResourcesStatus.
    The device plugin API carries no message, so Healthy/Unhealthy is all a pod shows.
    Before 1.36 the gate is alpha and off: the field stays empty, which is asserted too.
    The status names the plugin's device ids; each is compared as the GPU it names
    (Pods.health), held and other being the GPUs the containers got."""
    node = fake_gpus(NODE)
    pods.create(pods.gpu_pod("holder", 1, NODE))
    pods.create(pods.gpu_pod("other", 1, NODE))
    pods.wait_running("holder")
    pods.wait_running("other")
    held, other = pods.devices("holder")[0], pods.devices("other")[0]
    uuids = {g.uuid: g.index for g in node.node().gpus}
    assert {held, other} <= uuids.keys(), f"holder got {held}, other {other}"
    if versions.kube_minor(lab.lab.kubelet) < 36:  # the kubelet writes it: its version
        verdict.expect("no allocatedResourcesStatus (gate off before 1.36)")
        timed(verdict, lab, node.inject_xid(uuids[held], 79), N - 1)
        shown = pods.health(pods.get("holder"))
        verdict.saw(f"holder shows {shown or 'nothing'}")
        assert shown == {}
        return
    back = "Healthy again" if subject.expects.recovers else "stays Unhealthy"
    verdict.expect(f"holder Healthy -> Unhealthy, other Healthy; recover: {back}")
    assert pods.health(pods.get("holder")) == {held: "Healthy"}
    rec = node.inject_xid(uuids[held], 79)
    timed(verdict, lab, rec, N - 1)
    s = pod_health_seen(verdict, lab, pods, "holder", held, "Unhealthy", rec)
    bystander = pods.health(pods.get("other"))
    verdict.saw(f"holder Unhealthy {s:.2f}s after the Xid; other {bystander.get(other)}")
    assert bystander == {other: "Healthy"}
    rec = node.recover(uuids[held])
    if subject.expects.recovers:
        s = pod_health_seen(verdict, lab, pods, "holder", held, "Healthy", rec)
        verdict.saw(f"Healthy {s:.2f}s after recovery")
        return
    # NVIDIA's plugin never re-adds a device: a sentinel read after the recovery shows it.
    spare = next(i for u, i in uuids.items() if u not in (held, other))
    timed(verdict, lab, node.inject_xid(spare, 79), N - 2)
    still = pods.health(pods.get("holder"))
    verdict.saw(f"after recovery: {still.get(held)}")
    assert still == {held: "Unhealthy"}


def test_ignored_xids_change_nothing(
    subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    """The Xids the subject ignores (`ignored_xids`: NVIDIA's default 13, 31, 43, 45, 68,
    109, application errors; none; or its own list) leave GPU 1 in; NVIDIA's defaults it
    does not ignore take GPU 3 out; a sentinel Xid it does not ignore, read after them,
    counts GPU 2 out."""
    ignored = subject.expects.ignored_xid_codes
    others = sorted(DEFAULT_IGNORED_XIDS - ignored)
    sentinel = next(x for x in (79, 74, 94, 95) if x not in ignored)
    want = N - 1 - bool(others)
    verdict.expect(f"{want}/{N}: ignores {sorted(ignored) or 'none'}, "
                   f"takes GPU 3 out for {others or 'none'} and GPU 2 for {sentinel}")  # fmt: skip
    node = fake_gpus(NODE)
    for code in sorted(ignored):
        node.inject_xid(1, code)
    for code in others:
        node.inject_xid(3, code)
    rec = node.inject_xid(2, sentinel)  # plugins read events in order
    # The sentinel's update carries the plugin's view after the ignored Xids.
    timed(verdict, lab, rec, want)


@pytest.mark.needs("healthcheck_env")
def test_the_health_check_switch(
    subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    """The subject's health-check switch (`healthcheck_env`), one plugin start per setting
    and one restore at the end. Where it takes codes and has an enable variable (NVIDIA's
    DP_DISABLE_HEALTHCHECKS=79 DP_ENABLE_HEALTHCHECKS=13): Xid 79 is ignored and Xid 13,
    ignored by default, counts. Then each value that turns checks off (NVIDIA's `all`,
    then `xids`): an Xid 79 and a lost GPU leave every GPU allocatable two node-status
    periods later (where checks are on, the API shows a fault within one)."""
    switch = subject.expects.healthcheck_env
    assert switch  # the need
    codes = subject.expects.health_codes
    verdict.expect((f"{switch.disable}=79 {switch.enable}=13: {N - 1}/{N}; " if codes else "")
                   + f"{switch.disable}={' then '.join(switch.off_values)}: Xid 79 and a "
                   f"lost GPU leave {N}/{N}")  # fmt: skip
    node = fake_gpus(NODE)
    wait_s = 2 * lab.lab.spec.node_status_update_frequency
    cleared: dict[str, str | None] = {switch.disable: None}
    if switch.enable:
        cleared[switch.enable] = None
    try:
        if codes and switch.enable:
            lab.set_plugin_env({switch.disable: "79", switch.enable: "13"})
            node.inject_xid(1, 79)  # now ignored
            rec = node.inject_xid(2, 13)  # now critical
            timed(verdict, lab, rec, N - 1)  # only GPU 2: the Xid 79 came first
            # Healthy hardware again before the next start: a plugin reads what is
            # pending (GPU 1's Xid 79 left a recovery action).
            node.recover(1)
            node.recover(2)
        for value in switch.off_values:
            lab.set_plugin_env({**cleared, switch.disable: value})
            node.inject_xid(1, 79)
            node.lose(4)
            time.sleep(wait_s)
            assert lab.capacity(NODE) == (N, N), f"{switch.disable}={value}"
            node.recover(1)
            node.recover(4)
        verdict.saw(f"{N}/{N} {wait_s:g} s after the faults, for each value")
    finally:
        lab.set_plugin_env(cleared)


@pytest.mark.needs("start_with_lost_gpu")
def test_a_plugin_started_with_a_lost_gpu(
    subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    """GPU 4 lost, then the node's plugin pod restarted: `serves-the-rest` (ours) serves
    the other GPUs; `exits` (NVIDIA's) ends its container with an error naming the lost
    GPU, and the node's other GPUs go unserved while its pod crash-loops (allocatable 0;
    NVIDIA/k8s-device-plugin#231)."""
    how = subject.expects.start_with_lost_gpu
    node = fake_gpus(NODE)
    node.lose(4)
    (old,) = lab.plugin_pods(NODE)
    lab.core.delete_namespaced_pod(old.metadata.name, old.metadata.namespace)
    if how == "serves-the-rest":
        verdict.expect(f"GPU 4 lost at start: {N - 1}/{N - 1}")
        # Capacity falls here (the new registration lists one device fewer), so not
        # wait_allocatable: it refuses a capacity above the one waited for at once.
        capacity.wait_nodes(lab.ctx, f"{NODE} serving {N - 1} of {N - 1}", {NODE},
                            lambda seen: seen.get(NODE) == (N - 1, N - 1), 60,
                            subject.spec.resource)  # fmt: skip
    else:
        verdict.expect("GPU 4 lost at start: its container exits, allocatable 0")
        ns, labels = old.metadata.namespace, subject.selector
        hits: list[tuple[str, bool]] = []

        def ended(pods: dict[str, V1Pod]) -> tuple[bool, str]:
            hit = exited(pods, NODE, old.metadata.uid)
            if hit:
                hits.append(hit)
            return hit is not None, ""

        lab.kube.watch_until(f"a new {NODE} plugin pod's container exiting",
                             lab.core.list_namespaced_pod, ended, 60, namespace=ns,
                             label_selector=labels)  # fmt: skip
        name, previous = hits[-1]
        log = lab.core.read_namespaced_pod_log(name, ns, previous=previous, tail_lines=5)
        verdict.saw(log.strip().splitlines()[-1][-200:])
        assert "GPU is lost" in log
        lab.wait_allocatable(NODE, 0)
    verdict.saw(f"{lab.capacity(NODE)[1]}/{lab.capacity(NODE)[0]}")
    if how == "serves-the-rest":
        # A GPU it left out comes back only when it starts again. (An exiting plugin's pod
        # is the lab's heal's: it recovers GPU 4 and restarts the pod, as for any fault
        # NVIDIA's plugin does not come back from by itself.)
        node.recover(4)
        lab.serving.restart(lab.ctx, [NODE])


def exited(pods: dict[str, V1Pod], node: str, old: str) -> tuple[str, bool] | None:
    """A new pod on `node` whose container ended in an error: its name, and whether that
    was its previous container (a new one is waiting to start again); None while none."""
    for p in pods.values():
        if p.spec.node_name != node or p.metadata.uid == old:
            continue
        for c in p.status.container_statuses or []:
            for state, previous in ((c.state, False), (c.last_state, True)):
                t = state and state.terminated
                if t and t.exit_code:
                    return p.metadata.name, previous
    return None


def test_gpu_lost(subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir],
                  verdict: Verdict) -> None:  # fmt: skip
    """`lost_gpu: every-device` (NVIDIA's: a GPU_IS_LOST wait names no GPU) marks every
    device unhealthy; `that-device` (ours asks NVML) only the lost one; `ignored` none: a
    sentinel Xid 79 on another GPU, read after the loss, is the only one counted out."""
    how = subject.expects.lost_gpu
    node = fake_gpus(NODE)
    if how == "ignored":
        verdict.expect(f"lost_gpu ignored + sentinel: {N - 1}/{N} (the lost GPU still in)")
        node.lose(4)
        timed(verdict, lab, node.inject_xid(6, 79), N - 1)
        return
    every = how == "every-device"
    verdict.expect(f"lost_gpu {how}: {0 if every else N - 1}/{N}")
    rec = node.lose(4)
    timed(verdict, lab, rec, 0 if every else N - 1)


def test_double_bit_ecc(subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir],
                        verdict: Verdict) -> None:  # fmt: skip
    """A DBE as the driver reports it, the ECC event and Xid 48, takes its GPU out for every
    subject (NVIDIA's acts on the Xid, ours on either). Then the ECC event alone
    (`--no-xid`): `double_bit_ecc: unhealthy` (ours) takes that GPU out too; `ignored`
    (NVIDIA's registers for the event but acts on Xids only) does not, which a sentinel Xid
    79 read after it shows."""
    counted = subject.expects.double_bit_ecc == "unhealthy"
    want = N - 3 if counted else N - 2
    verdict.expect(f"DBE + Xid 48 {N - 1}/{N}; ECC alone "
                   f"{subject.expects.double_bit_ecc} + sentinel: {want}/{N}")  # fmt: skip
    node = fake_gpus(NODE)
    timed(verdict, lab, node.inject_ecc(5, double=True), N - 1)
    node.inject_ecc(4, double=True, xid=False)
    rec = node.inject_xid(6, 79)  # sentinel
    timed(verdict, lab, rec, want)
    if not counted:
        # A plugin that wrongly counts the ECC event passes through N-2 on its way to N-3:
        # two node-status periods later it would show.
        time.sleep(2 * lab.lab.spec.node_status_update_frequency)
        assert lab.capacity(NODE) == (N, want)


def test_recovery(subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir],
                  verdict: Verdict) -> None:  # fmt: skip
    node = fake_gpus(NODE)
    if subject.expects.recovers:
        verdict.expect(f"Xid 79 {N - 1}/{N}, recover {N}/{N}")
        timed(verdict, lab, node.inject_xid(3, 79), N - 1)
        timed(verdict, lab, node.recover(3), N)
        return
    # `recovers: false` (NVIDIA's documented behaviour): Unhealthy until its pod restarts.
    # A sentinel read after the recovery shows GPU 3 still counted out.
    verdict.expect(f"stays out after recover: {N - 2}/{N}; restart {N}/{N}")
    timed(verdict, lab, node.inject_xid(3, 79), N - 1)
    node.recover(3)
    timed(verdict, lab, node.inject_xid(6, 79), N - 2)
    lab.restart_plugin()
    cap, alloc = lab.capacity(NODE)
    verdict.saw(f"after restart {alloc}/{cap}")
    assert (cap, alloc) == (N, N)


def test_plugin_gone_allocatable_zero_then_restored(lab: Lab, verdict: Verdict) -> None:
    """The plugin's pod leaves the node (its DaemonSet label removed, so it stays gone
    long enough to observe): allocatable 0 at once, capacity kept (kubelet's 5-minute
    grace); the DaemonSet's new pod registers again and restores both."""
    verdict.expect(f"0/{N} while gone, {N}/{N} back")
    lab.set_plugin_on(NODE, False)
    try:
        t0 = time.time_ns()
        gone = lab.wait_allocatable(NODE, 0, N, deadline_s=60)
        verdict.saw(f"0/{N} in {(gone - t0) / 1e9:.1f}s")
    finally:
        lab.set_plugin_on(NODE, True)
    t0 = time.time_ns()
    back = lab.wait_allocatable(NODE, N, N, deadline_s=120)
    verdict.saw(f"{N}/{N} in {(back - t0) / 1e9:.1f}s")
