"""node-problem-detector's GPU rules (clusters/labs/npd.py) against the lines the fake driver
writes (fakenvml/kernlog.py): each Xid's line matches the Event rule, and the condition
rule of its code exactly when the driver asks for a reset or a reboot after it."""

from __future__ import annotations

import json
import re

import pytest

from clusters.labs import kindconfig, npd
from fakenvml import kernlog, xids

BUS = "00000000:3B:00.0"


def matches(message: str, code: int | None = None) -> bool:
    """The rule for `code` (any Xid: None) matches as node-problem-detector matches: up to
    the message's end."""
    return re.search(npd.xid_pattern(code) + r"\Z", message) is not None


def message(code: int) -> str:
    """What the monitor matches its rules against: the line after the kernel's uptime."""
    text = kernlog.line("node-a", BUS, code, 1_764_000_000 * 10**9, 123 * 10**9)
    found = re.search(npd.monitor_config()["pluginConfig"]["message"], text)
    assert found, text
    return found.group(1)


@pytest.mark.parametrize("code", [13, 31, 43, 48, 63, 74, 79, 92, 94, 95, 119, 120, 999])
def test_each_xid_is_an_event_and_a_condition_when_the_driver_asks_for_a_reset(code: int) -> None:
    critical = xids.recovery_action(code) != xids.RecoveryAction.NONE
    assert matches(message(code))
    # Its own condition rule where it has one, and no other code's (79 is not 7 or 179).
    assert [c for c in npd.critical_xids() if matches(message(code), c)] == [code] * critical


def test_the_condition_rules_are_the_xid_tables() -> None:
    rules = npd.monitor_config()["rules"]
    assert [r["reason"] for r in rules if r["type"] == "permanent"] == [
        f"Xid{c}" for c in sorted(xids.RECOVERY) if xids.RECOVERY[c] != xids.RecoveryAction.NONE
    ]
    assert all(r["condition"] == npd.CONDITION for r in rules if r["type"] == "permanent")


def test_the_monitor_follows_the_log_where_the_node_has_it() -> None:
    docs = npd.docs("gpulab/node-problem-detector:test")
    config = json.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"][npd.CONFIG_FILE])
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert config["logPath"] == f"{kindconfig.NODE_STATE_DIR}/{kernlog.KERNEL_LOG_FILE}"
    assert mounts["kernel-log"] == host["kernel-log"] == kindconfig.NODE_STATE_DIR
    assert pod["containers"][0]["image"] == "gpulab/node-problem-detector:test"
    assert pod["nodeSelector"] == {f"{kindconfig.LABEL_PREFIX}/fake-gpus": "true"}
    assert not [d for d in docs if "${" in json.dumps(d)]  # every placeholder filled
