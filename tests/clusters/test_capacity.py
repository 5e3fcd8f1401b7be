"""When a plugin's capacity wait gives up early (clusters/labs/capacity.py `hopeless`): a
plugin pod that crash-loops, a kubelet that refused a device list past its gRPC limit;
with stand-ins for the cluster's answers (the lab tier shows both on a real one:
e2e/test_share.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes import client

from clusters.labs import capacity
from clusters.subjects import subject

SHARE = subject.load(Path(__file__).resolve().parents[2] / "examples/gpu-mem-share/subject.yaml")
TOO_LARGE = ('E1206 17:20:01.1 1 client.go:95] "ListAndWatch ended unexpectedly for device '
             'plugin" err="rpc error: code = ResourceExhausted desc = grpc: received message '
             'larger than max (21234567 vs. 4194304)" resource="example.com/gpu-mem"')  # fmt: skip


def pod(restarts: int, reason: str | None, deleting: bool = False) -> client.V1Pod:
    waiting = client.V1ContainerStateWaiting(reason=reason) if reason else None
    status = client.V1ContainerStatus(
        name="plugin", image="i", image_id="", ready=False, restart_count=restarts,
        state=client.V1ContainerState(waiting=waiting),
    )  # fmt: skip
    meta = client.V1ObjectMeta(
        name="share-x", deletion_timestamp=datetime.now(UTC) if deleting else None
    )
    return client.V1Pod(metadata=meta, status=client.V1PodStatus(container_statuses=[status]))


def ctx(journal: str = "") -> SimpleNamespace:
    asked: list[tuple[str, ...]] = []

    def node_exec(node: str, *cmd: str) -> str:
        asked.append(cmd)
        return journal

    kube = SimpleNamespace(log_tail=lambda p, n, c, previous: ["Traceback", "ImportError: x"])
    return SimpleNamespace(kube=kube, node_exec=node_exec, asked=asked)


def test_a_plugin_that_crash_loops_is_given_up_on_with_its_last_words() -> None:
    why = capacity.hopeless(ctx(), SHARE, lambda n: [pod(2, "CrashLoopBackOff")], ["w"], 0)()
    assert why == ("plugin pod share-x on w crash-loops (2 restarts); its last run said: "
                   "Traceback | ImportError: x")  # fmt: skip


def test_a_plugin_starting_or_restarting_is_waited_for() -> None:
    for p in (pod(1, "CrashLoopBackOff"), pod(5, None), pod(3, "CrashLoopBackOff", True)):
        assert capacity.hopeless(ctx(), SHARE, lambda n, p=p: [p], ["w"], 0)() is None


def test_a_device_list_past_the_kubelets_limit_is_named_with_its_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capacity, "expected_devices", lambda c, s, n: 815590)
    c = ctx(TOO_LARGE)
    why = capacity.hopeless(c, SHARE, lambda n: [], ["w"], 1765041600.7)()
    assert why == ("w's kubelet refused the plugin's ListAndWatch answer: 21,234,567 bytes "
                   "(815,590 devices), past its gRPC limit of 4,194,304 bytes (4 MiB): "
                   "advertise fewer devices")  # fmt: skip
    assert c.asked[0][5:7] == ("--since", "@1765041600")
    # Another plugin's refusal is not this one's.
    other = ctx(TOO_LARGE.replace("example.com/gpu-mem", "nvidia.com/gpu"))
    assert capacity.hopeless(other, SHARE, lambda n: [], ["w"], 0)() is None
