"""Sharing by GPU memory, for subjects whose devices are units of one GPU's memory and
whose scheduler picks the GPU (`expects.memory_unit_mib`, `scheduler:`, `companions:`;
gpu-mem-share, HAMi- and gpushare-style plugins): capacity in units, the GPU a container
gets is the one its scheduler chose, a pod no GPU can hold stays Pending for the scheduler's
reason, and an Xid shows where the subject reports health. On the `seed` lab's first GPU
worker. The whole-GPU suites count GPUs and are not these subjects' scenarios.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clusters.labs import spec
from clusters.labs.capacity import memory_units
from clusters.labs.lab import Lab
from clusters.steps import StepError
from clusters.subjects.subject import Subject, unstated
from clusters.subjects.subject import load as load_subject
from e2e.fixtures import lab_fixture, namespaced_pods
from e2e.pods import Pods, PodWaitError
from e2e.timing import fault_seen
from e2e.verdict import Verdict
from fakenvml.model import Gpu
from fakenvml.node import NodeDir

SEED = spec.load("seed")  # the --lab default: its first GPU worker
NODE = SEED.gpu_nodes[0].name
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gpu-mem-share"
pytestmark = pytest.mark.needs("shares_memory")


def node_gpus(lab: Lab) -> list[Gpu]:
    return list(lab.fake_gpus(NODE).node().gpus)


def units_of(subject: Subject, gpu: Gpu) -> int:
    return memory_units(gpu, subject.expects.memory_unit_mib)


def chosen(subject: Subject, pods: Pods, name: str, gpus: list[Gpu]) -> str:
    """The UUID of the GPU the subject's scheduler wrote on the pod."""
    sched = subject.spec.scheduler
    if sched is None or sched.choice is None:
        raise unstated(subject.source, "scheduler.choice", "{annotation: ..., id: '{index}'}")
    value = (pods.get(name).metadata.annotations or {}).get(sched.choice.annotation)
    assert value is not None, f"pod {name}: its scheduler wrote no {sched.choice.annotation}"
    uuid = sched.choice.form.gpu_of(value, gpus)
    assert uuid is not None, f"pod {name}: {sched.choice.annotation}={value} names no GPU of {NODE}"
    return uuid


def check_scheduler_choice(subject: Subject, lab: Lab, pods: Pods, verdict: Verdict) -> None:
    """Two pods asking for a whole GPU's memory each, and one asking for a tenth of one,
    through the subject's scheduler: each container gets exactly the GPU its scheduler
    chose (the subject's env, read as `env_id` says, and the GPU's device node), and the
    two whole-GPU pods got different GPUs."""
    gpus = node_gpus(lab)
    whole = units_of(subject, gpus[0])
    asks = {"whole-a": whole, "whole-b": whole, "tenth": max(1, whole // 10)}
    verdict.expect("each container gets the GPU its scheduler chose")
    for name, units in asks.items():
        pods.create(pods.gpu_pod(name, units, NODE))
    seen = {}
    for name in asks:
        pods.wait_running(name)
        want, got = chosen(subject, pods, name, gpus), pods.devices(name)
        minor = {g.uuid: g.minor if g.minor >= 0 else g.index for g in gpus}
        nodes = {e for e in pods.device_nodes(name) if e.startswith("nvidia") and e[6:].isdigit()}
        seen[name] = (want, got, sorted(nodes))
    verdict.saw("; ".join(f"{n}: chose {w[-8:]}, got {[g[-8:] for g in got]}, /dev {d}"
                          for n, (w, got, d) in seen.items()))  # fmt: skip
    for name, (want, got, nodes) in seen.items():
        assert got == [want], (f"pod {name}: its scheduler chose GPU {want}, the plugin's "
                               f"Allocate handed the container {got}")  # fmt: skip
        assert nodes == [f"nvidia{minor[want]}"], f"pod {name}: /dev has {nodes}, chose {want}"
    assert seen["whole-a"][0] != seen["whole-b"][0], "two whole-GPU pods on one GPU"


def test_capacity_is_the_gpus_memory_in_units(subject: Subject, lab: Lab, verdict: Verdict) -> None:
    """Capacity = allocatable = each GPU's memory in the subject's units, summed."""
    want = sum(units_of(subject, g) for g in node_gpus(lab))
    verdict.expect(f"{want}/{want}")
    cap, alloc = lab.capacity(NODE)
    verdict.saw(f"{alloc}/{cap}")
    assert (cap, alloc) == (want, want)


def test_the_gpu_a_container_gets_is_the_one_its_scheduler_chose(
    subject: Subject, lab: Lab, pods: Pods, verdict: Verdict
) -> None:
    check_scheduler_choice(subject, lab, pods, verdict)


def test_a_pod_no_gpu_can_hold_stays_pending_for_its_schedulers_reason(
    subject: Subject, lab: Lab, pods: Pods, verdict: Verdict
) -> None:
    """One unit more than a GPU has: the node's allocatable holds it, no GPU does. The pod
    stays Pending, and its FailedScheduling comes from the subject's scheduler with a reason
    that is not the node's allocatable."""
    sched = subject.spec.scheduler
    if sched is None:
        raise unstated(subject.source, "scheduler", "{name: ..., choice: ...}")
    units = max(units_of(subject, g) for g in node_gpus(lab)) + 1
    verdict.expect(f"Pending, FailedScheduling from {sched.name}")
    pods.create(pods.gpu_pod("too-big", units, NODE))
    msg = pods.wait_failed_scheduling("too-big", "")
    event = next(e for e in pods.events("too-big") if e.reason == "FailedScheduling")
    by = event.reporting_component or (event.source.component if event.source else "")
    verdict.saw(f"{by}: {msg[:160]}")
    assert by == sched.name
    assert f"Insufficient {pods.resource}" not in msg, msg
    assert pods.get("too-big").spec.node_name is None


@pytest.mark.needs("scheduler_webhook")
def test_its_webhook_sends_pods_that_ask_for_it_to_its_scheduler(
    subject: Subject, pods: Pods, verdict: Verdict
) -> None:
    """A pod that asks for the resource and names no scheduler gets the subject's in its
    schedulerName (the scenarios' pods all go this way, as users' do); a pod that does not
    ask keeps the default scheduler."""
    sched = subject.spec.scheduler
    assert sched is not None
    verdict.expect(f"asking: {sched.name}; not asking: default-scheduler")
    plain = pods.gpu_pod("no-gpu", 0, NODE)
    plain["spec"]["containers"][0]["resources"] = {}
    pods.create(plain)
    pods.create(pods.gpu_pod("asks", 1, NODE))
    got = {n: pods.get(n).spec.scheduler_name for n in ("asks", "no-gpu")}
    verdict.saw(f"asking: {got['asks']}; not asking: {got['no-gpu']}")
    assert got == {"asks": sched.name, "no-gpu": "default-scheduler"}, got


def test_a_pod_that_bypasses_its_scheduler_is_refused_at_admission_at_once(
    subject: Subject, pods: Pods, verdict: Verdict
) -> None:
    """A pod bound to its node by nodeName (no scheduler sees it; the node's allocatable
    holds it) carries no choice: the plugin's Allocate fails, the kubelet rejects the pod at
    admission, and the wait for it to run ends within seconds, naming the rejection and the
    plugin's last lines (a failing plugin's run is as fast as a passing one's)."""
    verdict.expect("UnexpectedAdmissionError, the wait over in seconds")
    pod = pods.gpu_pod("bypass", 1)
    pod["spec"]["nodeName"] = NODE
    pods.create(pod)
    t0 = time.monotonic()
    with pytest.raises(PodWaitError) as e:
        pods.wait_running("bypass", deadline_s=90)
    took = time.monotonic() - t0
    verdict.saw(f"{took:.1f}s: {str(e.value).splitlines()[0][:200]}")
    assert "will never be Running" in str(e.value) and "UnexpectedAdmissionError" in str(e.value)
    assert took < 30, f"{took:.0f}s"


@pytest.mark.needs("node_health")
def test_an_xid_shows_on_the_node_and_takes_out_that_gpus_memory(
    subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    """Xid 79 on GPU 3: allocatable drops by that GPU's units, and the subject's node
    annotation says that GPU, and no other, is Unhealthy."""
    health = subject.expects.node_health
    gpus = node_gpus(lab)
    full = sum(units_of(subject, g) for g in gpus)
    down = full - units_of(subject, gpus[3])
    verdict.expect(f"{down}/{full}, GPU 3 Unhealthy in {health.annotation}")
    fault_seen(verdict, lab, NODE, fake_gpus(NODE).inject_xid(3, 79), down, full)
    t0 = time.monotonic()
    while True:
        value = (lab.core.read_node(NODE).metadata.annotations or {}).get(health.annotation, "")
        marked = [g.index for g in gpus if health.unhealthy_of(g).search(value)]
        if marked == [3] or time.monotonic() - t0 > 30:
            break
        time.sleep(0.5)
    verdict.saw(f"{health.annotation}: GPUs {marked} Unhealthy")
    assert marked == [3], f"{health.annotation}={value!r}"


def for_a_while(lab: Lab, subject: Subject | None = None) -> Iterator[Lab]:
    """`lab` running `subject` (or what the test deploys) for one test, then the subject
    it ran before: the suites' `lab` fixture keeps one Lab for every test of its subject,
    so a test that switches must switch back."""
    before = lab.subject
    try:
        if subject is not None:
            lab.use_subject(subject)
        yield lab
    finally:
        lab.use_subject(before)


@lab_fixture(SEED.name, scope="function")
def broken_share(labs: Callable[..., Lab]) -> Iterator[Lab]:
    """The seed lab running gpu-mem-share broken on purpose (examples/gpu-mem-share/broken.yaml)."""
    yield from for_a_while(labs(SEED.name), load_subject(EXAMPLE / "broken.yaml"))


@lab_fixture(SEED.name, scope="function")
def seed_lab(labs: Callable[..., Lab]) -> Iterator[Lab]:
    """The seed lab, back on its subject afterwards."""
    yield from for_a_while(labs(SEED.name))


@pytest.fixture
def broken_pods(broken_share: Lab) -> Iterator[Pods]:
    yield from namespaced_pods(broken_share)


def test_a_device_list_past_the_kubelets_grpc_limit_is_reported_with_its_size(
    seed_lab: Lab, verdict: Verdict
) -> None:
    """gpu-mem-share with a device per MiB: some 815,000 ids, a ListAndWatch answer the
    kubelet refuses (its gRPC receive limit, 4 MiB). The lab's capacity wait ends as soon as
    the kubelet says so, naming the answer's size and the limit, not at its deadline."""
    verdict.expect("refused at once: the size and the kubelet's limit named")
    t0 = time.monotonic()
    with pytest.raises(StepError) as e:
        seed_lab.use_subject(load_subject(EXAMPLE / "per-mib.yaml"))
    took = time.monotonic() - t0
    said = str(e.value)
    verdict.saw(f"{took:.0f}s: {said[:300]}")
    assert re.search(
        r"kubelet refused the plugin's ListAndWatch answer: [\d,]+ bytes "
        r"\(8[\d,]+ devices\), past its gRPC limit of 4,194,304 bytes",
        said,
    ), said
    assert took < 120, f"{took:.0f}s: the wait ran toward its deadline"


def test_the_scheduler_choice_scenario_fails_a_plugin_that_ignores_the_choice(
    broken_share: Lab, broken_pods: Pods, verdict: Verdict
) -> None:
    """gpu-mem-share with GPU_SHARE_IGNORE_SCHEDULER=1 hands every container GPU 0: the
    scenario above fails on it, naming the GPU chosen and the one handed."""
    verdict.expect("the scheduler-choice scenario fails")
    broken = load_subject(EXAMPLE / "broken.yaml")
    with pytest.raises(AssertionError, match=r"its scheduler chose GPU .* handed the container"):
        check_scheduler_choice(
            broken, broken_share, broken_pods, Verdict(lambda _key, _value: None)
        )
    verdict.saw("it failed, naming the chosen GPU and the one handed")
