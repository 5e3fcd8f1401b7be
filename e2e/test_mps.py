"""MPS on the `seed` lab, for subjects whose replicas are MPS clients (`expects.mps`;
NVIDIA's `sharing.mps` with its MPS control daemon and the real nvidia-cuda-mps-control):
what a pod gets, what it may ask for, and what happens when the daemon dies.

The client pods run the gpulab image: any image with a C library runs the driver's programs
the NVIDIA Container Toolkit mounts in (the workload image is static busybox), as a CUDA
application's would. They talk to the daemon the way a CUDA client does, through the pipe
directory in CUDA_MPS_PIPE_DIRECTORY.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from clusters.labs import spec
from clusters.labs.lab import Lab
from clusters.subjects.subject import Mps, Subject
from e2e.pods import Pods, PodWaitError, restarts
from e2e.verdict import Verdict

SEED = spec.load("seed")  # the --lab default: its first GPU worker
NODE, GPUS = SEED.gpu_nodes[0].name, SEED.gpu_nodes[0].gpu_count
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
CONTROL = "nvidia-cuda-mps-control"
MIB = 1 << 20
pytestmark = pytest.mark.needs("mps")


def mps_of(subject: Subject) -> Mps:
    mps = subject.expects.mps
    assert mps  # the need
    return mps


def client_pod(lab: Lab, pods: Pods, name: str, replicas: int = 1) -> dict:
    """A pod of the gpulab image asking for `replicas` on NODE, sleeping."""
    doc = pods.gpu_pod(name, replicas, NODE)
    main = doc["spec"]["containers"][0]
    main["image"], main["command"] = lab.images["gpulab"], ["sleep", "3600"]
    return doc


def ask(pods: Pods, pod: str, *commands: str, until: list[str] | None = None) -> list[str]:
    """Each command's answer from the MPS control daemon, asked through the pod's pipe
    directory (a failed one answers its error and `failed: exit N`); with `until`, asked
    again until the answers are those: a daemon just started answers with its defaults
    until NVIDIA's manager has set its limits (mps/daemon.go sets them after `-d`)."""
    script = "; ".join(f'echo "{c}" | {CONTROL} 2>&1 || echo "failed: exit $?"'
                       for c in commands)  # fmt: skip
    out = pods.exec(
        pod,
        ["sh", "-c", script],
        lambda out: bool(out.strip()) and until in (None, out.strip().splitlines()),
    )
    return out.strip().splitlines()


def daemon_pod(lab: Lab, mps: Mps) -> client.V1Pod:
    found = lab.kube.pods(mps.daemon.namespace, mps.daemon.selector, NODE)
    assert len(found) == 1, f"MPS control daemon pods on {NODE}: {len(found)}"
    return found[0]


def in_daemon(lab: Lab, mps: Mps, command: str) -> str:
    """`command`'s output in NODE's control-daemon container."""
    pod = daemon_pod(lab, mps)
    runner = Pods(lab.core, mps.daemon.namespace, "")
    return runner.exec(pod.metadata.name, ["sh", "-c", command], lambda out: True,
                       container=pod.spec.containers[0].name)  # fmt: skip


def restart_daemon(lab: Lab, mps: Mps) -> None:
    """NODE's control-daemon pod deleted and its replacement Ready: a new daemon."""
    lab.kube.restart_pods(mps.daemon.namespace, mps.daemon.selector, "MPS control daemon",
                          nodes={NODE})  # fmt: skip


def shown(mib: int) -> str:
    """A pinned-memory limit as the daemon prints it: whole GiB, rounded down, from 1 GiB
    up (NVIDIA's 550.163.01: 20389M shows as 19G, 40960M as 40G), else MiB."""
    return f"{mib // 1024}G" if mib >= 1024 else f"{mib}M"


def test_an_mps_pod_reaches_the_daemon_and_its_limits_through_its_pipe(
    subject: Subject, lab: Lab, pods: Pods, verdict: Verdict
) -> None:
    """A pod asking for one replica runs with CUDA_MPS_PIPE_DIRECTORY; through that pipe the
    node's control daemon answers each client's share: 100 / replicas percent of the
    threads, memory / replicas of each GPU's pinned memory (the limits NVIDIA's daemon
    set, read back from its log). The pod's /dev/shm is the daemon's, and every GPU of the
    node is in EXCLUSIVE_PROCESS compute mode (the real nvidia-smi, in the pod)."""
    mps, r = mps_of(subject), subject.expects.replicas
    gpus = sorted(lab.fake_gpus(NODE).node().gpus, key=lambda g: g.index)
    want_mib = {g.index: g.memory_total // r // MIB for g in gpus}
    verdict.expect(f"{PIPE_ENV} set; threads {100 / r:.1f}%, pinned memory 1/{r} of each GPU; "
                   "/dev/shm the daemon's; Exclusive_Process")  # fmt: skip
    pods.create(client_pod(lab, pods, "mps-client"))
    pods.wait_running("mps-client")
    pipe = pods.env("mps-client").get(PIPE_ENV)
    assert pipe, f"no {PIPE_ENV} in the pod's environment"
    threads, *limits = ask(
        pods,
        "mps-client",
        "get_default_active_thread_percentage",
        *(f"get_default_device_pinned_mem_limit {i}" for i in want_mib),
    )
    assert threads == f"{100 / r:.1f}", threads
    assert limits == [shown(m) for m in want_mib.values()], limits
    # What the daemon was told, exactly (its answers round to whole GiB).
    log = lab.kube.pod_log(daemon_pod(lab, mps))
    told = dict(re.findall(r"Cmd:set_default_device_pinned_mem_limit (\d+) (\d+)M", log))
    assert {int(i): int(m) for i, m in told.items()} == want_mib, told
    marker = f"/dev/shm/gpulab-{int(time.time_ns())}"
    pods.exec("mps-client", ["sh", "-c", f"touch {marker} && echo ok"], lambda o: "ok" in o)
    assert in_daemon(lab, mps, f"test -e {marker} && echo shared && rm {marker}").strip() == \
        "shared", "the pod's /dev/shm is not the daemon's"  # fmt: skip
    query = ["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"]
    modes = pods.exec("mps-client", query, lambda o: bool(o.strip()))
    assert modes.split() and set(modes.split()) == {"Exclusive_Process"}, modes
    verdict.saw(f"{PIPE_ENV}={pipe}; {threads}%, {limits[0]} (told {want_mib[0]}M); shared "
                f"/dev/shm; Exclusive_Process")  # fmt: skip


def test_a_pod_asking_for_more_replicas_than_mps_allows_is_refused(
    subject: Subject, lab: Lab, pods: Pods, verdict: Verdict
) -> None:
    """`max_request` + 1 replicas in one container: the kubelet rejects the pod at
    admission (the plugin's Allocate refuses it), and the wait ends at the rejection."""
    most = mps_of(subject).max_request
    if most is None:
        pytest.fail(f"{subject.source}: expects.mps.max_request is not stated", pytrace=False)
    verdict.expect(f"{most + 1} replicas: Failed, UnexpectedAdmissionError")
    pods.create(client_pod(lab, pods, "mps-greedy", most + 1))
    with pytest.raises(PodWaitError, match="will never be Running"):
        pods.wait_running("mps-greedy")
    status = pods.get("mps-greedy").status
    verdict.saw(f"{status.phase}, {status.reason}: {status.message}")
    assert (status.phase, status.reason) == ("Failed", "UnexpectedAdmissionError")


# Every `nvidia-cuda-mps-control -d` the container sees (the pod shares one process
# namespace, as NVIDIA's chart has it), killed; their pids printed.
KILL_DAEMON = f"""for p in /proc/[0-9]*; do
  case "$(tr '\\0' ' ' <"$p/cmdline" 2>/dev/null)" in
    "{CONTROL} -d"*) kill "${{p#/proc/}}" && echo "${{p#/proc/}}";;
  esac
done"""


@pytest.fixture
def daemon_healed(lab: Lab, subject: Subject) -> Iterator[dict[str, bool]]:
    """NODE's control-daemon pod restarted afterwards unless the test did (`healed`)."""
    state = {"healed": False}
    yield state
    if not state["healed"]:
        restart_daemon(lab, mps_of(subject))


def test_the_mps_daemon_dying(
    subject: Subject, lab: Lab, pods: Pods, daemon_healed: dict[str, bool], verdict: Verdict
) -> None:
    """NODE's nvidia-cuda-mps-control killed. `unnoticed` (NVIDIA's): two node-status
    periods later every replica is still allocatable, the daemon's pod still Running and
    unrestarted, and a new pod is admitted and runs with a pipe no daemon answers. Its pod
    restarted, a new daemon answers the same pod through the same pipe."""
    mps, full = mps_of(subject), GPUS * subject.expects.replicas
    verdict.expect(f"{mps.daemon_death}: {full}/{full}, a new pod admitted, its pipe dead; "
                   "a restarted daemon answers it")  # fmt: skip
    before = daemon_pod(lab, mps)
    killed = in_daemon(lab, mps, KILL_DAEMON).split()
    assert killed, f"no `{CONTROL} -d` in {before.metadata.name}"
    time.sleep(2 * lab.lab.spec.node_status_update_frequency)
    assert lab.capacity(NODE) == (full, full)
    after = daemon_pod(lab, mps)
    restarted, said = restarts(after)
    assert (after.metadata.uid, after.status.phase, restarted) == \
        (before.metadata.uid, "Running", 0), said  # fmt: skip
    pods.create(client_pod(lab, pods, "mps-orphan"))
    pods.wait_running("mps-orphan")
    dead = ask(pods, "mps-orphan", "get_default_active_thread_percentage")
    assert dead[-1].startswith("failed:"), dead
    restart_daemon(lab, mps)  # Ready once its daemons answer (the DaemonSet's startup probe)
    daemon_healed["healed"] = True
    share = f"{100 / subject.expects.replicas:.1f}"
    try:
        back = ask(pods, "mps-orphan", "get_default_active_thread_percentage", until=[share])
    except PodWaitError as e:
        # Did the new daemon start (and set its limits), or does the pod not reach it?
        tail = lab.kube.log_tail(daemon_pod(lab, mps), 15)
        raise AssertionError(f"{e}\nthe new daemon pod's log:\n" + "\n".join(tail)) from e
    verdict.saw(f"{full}/{full}; daemon pod Running, 0 restarts; new pod: {dead[0]!r}; "
                f"after its restart: {back[0]}%")  # fmt: skip
