"""bench/scale_bench.py's parts that need no cluster: /proc reading, the figures from
timestamps, the claims check, the workloads' pods, the CLI's refusals, the table and plot."""

from __future__ import annotations

import dataclasses
import json
import socket
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client
from rich.console import Console

from bench import scale_bench as sb
from bench import scheduler_perf
from clusters import steps
from clusters.labs import dra, fleet, spec

STAT = "4242 (kube apiserver) S 1 4242 4242 0 -1 4194560 1 0 0 0 {utime} {stime} 0 0 20 0 9"


def test_cpu_ticks_count_fields_after_the_command_name() -> None:
    # A command name with a space and a parenthesis must not shift the fields.
    assert sb.cpu_ticks("7 (a) b)) S 1 1 1 0 -1 0 0 0 0 0 30 12 0 0") == 42
    assert sb.cpu_ticks(STAT.format(utime=100, stime=5)) == 105


def test_rss_is_read_from_status_and_absent_is_zero() -> None:
    assert sb.rss_kib("Name:\tetcd\nVmRSS:\t  123456 kB\nThreads: 9\n") == 123456
    assert sb.rss_kib("Name:\tkthreadd\n") == 0


def fake_proc(root: Path, pid: int, comm: str, cgroup: str, ticks: int = 0,
              rss_kib: int = 0) -> None:  # fmt: skip
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "stat").write_text(STAT.format(utime=ticks, stime=0))
    (d / "status").write_text(f"Name:\t{comm}\nVmRSS:\t{rss_kib} kB\n")


def test_pids_are_the_containers_own(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, "kube-apiserver", "/system.slice/docker-other.scope")
    fake_proc(tmp_path, 11, "kube-apiserver", "/system.slice/docker-abc123.scope/kubelet")
    fake_proc(tmp_path, 12, "kube-scheduler", "/system.slice/docker-abc123.scope/kubelet")
    fake_proc(tmp_path, 13, "bash", "/system.slice/docker-abc123.scope")
    (tmp_path / "self").mkdir()
    got = sb.container_pids("abc123", sb.PROCESSES, tmp_path)
    assert got == {"kube-apiserver": 11, "kube-scheduler": 12}


def test_the_sampler_takes_cpu_since_its_first_sample_and_the_peak_memory(tmp_path: Path) -> None:
    fake_proc(tmp_path, 11, "kube-apiserver", "x", ticks=1000, rss_kib=100 * 1024)
    s = sb.Sampler({"kube-apiserver": 11, "gone": 99}, tmp_path)
    s.sample()
    fake_proc(tmp_path, 11, "kube-apiserver", "x", ticks=1000 + 3 * s.hz, rss_kib=300 * 1024)
    s.sample()
    fake_proc(tmp_path, 11, "kube-apiserver", "x", ticks=1000 + 5 * s.hz, rss_kib=200 * 1024)
    s.sample()
    u = s.usage["kube-apiserver"]
    assert (u.cpu_s, u.peak_rss_mib) == (5.0, 300.0)
    assert s.usage["gone"] == sb.Usage()  # a process that went away is not a crash


def test_rates_and_percentiles_come_from_send_and_bind_times() -> None:
    sent = {f"p{i}": 100.0 + i * 0.1 for i in range(10)}  # all sent within 0.9 s
    bound = {f"p{i}": (101.0 + i, "n1") for i in range(9)}  # one never bound
    run = sb.summarize(sb.Run("claim", 1, 10), sent, bound, created_by=101.0)
    assert run.bound == 9
    assert run.creates_per_s == pytest.approx(10.0)
    assert run.wall_s == pytest.approx(9.0)  # first send 100.0, last binding 109.0
    assert run.pods_per_s == pytest.approx(1.0)
    lat = sorted(bound[n][0] - sent[n] for n in bound)
    assert (run.p50_s, run.p99_s) == (pytest.approx(lat[4]), pytest.approx(lat[-1]))


def claim(pod: str, *results: tuple[str, str]) -> dict:
    return {"status": {
        "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": dra.DRIVER, "pool": p, "device": d} for p, d in results]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}]}}  # fmt: skip


def test_a_device_given_twice_and_one_off_its_pods_node_are_counted() -> None:
    bound = {"a": (1.0, "n1"), "b": (1.0, "n1"), "c": (1.0, "n2")}
    fine = [claim("a", ("n1", "gpu-0")), claim("b", ("n1", "gpu-1")), claim("c", ("n2", "gpu-0"))]
    assert sb.allocations(fine, bound) == (0, 0)
    twice = [*fine, claim("b", ("n1", "gpu-0"))]
    assert sb.allocations(twice, bound) == (1, 0)
    off = [claim("c", ("n1", "gpu-7"))]
    assert sb.allocations(off, bound) == (0, 1)
    assert sb.allocations([{"status": {}}, {}], bound) == (0, 0)  # not allocated yet


@pytest.mark.parametrize("name", list(sb.WORKLOADS))
def test_each_workloads_pod_asks_one_gpu_of_a_fleet_copy(name: str) -> None:
    work = sb.WORKLOADS[name]
    doc = fleet.on_fleet(work.pod("p-00001", "img"), "model")
    spec = doc["spec"]
    assert spec["tolerations"] == [fleet.TOLERATION]
    assert spec["nodeSelector"] == {fleet.FLEET_LABEL: "model"}
    (c,) = spec["containers"]
    if name == "extended":
        assert "resourceClaims" not in spec
        assert c["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    else:
        (rc,) = spec["resourceClaims"]
        assert c["resources"]["claims"] == [{"name": rc["name"]}]


def device(name: str, kind: str, profile: str | None = None) -> client.V1Device:
    attrs = {
        "type": client.V1DeviceAttribute(string=kind),
        "productName": client.V1DeviceAttribute(string="NVIDIA H100 80GB HBM3"),
    }
    if profile:
        attrs["profile"] = client.V1DeviceAttribute(string=profile)
    return client.V1Device(name=name, attributes=attrs,
                           capacity={"memory": client.V1DeviceCapacity(value="80Gi")})  # fmt: skip


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that publishes 2 GPUs, each whole and as 7 1g.10gb and 2 3g.40gb placements
    (the dra.devices the workloads read, patched)."""
    found = [device(f"gpu-{g}", "gpu") for g in range(2)]
    found += [device(f"gpu-{g}-mig-1g-{i}", "mig", "1g.10gb") for g in range(2) for i in range(7)]
    found += [device(f"gpu-{g}-mig-3g-{i}", "mig", "3g.40gb") for g in range(2) for i in range(2)]
    monkeypatch.setattr(dra, "devices", lambda lab, node: {d.name: d for d in found})


LAB: Any = object()  # the workloads ask dra.devices only (patched)


@pytest.mark.usefixtures("published")
def test_how_many_pods_fill_a_copy_comes_from_what_the_model_publishes() -> None:
    fill = {name: w.per_node(LAB, "model") for name, w in sb.WORKLOADS.items()}
    assert fill == {"claim": 2, "extended": 2, "cel": 2, "mig": 14}


@pytest.mark.usefixtures("published")
def test_the_claims_select_the_models_product_and_memory_or_a_mig_profile() -> None:
    ((selector, device_class),) = sb.WORKLOADS["cel"].templates(LAB, "model").values()
    assert "productName == 'NVIDIA H100 80GB HBM3'" in selector
    assert "memory.compareTo(quantity('80Gi')) >= 0" in selector
    assert device_class == dra.DEVICE_CLASS
    ((selector, device_class),) = sb.WORKLOADS["mig"].templates(LAB, "model").values()
    assert (selector, device_class) == (dra.profile_selector("1g.10gb"), dra.MIG_CLASS)


@pytest.mark.parametrize("argv, says", [
    (["--nodes", "100,lots"], "--nodes '100,lots': whole numbers"),
    (["--nodes", "0"], "--nodes '0': 1 or more"),
    (["--workloads", "claim,nope"], "no workload nope"),
    (["--fill", "1.5"], "--fill 1.5: more than 0, at most 1"),
    (["--node-lease", "2"], "--node-lease 2: lab dra with fleet_node_lease=2: fleet_node_lease: "
                             "expected a number >= 4"),
])  # fmt: skip
def test_bad_arguments_are_one_line_and_touch_no_lab(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sb, "Lab", lambda *a, **k: pytest.fail("a lab was touched"))
    with pytest.raises(SystemExit) as e:
        sb.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1]


def test_a_node_lease_given_is_the_labs_for_the_run_and_none_leaves_its_spec() -> None:
    assert sb.lab_spec("dra", None).spec == spec.load("dra").spec
    longer = sb.lab_spec("dra", 240)
    assert longer.spec.fleet_node_lease == 240 and longer.name == "dra"
    assert longer.spec.nodes == spec.load("dra").spec.nodes


def runs() -> list[sb.Run]:
    out = []
    for w, rate in (("claim", 40.0), ("cel", 30.0)):
        for n in (100, 500):
            r = sb.Run(w, n, n * 8, bound=n * 8, pods_per_s=rate * 100 / n, p99_s=n / 100,
                       wall_s=10.0)  # fmt: skip
            r.usage = {"kube-apiserver": sb.Usage(12.0, 900.0)}
            out.append(r)
    return out


def test_the_table_has_a_row_per_run_and_the_plot_is_written(tmp_path: Path) -> None:
    console = Console(record=True, width=100)
    console.print(sb.table(runs()))
    text = console.export_text()
    assert text.count("claim") == 2 and text.count("cel") == 2
    assert "1.20" in text  # the API server's 12 CPU s over a 10 s run
    sb.plot(runs(), tmp_path / "scale.png")
    assert (tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sb.plot(runs(), tmp_path / "beside.png", {"Average": 42.0})  # scheduler_perf's point
    assert (tmp_path / "beside.png").read_bytes() != (tmp_path / "scale.png").read_bytes()
    json.dumps([sb.asdict(r) for r in runs()])  # the JSON the bench writes


def test_a_fleet_that_never_gets_ready_ends_its_labs_curve_and_keeps_the_runs_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5,000 copies on 2 cores once never all got Ready (2026-12-07): the 1,000 row stays, the
    JSON says where it stopped, the run exits 1 with one line, the fleet is deleted."""
    grown, deleted = [], []

    def up(ctx: object, model: str, n: int) -> list[str]:
        grown.append(n)
        if n == 5000:
            raise steps.StepError("KWOK nodes x-0..x-4999: 1127/5000 Ready, none more for 120s")
        return []

    class FakeLab:
        name, ctx, core = "dra", None, None

        def up(self) -> FakeLab:
            return self

    monkeypatch.setattr(sb, "Lab", lambda spec, console: FakeLab())
    monkeypatch.setattr(sb, "model_node", lambda lab: "dra-worker3")
    monkeypatch.setattr(sb, "SETTLE_S", 0)
    monkeypatch.setattr(fleet, "up", up)
    monkeypatch.setattr(fleet, "down", lambda ctx: deleted.append("fleet"))
    monkeypatch.setattr(sb, "delete_namespace", lambda core, ns: None)
    claim = dataclasses.replace(sb.WORKLOADS["claim"], per_node=lambda lab, model: 8)
    monkeypatch.setitem(sb.WORKLOADS, "claim", claim)
    monkeypatch.setattr(sb, "measure", lambda lab, model, n, w, pods, console: sb.Run(
        w.name, n, pods, bound=pods, pods_per_s=10.0, wall_s=1.0))  # fmt: skip
    out = tmp_path / "scale.json"
    code = sb.main(["--nodes", "1000,5000,6000", "--workloads", "claim", "--fill", "0.05",
                    "--no-scheduler-perf", "--out", str(out)])  # fmt: skip
    doc = json.loads(out.read_text())
    assert code == 1 and grown == [1000, 5000] and deleted == ["fleet"]
    assert [(r["workload"], r["nodes"]) for r in doc["runs"]] == [("claim", 1000)]
    assert doc["stopped"] == ["dra at 5000 copies: KWOK nodes x-0..x-4999: 1127/5000 Ready, "
                              "none more for 120s"]  # fmt: skip


def test_scheduler_perfs_throughput_is_read_from_its_data_items() -> None:
    name = f"BenchmarkPerfScheduling/{scheduler_perf.WORKLOAD}/test"
    items = {"version": "v1", "dataItems": [
        {"data": {"Perc50": 0.01}, "unit": "s",
         "labels": {"Metric": "scheduler_e2e", "Name": name}},
        {"data": {"Average": 71.5, "Perc50": 72, "Perc90": 80}, "unit": "pods/s",
         "labels": {"Metric": "SchedulingThroughput", "Name": name}}]}  # fmt: skip
    assert scheduler_perf.throughput(items) == {"Average": 71.5, "Perc50": 72.0, "Perc90": 80.0}
    with pytest.raises(steps.StepError, match="no SchedulingThroughput"):
        scheduler_perf.throughput({"dataItems": items["dataItems"][:1]})


def test_scheduler_perf_runs_its_one_benchmark_and_writes_where_it_was_asked_from_its_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test binary runs in its package's directory: a relative --out (make bench-scale's
    `build/`) reached it as is, and it wrote into the module cache ("no data items"); an
    unanchored -bench also ran BenchmarkPerfSchedulingExperimental."""
    where = tmp_path / "bin"
    (where / "dra").mkdir(parents=True)
    test = where / "dra.test"
    # Go's -bench: each level a regexp *searched* in its name; the stand-in writes its data
    # items to -data-items-dir and says which benchmarks its pattern selects.
    test.write_text(
        textwrap.dedent("""\
        #!/usr/bin/env python3
        import json, os, re, sys
        args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
        levels = args["test.bench"].split("/")
        for name in ("BenchmarkPerfScheduling", "BenchmarkPerfSchedulingExperimental"):
            full = [name, "SchedulingWithResourceClaimTemplate", "5000pods_500nodes"]
            if all(re.search(p, n) for p, n in zip(levels, full)):
                print("ran", name)
        assert os.path.isabs(args["data-items-dir"]) and os.path.isabs(os.environ["ARTIFACTS"])
        item = {"data": {"Average": 30.5}, "labels": {"Metric": "SchedulingThroughput",
                "Name": "SchedulingWithResourceClaimTemplate/5000pods_500nodes/x"}}
        with open(os.path.join(args["data-items-dir"], "BenchmarkPerfScheduling_x.json"), "w") as f:
            json.dump({"dataItems": [item]}, f)
        """)
    )
    test.chmod(0o755)
    monkeypatch.setattr(scheduler_perf, "build", lambda: where)
    monkeypatch.chdir(tmp_path)
    assert scheduler_perf.run(Path("build/scheduler-perf")) == {"Average": 30.5}
    log = (tmp_path / "build/scheduler-perf/scheduler_perf.log").read_text()
    assert log.splitlines() == ["ran BenchmarkPerfScheduling"]


def test_scheduler_perf_is_set_beside_the_claim_run_nearest_its_size() -> None:
    said = sb.beside(runs(), {"Average": 20.0, "Perc50": 21, "Perc90": 25})
    assert "20.0 pods/s on average" in said
    assert "claim workload on 500 KWOK nodes: 8.0 pods/s, 0.40x" in said


def test_bindings_take_each_pods_first_binding_and_go_on_from_the_newest_version() -> None:
    class Core:
        def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
            return type("Resp", (), {"data": b'{"metadata": {"resourceVersion": "9"}}'})

    w = sb.Bindings(Core(), "ns")  # type: ignore[arg-type]
    assert w.version == "9"

    def pod(name: str, node: str | None, rv: str) -> dict:
        return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {"nodeName": node}}

    w.seen({"type": "ADDED", "object": pod("p", None, "10")}, now=1.0)
    w.seen({"type": "MODIFIED", "object": pod("p", "n-1", "11")}, now=2.0)
    w.seen({"type": "MODIFIED", "object": pod("p", "n-1", "12")}, now=3.0)
    assert (w.bound, w.version) == ({"p": (2.0, "n-1")}, "12")
    w.seen({"type": "ERROR", "object": {"kind": "Status", "code": 410}})  # expired
    assert w.version == "9"


def test_closing_a_quiet_watch_ends_its_blocked_read_at_once() -> None:
    """A watch the server keeps open with nothing to say (every pod bound): close() returns
    in well under a second, its thread ended, not when the server ends the watch."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        conn, _ = server.accept()
        held.append(conn)
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")  # then silence

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/"

    class Quiet(sb.RawWatch):
        def list(self, **kw: object) -> Any:
            if not kw.get("watch"):
                return {"metadata": {"resourceVersion": "1"}}
            return urllib3.request("GET", url, preload_content=False)

    w = Quiet()
    w.start()
    while w.resp is None:
        time.sleep(0.01)
    time.sleep(0.2)  # the thread is in its read
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < 1 and not w.is_alive()
    server.close()
    for c in held:
        c.close()
