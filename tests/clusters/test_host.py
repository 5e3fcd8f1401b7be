"""The host seam's claim on a lab: one process drives a lab at a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusters.labs.host import Host, LabInUse


def test_a_lab_another_process_drives_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from clusters.labs.host import Host; Host('seed', Path(sys.argv[1])).claim(); "
         "print('held', flush=True); time.sleep(60)", str(tmp_path / "seed")],
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        mine = Host("seed", tmp_path / "seed")
        with pytest.raises(
            LabInUse, match=rf"lab seed is in use by another process \(pid {holder.pid}: "
        ):
            mine.claim()
        Host("other", tmp_path / "other").claim()  # another lab is free
    finally:
        holder.kill()
        holder.wait()
    mine.claim()  # the holder is gone: its flock went with it
    Host("seed", tmp_path / "seed").claim()  # this process's second object shares the claim
    mine.release()
    Host("other", tmp_path / "other").release()
