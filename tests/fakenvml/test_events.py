"""Fault delivery: every event set in every process that registered a device and event
type gets each injected event exactly once, in injection order; waits block."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pynvml as nv
import pytest

from fakenvml import journal
from fakenvml.journal import Kind, Record
from fakenvml.node import NodeDir, faulted
from tests.fakenvml.conftest import H100x8, build_node, subprocess_env

XID = nv.nvmlEventTypeXidCriticalError
REPO = Path(__file__).resolve().parents[2]


class Waiter:
    """A waiter process; READY means its sets are registered."""

    def __init__(self, state: NodeDir, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fakenvml.waiter", *args],
            stdout=subprocess.PIPE, text=True, cwd=REPO, env=subprocess_env(state.path),
        )  # fmt: skip
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert json.loads(line) == {"ready": True}, f"waiter did not start: {line!r}"

    def events(self, timeout: float = 60) -> list[dict]:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"waiter exited {self.proc.returncode}"
        return [json.loads(line) for line in out.splitlines()]


def per_set(events: list[dict]) -> dict[int, list[tuple[int, int]]]:
    sets: dict[int, list[tuple[int, int]]] = {}
    for e in events:
        sets.setdefault(e["set"], []).append((e["gpu"], e["data"]))
    return sets


def test_injection_reaches_every_set_in_two_other_processes_once_in_order(
    state: NodeDir,
) -> None:
    injected = [(g, 100 + i) for i, g in enumerate([0, 1, 2, 3] * 10)]  # 40 events
    waiters = [Waiter(state, "--gpus", "0,1,2,3", "--sets", "2", "--expect", "40",
                      "--idle-ms", "3000") for _ in range(2)]  # fmt: skip
    state.inject_xid(5, 13)  # a GPU nobody registered: never delivered
    for gpu, code in injected:
        state.inject_xid(gpu, code)
    for w in waiters:
        sets = per_set(w.events())
        assert sorted(sets) == [0, 1]
        for received in sets.values():
            assert received == injected  # all 40, none twice, none from GPU 5, in order


def test_sets_receive_only_their_registered_event_types(state: NodeDir) -> None:
    w = Waiter(state, "--gpus", "1", "--mask", "xid", "--expect", "2", "--idle-ms", "1500")
    state.inject_ecc(1, double=True, xid=False)  # filtered out: the set asked for Xids only
    state.inject_xid(1, 79)
    state.inject_ecc(1, double=False)
    state.inject_xid(1, 48)
    got = [(e["type"], e["data"]) for e in w.events()]
    assert got == [(XID, 79), (XID, 48)]


def test_ecc_events_carry_their_type(nvml: object, state: NodeDir) -> None:
    es = nv.nvmlEventSetCreate()
    mask = XID | nv.nvmlEventTypeDoubleBitEccError | nv.nvmlEventTypeSingleBitEccError
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(0), mask, es)
    state.inject_ecc(0, double=True, xid=False)
    state.inject_ecc(0, double=False)
    assert nv.nvmlEventSetWait_v2(es, 1000).eventType == nv.nvmlEventTypeDoubleBitEccError
    assert nv.nvmlEventSetWait_v2(es, 1000).eventType == nv.nvmlEventTypeSingleBitEccError
    nv.nvmlEventSetFree(es)


# A double-bit error is Xid 48 too, as on hardware ("XID 48: ... an uncorrectable ECC error
# has occurred", NVIDIA's GPU Memory Error Management note). Each test ends with a sentinel
# Xid 79 on the same GPU: events arrive in journal order, so the event after the fault's
# shows that nothing else was delivered, without waiting out a timeout.
DBE, SBE = nv.nvmlEventTypeDoubleBitEccError, nv.nvmlEventTypeSingleBitEccError


def delivered(es: object, gpu: int = 3) -> list[tuple[int, int]]:
    """(eventType, eventData) of each event up to and including the sentinel Xid 79."""
    got: list[tuple[int, int]] = []
    while not got or got[-1] != (XID, 79):
        e = nv.nvmlEventSetWait_v2(es, 1000)
        assert nv.nvmlDeviceGetIndex(e.device) == gpu
        got.append((e.eventType, e.eventData))
    return got


def registered(mask: int, gpu: int = 3) -> object:
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(gpu), mask, es)
    return es


def test_a_double_bit_error_delivers_its_ecc_event_then_xid_48(
    nvml: object, state: NodeDir
) -> None:
    es = registered(XID | DBE | SBE)
    state.inject_ecc(3, double=True, count=2)
    state.inject_xid(3, 79)
    assert delivered(es) == [(DBE, 0), (XID, 48), (XID, 79)]
    nv.nvmlEventSetFree(es)


def test_a_set_registered_for_xids_only_gets_a_double_bit_error_s_xid_48(
    nvml: object, state: NodeDir
) -> None:
    es = registered(XID)
    state.inject_ecc(3, double=True)
    state.inject_xid(3, 79)
    assert delivered(es) == [(XID, 48), (XID, 79)]
    nv.nvmlEventSetFree(es)


def test_no_xid_delivers_only_the_double_bit_ecc_event(nvml: object, state: NodeDir) -> None:
    es = registered(XID | DBE | SBE)
    state.inject_ecc(3, double=True, xid=False)
    state.inject_xid(3, 79)
    assert delivered(es) == [(DBE, 0), (XID, 79)]
    nv.nvmlEventSetFree(es)


def test_a_single_bit_error_delivers_no_xid(nvml: object, state: NodeDir) -> None:
    es = registered(XID | DBE | SBE)
    state.inject_ecc(3, double=False, count=4)
    state.inject_xid(3, 79)
    assert delivered(es) == [(SBE, 0), (XID, 79)]
    nv.nvmlEventSetFree(es)


@pytest.mark.parametrize(
    ("flags", "want"),
    [(["--double"], [(DBE, 0), (XID, 48)]), (["--double", "--no-xid"], [(DBE, 0)]),
     (["--single"], [(SBE, 0)])],
)  # fmt: skip
def test_the_cli_injects_what_the_api_does(
    nvml: object, state: NodeDir, flags: list[str], want: list[tuple[int, int]]
) -> None:
    from fakenvml import cli

    es = registered(XID | DBE | SBE)
    assert cli.main(["inject", "ecc", "3", *flags, "--state-dir", str(state.path)]) == 0
    state.inject_xid(3, 79)
    assert delivered(es) == [*want, (XID, 79)]
    nv.nvmlEventSetFree(es)


def test_a_double_bit_error_s_xid_48_counts_as_one_injected_by_hand(
    nvml: object, state: NodeDir
) -> None:
    """The records after the ECC one are what `inject xid 48` writes, so the recovery
    action, `faulted()` and `fakenvml events` read them alike, and `recover` clears them."""
    by_hand = NodeDir(state.path.parent / "by-hand")
    by_hand.init(build_node(H100x8))
    state.inject_ecc(3, double=True)
    by_hand.inject_xid(3, 48)
    after_ecc = [(r.kind, r.gpu, r.data) for r in state.events(start=1)]
    assert after_ecc == [(r.kind, r.gpu, r.data) for r in by_hand.events()]
    assert after_ecc == [(Kind.XID, 3, 48), (Kind.RECOVERY_ACTION, 3, 1)]
    assert state.faulted() == by_hand.faulted() == {3}
    assert recovery_action(3) == nv.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    state.recover(3)
    assert (state.faulted(), recovery_action(3)) == (set(), nv.NVML_GPU_RECOVERY_ACTION_NONE)


def recovery_action(gpu: int) -> int:
    field = nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    (value,) = nv.nvmlDeviceGetFieldValues(nv.nvmlDeviceGetHandleByIndex(gpu), [field])
    return value.value.uiVal  # type: ignore[no-any-return]


def test_events_before_registration_are_not_delivered(nvml: object, state: NodeDir) -> None:
    state.inject_xid(2, 31)
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(2), XID, es)
    with pytest.raises(nv.NVMLError_Timeout):
        nv.nvmlEventSetWait_v2(es, 50)
    nv.nvmlEventSetFree(es)


def test_wait_blocks_for_its_timeout(nvml: object, state: NodeDir) -> None:
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(0), XID, es)
    t0 = time.monotonic()
    with pytest.raises(nv.NVMLError_Timeout):
        nv.nvmlEventSetWait_v2(es, 300)
    assert time.monotonic() - t0 >= 0.29
    nv.nvmlEventSetFree(es)


def test_lost_gpu_fails_getters_and_wakes_waiters_then_waits_block(
    nvml: object, state: NodeDir
) -> None:
    es = nv.nvmlEventSetCreate()
    handle = nv.nvmlDeviceGetHandleByIndex(3)
    nv.nvmlDeviceRegisterEvents(handle, XID, es)
    state.lose(3)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlEventSetWait_v2(es, 5000)  # the loss itself wakes the waiter
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetUUID(handle)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetHandleByIndex(3)
    assert nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(2))  # others unaffected
    t0 = time.monotonic()
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlEventSetWait_v2(es, 300)  # still lost: the error comes after the timeout
    assert time.monotonic() - t0 >= 0.29, "a wait on a lost GPU must not return at once"
    state.recover(3)
    assert nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(3))
    with pytest.raises(nv.NVMLError_Timeout):
        nv.nvmlEventSetWait_v2(es, 50)
    nv.nvmlEventSetFree(es)


def test_an_event_is_read_only_once_its_writer_committed_it(
    nvml: object, state: NodeDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer appends a record, then stores the count in journal.gen. A waiter that read
    the record in between handed out a recovery event while every getter still answered
    GPU_IS_LOST, and a plugin dropped it as a lost GPU's event (seen in a lab: the GPU
    stayed Unhealthy). Events wait for the commit, so the state they meet includes them."""
    es = nv.nvmlEventSetCreate()
    handle = nv.nvmlDeviceGetHandleByIndex(3)
    nv.nvmlDeviceRegisterEvents(handle, XID | nv.nvmlEventTypeGpuRecoveryAction, es)
    state.lose(3)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlEventSetWait_v2(es, 5000)
    store = journal._store_committed
    monkeypatch.setattr(journal, "_store_committed", lambda *a: None)  # stopped in between
    rec = state.recover(3)
    with pytest.raises(nv.NVMLError_GpuIsLost):  # not the recovery event: not committed
        nv.nvmlEventSetWait_v2(es, 50)
    store(state.path, rec.seq)
    event = nv.nvmlEventSetWait_v2(es, 5000)
    assert event.eventType == nv.nvmlEventTypeGpuRecoveryAction
    assert nv.nvmlDeviceGetUUID(event.device) == nv.nvmlDeviceGetUUID(handle)  # not lost
    nv.nvmlEventSetFree(es)


def test_a_commit_wakes_a_waiter_that_met_the_record_uncommitted(
    nvml: object, state: NodeDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append wakes a blocked waiter; if it scans before the writer committed, only
    the commit can wake it again. Watching the journal alone, it slept out its timeout: an
    Xid reached NVIDIA's DRA driver 5 s late (its wait is 5000 ms; seen in an experiment
    with two Xids 1 ms apart)."""
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(1), XID, es)
    store = journal._store_committed
    monkeypatch.setattr(journal, "_store_committed", lambda *a: None)
    got: list[tuple[float, object]] = []
    waiter = threading.Thread(target=lambda: got.append((0.0, nv.nvmlEventSetWait_v2(es, 5000))))
    waiter.start()
    time.sleep(0.2)  # the waiter is blocked
    rec = state.inject_xid(1, 79)  # appended: the waiter wakes, finds it uncommitted
    time.sleep(0.3)
    committed = time.monotonic()
    store(state.path, rec.seq)
    waiter.join(timeout=10)
    late = time.monotonic() - committed
    assert got and got[0][1].eventData == 79
    assert late < 1.0, f"the event came {late:.2f}s after its commit"
    nv.nvmlEventSetFree(es)


def test_fallen_off_the_bus_is_xid_79_then_lost(nvml: object, state: NodeDir) -> None:
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(6), XID, es)
    state.fall_off_bus(6)
    e = nv.nvmlEventSetWait_v2(es, 1000)
    assert (e.eventType, e.eventData) == (XID, 79)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetUUID(e.device)
    nv.nvmlEventSetFree(es)


def test_journal_numbers_and_timestamps_every_fault(state: NodeDir) -> None:
    recs = [state.inject_xid(0, 31), state.lose(1), state.recover(1), state.inject_ecc(2, False)]
    journal = list(state.events())
    assert [r.seq for r in journal] == [1, 2, 3, 4]
    assert [r.kind for r in journal] == [Kind.XID, Kind.LOST, Kind.RECOVER, Kind.ECC_SINGLE]
    assert journal == recs
    state.inject_xid(0, 79)  # the Xid, then the recovery action the driver asks for
    assert [(r.kind, r.data) for r in state.events(start=4)] == [
        (Kind.XID, 79), (Kind.RECOVERY_ACTION, 2),
    ]  # fmt: skip
    assert all(a.monotonic_ns <= b.monotonic_ns for a, b in itertools.pairwise(journal))


def test_faulted_gpus_are_those_not_recovered_since() -> None:
    """The one rule for faulted GPUs (fakenvml.node.faulted): the lab's heal, NodeDir."""

    def r(seq: int, kind: Kind, gpu: int, data: int = 0) -> Record:
        return Record(seq, 0, 0, kind, gpu, data)

    records = [
        r(1, Kind.XID, 0, 79), r(2, Kind.RECOVERY_ACTION, 0, 2), r(3, Kind.LOST, 1),
        r(4, Kind.RECOVER, 0), r(5, Kind.RECOVERY_ACTION, 0, 0), r(6, Kind.ECC_DOUBLE, 3),
    ]  # fmt: skip
    assert faulted(records) == {1, 3}  # a recovery action of 0 (NONE) is no fault
    # The heal's question: which GPUs had a fault at all, even those recovered since.
    assert faulted(records, recovered_too=True) == {0, 1, 3}
