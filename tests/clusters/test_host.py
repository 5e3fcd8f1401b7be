"""The host seam's claim on a lab: one process drives a lab at a time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusters import steps
from clusters.labs.host import Host, LabInUse


def hold(lab_dir: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process holding the lab of `lab_dir` for `seconds`, once it says so."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from clusters.labs.host import Host; Host('seed', Path(sys.argv[1])).claim(); "
         "print('held', flush=True); time.sleep(float(sys.argv[2]))", str(lab_dir),
         str(seconds)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_lab_another_process_drives_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    holder = hold(tmp_path / "seed", 60)
    try:
        mine = Host("seed", tmp_path / "seed")
        with pytest.raises(
            LabInUse, match=rf"lab seed is in use by another process \(pid {holder.pid}: "
        ):
            mine.claim()
        Host("other", tmp_path / "other").claim()  # another lab is free
    finally:
        holder.kill()
        holder.wait()
    assert mine.claim()  # the holder is gone: its flock went with it
    # This process's second object shares the claim, and says it took nothing.
    assert not Host("seed", tmp_path / "seed").claim()
    mine.release()
    Host("other", tmp_path / "other").release()


def test_a_claim_with_a_wait_takes_the_lab_once_its_holder_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPULAB_LAB_WAIT_S=30: the claim says whom it waits for, and takes the lab when the
    holder exits (2 s here); a wait that runs out is refused, saying how long it waited."""
    holder = hold(tmp_path / "seed", 2)
    try:
        monkeypatch.setenv("GPULAB_LAB_WAIT_S", "30")
        mine = Host("seed", tmp_path / "seed")
        t0 = time.monotonic()
        mine.claim()
        assert time.monotonic() - t0 > 1, "claimed while the holder still held it"
        assert (
            f"lab seed is in use by another process (pid {holder.pid}: " in capsys.readouterr().out
        )
        mine.release()
    finally:
        holder.kill()
        holder.wait()
    holder = hold(tmp_path / "seed", 60)
    try:
        monkeypatch.setenv("GPULAB_LAB_WAIT_S", "2")
        with pytest.raises(LabInUse, match=r"\) after 2s; wait for it, or stop it$"):
            Host("seed", tmp_path / "seed").claim()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("raw", ["soon", "-1", "inf", "nan"])
def test_a_lab_wait_that_is_not_seconds_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("GPULAB_LAB_WAIT_S", raw)
    with pytest.raises(steps.StepError, match=rf"^GPULAB_LAB_WAIT_S='{raw}': expected seconds"):
        Host("seed", tmp_path / "seed").claim()
    assert not (tmp_path / ".seed.lock").exists()  # changes nothing


def test_a_failed_kind_says_why_in_its_error(tmp_path: Path) -> None:
    """kind's last lines of stderr are in the error (the CI log shows the error alone)."""
    fake = tmp_path / "kind"
    fake.write_text(
        "#!/bin/sh\necho ' ✗ Starting control-plane' >&2\n"
        "echo 'ERROR: failed to init node with kubeadm' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    with pytest.raises(steps.StepError) as e:
        steps.kind(str(fake), "create", "cluster")
    assert str(e.value).splitlines() == [
        "kind create cluster failed (exit 1):", " ✗ Starting control-plane",
        "ERROR: failed to init node with kubeadm"]  # fmt: skip


def test_a_failed_create_exports_the_nodes_logs_and_leaves_the_delete_to_the_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster is retained for `kind export logs`; deleting it is Lab.up's call (KEEP=1
    keeps it), so Host.create deletes nothing itself."""
    calls = tmp_path / "calls"
    fake = tmp_path / "kind"
    fake.write_text(
        f'#!/bin/sh\necho "$1 $2" >>{calls}\n'
        '[ "$1" = create ] && { echo "ERROR: boom" >&2; exit 1; }\nexit 0\n'
    )
    fake.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    host = Host("lab", tmp_path / "lab")
    host.kind = str(fake)
    with pytest.raises(
        steps.StepError, match=r"(?s)ERROR: boom.*the nodes' logs: build/kind-logs/lab-"
    ):
        host.create({"kind": "Cluster"})
    assert calls.read_text().splitlines() == ["create cluster", "export logs"]


def test_kind_gets_the_preloaded_node_image_and_the_lab_records_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node image with a preloaded stand-in is created from the stand-in; kind.yaml (what
    a reused lab is compared with) keeps the node image, so new lab images built since
    (new stand-ins) do not make a reused lab's config differ."""
    given = tmp_path / "given.yaml"
    fake = tmp_path / "kind"
    fake.write_text(f'#!/bin/sh\n[ "$1" = create ] && cp "$6" {given}\nexit 0\n')
    fake.chmod(0o755)
    host = Host("lab", tmp_path / "lab")
    host.kind = str(fake)
    config = {"kind": "Cluster", "nodes": [{"role": "control-plane", "image": "node:a"},
                                           {"role": "worker", "image": "node:b"}]}  # fmt: skip
    host.create(config, {"node:a": "lab-node:a"})
    assert [n["image"] for n in yaml.safe_load(given.read_text())["nodes"]] == [
        "lab-node:a", "node:b"]  # fmt: skip
    assert host.config() == config


def test_a_clusters_state_is_read_with_one_kind_call(tmp_path: Path) -> None:
    """kind's cluster and the lab's kubeconfig: up (both), orphaned (kind's alone: a killed
    create or delete), none (neither; a kubeconfig without kind's cluster counts as none)."""
    fake, calls = tmp_path / "kind", tmp_path / "calls"
    fake.write_text(f'#!/bin/sh\necho "$@" >>{calls}\ncat {tmp_path / "clusters"}\n')
    fake.chmod(0o755)
    host = Host("seed", tmp_path / "seed")
    host.kind = str(fake)
    (tmp_path / "seed").mkdir()
    seen = []
    for kind_has, kubeconfig in ((True, True), (True, False), (False, True), (False, False)):
        (tmp_path / "clusters").write_text("seed\n" if kind_has else "other\n")
        host.kubeconfig.unlink(missing_ok=True)
        if kubeconfig:
            host.kubeconfig.write_text("apiVersion: v1\n")
        seen.append(host.state())
    assert seen == ["up", "orphaned", "none", "none"]
    assert calls.read_text().splitlines() == ["get clusters"] * 4
