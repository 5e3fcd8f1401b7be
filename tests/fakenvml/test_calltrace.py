"""The call log (fakenvml/native/calltrace.py): a consumer that loads it gets the fake's
answers, and every call, field value and export-table slot it made is in the log."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fakenvml import library
from fakenvml.native import calltrace
from fakenvml.node import NodeDir

CONSUMER = """
import ctypes, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(1)
print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetFieldValues(h, [(91, 0)])[0].value.uiVal)
lib = ctypes.CDLL("libnvidia-ml.so.1")
guid = bytes.fromhex("c4fe3e6cc98f6c4ea327ee696e12f7c4")  # nvidia-smi's
table = ctypes.c_void_p()
assert lib.nvmlInternalGetExportTable(ctypes.byref(table), guid) == 0
slot = ctypes.c_void_p.from_address(table.value + 8 * 81).value
gpu_name = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.c_char_p, ctypes.c_uint)(slot)
print(gpu_name(1, ctypes.create_string_buffer(34), 34))
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return calltrace.build(tmp_path_factory.mktemp("calltrace"), library.path())


def test_every_call_field_and_slot_is_logged_with_its_answer(
    shim: Path, make_state: Callable[..., NodeDir], tmp_path: Path
) -> None:
    node = make_state()  # 8 x H100 on an NVSwitch board: 18 links each
    log = tmp_path / "calls.log"
    env = {**os.environ, "LD_LIBRARY_PATH": str(shim.parent), "FAKENVML_CALLTRACE": str(log)}
    res = subprocess.run([sys.executable, "-c", CONSUMER], env=env, capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split() == ["8", "18", "0"]  # the fake's answers came through
    lines = log.read_text().splitlines()
    assert any(
        line.startswith("nvmlDeviceGetCount_v2(") and line.endswith(") = 0") for line in lines
    )
    assert any(line.endswith("= 0 [91/0 = 0 (18)]") for line in lines), lines
    assert "nvmlInternalGetExportTable(" in "\n".join(lines)
    assert any(line.startswith("slot 81(0x1, ") and line.endswith(") = 0") for line in lines)
    assert node.node().gpus[1].links  # what field 91 counted
