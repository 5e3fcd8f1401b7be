"""The API client's default deadline, against a loopback server that accepts a connection
and never answers (what a stuck API server or node proxy looks like to the client). The
TLS handshake is cut at the connect deadline, a response at the read one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client

from clusters.kube import TimedApiClient


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
