"""Each Xid the fake driver raises is in its node's kernel log once, in the driver's words and
rsyslog's format (fakenvml/kernlog.py), whichever way it was injected."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from fakenvml import kernlog
from fakenvml.errors import FakeNvmlError
from fakenvml.node import NodeDir

from .conftest import build_node, subprocess_env

# node-problem-detector's kernel-monitor-filelog.json (its pluginConfig): a timestamp of
# the first 15 characters in Go's "Jan _2 15:04:05", the message after the uptime.
NPD_TIMESTAMP, NPD_MESSAGE = re.compile(r"^.{15}"), re.compile(r"kernel: \[.*\] (.*)")
DRIVER = re.compile(r"^NVRM: Xid \(PCI:([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\): (\d+), "
                    r"pid='<unknown>', name=<unknown>(, (.*))?$")  # fmt: skip


def log_lines(d: NodeDir) -> list[str]:
    return (d.path / kernlog.KERNEL_LOG_FILE).read_text().splitlines()


def parsed(text: str) -> tuple[datetime, str, str, int, str | None]:
    """(time, host, PCI, code, text) as a filelog monitor reads one line."""
    stamp = NPD_TIMESTAMP.match(text)
    message = NPD_MESSAGE.search(text)
    assert stamp and message, text
    when = datetime.strptime(f"{datetime.now().year} {stamp.group(0)}", "%Y %b %d %H:%M:%S")
    driver = DRIVER.match(message.group(1))
    assert driver, message.group(1)
    return when, text.split()[3], driver.group(1), int(driver.group(2)), driver.group(4)


def test_init_leaves_an_empty_log_for_a_monitor_to_follow(state: NodeDir) -> None:
    assert log_lines(state) == []


def test_an_xid_is_one_line_with_the_gpus_bus_and_the_nodes_name(state: NodeDir) -> None:
    before = datetime.now().replace(microsecond=0)
    state.inject_xid(3, 79)
    (text,) = log_lines(state)
    when, host, pci, code, what = parsed(text)
    gpu = state.resolve(3)
    assert (host, code, what) == ("node-a", 79, "GPU has fallen off the bus.")
    assert pci == gpu.bus_id[4:-2].lower()  # "00000000:3B:00.0" -> "0000:3b:00"
    assert before <= when <= datetime.now()
    uptime = float(re.search(r"\[\s*(\d+\.\d{6})\]", text).group(1))  # type: ignore[union-attr]
    assert abs(uptime - time.monotonic()) < 5


@pytest.mark.parametrize(
    ("fault", "args", "codes"),
    [
        ("xid", {"code": 13}, [13]),
        ("xid", {"code": 31, "gpu_instance": 1, "compute_instance": 0}, [31]),
        ("fallen-off-bus", {}, [79]),
        ("ecc", {"double": True}, [48]),  # the driver's Xid 48, once
        ("ecc", {"double": True, "xid": False}, []),
        ("ecc", {"double": False}, []),
        ("lost", {}, []),  # NVML answers GPU_IS_LOST; the driver printed no Xid
        ("recover", {}, []),
    ],
)
def test_the_driver_prints_an_xid_only_for_the_faults_that_raise_one(
    state: NodeDir, fault: str, args: dict[str, object], codes: list[int]
) -> None:
    state.inject(fault, 1, **args)
    assert [parsed(t)[3] for t in log_lines(state)] == codes


def test_ecc_double_bits_line_has_the_drivers_text(state: NodeDir) -> None:
    state.inject_ecc(0, double=True)
    assert parsed(log_lines(state)[0])[4] == kernlog.TEXT[48]


def test_an_xid_without_a_fixed_text_ends_at_the_process(state: NodeDir) -> None:
    state.inject_xid(0, 13)
    pci = kernlog.pci(state.resolve(0).bus_id)
    tail = f"NVRM: Xid (PCI:{pci}): 13, pid='<unknown>', name=<unknown>"
    assert log_lines(state)[0].endswith(tail)


def test_the_log_outlives_a_new_boot_as_a_kernel_log_does(state: NodeDir) -> None:
    state.inject_xid(0, 79)
    state.init(build_node({"gpus": [{"profile": "T4", "count": 2}]}, "node-a"))
    state.inject_xid(1, 48)
    assert [parsed(t)[3] for t in log_lines(state)] == [79, 48]


def test_the_cli_writes_the_same_line(state: NodeDir) -> None:
    env = subprocess_env(state.path)
    cmd = [sys.executable, "-m", "fakenvml", "inject", "xid", "2", "94"]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    assert parsed(log_lines(state)[0])[2:4] == (kernlog.pci(state.resolve(2).bus_id), 94)


def test_a_log_that_cannot_be_written_is_a_one_line_error(state: NodeDir) -> None:
    path = state.path / kernlog.KERNEL_LOG_FILE
    path.unlink()
    path.mkdir()  # not a file
    with pytest.raises(FakeNvmlError, match=r"recorded, but .*kern\.log cannot be written"):
        state.inject_xid(0, 79)
    assert [r.data for r in state.events()] == [79, 2]  # the Xid, its node reboot


@pytest.mark.parametrize(
    ("bus_id", "printed"),
    [("00000000:3B:00.0", "0000:3b:00"), ("00000001:C1:1F.0", "0001:c1:1f")],
)
def test_pci_as_the_driver_prints_it(bus_id: str, printed: str) -> None:
    assert kernlog.pci(bus_id) == printed


def test_every_line_is_one_write(tmp_path: Path) -> None:
    kernlog.append(tmp_path, "a\n")
    kernlog.append(tmp_path, "")
    kernlog.append(tmp_path, "b\n")
    assert (tmp_path / kernlog.KERNEL_LOG_FILE).read_text() == "a\nb\n"


def test_a_kept_state_without_a_log_gets_an_empty_one(state: NodeDir, tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("gpus: [{profile: T4, count: 1}]\n")
    env = subprocess_env(state.path)
    cmd = [sys.executable, "-m", "fakenvml", "init", str(inv), "--node", "node-a", "--if-unchanged"]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    state.inject_xid(0, 79)
    (state.path / kernlog.KERNEL_LOG_FILE).unlink()  # as an older fakenvml left it
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    assert "kept" in out and log_lines(state) == []
