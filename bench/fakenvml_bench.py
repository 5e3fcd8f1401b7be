"""fakenvml benchmarks: fault delivery latency across processes, CLI start, the C call
path, nvidia-ml-py call rates (beside a peer fake's when NVML_PEER names one), nvmlInit
time. Each returns rows of (metric, value, unit, aim)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.rows import Row, pct
from fakenvml import inventory, library
from fakenvml.node import STATE_DIR_ENV, NodeDir

REPO = Path(__file__).resolve().parents[1]


def _state(count: int, root: Path) -> NodeDir:
    d = NodeDir(root / f"gpus{count}")
    d.init(inventory.from_dict({"gpus": [{"profile": "H100-SXM5-80GB", "count": count}]}, "bench"))
    return d


def _waiter(d: NodeDir, expect: int, idle_ms: int) -> subprocess.Popen[str]:
    """A fakenvml.waiter on GPU 0 of `d`, registered (READY read) and waiting."""
    env = {**os.environ, STATE_DIR_ENV: str(d.path), library.LIBRARY_ENV: str(library.path())}
    waiter = subprocess.Popen(
        [sys.executable, "-m", "fakenvml.waiter", "--gpus", "0", "--expect", str(expect),
         "--idle-ms", str(idle_ms)],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    assert json.loads(waiter.stdout.readline()) == {"ready": True}  # type: ignore[union-attr]
    return waiter


def delivery_latency(root: Path, events: int = 1000) -> list[Row]:
    """Injection (journal timestamp) -> nvmlEventSetWait return in another process."""
    d = _state(8, root)
    waiter = _waiter(d, events, 5000)
    injected = []
    for i in range(events):
        injected.append(d.inject_xid(0, 1000 + i).monotonic_ns)
        time.sleep(0.002)  # paced: this measures latency, not throughput
    out, _ = waiter.communicate(timeout=60)
    seen = [json.loads(line)["t"] for line in out.splitlines()]
    lat = [(t - s) / 1e3 for s, t in zip(injected, seen, strict=True)]
    return [
        {"metric": "inject -> wait return, p50 (cross-process)", "value": pct(lat, 50),
         "unit": "us", "aim": ""},
        {"metric": "inject -> wait return, p99 (cross-process)", "value": pct(lat, 99),
         "unit": "us", "aim": "<= 1000"},
    ]  # fmt: skip


def _cli() -> list[str]:
    """The console script as users run it (`fakenvml`), from this interpreter's venv."""
    script = Path(sys.executable).with_name("fakenvml")
    return [str(script)] if script.exists() else [sys.executable, "-m", "fakenvml"]


def cli_start(root: Path, runs: int = 30) -> list[Row]:
    """Wall time of a whole `fakenvml inject xid` (start, imports, the write), beside the
    interpreter's own start (`python -c pass`), the floor no CLI in Python goes under."""
    d = _state(8, root)

    def wall(argv: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=root)
        return (time.perf_counter() - t0) * 1e3

    cli = [wall([*_cli(), "inject", "xid", "0", "13", "--state-dir", str(d.path)])
           for _ in range(runs)]  # fmt: skip
    floor = [wall([sys.executable, "-c", "pass"]) for _ in range(runs)]
    return [
        {"metric": "fakenvml inject (whole command), median", "value": statistics.median(cli),
         "unit": "ms", "aim": "<= 40"},
        {"metric": "python -c pass (interpreter start), median",
         "value": statistics.median(floor), "unit": "ms", "aim": ""},
    ]  # fmt: skip


def cli_latency(root: Path, samples: int = 50) -> list[Row]:
    """`fakenvml inject` spawned -> nvmlEventSetWait return in another process: what a
    test that injects through the CLI waits for."""
    d = _state(8, root)
    waiter = _waiter(d, samples, 10000)
    assert waiter.stdout is not None
    lat = []
    for i in range(samples):
        t0 = time.monotonic_ns()
        subprocess.run([*_cli(), "inject", "xid", "0", str(2000 + i), "--state-dir",
                        str(d.path)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        lat.append((json.loads(waiter.stdout.readline())["t"] - t0) / 1e6)
    waiter.wait(timeout=60)
    return [
        {"metric": "fakenvml inject spawned -> wait return, p50", "value": pct(lat, 50),
         "unit": "ms", "aim": ""},
        {"metric": "fakenvml inject spawned -> wait return, p99", "value": pct(lat, 99),
         "unit": "ms", "aim": "<= 60"},
    ]  # fmt: skip


PEER_ENV = "NVML_PEER"  # a peer fake's libnvidia-ml.so.1 (NVIDIA's nvml-mock), by path


def _peer() -> Path | None:
    """The peer to compare with, when given; its own configuration (GPU count, its env
    variables) is whatever the caller's environment gives it."""
    p = os.environ.get(PEER_ENV)
    return Path(p) if p else None


def _pynvml_rates(lib: Path, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "bench.pynvml_rate", str(lib)], cwd=REPO,
                         env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    return json.loads(out)


def call_rates(root: Path) -> list[Row]:
    """nvidia-ml-py call rates, each library in a process of its own; with a peer, both in
    the same run and the ratio against the aim (>= 1.5x the peer's GetMemoryInfo rate)."""
    rows: list[Row] = []
    ours = {}
    for count in (8, 1024):
        env = {**os.environ, STATE_DIR_ENV: str(_state(count, root).path)}
        got = _pynvml_rates(library.path(), env)
        ours[count] = got["rates"]
        for name, rate in got["rates"].items():
            rows.append({"metric": f"nvidia-ml-py {name}, {count} GPUs", "value": rate,
                         "unit": "calls/s", "aim": ""})  # fmt: skip
    if peer := _peer():
        got = _pynvml_rates(peer, dict(os.environ))
        for name, rate in got["rates"].items():
            rows.append({"metric": f"nvidia-ml-py {name}, peer ({got['gpus']} GPUs)",
                         "value": rate, "unit": "calls/s", "aim": ""})  # fmt: skip
        ratio = ours[8]["GetMemoryInfo"] / got["rates"]["GetMemoryInfo"]
        rows.append({"metric": "nvidia-ml-py GetMemoryInfo rate, ours / peer", "value": ratio,
                     "unit": "x", "aim": ">= 1.5"})  # fmt: skip
    return rows


def _callloop(root: Path) -> Path:
    exe = root / "callloop"
    if not exe.exists():
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(REPO / "bench" / "callloop.c"), "-ldl"],
                       check=True)  # fmt: skip
    return exe


def _c_loop_ns(root: Path, lib: Path, gpus: int, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([str(_callloop(root)), str(lib), str(gpus), "2000000"], env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return {name: float(ns) for name, ns in (line.split() for line in out.splitlines())}


def c_loop(root: Path) -> list[Row]:
    """ns per getter call from C (bench/callloop.c), the library's own cost: the call path
    that has no system call (journal.gen). With a peer, the same loop against it."""
    env = {**os.environ, STATE_DIR_ENV: str(_state(8, root).path)}
    rows: list[Row] = [
        {"metric": f"C loop {name}, 8 GPUs", "value": ns, "unit": "ns/call", "aim": "<= 60"}
        for name, ns in _c_loop_ns(root, library.path(), 8, env).items()
    ]
    if peer := _peer():
        for name, ns in _c_loop_ns(root, peer, 0, dict(os.environ)).items():
            rows.append({"metric": f"C loop {name}, peer", "value": ns, "unit": "ns/call",
                         "aim": ""})  # fmt: skip
    return rows


def init_time(root: Path, runs: int = 20) -> list[Row]:
    import pynvml as nv

    os.environ[STATE_DIR_ENV] = str(_state(1024, root).path)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        nv.nvmlInit()
        times.append((time.perf_counter() - t0) * 1e3)
        nv.nvmlShutdown()
    return [{"metric": "nvmlInit, 1024 GPUs (median)", "value": statistics.median(times),
             "unit": "ms", "aim": ""}]  # fmt: skip


def run() -> list[Row]:
    library.preload()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        return [*delivery_latency(root), *cli_start(root), *cli_latency(root),
                *c_loop(root), *call_rates(root), *init_time(root)]  # fmt: skip
