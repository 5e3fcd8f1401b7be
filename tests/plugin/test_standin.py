"""The kubelet stand-in behaves as the kubelet's device manager does, checked against a
minimal in-process plugin (tests/plugin/fake_plugin.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from standin import Kubelet, StandinError
from tests.plugin.fake_plugin import RESOURCE, FakePlugin

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake(kubelet: Kubelet) -> Iterator[Callable[..., FakePlugin]]:
    made: list[FakePlugin] = []

    def make(count: int = 4, **kw: object) -> FakePlugin:
        p = FakePlugin(kubelet.dir, count, **kw).start()  # type: ignore[arg-type]
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


def test_register_answers_after_dialling_and_getting_options(
    kubelet: Kubelet, fake: Callable[..., FakePlugin]
) -> None:
    p = fake()
    p.register()
    # ListAndWatch may start before Register returns, as in the kubelet; options may not.
    assert p.calls.index("GetDevicePluginOptions") < p.calls.index("Register returned")
    kubelet.wait_devices(RESOURCE, 4)
    res = kubelet.resource(RESOURCE)
    assert (res.registrations, res.endpoint, res.connected) == (1, "fake.sock", True)


def test_register_with_another_api_version_is_refused(
    kubelet: Kubelet, fake: Callable[..., FakePlugin]
) -> None:
    p = fake(version="v1alpha1")
    with pytest.raises(grpc.RpcError, match="v1alpha1"):
        p.register()
    assert RESOURCE not in kubelet.resources


def test_each_update_replaces_the_health_sets(
    kubelet: Kubelet, fake: Callable[..., FakePlugin]
) -> None:
    p = fake()
    p.register()
    first = kubelet.wait_devices(RESOURCE, 4)
    p.set_health("dev-2", healthy=False)
    res = kubelet.wait_health(RESOURCE, ["dev-2"], after=first.updates)
    assert res.healthy == {"dev-0", "dev-1", "dev-3"}
    p.set_health("dev-2", healthy=True)
    res = kubelet.wait_health(RESOURCE, [], after=res.updates)
    assert len(res.healthy) == 4


def test_stream_end_marks_every_device_unhealthy(
    kubelet: Kubelet, fake: Callable[..., FakePlugin]
) -> None:
    p = fake()
    p.register()
    kubelet.wait_devices(RESOURCE, 4)
    p.end_streams()
    res = kubelet.wait_for(
        lambda: (r := kubelet.resources[RESOURCE]) and not r.connected and r,
        f"{RESOURCE} to disconnect",
        lambda: kubelet.resources[RESOURCE].summary(),
    )
    assert not res.healthy and len(res.unhealthy) == 4


def test_admit_prefers_then_allocates_then_prestarts(
    kubelet: Kubelet, fake: Callable[..., FakePlugin]
) -> None:
    p = fake(pre_start=True)
    p.register()
    kubelet.wait_devices(RESOURCE, 4)
    got = kubelet.admit(RESOURCE, 2)
    assert got.devices == got.preferred == ["dev-2", "dev-3"]
    assert got.response.envs["FAKE_DEVICES"] == "dev-2,dev-3"
    assert p.calls[-3:] == ["GetPreferredAllocation", "Allocate", "PreStartContainer"]
    # Allocated devices are no longer available to the next container.
    assert kubelet.admit(RESOURCE, 2).devices == ["dev-0", "dev-1"]


def test_admit_refuses_more_than_healthy_and_free(
    kubelet: Kubelet, fake: Callable[..., FakePlugin]
) -> None:
    p = fake()
    p.register()
    first = kubelet.wait_devices(RESOURCE, 4)
    p.set_health("dev-0", healthy=False)
    kubelet.wait_health(RESOURCE, ["dev-0"], after=first.updates)
    with pytest.raises(StandinError, match="only 3 healthy and unallocated"):
        kubelet.admit(RESOURCE, 4)


def test_restart_wipes_sockets_and_recreates_kubelet_sock(
    kubelet: Kubelet, fake: Callable[..., FakePlugin]
) -> None:
    p = fake()
    p.register()
    kubelet.wait_devices(RESOURCE, 4)
    kubelet.restart()
    assert sorted(f.name for f in kubelet.dir.iterdir()) == ["kubelet.sock"]
    res = kubelet.resource(RESOURCE)
    assert not res.connected and len(res.unhealthy) == 4
    assert [r.rpc for r in kubelet.records if r.direction == "event"][-2:] == [
        "KubeletRestart",
        "KubeletStarted",
    ]


def test_records_carry_monotonic_times_in_order(
    kubelet: Kubelet, fake: Callable[..., FakePlugin]
) -> None:
    p = fake()
    p.register()
    kubelet.wait_devices(RESOURCE, 4)
    times = [r.t_ns for r in kubelet.records]
    assert times == sorted(times)
    rpcs = [(r.direction, r.rpc) for r in kubelet.records if r.resource == RESOURCE]
    # Options before the answer to Register; ListAndWatch may start before that answer.
    assert rpcs[:3] == [
        ("recv", "Register"),
        ("send", "GetDevicePluginOptions"),
        ("recv", "GetDevicePluginOptions"),
    ]
    assert ("send", "Register") in rpcs


def test_a_wait_that_runs_out_says_what_it_saw(kubelet: Kubelet) -> None:
    with pytest.raises(StandinError) as e:
        kubelet.wait_devices(RESOURCE, 8, timeout=0.05)
    assert str(e.value) == (
        f"waited 0.05s for {RESOURCE} to list 8 devices; "
        f"last saw no registration of {RESOURCE} (registered: none)"
    )


def test_gpulab_standin_runs_a_plugin_command_and_allocates(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpulab", "standin", "--allocate", f"{RESOURCE}=3",
         "--exit-after-allocate", "--", sys.executable, "-m", "tests.plugin.fake_plugin", "5"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"ListAndWatch {RESOURCE}: 5 devices, 5 healthy" in done.stdout
    assert "env FAKE_DEVICES=dev-2,dev-3,dev-4" in done.stdout
