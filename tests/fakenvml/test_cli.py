"""The `fakenvml` command: init, smi (through nvidia-ml-py), inject, recover, events.

Most tests call cli.main in-process; the few that need a separate process (the real exit
status, `events --follow`) run `python -m fakenvml.cli`. Every refusal must be one stderr
line, exit status 2, and leave the state directory byte-for-byte as it was.
"""

from __future__ import annotations

import json
import os
import re
import select
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fakenvml import cli, library
from fakenvml.node import STATE_DIR_ENV, NodeDir

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "fakenvml" / "inventories"
DGX = EXAMPLES / "dgx-h100.yaml"
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """run(*argv) -> (exit status, stdout, stderr) of cli.main in this process."""
    # smi sets the library's env var; monkeypatch puts the old value back afterwards.
    monkeypatch.setenv(STATE_DIR_ENV, os.environ.get(STATE_DIR_ENV, "/nonexistent"))

    def call(*argv: str | Path) -> tuple[int, str, str]:
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.fixture
def node(tmp_path: Path, run: Run) -> Path:
    """A DGX H100 state directory written by `fakenvml init`."""
    d = tmp_path / "dgx"
    assert run("init", DGX, "--state-dir", d)[0] == 0
    return d


def snapshot(d: Path) -> dict[str, bytes]:
    if not d.exists():
        return {}
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def refused(run: Run, state_dir: Path, match: str, *argv: str | Path) -> str:
    before = snapshot(state_dir)
    code, out, err = run(*argv)
    lines = err.splitlines()
    assert code == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("fakenvml: error: "), err
    assert re.search(match, lines[0]), lines[0]
    assert out == ""
    assert snapshot(state_dir) == before
    return lines[0]


def write(tmp_path: Path, text: str, name: str = "inv.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def child_env(state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            STATE_DIR_ENV: str(state_dir),
            library.LIBRARY_ENV: str(library.path()),
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        }
    )
    return env


def table(out: str) -> list[dict[str, str]]:
    """The rows of `smi`'s plain table, cut at the header's column starts."""
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("GPU  Name"))
    names = re.split(r"\s{2,}", header.strip())
    starts = [header.index(n) for n in names] + [None]
    rows = [line for line in lines[lines.index(header) + 1 :] if line]
    return [
        {n: row[a:b].strip() for n, a, b in zip(names, starts, starts[1:], strict=False)}
        for row in rows
    ]


def uuids(state_dir: Path) -> list[str]:
    return [g.uuid for g in NodeDir(state_dir).node().gpus]


# --------------------------------------------------------------------------- init


def test_init_writes_state_and_journal(tmp_path: Path, run: Run) -> None:
    code, out, err = run("init", DGX, "--state-dir", tmp_path / "n")
    assert (code, err) == (0, "")
    assert out.startswith("node dgx-h100: 8 GPU(s) (NVIDIA H100 80GB HBM3) in ")
    assert sorted(snapshot(tmp_path / "n")) == [
        "journal.bin", "journal.gen", "kern.log", "knobs.bin", "state.bin",
    ]  # fmt: skip


def test_init_defaults_to_the_state_dir_env(
    tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "from-env"))
    assert run("init", EXAMPLES / "t4-2.yaml")[0] == 0
    assert NodeDir(tmp_path / "from-env").node().name == "t4-vm"


def test_init_node_flag_overrides_the_inventory_name(tmp_path: Path, run: Run) -> None:
    assert run("init", DGX, "--state-dir", tmp_path / "n", "--node", "worker-3")[0] == 0
    assert NodeDir(tmp_path / "n").node().name == "worker-3"


def test_init_driver_version_flag_overrides_the_inventorys(tmp_path: Path, run: Run) -> None:
    assert run("init", DGX, "--state-dir", tmp_path / "n", "--driver-version", "535.261.03")[0] == 0
    node = NodeDir(tmp_path / "n").node()
    # The CUDA and NVML versions follow the driver's branch, as with the inventory key.
    assert (node.driver_version, node.nvml_version, node.cuda_driver_version) == (
        "535.261.03",
        "12.535.261.03",
        12020,
    )


def test_init_refuses_a_malformed_driver_version(tmp_path: Path, run: Run) -> None:
    refused(run, tmp_path / "n", r"--driver-version: expected like 535\.261\.03, found '535'",
            "init", DGX, "--state-dir", tmp_path / "n", "--driver-version", "535")  # fmt: skip


def test_reinit_keeps_the_same_uuids(tmp_path: Path, run: Run) -> None:
    run("init", DGX, "--state-dir", tmp_path / "a")
    run("init", DGX, "--state-dir", tmp_path / "b")
    assert uuids(tmp_path / "a") == uuids(tmp_path / "b")


def test_init_of_1024_gpus(tmp_path: Path, run: Run) -> None:
    assert run("init", EXAMPLES / "wide-1024.yaml", "--state-dir", tmp_path / "w")[0] == 0
    assert len(NodeDir(tmp_path / "w").node().gpus) == 1024


# --------------------------------------------------------------------------- inject / recover


def test_inject_xid_prints_seq_and_timestamp(node: Path, run: Run) -> None:
    code, out, _ = run("inject", "xid", "0", "79", "--state-dir", node)
    assert code == 0
    assert re.fullmatch(rf"seq 1 at {ISO}: xid 79 on GPU 0 \({uuids(node)[0]}\)\n", out)


def test_inject_xid_records_gpu_and_compute_instance(node: Path, run: Run) -> None:
    run("inject", "xid", "2", "31", "--gpu-instance", "1", "--compute-instance", "0",
        "--state-dir", node)  # fmt: skip
    (rec,) = NodeDir(node).events()
    assert (rec.gpu, rec.data, rec.gpu_instance, rec.compute_instance) == (2, 31, 1, 0)


def test_inject_ecc_double_with_count_prints_the_error_and_its_xid_48(node: Path, run: Run) -> None:
    code, out, _ = run("inject", "ecc", "1", "--double", "--count", "3", "--state-dir", node)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[0].startswith("seq 1 ") and "ecc-double x3 on GPU 1" in lines[0]
    assert lines[1].startswith("seq 2 ") and "xid 48 on GPU 1" in lines[1]


def test_inject_ecc_double_no_xid_writes_no_xid(node: Path, run: Run) -> None:
    code, out, _ = run("inject", "ecc", "1", "--double", "--no-xid", "--state-dir", node)
    assert code == 0 and out.count("\n") == 1 and "ecc-double x1 on GPU 1" in out
    assert [r.kind.spelling for r in NodeDir(node).events()] == ["ecc-double", "recovery-action"]


def test_inject_ecc_single_defaults_to_one_error(node: Path, run: Run) -> None:
    assert "ecc-single x1 on GPU 4" in run("inject", "ecc", "4", "--single", "--state-dir", node)[1]


def test_faults_get_consecutive_sequence_numbers(node: Path, run: Run) -> None:
    outs = [
        run("inject", "lost", "3", "--state-dir", node)[1],
        run("inject", "fallen-off-bus", "5", "--state-dir", node)[1],
        run("recover", "3", "--state-dir", node)[1],
    ]
    assert [o.split()[1] for o in outs] == ["1", "2", "3"]
    what = [o.split(": ", 1)[1].split(" (")[0] for o in outs]
    assert what == ["lost on GPU 3", "fallen-off-bus on GPU 5", "recover on GPU 3"]


def test_inject_accepts_a_uuid_or_a_bus_id(node: Path, run: Run) -> None:
    bus = NodeDir(node).node().gpus[6].bus_id
    assert "on GPU 7" in run("inject", "lost", uuids(node)[7], "--state-dir", node)[1]
    assert "on GPU 6" in run("inject", "lost", bus.lower(), "--state-dir", node)[1]


# --------------------------------------------------------------------------- events


def test_events_lists_the_journal_in_order(node: Path, run: Run) -> None:
    run("inject", "xid", "0", "43", "--state-dir", node)
    run("inject", "lost", "1", "--state-dir", node)
    code, out, _ = run("events", "--state-dir", node)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert re.fullmatch(rf"\s+1  {ISO}  GPU 0     xid 43", lines[0])
    assert lines[1].split()[-1] == "lost"


def test_events_since_skips_earlier_events(node: Path, run: Run) -> None:
    for code in ("13", "31", "43"):
        run("inject", "xid", "0", code, "--state-dir", node)
    out = run("events", "--since", "2", "--state-dir", node)[1]
    assert [line.split()[0] for line in out.splitlines()] == ["3"]


def test_events_json_is_one_object_per_line(node: Path, run: Run) -> None:
    run("inject", "xid", "4", "31", "--state-dir", node)
    run("inject", "ecc", "4", "--double", "--state-dir", node)
    out = run("events", "--json", "--state-dir", node)[1]
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["seq"], r["kind"], r["gpu"], r["data"]) for r in records] == [
        (1, "xid", 4, 31),
        (2, "ecc-double", 4, 1),
        (3, "xid", 4, 48),  # as the driver logs every uncorrectable ECC error
        (4, "recovery-action", 4, 1),  # the driver then asks for a GPU reset
    ]
    assert records[0]["uuid"] == uuids(node)[4] and records[0]["gpu_instance"] is None
    assert records[1]["monotonic_ns"] > records[0]["monotonic_ns"]


def test_events_of_a_fresh_node_prints_nothing(node: Path, run: Run) -> None:
    assert run("events", "--state-dir", node) == (0, "", "")


def test_events_follow_prints_events_as_they_are_injected(node: Path, run: Run) -> None:
    run("inject", "xid", "0", "13", "--state-dir", node)
    child = _follow(node)
    try:
        assert "xid 13" in _line(child)
        run("inject", "xid", "1", "79", "--state-dir", node)
        assert "GPU 1     xid 79" in _line(child)
    finally:
        child.terminate()
        child.wait(timeout=10)


def test_events_follow_exits_cleanly_on_sigterm(node: Path, run: Run) -> None:
    """A stop asks with SIGTERM: the follower exits 0 (the default action would leave -15;
    as a pod's PID 1, with no handler, it would not exit at all)."""
    child = _follow(node)
    try:
        run("inject", "xid", "0", "13", "--state-dir", node)
        assert "xid 13" in _line(child)  # following, so its handler is in place
        child.terminate()
        assert child.wait(timeout=10) == 0
    finally:
        child.kill()
        child.wait()


def _follow(node: Path) -> subprocess.Popen[str]:
    """`fakenvml events --follow` on `node`, its output read line by line (_line)."""
    return subprocess.Popen(
        [sys.executable, "-m", "fakenvml.cli", "events", "--follow", "--state-dir", str(node)],
        stdout=subprocess.PIPE, text=True, env=child_env(node),
    )  # fmt: skip


def _line(child: subprocess.Popen[str], timeout: float = 10) -> str:
    assert child.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([child.stdout], [], [], 0.1)
        if ready:
            return child.stdout.readline()
    raise AssertionError(f"no event line from `events --follow` within {timeout}s")


# --------------------------------------------------------------------------- smi


def test_smi_table_shows_every_gpu(node: Path, run: Run) -> None:
    code, out, err = run("smi", "--state-dir", node)
    lines = out.splitlines()
    assert (code, err) == (0, "")
    assert lines[0].startswith("FAKENVML-SMI  Driver Version: 580.95.05")
    assert "CUDA Version: 13.0" in lines[0]
    rows = table(out)
    assert len(rows) == 8
    assert rows[0] == {
        "GPU": "0",
        "Name": "NVIDIA H100 80GB HBM3",
        "Persist-M": "On",
        "Bus-Id": "00000100:01:00.0",
        "Fan": "N/A",
        "Temp": "46C",
        "Perf": "P0",
        "Pwr:Usage/Cap": "72W / 700W",
        "Memory-Usage": "0MiB / 81559MiB",
        "GPU-Util": "0%",
        "Uncorr. ECC": "0",
        "Compute M.": "Default",
        "MIG M.": "Disabled",
    }


def test_smi_list_prints_each_uuid(node: Path, run: Run) -> None:
    out = run("smi", "-L", "--state-dir", node)[1]
    expected = [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {u})" for i, u in enumerate(uuids(node))]
    assert out.splitlines() == expected


def test_smi_into_a_reader_that_leaves_ends_quietly(tmp_path: Path, run: Run) -> None:
    # A 1024-GPU table is far more than a pipe holds: a write meets the closed pipe.
    big = tmp_path / "w"
    assert run("init", EXAMPLES / "wide-1024.yaml", "--state-dir", big)[0] == 0
    smi = f"{sys.executable} -m fakenvml smi --state-dir {big} | head -1"
    out = subprocess.run(smi, shell=True, env=child_env(big), capture_output=True, text=True)
    assert out.stdout.strip()
    assert out.stderr == ""


def test_smi_query_shows_details_and_nvswitch_topology(node: Path, run: Run) -> None:
    out = run("smi", "-q", "-i", "0", "--state-dir", node)[1]
    for expected in [
        r"Product Name\s+: NVIDIA H100 80GB HBM3",
        r"Product Architecture\s+: Hopper",
        r"Device Id\s+: 0x233010DE",
        r"NUMA Node\s+: 0",
        r"CPU Affinity\s+: 0-111",
        r"GPU Shutdown Temp\s+: 95 C",
        r"Max Clocks\n\s+Graphics\s+: 1980 MHz",
        r"NVLink\s+: 18 links, nvmlNvlinkVersion 6",
        r"GPU 7\s+: NV18",
    ]:
        assert re.search(expected, out), expected


def test_smi_query_shows_pcie_relations_without_nvlink(tmp_path: Path, run: Run) -> None:
    run("init", EXAMPLES / "a100-8-nvlink-groups.yaml", "--state-dir", tmp_path / "a")
    out = run("smi", "-q", "-i", "0", "--state-dir", tmp_path / "a")[1]
    assert re.search(r"GPU 3\s+: NV4", out)
    assert re.search(r"GPU 4\s+: SYS", out)  # the other quad, on the other socket


def test_smi_marks_a_lost_gpu_and_recovers_it(node: Path, run: Run) -> None:
    run("inject", "lost", "3", "--state-dir", node)
    row = table(run("smi", "--state-dir", node)[1])[3]
    assert (row["Name"], row["Bus-Id"], row["Temp"]) == ("GPU is lost", "ERR!", "ERR!")
    assert "GPU 3: [GPU is lost]" in run("smi", "-L", "--state-dir", node)[1]
    run("recover", "3", "--state-dir", node)
    assert "GPU 3: NVIDIA H100 80GB HBM3" in run("smi", "-L", "--state-dir", node)[1]


def test_smi_counts_injected_double_bit_errors(node: Path, run: Run) -> None:
    run("inject", "ecc", "2", "--double", "--count", "3", "--state-dir", node)
    rows = table(run("smi", "--state-dir", node)[1])
    assert [r["Uncorr. ECC"] for r in rows[:3]] == ["0", "0", "3"]


def test_smi_selects_a_gpu_by_uuid(node: Path, run: Run) -> None:
    out = run("smi", "-L", "-i", uuids(node)[5], "--state-dir", node)[1]
    assert out == f"GPU 5: NVIDIA H100 80GB HBM3 (UUID: {uuids(node)[5]})\n"


def test_smi_shows_fans_only_on_boards_that_have_them(tmp_path: Path, run: Run) -> None:
    run("init", EXAMPLES / "mixed-explicit.yaml", "--state-dir", tmp_path / "m")
    rows = table(run("smi", "--state-dir", tmp_path / "m")[1])
    assert [r["Fan"] for r in rows] == ["N/A", "N/A", "0%", "30%", "30%"]


def test_smi_draws_a_rich_table_on_a_terminal(
    node: Path, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    out = run("smi", "--state-dir", node)[1]
    assert "───" in out and "NVIDIA H100 80GB HBM3" in out


def test_smi_runs_as_its_own_process(node: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fakenvml.cli", "smi", "-L"],
        capture_output=True,
        text=True,
        env=child_env(node),
        timeout=60,
    )
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 8, done.stderr


# --------------------------------------------------------------------------- refusals


def test_unknown_gpu_is_refused(node: Path, run: Run) -> None:
    refused(run, node, r"GPU '9' not in inventory .*0-7", "inject", "xid", "9", "79",
            "--state-dir", node)  # fmt: skip


def test_unknown_gpu_uuid_is_refused(node: Path, run: Run) -> None:
    refused(run, node, "not in inventory", "inject", "lost", "GPU-nope", "--state-dir", node)


def test_recover_of_an_unknown_gpu_is_refused(node: Path, run: Run) -> None:
    refused(run, node, "GPU '8' not in inventory", "recover", "8", "--state-dir", node)


def test_unknown_profile_is_refused(node: Path, run: Run, tmp_path: Path) -> None:
    inv = write(tmp_path, "gpus: [{profile: H900, count: 8}]\n")
    refused(run, node, r"unknown profile 'H900' \(known: A100-SXM4-40GB, ", "init", inv,
            "--state-dir", node)  # fmt: skip


def test_malformed_yaml_is_refused(node: Path, run: Run, tmp_path: Path) -> None:
    inv = write(tmp_path, "gpus: [{profile: T4\n")
    refused(run, node, r"inv\.yaml: not valid YAML at line \d+", "init", inv, "--state-dir", node)


def test_count_zero_is_refused(node: Path, run: Run, tmp_path: Path) -> None:
    inv = write(tmp_path, "gpus: [{profile: T4, count: 0}]\n")
    refused(run, node, r"count: expected a number >= 1, found 0", "init", inv, "--state-dir", node)


def test_duplicate_uuids_are_refused(node: Path, run: Run, tmp_path: Path) -> None:
    u = "GPU-12345678-1234-1234-1234-123456789abc"
    inv = write(tmp_path, f"gpus: [{{profile: T4, uuid: {u}}}, {{profile: T4, uuid: {u}}}]\n")
    refused(run, node, "GPU 0 and GPU 1 have the same uuid", "init", inv, "--state-dir", node)


def test_duplicate_bus_ids_are_refused(node: Path, run: Run, tmp_path: Path) -> None:
    inv = write(tmp_path, "gpus:\n- {profile: T4, bus_id: '0000:3b:00.0'}\n"
                          "- {profile: T4, bus_id: '0000:3b:00.0'}\n")  # fmt: skip
    refused(run, node, "same PCI bus id", "init", inv, "--state-dir", node)


def test_nvlink_group_with_a_missing_gpu_is_refused(node: Path, run: Run, tmp_path: Path) -> None:
    inv = write(tmp_path, "gpus: [{profile: A100-SXM4-80GB, count: 4}]\n"
                          "topology: {nvlink: {groups: [[0, 1, 2, 4]]}}\n")  # fmt: skip
    refused(run, node, r"groups\[0\]: GPU 4 does not exist \(indexes 0-3\)", "init", inv,
            "--state-dir", node)  # fmt: skip


def test_unknown_inventory_key_is_refused(node: Path, run: Run, tmp_path: Path) -> None:
    inv = write(tmp_path, "gpus: [{profile: T4}]\ntopolgy: {}\n")
    refused(run, node, r"topolgy: unknown key \(expected one of: ", "init", inv,
            "--state-dir", node)  # fmt: skip


def test_missing_inventory_file_is_refused(node: Path, run: Run, tmp_path: Path) -> None:
    refused(run, node, "no inventory file", "init", tmp_path / "missing.yaml", "--state-dir", node)


def test_unwritable_state_dir_is_refused(tmp_path: Path, run: Run) -> None:
    blocker = write(tmp_path, "a file, not a directory", name="blocker")
    refused(run, tmp_path, "cannot write state to", "init", DGX, "--state-dir", blocker / "n")


def test_xid_zero_is_refused(node: Path, run: Run) -> None:
    refused(run, node, "CODE: expected a number >= 1, found 0", "inject", "xid", "0", "0",
            "--state-dir", node)  # fmt: skip


def test_non_numeric_xid_is_refused(node: Path, run: Run) -> None:
    refused(run, node, "CODE: expected a number, found 'abc'", "inject", "xid", "0", "abc",
            "--state-dir", node)  # fmt: skip


def test_ecc_without_single_or_double_is_refused(node: Path, run: Run) -> None:
    refused(run, node, "one of the arguments --single --double is required", "inject", "ecc",
            "0", "--state-dir", node)  # fmt: skip


def test_no_xid_on_a_single_bit_error_is_refused(node: Path, run: Run) -> None:
    refused(run, node, r"--no-xid: only with --double \(a single-bit error has no Xid\)",
            "inject", "ecc", "0", "--single", "--no-xid", "--state-dir", node)  # fmt: skip


def test_unknown_fault_is_refused(node: Path, run: Run) -> None:
    refused(run, node, "invalid choice: 'melt'", "inject", "melt", "0", "--state-dir", node)


def test_missing_command_is_refused(node: Path, run: Run) -> None:
    refused(run, node, "the following arguments are required: COMMAND")


def test_inject_without_state_is_refused(tmp_path: Path, run: Run) -> None:
    refused(run, tmp_path, "run `fakenvml init` first", "inject", "lost", "0",
            "--state-dir", tmp_path)  # fmt: skip


def test_events_without_state_is_refused(tmp_path: Path, run: Run) -> None:
    refused(run, tmp_path, "run `fakenvml init` first", "events", "--state-dir", tmp_path)


def test_smi_without_state_is_refused(tmp_path: Path, run: Run) -> None:
    refused(run, tmp_path, "no state in .*run `fakenvml init` first", "smi",
            "--state-dir", tmp_path)  # fmt: skip


def test_smi_of_an_unknown_gpu_is_refused(node: Path, run: Run) -> None:
    refused(run, node, r"GPU '12' not found \(indexes 0-7", "smi", "-i", "12", "--state-dir", node)


def test_refusal_exits_2_with_one_line_from_a_real_process(node: Path) -> None:
    before = snapshot(node)
    done = subprocess.run(
        [sys.executable, "-m", "fakenvml.cli", "inject", "xid", "9", "79"],
        capture_output=True,
        text=True,
        env=child_env(node),
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("fakenvml: error: GPU '9' not in inventory")
    assert snapshot(node) == before


def test_init_if_absent_keeps_an_existing_state(node: Path, run: Run) -> None:
    before = (node / "state.bin").read_bytes()
    code, out, _ = run("init", DGX, "--if-absent", "--state-dir", node)
    assert code == 0 and "kept" in out
    assert (node / "state.bin").read_bytes() == before


def test_init_if_unchanged_keeps_a_state_from_the_same_inventory_only(
    tmp_path: Path, run: Run
) -> None:
    """The fake-gpus chart's DaemonSet: a restarted pod keeps the state (and the journal
    every NVML client has open); a changed inventory or driver version writes a new one."""
    inv, d = tmp_path / "pool.yaml", tmp_path / "state"
    inv.write_text("gpus: [{profile: T4, count: 2}]\n")
    args = ("init", inv, "--node", "n1", "--if-unchanged", "--state-dir", d)
    assert run(*args)[0] == 0
    first = snapshot(d)
    assert run("inject", "xid", "0", "79", "--state-dir", d)[0] == 0  # a fault: not a change
    faulted = snapshot(d)
    code, out, _ = run(*args)
    assert code == 0 and "kept" in out
    assert snapshot(d) == faulted
    inv.write_text("gpus: [{profile: T4, count: 3}]\n")
    code, out, _ = run(*args)
    assert code == 0 and "3 GPU(s)" in out
    assert snapshot(d)["state.bin"] != first["state.bin"]
    code, out, _ = run(*args, "--driver-version", "535.261.03")
    assert code == 0 and "kept" not in out
    # A state written without a digest (by --if-absent, a lab host) is written anew.
    assert run("init", inv, "--state-dir", tmp_path / "other")[0] == 0
    code, out, _ = run("init", inv, "--if-unchanged", "--state-dir", tmp_path / "other")
    assert code == 0 and "kept" not in out


def test_init_if_absent_and_if_unchanged_exclude_each_other(tmp_path: Path, run: Run) -> None:
    refused(run, tmp_path / "s", "not allowed with", "init", DGX, "--if-absent",
            "--if-unchanged", "--state-dir", tmp_path / "s")  # fmt: skip


def test_install_driver_places_the_library_in_a_driver_root(tmp_path: Path, run: Run) -> None:
    code, out, _ = run("install-driver", tmp_path / "driver")
    lib = tmp_path / "driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    assert code == 0 and str(lib) in out
    assert lib.read_bytes()[:4] == b"\x7fELF"
    assert (lib.parent / "libnvidia-ml.so").resolve() == lib.resolve()


def test_install_driver_into_an_unwritable_place_is_refused(tmp_path: Path, run: Run) -> None:
    blocker = write(tmp_path, "not a directory", name="blocker")
    code, _, err = run("install-driver", blocker / "driver")
    assert code == 2 and err.count("\n") == 1 and "cannot install the library" in err


def busybox(tmp_path: Path) -> Path:
    """Debian's static busybox, from the package `make infra` downloaded (the gpulab
    image's /usr/bin/busybox, which the fake-gpus chart installs as the root's modprobe)."""
    from clusters import built

    debs = sorted((built.cache_dir() / "images" / "busybox").glob("busybox-static_*.deb"))
    assert debs, "no busybox-static .deb in the gpulab cache: run `make infra`"
    subprocess.run(["dpkg-deb", "-x", debs[-1], tmp_path / "deb"], check=True)
    return tmp_path / "deb" / "bin" / "busybox"


def test_install_driver_gives_the_root_a_modprobe_that_finds_the_driver_loaded(
    tmp_path: Path, node: Path, run: Run
) -> None:
    """The GPU Operator's validator runs `chroot <root> /sbin/modprobe nvidia` (and
    nvidia-uvm, nvidia-modeset): loaded modules answer 0, an unloaded one fails."""
    root = tmp_path / "driver"
    code, _, err = run("install-driver", root, "--state-dir", node, "--modprobe",
                       busybox(tmp_path))  # fmt: skip
    assert code == 0, err
    assert os.access(root / "sbin/modprobe", os.X_OK)
    assert stat.S_ISCHR((root / "dev/nvidia-modeset").stat().st_mode)

    def modprobe(module: str) -> int:
        return subprocess.run(["chroot", root, "/sbin/modprobe", module],
                              capture_output=True).returncode  # fmt: skip

    assert [modprobe(m) for m in ("nvidia", "nvidia-uvm", "nvidia-modeset")] == [0, 0, 0]
    modules = root / "proc/modules"
    modules.write_text("".join(ln for ln in modules.read_text().splitlines(keepends=True)
                               if not ln.startswith("nvidia_uvm ")))  # fmt: skip
    assert modprobe("nvidia-uvm") != 0  # not loaded: busybox tries to insert it, and cannot


def test_install_driver_refuses_a_modprobe_that_is_no_program(tmp_path: Path, run: Run) -> None:
    code, _, err = run("install-driver", tmp_path / "driver", "--modprobe", tmp_path / "none")
    assert code == 2 and err.count("\n") == 1 and "--modprobe" in err
    assert not (tmp_path / "driver").exists()


def test_faulted_lists_the_gpus_not_recovered_since_their_last_fault(node: Path) -> None:
    d = NodeDir(node)
    assert d.faulted() == set()
    d.inject_xid(1, 79)
    d.inject_ecc(2, double=False)
    d.lose(3)
    d.recover(2)
    d.recover(3)
    d.fall_off_bus(3)
    assert d.faulted() == {1, 3}


def test_install_driver_lists_the_mig_capability_minors_as_the_driver_does(
    tmp_path: Path, node: Path, run: Run
) -> None:
    code, _, err = run("install-driver", tmp_path / "driver", "--state-dir", node)
    assert code == 0, err
    lines = (tmp_path / "driver/proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    # The lines NVIDIA's MIG user guide prints, first and last, and the plugin's parse of
    # them: each minor names a GPU instance's, then its 8 compute instances' capability.
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert lines[-1] == "gpu31/gi14/ci7/access 4322"
    minors = dict(reversed(line.rsplit(" ", 1)) for line in lines)
    assert minors["439"] == "gpu3/gi3/ci3/access" and minors["918"] == "gpu6/gi11/ci5/access"
    assert len(set(minors)) == len(lines)


def test_install_driver_makes_the_mig_capability_nodes(
    tmp_path: Path, node: Path, run: Run
) -> None:
    """/dev/nvidia-caps as nvidia-modprobe leaves it on a MIG host: config, monitor and an
    access node per possible instance, numbered as mig-minors lists them."""
    code, _, err = run("install-driver", tmp_path / "driver", "--state-dir", node)
    assert code == 0, err
    caps = tmp_path / "driver/dev/nvidia-caps"
    st = (caps / "nvidia-cap439").stat()  # gpu3/gi3/ci3/access
    assert stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == 439
    assert os.major(st.st_rdev) == os.major((caps / "nvidia-cap1").stat().st_rdev)
    assert len(list(caps.iterdir())) == 2 + 8 * 15 * 9  # 8 GPUs, 15 GIs, GI + 8 CIs each
    t4 = tmp_path / "t4.yaml"
    t4.write_text("node: t4\ngpus: [{profile: T4, count: 1}]\n")
    assert run("init", t4, "--state-dir", tmp_path / "t4")[0] == 0
    assert run("install-driver", tmp_path / "driver", "--state-dir", tmp_path / "t4")[0] == 0
    assert list(caps.iterdir()) == []  # no MIG-capable GPU: the old nodes are gone


def test_install_driver_writes_the_mig_capability_files_of_procfs(
    tmp_path: Path, node: Path, run: Run
) -> None:
    """proc/driver/nvidia/capabilities as a MIG host's procfs has it, where NVIDIA's DRA
    driver reads a MIG device's two access files when it prepares a claim: the same minors
    as mig-minors, mode 0444 (0400 for mig/config) in decimal, Modify 1."""
    code, _, err = run("install-driver", tmp_path / "driver", "--state-dir", node)
    assert code == 0, err
    caps = tmp_path / "driver/proc/driver/nvidia/capabilities"
    assert (caps / "gpu3/mig/gi3/ci3/access").read_text() == (
        "DeviceFileMinor: 439\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    )
    assert (caps / "gpu0/mig/gi0/access").read_text().startswith("DeviceFileMinor: 3\n")
    assert (caps / "mig/config").read_text().splitlines()[:2] == [
        "DeviceFileMinor: 1",
        "DeviceFileMode: 256",
    ]
    assert (caps / "mig/monitor").read_text().splitlines()[0] == "DeviceFileMinor: 2"
    files = [p for p in caps.rglob("*") if p.is_file()]
    assert len(files) == 2 + 8 * 15 * 9  # 8 GPUs, 15 GIs, GI + 8 CIs each
    t4 = tmp_path / "t4.yaml"
    t4.write_text("node: t4\ngpus: [{profile: T4, count: 1}]\n")
    assert run("init", t4, "--state-dir", tmp_path / "t4")[0] == 0
    assert run("install-driver", tmp_path / "driver", "--state-dir", tmp_path / "t4")[0] == 0
    assert list(caps.rglob("*")) == []  # no MIG-capable GPU: nothing left


def test_install_driver_lists_the_drivers_majors_in_proc_devices(
    tmp_path: Path, node: Path, run: Run
) -> None:
    """proc/devices: the kernel's list with nvidia (195), nvidia-uvm and nvidia-caps among
    the character devices, what NVIDIA's DRA driver reads the nvidia-caps major from."""
    code, _, err = run("install-driver", tmp_path / "driver", "--state-dir", node)
    assert code == 0, err
    text = (tmp_path / "driver/proc/devices").read_text()
    chars, block = text.split("\n\nBlock devices:\n")
    lines = chars.splitlines()
    assert lines[0] == "Character devices:"
    majors = [int(line.split()[0]) for line in lines[1:]]
    assert majors == sorted(majors)
    assert {"195 nvidia", "508 nvidia-caps", "509 nvidia-uvm"} <= set(lines)
    caps = re.search(r"(?s)Character devices:.*?([0-9]+) nvidia-caps\n.*Block devices:", text)
    assert caps and caps[1] == "508"  # the DRA driver's own pattern
    assert "nvidia" not in block


def test_install_driver_keeps_the_kernels_pci_tree_one_root_complex_per_host_bridge(
    tmp_path: Path, node: Path, run: Run
) -> None:
    """sys/devices: each GPU where the kernel keeps it, under its root complex, with the
    same files as the flat sys/bus/pci/devices view; GPUs share a root complex exactly when
    the fake's topology puts them behind one host bridge (NVML_TOPOLOGY_HOSTBRIDGE)."""
    code, _, err = run("install-driver", tmp_path / "driver", "--state-dir", node)
    assert code == 0, err
    sysfs = tmp_path / "driver/sys"
    gpus = NodeDir(node).node().gpus
    root_of = {}
    for gpu in gpus:
        bus_id = gpu.bus_id.lower()[4:]  # sysfs: 4-digit domain
        (leaf,) = (sysfs / "devices").glob(f"pci*/*/{bus_id}")
        flat = sysfs / "bus/pci/devices" / bus_id
        assert sorted(p.name for p in leaf.iterdir()) == sorted(p.name for p in flat.iterdir())
        assert (leaf / "numa_node").read_text() == f"{gpu.numa_node}\n"
        root, port = leaf.relative_to(sysfs / "devices").parts[:2]
        assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", root) and port.startswith(root[3:])
        root_of[gpu.index] = root
    by_bridge = {g.index: g.host_bridge for g in gpus}
    assert len(set(root_of.values())) == len(set(by_bridge.values())) == 2  # two sockets
    assert all((root_of[a] == root_of[b]) == (by_bridge[a] == by_bridge[b])
               for a in root_of for b in root_of)  # fmt: skip
    # A state with fewer GPUs: the tree loses the rest.
    one = tmp_path / "one"
    (tmp_path / "one.yaml").write_text("gpus: [{profile: H100-SXM5-80GB}]\n")
    assert run("init", tmp_path / "one.yaml", "--node", "n", "--state-dir", one)[0] == 0
    assert run("install-driver", tmp_path / "driver", "--state-dir", one)[0] == 0
    leaves = [p.parent for p in (sysfs / "devices").rglob("vendor")]
    assert len(leaves) == 1 and len(list((sysfs / "devices").iterdir())) == 1


def test_proc_devices_names_the_gpu_device_and_imex_channels_as_the_drivers_branch_does() -> None:
    from fakenvml import driver, inventory

    kernel = "Character devices:\n  1 mem\n203 cpu/cpuid\n\nBlock devices:\n  7 loop\n"
    old = inventory.from_dict({"gpus": [{"profile": "T4"}], "driver_version": "535.104.05"}, "a")
    new = inventory.from_dict({"gpus": [{"profile": "T4"}], "driver_version": "550.54.15"}, "b")
    assert driver.proc_devices(old, kernel) == (
        "Character devices:\n  1 mem\n195 nvidia-frontend\n203 cpu/cpuid\n508 nvidia-caps\n"
        "509 nvidia-uvm\n\nBlock devices:\n  7 loop\n"
    )
    assert "\n195 nvidia\n203 cpu/cpuid\n" in driver.proc_devices(new, kernel)
    # IMEX channels (R550 on): what NVIDIA's DRA driver's compute-domain plugin looks up.
    assert "\n507 nvidia-caps-imex-channels\n508 nvidia-caps\n" in driver.proc_devices(new, kernel)
    # Installed again over its own output: the same list, no second copy.
    once = driver.proc_devices(new, kernel)
    assert driver.proc_devices(new, once) == once


def test_mig_from_the_command_line_as_nvidia_smi_mig(node: Path, run: Run) -> None:
    s = ("--state-dir", node)
    assert run("mig", "enable", "1", *s)[0] == 0
    code, _, err = run("mig", "create-gi", "1", "3g.40gb", *s)
    assert code == 2 and err.startswith("fakenvml: error: MIG is not enabled on GPU 1")
    assert run("reset", "1", *s)[0] == 0
    code, out, _ = run("mig", "create-gi", "1", "3g.40gb", "--placement", "4", "-C", *s)
    assert code == 0 and "GPU instance 2 on GPU 1, compute instance 0" in out
    before = snapshot(node)
    code, _, err = run("mig", "create-gi", "1", "7g.80gb", *s)  # overlaps slices 4-7
    assert code == 2 and err.count("\n") == 1 and snapshot(node) == before
    assert run("mig", "apply", "0", "all-1g.10gb", *s)[0] == 0
    code, out, _ = run("mig", "list", "--json", *s)
    devices = [json.loads(line) for line in out.splitlines()]
    assert [(d["gpu"], d["profile"]) for d in devices] == [(0, "1g.10gb")] * 7 + [(1, "3g.40gb")]
    assert run("mig", "destroy-gi", "1", "2", *s)[0] == 0
    assert len(run("mig", "list", "--json", *s)[1].splitlines()) == 7


def test_the_injection_path_loads_no_yaml_or_pydantic(node: Path) -> None:
    """`fakenvml inject|set|fail|delay|mig` start fast: the YAML and pydantic stack
    (hundreds of ms) is imported only by commands that read YAML (init). Timing lives in
    `make bench`; this guards the imports that made it slow."""
    code = (
        "import sys; from fakenvml.cli import main; "
        f"rc = main(['inject', 'xid', '0', '79', '--state-dir', {str(node)!r}]); "
        "rc |= main(['set', '0', 'temperature=80', '--state-dir', " + repr(str(node)) + "]); "
        "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'yaml', 'pydantic'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.stdout.split("\n")[-2] == "0 []", done.stdout + done.stderr


def test_inject_loads_neither_the_model_nor_dataclasses_nor_typing(node: Path) -> None:
    """What took `inject` from 58 to 36 ms (docs/benchmarks.md, "Injection that starts
    fast"): the dataclasses stack (inspect, ast, dis), typing and the model stay
    unimported; inject reads only the GPUs' names from the state."""
    heavy = {"dataclasses", "typing", "inspect", "fakenvml.model", "yaml", "pydantic"}
    code = (
        "import sys; from fakenvml.cli import main; "
        f"rc = main(['inject', 'xid', '0', '79', '--state-dir', {str(node)!r}]); "
        f"print(rc, sorted(set(sys.modules) & {heavy!r}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.stdout.split("\n")[-2] == "0 []", done.stdout + done.stderr


def test_install_driver_adds_the_driver_programs_as_regular_files(tmp_path: Path, run: Run) -> None:
    progs = [write(tmp_path, f"#!/bin/sh\necho {n}\n", name=n)
             for n in ("nvidia-smi", "nvidia-cuda-mps-control")]  # fmt: skip
    for p in progs:
        p.chmod(0o755)
    code, out, err = run("install-driver", tmp_path / "driver",
                         *(a for p in progs for a in ("--bin", p)))  # fmt: skip
    assert code == 0, err
    for p in progs:
        got = tmp_path / "driver/usr/bin" / p.name
        assert str(got) in out and got.is_file() and not got.is_symlink()
        assert got.read_bytes() == p.read_bytes() and os.access(got, os.X_OK)


def test_install_driver_refuses_a_missing_program_and_installs_nothing(
    tmp_path: Path, run: Run
) -> None:
    smi = write(tmp_path, "#!/bin/sh\n", name="nvidia-smi")
    smi.chmod(0o755)
    code, _, err = run("install-driver", tmp_path / "driver", "--bin", smi,
                       "--bin", tmp_path / "none")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "--bin" in err and "none" in err
    assert not (tmp_path / "driver").exists()


def test_install_driver_dev_makes_the_gpus_device_nodes_in_the_nodes_own_dev(
    tmp_path: Path, node: Path, run: Run
) -> None:
    """`--dev`: the same character devices a driver install leaves in the node's /dev
    (c 195:<minor> per GPU, nvidiactl 195:255, nvidia-uvm), which device-spec plugins name
    as host paths; a stale GPU's node is removed, other files are kept."""
    dev = tmp_path / "node-dev"
    dev.mkdir()
    (dev / "null-ish").write_text("not ours")
    code, out, err = run("install-driver", tmp_path / "driver", "--state-dir", node,
                         "--dev", dev)  # fmt: skip
    assert code == 0, err
    assert f"device nodes in {dev}: " in out
    for name, (major, minor) in {"nvidia0": (195, 0), "nvidia7": (195, 7),
                                 "nvidiactl": (195, 255)}.items():  # fmt: skip
        st = (dev / name).stat()
        assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == major, name
        assert os.minor(st.st_rdev) == minor, name
    assert (dev / "nvidia-uvm").exists() and (dev / "nvidia-caps").is_dir()
    assert not (dev / "nvidia8").exists() and (dev / "null-ish").read_text() == "not ours"


def test_install_driver_dev_leaves_a_real_drivers_dev_alone(tmp_path: Path, node: Path) -> None:
    from fakenvml import driver
    from fakenvml.node import NodeDir

    version = tmp_path / "proc-driver-nvidia-version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    made, why = driver.node_device_nodes(dev, NodeDir(node).node(), real_driver=version)
    assert made == [] and "a real NVIDIA driver is loaded" in why
    assert list(dev.iterdir()) == []


def test_install_driver_dev_that_is_no_directory_is_one_line(
    tmp_path: Path, node: Path, run: Run
) -> None:
    code, out, _ = run("install-driver", tmp_path / "driver", "--state-dir", node,
                       "--dev", tmp_path / "missing")  # fmt: skip
    assert code == 0 and f"no device nodes in {tmp_path / 'missing'}: " in out
    assert "is not a directory" in out
