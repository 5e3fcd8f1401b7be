"""Device-plugin benchmarks in the node tier: a plugin process over fakenvml, driven by
the kubelet stand-in. Each returns rows of (metric, value, unit, aim).

    rows = plugin_bench.run()                        # NVIDIA's newest pinned plugin
    rows = plugin_bench.run([nvidia_subject("v0.17.4"), Subject("gpulab", our_command)])

A Subject is any plugin: a name, and a function from (kubelet dir, fakenvml state dir,
scratch dir) to the plugin's argv and environment. Times are client-side (the stand-in's
stub call, gRPC included) or CLOCK_MONOTONIC differences between a fakenvml journal
record and the stand-in's receive time of the ListAndWatch update it caused.
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.rows import Row, pct
from fakenvml import inventory
from fakenvml.node import NodeDir
from plugin.api.v1beta1 import HEALTHY
from standin import Kubelet, gpulab, nvidia
from standin.process import PluginProcess

Command = Callable[[Path, Path, Path], tuple[list[str], dict[str, str]]]

ALLOCATE_CALLS = 500
PREFERRED_CALLS = {8: 200, 64: 20}  # 64 GPUs: NVIDIA reads every pair's links per call
XID_ROUNDS = 8  # x 8 GPUs = 64 samples (a fresh plugin per round: NVIDIA never recovers)
RESTARTS = 20
STALL_PROBE_S = 2.0


@dataclass(frozen=True)
class Subject:
    name: str
    command: Command
    resource: str = nvidia.RESOURCE
    # How to know the plugin's health loop is waiting on NVML events before injecting;
    # a thread blocked in poll(2) is fakenvml's nvmlEventSetWait (see PluginProcess).
    ready: Callable[[PluginProcess], None] = PluginProcess.wait_event_wait


def nvidia_subject(version: str) -> Subject:
    return Subject(f"nvidia {version}", functools.partial(nvidia.command, version))


def gpulab_subject() -> Subject:
    return Subject("gpulab", gpulab.command, ready=gpulab.ready)


def all_subjects() -> list[Subject]:
    return [*(nvidia_subject(v) for v in nvidia.versions()), gpulab_subject()]


def _latency_rows(name: str, what: str, ms: Sequence[float], aim99: str = "") -> list[Row]:
    label = f"{name}: {what} (n={len(ms)})"
    return [
        {"metric": f"{label}, p50", "value": pct(ms, 50), "unit": "ms", "aim": ""},
        {"metric": f"{label}, p99", "value": pct(ms, 99), "unit": "ms", "aim": aim99},
    ]


@contextmanager
def _running(subject: Subject, root: Path, gpus: int) -> Iterator[tuple[Kubelet, NodeDir]]:
    """A fresh node of `gpus` H100s, a stand-in, and the plugin registered and listing."""
    work = Path(tempfile.mkdtemp(dir=root))
    node = NodeDir(work / "node")
    spec = {"gpus": [{"profile": "H100-SXM5-80GB", "count": gpus}]}
    node.init(inventory.from_dict(spec, "bench"))
    with Kubelet() as kubelet:
        argv, env = subject.command(kubelet.dir, node.path, work)
        with PluginProcess(argv, env, work / "plugin.log") as plugin:
            kubelet.wait_devices(subject.resource, gpus, timeout=60)
            subject.ready(plugin)
            yield kubelet, node


def _timed(fn: Callable[[], object], calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def rpc_latency(subject: Subject, root: Path) -> list[Row]:
    rows: list[Row] = []
    r = subject.resource
    for gpus in (8, 64):
        with _running(subject, root, gpus) as (kubelet, _):
            ids = sorted(kubelet.resource(r).devices)
            pairs = iter([ids[i : i + 2] for i in range(0, gpus, 2)] * ALLOCATE_CALLS)
            ms = _timed(lambda: kubelet.allocate(r, next(pairs)), ALLOCATE_CALLS)  # noqa: B023
            rows += _latency_rows(subject.name, f"Allocate 2 of {gpus} GPUs", ms)
            # NVIDIA's best-effort policy enumerates partitions: for 64 GPUs only sizes 1
            # and 64 finish; 2 of 64 is probed once below.
            size = 2 if gpus == 8 else 1
            call = functools.partial(kubelet.get_preferred_allocation, r, ids, (), size)
            ms = _timed(call, PREFERRED_CALLS[gpus])
            rows += _latency_rows(subject.name, f"GetPreferredAllocation {size} of {gpus} GPUs", ms)
            if gpus == 64:
                rows.append(_preferred_stall(subject, kubelet, ids))
    return rows


def _preferred_stall(subject: Subject, kubelet: Kubelet, ids: list[str]) -> Row:
    metric = f"{subject.name}: GetPreferredAllocation 2 of 64 GPUs"
    t0 = time.perf_counter()
    try:
        kubelet.get_preferred_allocation(subject.resource, ids, (), 2, timeout=STALL_PROBE_S)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
            raise
        return {"metric": metric, "value": f"no answer in {STALL_PROBE_S:g} s", "unit": "",
                "aim": "answers"}  # fmt: skip
    return {"metric": metric, "value": (time.perf_counter() - t0) * 1e3, "unit": "ms", "aim": ""}


def xid_latency(subject: Subject, root: Path) -> list[Row]:
    """Xid 79 injected (journal monotonic_ns) -> ListAndWatch update showing that GPU
    unhealthy (stand-in receive time), one GPU at a time, paced by the updates."""
    ms: list[float] = []
    r = subject.resource
    for _ in range(XID_ROUNDS):
        with _running(subject, root, 8) as (kubelet, node):
            uuids = [g.uuid for g in node.node().gpus]
            for i, uuid in enumerate(uuids):
                before = kubelet.resource(r).updates
                rec = node.inject_xid(i, 79)
                kubelet.wait_health(r, uuids[: i + 1], after=before)
                seen = next(
                    u.t_ns
                    for u in kubelet.updates(r, after_ns=rec.monotonic_ns)
                    if uuid in _unhealthy(u.message)
                )
                ms.append((seen - rec.monotonic_ns) / 1e6)
    return _latency_rows(subject.name, "Xid 79 -> ListAndWatch update", ms)


def _unhealthy(update: object) -> set[str]:
    return {d.ID for d in update.devices if d.health != HEALTHY}  # type: ignore[attr-defined]


def reregistration(subject: Subject, root: Path) -> list[Row]:
    """kubelet.sock recreated -> Register received, and -> first ListAndWatch list."""
    to_register, to_list = [], []
    r = subject.resource
    with _running(subject, root, 8) as (kubelet, _):
        for n in range(2, RESTARTS + 2):
            before = kubelet.resource(r).updates
            kubelet.restart()
            created = next(x.t_ns for x in reversed(kubelet.records) if x.rpc == "KubeletStarted")
            kubelet.wait_registered(r, count=n, timeout=30)
            kubelet.wait_update(r, after=before, timeout=30)
            recs = [x for x in kubelet.records if x.t_ns >= created and x.resource == r]
            reg = next(x.t_ns for x in recs if x.rpc == "Register" and x.direction == "recv")
            lst = next(x.t_ns for x in recs if x.rpc == "ListAndWatch" and x.message is not None
                       and x.direction == "recv")  # fmt: skip
            to_register.append((reg - created) / 1e6)
            to_list.append((lst - created) / 1e6)
    return [
        *_latency_rows(subject.name, "kubelet.sock recreated -> Register", to_register),
        *_latency_rows(subject.name, "kubelet.sock recreated -> first list", to_list),
    ]


def run(subjects: Sequence[Subject] | None = None) -> list[Row]:
    subjects = subjects or [nvidia_subject(nvidia.versions()[0])]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-") as tmp:
        root = Path(tmp)
        for s in subjects:
            rows += [*rpc_latency(s, root), *xid_latency(s, root), *reregistration(s, root)]
    return rows


if __name__ == "__main__":
    for row in run():
        v = row["value"]
        print(f"{row['metric']:70} {v:>10.3f} {row['unit']}" if isinstance(v, float) else row)
