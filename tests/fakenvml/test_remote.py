"""`fakenvml ... --node NAME`: the command runs in the node's fakenvml pod (pod exec).

No cluster here: the refusals and an unreachable API server go through cli.main as a user
would; the exec itself runs against a stand-in for kubernetes' websocket client.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from fakenvml import cli, remote
from fakenvml.errors import FakeNvmlError
from fakenvml.node import STATE_DIR_ENV

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "fakenvml" / "inventories" / "dgx-h100.yaml"
UNREACHABLE = """\
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: someone
  user: {token: not-a-token}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: someone}
current-context: nowhere
"""

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """run(*argv) -> (exit status, stdout, stderr) of cli.main in this process."""
    monkeypatch.setenv(STATE_DIR_ENV, "/nonexistent")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def call(*argv: str | Path) -> tuple[int, str, str]:
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return call


def refused(run: Run, match: str, *argv: str | Path) -> str:
    code, out, err = run(*argv)
    assert code == cli.EXIT_BAD_INPUT, (out, err)
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("fakenvml: error: ") and match in err, err
    return err


# --------------------------------------------------------------------------- strip


@pytest.mark.parametrize(
    ("argv", "left"),
    [
        ("inject --node w1 xid 3 79", "inject xid 3 79"),
        ("inject xid 3 79 --node=w1", "inject xid 3 79"),
        (
            "inject xid --node w1 --namespace gpus 3 79 --gpu-instance 1 --kubeconfig=/k "
            "--context kind-lab",
            "inject xid 3 79 --gpu-instance 1",
        ),
        (
            "set all --namespace=gpus temperature=90 --context=c --kubeconfig /k power=300W "
            "--node w1",
            "set all temperature=90 power=300W",
        ),
        # Flags that only look alike stay, and so does everything after `--`.
        (
            "fail nvmlInit --error UNKNOWN --nodes x --node w1",
            "fail nvmlInit --error UNKNOWN --nodes x",
        ),
        ("set 0 --node w1 -- --node", "set 0 -- --node"),
        ("events --follow --since 4", "events --follow --since 4"),
    ],
)
def test_strip_remote_flags(argv: str, left: str) -> None:
    assert remote.strip_remote_flags(argv.split()) == left.split()


# --------------------------------------------------------------------------- refusals


def test_node_and_state_dir_exclude_each_other(tmp_path: Path, run: Run) -> None:
    d = tmp_path / "dgx"
    assert run("init", DGX, "--state-dir", d)[0] == 0
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    refused(run, "--node and --state-dir exclude each other",
            "inject", "xid", "0", "79", "--node", "w1", "--state-dir", d)  # fmt: skip
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


def test_remote_flags_without_node_are_refused(run: Run) -> None:
    refused(run, "--namespace: only with --node", "events", "--namespace", "gpus")


def test_abbreviated_remote_flags_are_refused(run: Run, tmp_path: Path) -> None:
    # `--nod` parses as --node here, but would reach the pod unstripped.
    refused(run, "in full", "events", "--nod", "w1", "--kubeconfig", tmp_path / "kc")


def test_a_missing_kubeconfig_is_refused(run: Run, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    refused(run, f"no kubeconfig file {missing}",
            "inject", "--node", "w1", "xid", "3", "79", "--kubeconfig", missing)  # fmt: skip


def test_no_kubeconfig_at_all_is_refused(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    refused(run, "set KUBECONFIG or pass --kubeconfig", "events", "--node", "w1")


def test_a_malformed_kubeconfig_is_refused(run: Run, tmp_path: Path) -> None:
    for text in ("clusters: [", "just a string\n"):
        (tmp_path / "kc").write_text(text)
        refused(run, "loading the kubeconfig", "events", "--node", "w1",
                "--kubeconfig", tmp_path / "kc")  # fmt: skip


def test_an_unknown_context_is_refused(run: Run, tmp_path: Path) -> None:
    (tmp_path / "kc").write_text(UNREACHABLE)
    refused(run, "nope", "events", "--node", "w1", "--kubeconfig", tmp_path / "kc",
            "--context", "nope")  # fmt: skip


def test_an_unreachable_cluster_fails_in_seconds(run: Run, tmp_path: Path) -> None:
    (tmp_path / "kc").write_text(UNREACHABLE)
    start = time.monotonic()
    err = refused(run, "cannot reach the cluster", "inject", "--node", "w1", "xid", "3", "79",
                  "--kubeconfig", tmp_path / "kc")  # fmt: skip
    assert "https://127.0.0.1:1" in err
    assert time.monotonic() - start < 10


def test_local_commands_do_not_import_kubernetes(tmp_path: Path) -> None:
    code = (
        "import sys; from fakenvml import cli; "
        f"assert cli.main(['init', {str(DGX)!r}, '--state-dir', {str(tmp_path)!r}]) == 0; "
        f"assert cli.main(['inject', 'xid', '0', '79', '--state-dir', {str(tmp_path)!r}]) == 0; "
        "assert 'kubernetes' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)


# --------------------------------------------------------------------------- find_pod


def pod(name: str, phase: str = "Running", namespace: str = "gpus") -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, namespace=namespace, deletion_timestamp=None),
        status=SimpleNamespace(phase=phase),
    )


class FakeApi:
    """CoreV1Api's two pod listings, recording their queries."""

    def __init__(self, *pods: SimpleNamespace) -> None:
        self.pods, self.calls = list(pods), []

    def list_pod_for_all_namespaces(self, **query: object) -> SimpleNamespace:
        self.calls.append((None, query))
        return SimpleNamespace(items=self.pods)

    def list_namespaced_pod(self, namespace: str, **query: object) -> SimpleNamespace:
        self.calls.append((namespace, query))
        return SimpleNamespace(items=self.pods)


def test_find_pod_asks_for_the_label_on_the_node() -> None:
    api = FakeApi(pod("fakenvml-abc"))
    assert remote.find_pod(api, "w1", None).metadata.name == "fakenvml-abc"  # type: ignore[arg-type]
    assert remote.find_pod(api, "w1", "gpus").metadata.name == "fakenvml-abc"  # type: ignore[arg-type]
    query = {
        "label_selector": "app.kubernetes.io/name=fakenvml",
        "field_selector": "spec.nodeName=w1",
        "_request_timeout": remote.LIST_TIMEOUT_S,
    }
    assert api.calls == [(None, query), ("gpus", query)]


def test_find_pod_skips_pods_that_are_not_running() -> None:
    api = FakeApi(pod("old", "Succeeded"), pod("new"))
    assert remote.find_pod(api, "w1", None).metadata.name == "new"  # type: ignore[arg-type]


def test_find_pod_without_a_running_pod_says_what_is_there() -> None:
    with pytest.raises(FakeNvmlError, match=r"no running fakenvml pod on node w1 .*chart"):
        remote.find_pod(FakeApi(), "w1", None)  # type: ignore[arg-type]
    with pytest.raises(FakeNvmlError, match=r"only gpus/fakenvml-abc \(Pending\)"):
        remote.find_pod(FakeApi(pod("fakenvml-abc", "Pending")), "w1", None)  # type: ignore[arg-type]


def test_find_pod_refuses_two_running_pods() -> None:
    api = FakeApi(pod("a", namespace="one"), pod("b", namespace="two"))
    with pytest.raises(FakeNvmlError, match=r"more than one .* one/a, two/b .*--namespace"):
        remote.find_pod(api, "w1", None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- exec


class FakeExec:
    """kubernetes' WSClient as run() uses it: `frames` are what each update() delivers,
    (stdout, stderr); then the connection closes with `status` on the error channel."""

    def __init__(self, frames: list[tuple[str, str]], status: str) -> None:
        self.frames, self.status, self.channels = list(frames), status, {1: "", 2: ""}
        self.open, self.closed = True, False

    def update(self, timeout: float = 0) -> None:
        if self.frames:
            out, err = self.frames.pop(0)
            self.channels[1] += out
            self.channels[2] += err
        else:
            self.open = False

    def is_open(self) -> bool:
        return self.open

    def _read(self, channel: int) -> str:
        text, self.channels[channel] = self.channels[channel], ""
        return text

    def read_stdout(self, timeout: float | None = None) -> str:
        return self._read(1)

    def read_stderr(self, timeout: float | None = None) -> str:
        return self._read(2)

    def peek_channel(self, channel: int, timeout: float = 0) -> str:
        return self.status

    @property
    def returncode(self) -> int:  # as WSClient's: yaml-parses the status
        import yaml

        status = yaml.safe_load(self.status)
        if status["status"] == "Success":
            return 0
        return int(status["details"]["causes"][0]["message"])

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def exec_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., list[dict]]:
    """exec_with(fake) makes --node run against `fake`; returns the stream() calls."""
    import kubernetes.stream

    calls: list[dict] = []
    (tmp_path / "kc").write_text(UNREACHABLE)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kc"))
    monkeypatch.setattr(remote, "find_pod", lambda api, node, ns: pod(f"fakenvml-{node}"))

    def use(fake: FakeExec) -> list[dict]:
        def stream(method: object, name: str, namespace: str, **kwargs: object) -> FakeExec:
            calls.append({"name": name, "namespace": namespace, **kwargs})
            return fake

        monkeypatch.setattr(kubernetes.stream, "stream", stream)
        return calls

    return use


SUCCESS = '{"metadata":{},"status":"Success"}'
EXIT_2 = (
    '{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code",'
    '"reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"2"}]}}'
)


def test_node_runs_the_command_in_the_pod(run: Run, exec_with: Callable[..., list[dict]]) -> None:
    fake = FakeExec([("seq 1 at ", ""), ("...: xid 79 on GPU 3\n", "")], SUCCESS)
    calls = exec_with(fake)
    code, out, err = run("inject", "--node", "w1", "xid", "3", "79", "--namespace", "gpus")
    assert (code, out, err) == (0, "seq 1 at ...: xid 79 on GPU 3\n", "")
    assert calls == [
        {
            "name": "fakenvml-w1",
            "namespace": "gpus",
            "command": ["python3", "-c", remote.TIED, "inject", "xid", "3", "79"],
            "container": "fakenvml",
            "stderr": True,
            "stdout": True,
            "stdin": True,
            "tty": False,
            "_preload_content": False,
        }
    ]
    assert fake.closed


def test_node_passes_on_the_remote_refusal_and_exit_status(
    run: Run, exec_with: Callable[..., list[dict]]
) -> None:
    refusal = "fakenvml: error: GPU '9' not in inventory\n"
    exec_with(FakeExec([("", refusal)], EXIT_2))
    assert run("recover", "9", "--node", "w1") == (2, "", refusal)


def test_an_exec_without_exit_status_is_one_line(
    run: Run, exec_with: Callable[..., list[dict]]
) -> None:
    no_python = (
        '{"metadata":{},"status":"Failure","message":"exec: \\"python3\\": executable file '
        'not found in $PATH: unknown","reason":"InternalError"}'
    )
    exec_with(FakeExec([], no_python))
    refused(run, 'exec: "python3": executable file not found', "events", "--node", "w1")
    exec_with(FakeExec([], ""))
    refused(run, "connection closed before", "events", "--node", "w1")


# --------------------------------------------------------------------------- TIED


def tied(state_dir: Path, *argv: str) -> subprocess.Popen[str]:
    """The pod's side of an exec: `python3 -c TIED ARGS...`, here with this Python."""
    return subprocess.Popen(
        [sys.executable, "-c", remote.TIED, *argv, "--state-dir", str(state_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def finished(child: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Its exit status and output, stdin left open (communicate() would close it first,
    and TIED would end the command)."""
    code = child.wait(timeout=60)
    assert child.stdout is not None and child.stderr is not None and child.stdin is not None
    out, err = child.stdout.read(), child.stderr.read()
    child.stdin.close()
    return code, out, err


def test_tied_passes_on_output_and_exit_status(tmp_path: Path) -> None:
    code, out, err = finished(tied(tmp_path, "init", str(DGX)))
    assert code == 0 and "node dgx-h100: 8 GPU(s)" in out, err
    code, out, err = finished(tied(tmp_path, "recover", "9"))
    assert (code, out) == (2, "")
    assert err.startswith("fakenvml: error: GPU '9' not in inventory") and err.count("\n") == 1


def test_tied_ends_the_command_when_stdin_closes(tmp_path: Path) -> None:
    # What the API server does when the client of `events --follow --node` goes away.
    assert finished(tied(tmp_path, "init", str(DGX)))[0] == 0
    child = tied(tmp_path, "events", "--follow")
    time.sleep(1)
    assert child.poll() is None  # following
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait(timeout=10) == 0  # ended: TIED's SIGTERM, on which a follower exits 0
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()
    child.stderr.close()
