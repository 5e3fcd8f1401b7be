"""node-problem-detector on a lab's GPU nodes, with a kernel monitor for the driver's Xids.

Fleet health monitors read Xids from the kernel log, not from NVML. The fake driver writes
each node's Xids there in the driver's words (fakenvml/kernlog.py); node-problem-detector's
filelog kernel monitor follows that log on each GPU node and reports, on that node only:

- an Event (reason GPUXid) for every Xid;
- the condition GPUXidError=True, reason XidN, for an Xid after which the driver asks for a
  GPU reset or a node reboot (fakenvml/xids.py's table: the rules are generated from it).

As every log monitor's condition, it stays True until node-problem-detector restarts
(`remove` takes it off the nodes). The monitor's start time is its start (lookback 0s):
earlier Xids in the log are not reported again.
"""

from __future__ import annotations

import json
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import steps
from clusters.kube import Kube
from clusters.labs import kindconfig
from fakenvml import kernlog, xids

NAMESPACE = "node-problem-detector"
NAME = "node-problem-detector"
CONFIG_MAP = "node-problem-detector-config"
CONFIG_FILE = "kernel-monitor-gpu.json"
SOURCE = "kernel-monitor"  # the Events' source component, as upstream's kernel monitor's
CONDITION = "GPUXidError"
CLEAN_REASON = "NoGPUXidError"
EVENT_REASON = "GPUXid"
CLEAN_MESSAGE = "no Xid that needs a GPU reset or a node reboot"
# How upstream's kernel-monitor-filelog.json reads rsyslog's traditional kern.log: the
# timestamp (first 15 characters, no year) and the message after the kernel's uptime.
PARSING = {"timestamp": "^.{15}", "message": r"kernel: \[.*\] (.*)",
           "timestampFormat": "Jan _2 15:04:05"}  # fmt: skip


def critical_xids() -> list[int]:
    """The Xids after which the driver asks for a GPU reset or a node reboot."""
    return sorted(c for c, a in xids.RECOVERY.items() if a != xids.RecoveryAction.NONE)


def xid_pattern(code: int | None = None) -> str:
    """The driver's message for Xid `code` (any Xid: None), as a rule pattern (matched up
    to the end of the message)."""
    number = r"\d+" if code is None else str(code)
    return r"NVRM: Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\): " + number + ",.*"


def monitor_config() -> dict[str, Any]:
    """The kernel monitor's configuration: upstream's kernel-monitor-filelog.json's parsing
    (rsyslog's traditional format) of the fake driver's log, with GPU rules."""
    rules = [{"type": "temporary", "reason": EVENT_REASON, "pattern": xid_pattern()}]
    rules += [{"type": "permanent", "condition": CONDITION, "reason": f"Xid{c}",
               "pattern": xid_pattern(c)} for c in critical_xids()]  # fmt: skip
    return {
        "plugin": "filelog",
        "pluginConfig": PARSING,
        "logPath": f"{kindconfig.NODE_STATE_DIR}/{kernlog.KERNEL_LOG_FILE}",
        "lookback": "0s",
        "bufferSize": 10,
        "source": SOURCE,
        "conditions": [{"type": CONDITION, "reason": CLEAN_REASON, "message": CLEAN_MESSAGE}],
        "rules": rules,
    }


def docs(image: str) -> list[dict]:
    """Its ServiceAccount, RBAC, configuration and DaemonSet (on the GPU nodes)."""
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
              "data": {CONFIG_FILE: json.dumps(monitor_config(), indent=2)}}  # fmt: skip
    return [config, *steps.manifest("node-problem-detector.yaml", {
        "${NAMESPACE}": NAMESPACE, "${NPD_IMAGE}": image,
        "${STATE_DIR}": kindconfig.NODE_STATE_DIR,
        "${GPU_NODE_LABEL}": f"{kindconfig.LABEL_PREFIX}/fake-gpus"})]  # fmt: skip


def deploy(kube: Kube, image: str, nodes: list[str], deadline_s: float = 120) -> float:
    """Applied, and running on `nodes`: each has the condition, False. Returns the wall
    clock second after which a new line of the log is reported (the monitors' start time
    is before their first condition; the log's timestamps are whole seconds)."""
    remove(kube, nodes)  # one left by an interrupted run may hold the condition True
    kube.ensure_namespace(NAMESPACE)
    for doc in docs(image):
        kube.apply(doc, namespace=NAMESPACE)
    kube.wait_daemonset(NAME, NAMESPACE, deadline_s)

    def reported(found: dict[str, client.V1Node]) -> tuple[bool, str]:
        have = {n: condition(found[n]) for n in nodes if n in found}
        up = [n for n, c in have.items() if c is not None and c.status == "False"]
        return len(up) == len(nodes), f"{CONDITION}=False on {sorted(up)} of {sorted(nodes)}"

    kube.watch_until(f"{NAME}'s {CONDITION} on {', '.join(nodes)}", kube.core.list_node,
                     reported, deadline_s)  # fmt: skip
    return float(int(time.time()) + 1)


def condition(node: client.V1Node) -> client.V1NodeCondition | None:
    return next((c for c in node.status.conditions or [] if c.type == CONDITION), None)


def events(kube: Kube, node: str) -> list[client.CoreV1Event]:
    """node-problem-detector's GPUXid Events about `node`, oldest first."""
    found = kube.core.list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind=Node,involvedObject.name={node},reason={EVENT_REASON}"
    ).items
    return sorted(found, key=lambda e: e.last_timestamp or e.metadata.creation_timestamp)


def remove(kube: Kube, nodes: list[str]) -> None:
    """The DaemonSet gone, then its condition taken off `nodes` (nobody else would: a
    log monitor's condition outlives its cause) and its Events deleted."""
    kube.delete_daemonset(NAME, NAMESPACE)
    for name in nodes:
        _drop_condition(kube, name)
        for e in kube.core.list_event_for_all_namespaces(
            field_selector=f"involvedObject.kind=Node,involvedObject.name={name},source={SOURCE}"
        ).items:
            kube.core.delete_namespaced_event(e.metadata.name, e.metadata.namespace)


def _drop_condition(kube: Kube, name: str, tries: int = 3) -> None:
    """A JSON patch that removes the condition by its index, tested first: the kubelet's
    own status updates may move it in between (then read again)."""
    for attempt in range(tries):
        conditions = kube.core.read_node(name).status.conditions or []
        at = next((i for i, c in enumerate(conditions) if c.type == CONDITION), None)
        if at is None:
            return
        patch = [{"op": "test", "path": f"/status/conditions/{at}/type", "value": CONDITION},
                 {"op": "remove", "path": f"/status/conditions/{at}"}]  # fmt: skip
        try:
            kube.core.patch_node_status(name, patch)
            return
        except ApiException as e:
            if e.status not in (409, 422) or attempt == tries - 1:
                raise
