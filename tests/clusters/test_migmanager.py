"""migmanager.switch_config's one recovery: a SIGHUP more to NVIDIA's plugin only when the
kubelet's own lines show it dropped the plugin's newest registration, over a stand-in for
the lab's node (its kubelet journal, the label calls and the commands run there)."""

from __future__ import annotations

from collections.abc import Callable

from clusters.labs import migmanager
from tests.clusters.test_registration import ASKED, CLOSED, EOF_OLD


class Node:
    """A lab node: the kubelet journal it answers with, what was run on it and labelled,
    and what the node serves after each SIGHUP to the plugin (`after_hup`)."""

    def __init__(self, journal: list[str], serves: list[int]) -> None:
        self.journal, self.serves = journal, serves
        self.ran: list[tuple[str, ...]] = []
        self.labels: list[dict[str, str | None]] = []
        self.kube = self

    def label_node(self, node: str, labels: dict[str, str | None]) -> None:
        self.labels.append(labels)

    def node_exec(self, node: str, *cmd: str) -> str:
        self.ran.append(cmd)
        if cmd[0] == "pkill":
            self.serves.pop(0)
        return "\n".join(self.journal) if cmd[0] == "journalctl" else ""

    def read(self) -> Callable[[], int]:
        return lambda: self.serves[0]


def switch(node: Node, want: int) -> tuple[int, str]:
    return migmanager.switch_config(node, "gpu-0", "ts-4", node.read(), want, 0.1)  # type: ignore[arg-type]


def test_a_config_served_is_only_the_label() -> None:
    node = Node([EOF_OLD, ASKED], [8])
    assert switch(node, 8) == (8, "")
    assert node.labels == [{migmanager.CONFIG_LABEL_PLUGIN: "ts-4"}] and node.ran == []


def test_a_dropped_registration_gets_one_sighup_more_and_says_so() -> None:
    node = Node([ASKED, EOF_OLD, CLOSED], [0, 8])
    got, note = switch(node, 8)
    assert got == 8 and "kubernetes/kubernetes#121994" in note and "connection is closing" in note
    hups = [c for c in node.ran if c[0] == "pkill"]
    assert hups == [("pkill", "-HUP", "-f", f"^{migmanager.PLUGIN_PROCESS}( |$)")]


def test_any_other_shortfall_is_left_to_the_test() -> None:
    node = Node([EOF_OLD, ASKED], [2, 8])
    assert switch(node, 8) == (2, "")
    assert not [c for c in node.ran if c[0] == "pkill"]
