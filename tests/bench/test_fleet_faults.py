"""bench/fleet_faults.py's parts that need no cluster: which copies fail, reading taints from
slices, what a run must show, the CLI's refusals, the table and the timeline."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench import fleet_faults as ff


@pytest.mark.parametrize(("live", "share", "xids", "lost"), [
    (100, 0.05, 3, 2),  # 5 of 100: the Xids get the odd one
    (20, 0.05, 1, 1),  # 1 rounded up, then at least two
    (3, 1.0, 2, 1),
])  # fmt: skip
def test_the_failing_copies_are_a_share_of_the_live_ones_xids_first(
    live: int, share: float, xids: int, lost: int
) -> None:
    names = [f"n-{i}" for i in range(live)]
    got = ff.faulted(names, share)
    assert got == (names[:xids], names[xids : xids + lost])


def test_taints_are_read_per_node_from_raw_slices() -> None:
    def device(name: str, taints: list[dict] | None = None) -> dict:
        return {"name": name, **({"taints": taints} if taints else {})}

    xid = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    slices = [{"spec": {"nodeName": "a", "devices": [device("gpu-0", xid), device("gpu-1")]}},
              {"spec": {"nodeName": "b", "devices": [device("gpu-0")]}},
              {"spec": {"nodeName": "c"}}]  # fmt: skip
    assert ff.tainted(slices) == {"a": {"gpu-0"}}


def good() -> ff.Result:
    r = ff.Result(copies=20, live=20, gpus=160, xid_nodes=["x"], lost_nodes=["l"])
    r.taint_s = {"x": 0.3, "l": 0.4}
    r.second_wave, r.second_bound, r.pending = 80, 80 - ff.EXTRA, ff.EXTRA
    r.timeline = {"taints": [0.3, 0.4], "second wave bound": [1.0, 2.0],
                  "second wave created": [0.5]}  # fmt: skip
    return r


@pytest.mark.parametrize(("change", "says"), [
    (lambda r: r.taint_s.pop("l"), "taints seen on ['x']"),
    (lambda r: setattr(r, "elsewhere", ["y/gpu-0"]), "off the faulted copies"),
    (lambda r: setattr(r, "on_faulted", 1), "1 second-wave pods bound to a faulted copy"),
    (lambda r: setattr(r, "pending", ff.EXTRA + 1), "second wave:"),
    (lambda r: setattr(r, "claims_lost", 2), "2 claims lost"),
    (lambda r: setattr(r, "first_moved_or_lost", 1), "1 pods moved or lost"),
    (lambda r: setattr(r, "given_twice", 1), "1 devices given twice"),
])  # fmt: skip
def test_a_run_passes_only_when_it_shows_everything(change: object, says: str) -> None:
    assert ff.checks(good()) == []
    r = good()
    change(r)  # type: ignore[operator]
    bad = ff.checks(r)
    assert len(bad) == 1 and says in bad[0]


@pytest.mark.parametrize(("argv", "says"), [
    (["--copies", "10", "--live", "11"], "--copies 10 --live 11"),
    (["--live", "1"], "2 or more live"),
    (["--share", "0"], "--share 0.0"),
])  # fmt: skip
def test_the_cli_refuses_impossible_fleets_before_any_lab(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        ff.main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_the_table_and_the_timeline_are_written(tmp_path: Path) -> None:
    console = Console(width=120, record=True)
    console.print(ff.table(good()))
    text = console.export_text()
    assert "1 / 1" in text and "72 / 8 (80)" in text
    out = tmp_path / "faults.png"
    ff.plot(good(), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
