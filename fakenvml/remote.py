"""`fakenvml ... --node NAME`: run a state command in the fakenvml pod on a cluster node.

    fakenvml inject --node worker2 xid 3 79
    # as: kubectl exec -c fakenvml <its pod on worker2> -- python3 -m fakenvml inject xid 3 79
    #     (but ended when the client goes away: see TIED)

A cluster node's state directory lives on that node (a kind node's container, a VM): from
outside the cluster no path reaches it, but the fakenvml DaemonSet pod on the node has it
mounted, with FAKENVML_STATE_DIR pointing at it. So the command runs there, through the API
server's pod exec, the way `kubectl exec` does it: the caller needs RBAC to list `pods` and
to get and create `pods/exec` (the websocket upgrade is a GET; newer API servers also
check create). The remote command's stdout, stderr and exit status are this one's.

Labs on one machine can keep using --state-dir on the host's bind-mounted state directory:
it is faster (no API round trip, no Python start-up in the pod) and needs no cluster access.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from fakenvml.errors import FakeNvmlError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:  # kubernetes is imported by run() only: local commands never pay for it
    from kubernetes.client import ApiClient, CoreV1Api, V1Pod

POD_SELECTOR = "app.kubernetes.io/name=fakenvml"
CONTAINER = "fakenvml"
REMOTE_FLAGS = ("--node", "--namespace", "--kubeconfig", "--context")
LIST_TIMEOUT_S = 5  # an unreachable API server fails the command in seconds, not minutes
# `python3 -c TIED ARGS...` runs `python3 -m fakenvml ARGS...` and ends it when its stdin
# closes. A client that goes away (Ctrl-C on `events --follow`) leaves the exec'd process
# running in the pod, its output still drained by the runtime; what the API server does
# close then is the exec's stdin. Stdlib only: it runs on whatever fakenvml the image has.
TIED = """\
import os, subprocess as sp, sys, threading
child = sp.Popen([sys.executable, "-m", "fakenvml", *sys.argv[1:]], stdin=sp.DEVNULL)
def watch():
    while os.read(0, 4096):  # the raw fd: a buffered stdin would wedge the exit below
        pass
    child.terminate()
threading.Thread(target=watch, daemon=True).start()
os._exit(child.wait())
"""


def strip_remote_flags(argv: Sequence[str]) -> list[str]:
    """argv less the remote flags (--node X, --node=X, ...): what the pod runs. Only the
    full spellings; cli.main refuses abbreviated ones (they would reach the pod)."""
    out: list[str] = []
    items = iter(argv)
    for arg in items:
        if arg == "--":  # argparse reads what follows as positionals: nothing to strip
            out.append(arg)
            out.extend(items)
            break
        if arg in REMOTE_FLAGS:
            next(items, None)  # its value
        elif arg.split("=", 1)[0] not in REMOTE_FLAGS:
            out.append(arg)
    return out


def run(
    node: str,
    argv: Sequence[str],
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> int:
    """Runs `python3 -m fakenvml *argv` in the fakenvml pod on `node` (through TIED),
    copying its output here as it comes; returns its exit status."""
    try:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config import ConfigException
        from urllib3.exceptions import HTTPError
        from websocket import WebSocketException
        from yaml import YAMLError
    except ImportError:
        raise FakeNvmlError("--node needs the kubernetes package: pip install kubernetes") from None

    try:
        api_client = _api_client(kubeconfig, context)
    except (ConfigException, YAMLError, OSError) as e:
        raise FakeNvmlError(f"loading the kubeconfig: {_one_line(str(e))}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        # kubernetes' loader on YAML that is no kubeconfig (a list, a string): its own bug
        raise FakeNvmlError(f"loading the kubeconfig: not a kubeconfig ({e!r})") from None
    api = client.CoreV1Api(api_client)
    doing = f"listing pods at {api_client.configuration.host}"
    try:
        pod = find_pod(api, node, namespace)
        doing = f"exec in pod {_name(pod)}"
        return _exec(api, pod, argv)
    except ApiException as e:
        raise FakeNvmlError(f"{doing}: {_api_error(e)}") from None
    except (HTTPError, OSError, WebSocketException) as e:
        raise FakeNvmlError(f"cannot reach the cluster ({doing}): {_net_error(e)}") from None
    finally:
        api_client.close()


def find_pod(api: CoreV1Api, node: str, namespace: str | None) -> V1Pod:
    """The one Running fakenvml pod on `node`, in `namespace` (None: any)."""
    query = {
        "label_selector": POD_SELECTOR,
        "field_selector": f"spec.nodeName={node}",
        "_request_timeout": LIST_TIMEOUT_S,
    }
    if namespace is None:
        pods = api.list_pod_for_all_namespaces(**query).items
    else:
        pods = api.list_namespaced_pod(namespace, **query).items
    running = [
        p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
    ]
    if not running:
        # A pod that is there but not Running (Pending, Terminating) says what to wait for.
        others = ", ".join(f"{_name(p)} ({p.status.phase})" for p in pods)
        raise FakeNvmlError(
            f"no running fakenvml pod on node {node} (label {POD_SELECTOR})"
            + (f", only {others}" if others else "")
            + ": is the fake-gpus chart installed with a pool on that node?"
        )
    if len(running) > 1:
        # Two releases on one node would write one state directory twice over: say so
        # rather than guess which one the user meant.
        names = ", ".join(_name(p) for p in running)
        raise FakeNvmlError(
            f"more than one running fakenvml pod on node {node}: {names} (pick with --namespace)"
        )
    return running[0]


def _api_client(kubeconfig: str | None, context: str | None) -> ApiClient:
    """A client of its own (not kubernetes' global default): KUBECONFIG's, or the pod's
    service account when run in a pod without a kubeconfig."""
    from kubernetes import client, config

    cfg = client.Configuration()
    cfg.retries = 0  # urllib3 would retry a refused connection 3 times, warning each time
    given = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    paths = [Path(p).expanduser() for p in given.split(os.pathsep) if p]
    if not any(p.is_file() for p in paths):
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        hint = "" if kubeconfig else " (set KUBECONFIG or pass --kubeconfig)"
        raise FakeNvmlError(f"no kubeconfig file {given}{hint}")
    return config.new_client_from_config(given, context, client_configuration=cfg)


def _exec(api: CoreV1Api, pod: V1Pod, argv: Sequence[str]) -> int:
    from kubernetes.stream import stream
    from kubernetes.stream.ws_client import ERROR_CHANNEL

    resp = stream(
        api.connect_get_namespaced_pod_exec,
        pod.metadata.name,
        pod.metadata.namespace,
        command=["python3", "-c", TIED, *argv],
        container=CONTAINER,
        stderr=True,
        stdout=True,
        stdin=True,  # never written: it stays open for as long as this client is there
        tty=False,
        _preload_content=False,
    )
    try:
        while True:  # a last pass after the close drains what came with it
            resp.update(timeout=1)
            for text, out in ((resp.read_stdout(0), sys.stdout), (resp.read_stderr(0), sys.stderr)):
                if text:
                    out.write(text)
                    out.flush()  # `events --follow` through exec should feel as live
            if not resp.is_open():
                break
        status = resp.peek_channel(ERROR_CHANNEL)  # returncode reads it away
        try:
            return int(resp.returncode)
        except (TypeError, KeyError, IndexError, ValueError):
            # No exit code: the exec itself failed (no such container, no python3) or the
            # connection dropped before the status came.
            raise FakeNvmlError(_status_message(status)) from None
    finally:
        resp.close()


def _name(pod: V1Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _status_message(status: str) -> str:
    if not status:
        return "the connection closed before the command's exit status came"
    return _json_message(status) or _one_line(status)


def _api_error(e: Exception) -> str:
    """'403 Forbidden: pods is forbidden: User ...': the status, and the API server's own
    message, which names the missing permission."""
    status, reason, body = (getattr(e, name, None) for name in ("status", "reason", "body"))
    head = f"{status} {reason}"
    if not status:
        # The websocket (exec) failed: kubernetes puts the whole exception text in reason,
        # for a refused upgrade "Handshake status 403 Forbidden -+-+- {headers} -+-+- body".
        parts = str(reason).split(" -+-+- ")
        head, body = parts[0], (parts[-1] if len(parts) > 2 else None)
    message = _json_message(body) if body else ""
    return f"{_one_line(head)}: {message}" if message else _one_line(head)


def _json_message(text: str | bytes) -> str:
    """A Kubernetes Status's message, or "" when `text` is no Status."""
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError, TypeError):
        return ""
    return _one_line(str(message)) if message else ""


def _net_error(e: Exception) -> str:
    reason = getattr(e, "reason", None) or e  # MaxRetryError: the connection error inside
    # "<urllib3.connection.HTTPSConnection object at 0x..>: Failed to ...": drop the repr
    return _one_line(re.sub(r"^<[^>]*>:\s*", "", str(reason)))
