"""A fault is one row of fakenvml/faults.py: the CLI, the Python API, the remote path and
the experiments accept exactly the table's faults with the table's arguments, and a row
added to the table reaches all of them with no other edit."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest

from e2e import experiments as ex
from e2e import recording, runner
from fakenvml import cli, faults, remote
from fakenvml.journal import NO_INSTANCE, Kind
from fakenvml.node import NodeDir

DGX = Path(cli.__file__).resolve().parent / "inventories" / "dgx-h100.yaml"


def _sub(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)  # type: ignore[arg-type]


def _cli_faults() -> dict[str, argparse.ArgumentParser]:
    """The fault parsers of `fakenvml`: inject's subcommands, and commands of their own."""
    commands = _sub(cli._parser())
    out = dict(_sub(commands["inject"]))
    for f in faults.FAULTS:
        if faults.command(f)[0] != "inject":
            out[f.name] = commands[faults.command(f)[-1]]
    return out


def _sample(f: faults.Fault) -> dict[str, object]:
    """Arguments for f: its required ones at their smallest value."""
    return {p.name: p.least for p in f.params if p.default is faults.REQUIRED}


def _argv(f: faults.Fault) -> list[str]:
    """f on the command line: its required values, and the choices it always asks for."""
    pairs = [cli._flag(p, p.default) for p in f.params if "/" in p.cli]
    return [*faults.command(f), "0", *(str(v) for v in _sample(f).values()), *pairs]


@pytest.fixture
def node(tmp_path: Path) -> NodeDir:
    d = tmp_path / "dgx"
    assert cli.main(["init", str(DGX), "--state-dir", str(d)]) == 0
    return NodeDir(d)


def test_every_way_in_accepts_exactly_the_table_s_faults() -> None:
    names = set(faults.NAMES)
    assert set(_cli_faults()) == names  # `fakenvml inject NAME`, `fakenvml recover`
    assert set(ex.FAULT_ACTIONS) == names  # experiments' `do: NAME`
    assert {c.model_fields["do"].annotation.__args__[0] for c in ex.FAULTS} == names


def test_every_way_in_takes_the_table_s_arguments() -> None:
    for name, parser in _cli_faults().items():
        dests = {a.dest for a in parser._actions} - {"help", "state_dir", *cli._REMOTE_DESTS}
        params = {p.name for p in faults.named(name).params}
        assert dests == {"gpu", *params}, name
        assert params <= set(ex.FAULT_ACTIONS[name].model_fields), name


def test_the_remote_path_parses_by_the_table_and_forwards_the_fault_s_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`fakenvml inject --node N ...` parses here before it runs in the node's pod: the
    table decides what reaches the pod, and the pod gets the fault by its table name."""
    for f in faults.FAULTS:
        argv = [*_argv(f), "--node", "worker"]
        args = cli._parser(argv[0]).parse_args(argv)
        assert args.fault == f.name and args.node == "worker"
        assert remote.strip_remote_flags(argv) == _argv(f)
    assert cli.main(["inject", "--node", "worker", "melt", "0"]) == cli.EXIT_BAD_INPUT
    injected = [f.name for f in faults.FAULTS if faults.command(f)[0] == "inject"]
    assert f"(choose from {', '.join(map(repr, injected))})" in capsys.readouterr().err


def test_the_api_writes_each_fault_s_own_record_first(node: NodeDir) -> None:
    for f in faults.FAULTS:
        first = node.inject(f.name, 1, **_sample(f))[0]
        assert first.kind in {s.kind for s in f.shows} and first.gpu == 1, f.name


def test_reports_label_every_record_kind_a_fault_shows() -> None:
    shown = {s.kind.spelling for f in faults.FAULTS for s in f.shows}
    assert set(recording.FAULT_NAMES) == shown
    assert shown >= recording.HEALING_KINDS | recording.UNHEALTHY_KINDS


def test_a_new_row_reaches_the_cli_the_api_and_the_experiments(
    node: NodeDir, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What "a new fault is one row" means: a row (here a made-up `melt`, written as a
    lost GPU with its temperature code) is injectable everywhere with no other edit."""
    melt = faults.Fault(
        name="melt",
        help="the GPU overheats and is lost",
        params=(faults.Param("celsius", "--celsius", "how hot", default=120),),
        entries=lambda gpu, celsius: [(Kind.LOST, gpu, celsius, NO_INSTANCE, NO_INSTANCE, 0)],
        shows=(faults.Shown(Kind.LOST, "GPU melted", faults.DOWN),),
        heal=faults.RECOVER,
        says=lambda a: f"{{where}} melted at {a['celsius']} C",
    )
    monkeypatch.setattr(faults, "FAULTS", (*faults.FAULTS, melt))
    monkeypatch.setitem(faults.BY_NAME, "melt", melt)

    argv = ["inject", "melt", "2", "--celsius", "150", "--state-dir", str(node.path)]
    assert cli.main(argv) == 0
    assert "seq 1 " in capsys.readouterr().out
    assert list(node.events())[-1][3:6] == (Kind.LOST, 2, 150)
    assert node.inject("melt", 3)[0].data == 120

    action = ex.fault_action(melt).model_validate(
        {"at": 1, "do": "melt", "node": "n", "gpu": 0, "celsius": 90}
    )
    assert isinstance(action, ex.FaultAction) and action.args() == {"celsius": 90}
    assert action.describe() == "n GPU 0 melted at 90 C"


def test_the_runner_injects_every_fault_through_the_table(node: NodeDir) -> None:
    """The experiments' dispatch is NodeDir.inject by the action's name, a storm repeated."""

    class Lab:
        def fake_gpus(self, name: str) -> NodeDir:
            return node

    uuids = [g.uuid for g in node.identities().gpus]
    rec = recording.Recording({}, "", "", 0, {"n": {"uuids": uuids}})
    run = runner.Runner.__new__(runner.Runner)  # no cluster: only what _inject reads
    run.lab, run.t0_ns = Lab(), 0  # type: ignore[assignment]
    run._stop = threading.Event()
    timeline = [{"at": 0, "do": f.name, "node": "n", "gpu": 2, **_sample(f)} for f in faults.FAULTS]
    timeline[0].update(count=3)  # xid: a storm of 3
    for i, data in enumerate(timeline):
        run._inject(ex.FAULT_ACTIONS[data["do"]].model_validate(data), i, rec)
    kinds = [f.kind for f in rec.faults]
    assert kinds == ["xid"] * 3 + ["ecc-double", "lost", "fallen-off-bus", "recover"]
