"""The API client's default deadline, against a loopback server that accepts a connection
and never answers (what a stuck API server or node proxy looks like to the client). The
TLS handshake is cut at the connect deadline, a response at the read one."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
import yaml
from kubernetes import client

from clusters.kube import Kube, TimedApiClient, absent_ok, or_none


@pytest.fixture
def silent_server() -> Iterator[str]:
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])  # keep it open, say nothing
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"https://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def configuration(host: str) -> client.Configuration:
    cfg = client.Configuration()
    cfg.host, cfg.verify_ssl = host, False
    cfg.retries = urllib3.Retry(total=1, backoff_factor=0, allowed_methods=None)
    return cfg


def test_a_call_without_a_deadline_gets_the_default_one(silent_server: str) -> None:
    api = TimedApiClient(configuration(silent_server))
    api.timeout = (0.5, 0.5)
    # Cut at the default read deadline (a plain ApiClient waits here forever).
    with pytest.raises(urllib3.exceptions.MaxRetryError) as e:
        client.CoreV1Api(api).list_node()
    assert isinstance(e.value.reason, urllib3.exceptions.ReadTimeoutError)
    assert "read timeout=0.5" in str(e.value.reason)


def test_a_call_with_its_own_deadline_keeps_it(silent_server: str) -> None:
    api = TimedApiClient(configuration(silent_server))
    api.timeout = (60, 60)
    with pytest.raises(urllib3.exceptions.MaxRetryError) as e:
        client.CoreV1Api(api).list_node(_request_timeout=0.25)
    assert "read timeout=0.25" in str(e.value.reason)


def test_a_health_check_keeps_its_deadline_against_a_server_that_never_answers(
    silent_server: str, tmp_path: Path
) -> None:
    """A paused control plane accepts connections and never answers. The check's calls get
    no retries and no more than the time left: 6 retries with back-off once made a 5 s
    health deadline take 100 s (a reused lab that never answers is made again)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": silent_server,
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    ok, why = Kube(kubeconfig).healthy(deadline_s=2)
    assert not ok
    assert why.startswith("waited 2s for the API server and Ready nodes; last saw: ")
    # One attempt, cut at what was left of the 2 s (urllib3 names the timeout it used).
    assert "ReadTimeoutError" in why and "MaxRetryError" not in why
    timeouts = [float(t) for t in re.findall(r"read timeout=([\d.]+)", why)]
    assert timeouts and max(timeouts) <= 2


def test_a_wait_gives_up_as_soon_as_what_it_awaits_can_no_longer_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """give_up is asked between watches, not before GIVE_UP_EVERY_S: the wait ends in one
    line naming why (a plugin that crash-loops), long before its deadline."""
    from kubernetes.client.exceptions import ApiException

    from clusters import kube as kube_module
    from clusters.steps import StepError

    monkeypatch.setattr(kube_module, "GIVE_UP_EVERY_S", 0.3)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    asked: list[float] = []

    def listing(**_: object) -> None:
        raise ApiException(status=503, reason="starting")

    def give_up() -> str | None:
        asked.append(1)
        return "plugin pod p crash-loops" if len(asked) == 2 else None

    with pytest.raises(StepError) as e:
        Kube(kubeconfig).watch_until("capacity", listing, lambda _: (False, ""), 60, give_up)
    assert re.match(r"gave up after \d+s on capacity: plugin pod p crash-loops; last saw: "
                    r"ApiException", str(e.value))  # fmt: skip
    assert len(asked) == 2


class FakeDynamic:
    """What Kube.apply, apply_all and delete ask of the dynamic client, recorded."""

    def __init__(self, missing: Exception | None = None) -> None:
        self.calls: list[tuple[str, str, str | None]] = []
        self.missing = missing

    @property
    def resources(self) -> FakeDynamic:
        return self

    def get(self, api_version: str, kind: str) -> object:
        if self.missing is not None and kind == "Widget":
            raise self.missing
        return type(
            "Resource", (), {"namespaced": kind not in ("Namespace", "CustomResourceDefinition")}
        )

    def server_side_apply(self, resource: object, body: dict, namespace: str | None,
                          **kw: object) -> None:  # fmt: skip
        self.calls.append(("apply", body["metadata"]["name"], namespace))

    def delete(self, resource: object, name: str, namespace: str | None, body: dict) -> None:
        assert body == {"propagationPolicy": "Background"}
        if name == "gone":
            raise client.ApiException(status=404)
        if name == "refused":
            raise client.ApiException(status=403)
        self.calls.append(("delete", name, namespace))


def doc(kind: str, name: str, **meta: str) -> dict:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, **meta}}


def test_apply_all_serves_a_charts_crds_before_its_other_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = Kube(tmp_path / "kubeconfig")
    kube._dynamic = fake = FakeDynamic()  # type: ignore[assignment]
    waited: list[list[str]] = []
    monkeypatch.setattr(kube, "wait_crds_established", lambda names: waited.append(names))
    kube.apply_all([doc("Deployment", "d"), doc("CustomResourceDefinition", "c"),
                    doc("Service", "s", namespace="elsewhere")], "ns")  # fmt: skip
    assert fake.calls == [("apply", "c", None), ("apply", "d", "ns"), ("apply", "s", "elsewhere")]
    assert waited == [["c"]]


def test_delete_goes_on_past_what_is_not_there_and_raises_anything_else(tmp_path: Path) -> None:
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    kube = Kube(tmp_path / "kubeconfig")
    kube._dynamic = fake = FakeDynamic(missing=ResourceNotFoundError("no Widget"))  # type: ignore[assignment]
    kube.delete(doc("Deployment", "d"), "ns")
    kube.delete(doc("Deployment", "gone"), "ns")  # 404: already gone
    kube.delete(doc("Widget", "w"), "ns")  # its kind (a CRD's) went first
    kube.delete(doc("Namespace", "n"))  # cluster-wide: no namespace
    assert fake.calls == [("delete", "d", "ns"), ("delete", "n", None)]
    with pytest.raises(client.ApiException):
        kube.delete(doc("Deployment", "refused"), "ns")


def test_a_delete_other_than_not_found_is_raised() -> None:
    def refuse() -> None:
        raise client.ApiException(status=403, reason="Forbidden")

    with pytest.raises(client.ApiException):
        absent_ok(refuse)


def test_absent_ok_says_whether_it_ran_and_or_none_reads_a_missing_object_as_none() -> None:
    def gone(*_: object) -> None:
        raise client.ApiException(status=404, reason="Not Found")

    calls: list[tuple[object, ...]] = []
    assert absent_ok(lambda *a, **kw: calls.append((*a, *kw.values())), "p", "ns", grace=0)
    assert calls == [("p", "ns", 0)]
    assert absent_ok(gone, "p") is False
    assert or_none(lambda name: {"name": name}, "p") == {"name": "p"}
    assert or_none(gone, "p") is None

    def refuse(*_: object) -> None:
        raise client.ApiException(status=500, reason="Internal")

    with pytest.raises(client.ApiException):
        or_none(refuse, "p")
