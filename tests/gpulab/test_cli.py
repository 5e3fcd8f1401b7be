"""The `gpulab` command without a cluster: every lab command is one of its words, `lab list`
names the shipped labs and which run, `inject` reaches a lab node's fake GPUs where the lab
keeps them, `test` is pytest over the shipped suites, and bad input is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusters.labs import dra, gpuoperator, kindconfig, spec
from clusters.labs import lab as labs
from fakenvml.journal import Kind
from fakenvml.node import NodeDir
from gpulab import cli

SEED = spec.load("seed")
NODE, OTHER = (n.name for n in SEED.gpu_nodes[:2])  # its first GPU node is the one laid out


def test_every_lab_command_is_a_word_of_gpulab(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    listed = capsys.readouterr().out
    for word in ("infra", "lab", "test", "experiment", "inject", "standin"):
        assert f"\n    {word}" in listed


def test_lab_list_gives_each_shipped_lab_a_line_and_says_which_run() -> None:
    shipped = spec.shipped()
    assert {lab.spec.name for lab in shipped} >= {"seed", "hetero", "dra", "mig"}
    lines = cli.lab_lines(shipped, running={"seed", "someone-elses"})
    assert lines[0].split() == ["LAB", "NODES", "GPUS", "FLEET", "SERVES", "CLUSTER"]
    rows = {line.split()[0]: line for line in lines[1:-1]}
    assert set(rows) == {lab.spec.name for lab in shipped}
    gpus = sum(n.gpu_count for n in SEED.gpu_nodes)
    assert rows["seed"].split() == ["seed", str(len(SEED.nodes)), str(gpus), "-", "subject",
                                    "gpulab", "running"]  # fmt: skip
    copies = sum(f.copies for f in spec.load("dra").fleet.values())
    assert rows["dra"].split()[3:] == [str(copies), *f"NVIDIA's DRA driver {dra.version()}".split(),
                                       "-"]  # fmt: skip
    serves = f"NVIDIA's GPU Operator {gpuoperator.version()}"
    assert rows["operator"].split()[3:] == ["-", *serves.split(), "-"]
    assert lines[-1] == "other kind clusters here: someone-elses"
    unknown = cli.lab_lines(shipped, running=None)
    assert all(line.endswith("  ?") for line in unknown[1:])


def test_lab_list_without_kind_lists_the_labs_and_says_why_running_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path))  # nothing built here
    assert cli.main(["lab", "list"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 + len(spec.shipped())
    assert err.splitlines() == [
        "gpulab lab list: which labs run is unknown: kind is not built (run `make infra`)"
    ]


def test_lab_up_of_an_unknown_lab_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["lab", "up", "no-such-lab"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpulab lab: error: no lab 'no-such-lab' (shipped: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize(("argv", "rc", "message"), [
    (["seed", SEED.control_plane.name, "3"], 1,
     f"gpulab lab: error: lab seed has no GPU node '{SEED.control_plane.name}' to copy (its "
     "GPU nodes: " + ", ".join(n.name for n in SEED.gpu_nodes) + ")"),
    (["seed", SEED.gpu_nodes[0].name, "-1"], 2, "gpulab lab fleet: error: COUNT is -1: 0 or more"),
    (["seed", SEED.gpu_nodes[0].name, "2", "--live", "3"], 2,
     "gpulab lab fleet: error: --live 3: 0 to COUNT (2)"),
    (["seed", SEED.gpu_nodes[0].name], 2,
     "gpulab lab fleet: error: give NODE and COUNT, or neither (the spec's fleet)"),
])  # fmt: skip
def test_lab_fleet_refuses_a_node_it_cannot_copy_or_a_count_out_of_range_in_one_line(
    argv: list[str], rc: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any cluster is asked (none runs here)."""
    assert cli.main(["lab", "fleet", *argv]) == rc
    assert capsys.readouterr().err == message + "\n"


@pytest.fixture
def seed_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NodeDir:
    """The seed lab's worker as a lab lays it out on the host (no cluster): its fake GPUs'
    state where kind bind-mounts it from, written from the lab spec's inventory."""
    monkeypatch.setattr(labs, "LABS_ROOT", tmp_path / "labs")
    node = SEED.gpu_nodes[0]
    d = NodeDir(kindconfig.state_dir(tmp_path / "labs", SEED, node.name))
    assert node.gpu_node is not None
    d.init(node.gpu_node)
    return d


def test_inject_puts_a_fault_into_the_lab_nodes_fake_gpus_and_recover_clears_it(
    seed_up: NodeDir, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["inject", "seed", NODE, "xid", "3", "79"]) == 0
    (rec,) = [r for r in seed_up.events() if r.kind == Kind.XID]
    assert (rec.gpu, rec.data) == (3, 79)
    assert seed_up.faulted() == {3}
    assert cli.main(["inject", "seed", NODE, "recover", "3"]) == 0
    assert seed_up.faulted() == set()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no-such-lab", NODE, "xid", "0", "79"], "no lab 'no-such-lab' (shipped: "),
        (["seed", SEED.control_plane.name, "xid", "0", "79"],
         f"lab seed has no GPU node '{SEED.control_plane.name}' (its GPU nodes: "
         + ", ".join(n.name for n in SEED.gpu_nodes) + ")"),
        (["seed", OTHER, "xid", "0", "79"],
         f"no fake GPUs of {OTHER} in {{labs}}/seed/{OTHER}: lab seed is not up on "
         "this machine (gpulab lab up seed)"),
    ],
)  # fmt: skip
def test_inject_refuses_an_unknown_lab_or_node_or_a_lab_not_up_in_one_line(
    seed_up: NodeDir, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["inject", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpulab inject: error: " + message.format(labs=labs.LABS_ROOT))
    assert err.count("\n") == 1


def test_a_bad_fault_is_fakenvmls_one_line(
    seed_up: NodeDir, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["inject", "seed", NODE, "xid", "99", "79"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fakenvml: error: ") and err.count("\n") == 1


def test_gpulab_test_is_pytest_over_the_shipped_suites_or_the_one_named() -> None:
    pytest_ = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs"]
    assert cli.suites_command(["--suites", "subject", "-k", "xid"]) == [
        *pytest_, "e2e", "--suites", "subject", "-k", "xid"]  # fmt: skip
    subject = ["--subjects", "examples/tiny-gpu-plugin/subject.yaml"]
    assert cli.suites_command(subject) == [*pytest_, "e2e", *subject]
    for suite in ("e2e/test_dra_mig.py", "e2e/test_seed.py::test_x", "e2e.test_seed"):
        assert cli.suites_command(["-q", suite]) == [*pytest_, "-q", suite]


def test_lab_wait_returns_once_no_other_process_drives_the_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpulab lab wait`: refused in one line naming the holder while another process holds
    the lab's claim past --timeout; free at once after it lets go."""
    # A lab of its own: this worker may hold the seed lab's claim (the unit tier's lab tests).
    monkeypatch.setattr(labs, "LABS_ROOT", tmp_path / "labs")
    spec_file = tmp_path / "waited.yaml"
    spec_file.write_text("name: waited\nnodes: [{role: control-plane}]\n")
    lock = tmp_path / "labs" / ".waited.lock"
    lock.parent.mkdir(parents=True)
    hold = ("import fcntl, os, sys, time\n"
            f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.pwrite(fd, b'pid 1: the cluster tier', 0)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert cli.main(["lab", "wait", str(spec_file), "--timeout", "1"]) == 1
        assert capsys.readouterr().err == (
            "gpulab lab: error: lab waited is in use by another process (pid 1: the cluster "
            "tier) after 1s; wait for it, or stop it\n"
        )
    finally:
        holder.communicate("")
    assert cli.main(["lab", "wait", str(spec_file)]) == 0
    assert capsys.readouterr().out == "lab waited is free\n"
