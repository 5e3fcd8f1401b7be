"""Mark.pending (clusters/labs/registration.py): which nodes still wait for a plugin pod
started since the mark to register, read from each kubelet's counter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from clusters.labs import registration
from clusters.labs.kubelet_metrics import DeviceMetrics

BEFORE = DeviceMetrics(1_796_200_000.25, 7, 3, 0.01)


def pending(monkeypatch: pytest.MonkeyPatch, now: DeviceMetrics | None) -> list[str]:
    monkeypatch.setattr(registration, "_read", lambda core, node, resource: now)
    mark = registration.Mark("nvidia.com/gpu", frozenset({"old-uid"}), {"w": BEFORE})
    fresh = SimpleNamespace(metadata=SimpleNamespace(uid="new-uid"),
                            spec=SimpleNamespace(node_name="w"))  # fmt: skip
    return mark.pending(None, [fresh])  # type: ignore[arg-type,list-item]


def test_a_kubelet_start_time_moved_by_the_clock_still_waits_for_a_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI: the start time read a second off, the wait counted from zero and passed on 7."""
    assert pending(monkeypatch, BEFORE._replace(started=BEFORE.started + 1)) == ["w"]
    assert pending(monkeypatch, BEFORE._replace(started=BEFORE.started + 1,
                                                registrations=8)) == []  # fmt: skip


def test_a_restarted_kubelet_counts_from_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pending(monkeypatch, DeviceMetrics(BEFORE.started + 60, 0, 0, 0.0)) == ["w"]
    assert pending(monkeypatch, DeviceMetrics(BEFORE.started + 60, 1, 0, 0.0)) == []
    assert pending(monkeypatch, None) == ["w"]  # not answering


def test_a_kubelet_that_does_not_answer_at_the_mark_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = iter([None, BEFORE])
    monkeypatch.setattr(registration, "_read", lambda core, node, resource: next(answers))
    monkeypatch.setattr(registration.time, "sleep", lambda s: None)
    got = registration.mark(None, [], "nvidia.com/gpu", ["w"])  # type: ignore[arg-type]
    assert got.seen == {"w": BEFORE}
