"""migmanager.switch_config's recovery: a SIGHUP more to NVIDIA's plugin only when the
kubelet's own lines show it dropped the plugin's newest registration (even where the
allocatable read what was wanted), over a stand-in for the lab's node (its kubelet journal,
the label calls and the commands run there)."""

from __future__ import annotations

from collections.abc import Callable

from clusters.labs import migmanager
from tests.clusters.test_registration import ASKED, CLOSED, EOF_OLD

HUP = ("pkill", "-HUP", "-f", f"^{migmanager.PLUGIN_PROCESS}( |$)")


class Node:
    """A lab node: its kubelet journal, what the node serves, each the next one after
    each SIGHUP to the plugin (the last one stays); what was run on it and labelled."""

    def __init__(self, journals: list[list[str]], serves: list[int]) -> None:
        self.journals, self.serves = journals, serves
        self.ran: list[tuple[str, ...]] = []
        self.labels: list[dict[str, str | None]] = []
        self.kube = self

    def label_node(self, node: str, labels: dict[str, str | None]) -> None:
        self.labels.append(labels)

    def node_exec(self, node: str, *cmd: str) -> str:
        self.ran.append(cmd)
        if cmd[0] == "pkill":
            for seq in (self.serves, self.journals):
                if len(seq) > 1:
                    seq.pop(0)
        return "\n".join(self.journals[0]) if cmd[0] == "journalctl" else ""

    def read(self) -> Callable[[], int]:
        return lambda: self.serves[0]

    def hups(self) -> int:
        return sum(c == HUP for c in self.ran)


def switch(node: Node, want: int) -> tuple[int, str]:
    return migmanager.switch_config(node, "gpu-0", "ts-4", node.read(), want, 0.1)  # type: ignore[arg-type]


def test_a_config_served_is_only_the_label() -> None:
    node = Node([[EOF_OLD, ASKED]], [8])
    assert switch(node, 8) == (8, "")
    assert node.labels == [{migmanager.CONFIG_LABEL_PLUGIN: "ts-4"}] and node.hups() == 0


def test_a_dropped_registration_gets_one_sighup_more_and_says_so() -> None:
    node = Node([[ASKED, EOF_OLD, CLOSED], [ASKED, EOF_OLD, CLOSED, ASKED]], [0, 8])
    got, note = switch(node, 8)
    assert got == 8 and "kubernetes/kubernetes#121994" in note and "connection is closing" in note
    assert node.hups() == 1 and "dropped too" not in note


def test_a_silent_drop_is_mended_though_the_allocatable_was_right() -> None:
    # The kubelet forgot the new client and serves its devices: `want` is read at once.
    node = Node([[ASKED, EOF_OLD], [ASKED, EOF_OLD, ASKED]], [8, 8])
    got, note = switch(node, 8)
    assert got == 8 and "1 SIGHUP(s) more" in note and node.hups() == 1


def test_a_drop_each_time_ends_after_the_last_sighup_and_says_so() -> None:
    journals = [[*[ASKED, EOF_OLD] * n] for n in range(1, 2 + migmanager.REREGISTERS)]
    node = Node(journals, [8])
    got, note = switch(node, 8)
    assert got == 8
    assert node.hups() == migmanager.REREGISTERS and note.endswith("the last dropped too")


def test_any_other_shortfall_is_left_to_the_test() -> None:
    node = Node([[EOF_OLD, ASKED]], [2, 8])
    assert switch(node, 8) == (2, "")
    assert node.hups() == 0
