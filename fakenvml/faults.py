"""The faults users inject, one row each: its name, its arguments, what the library is told
(the journal records it appends, fakenvml/journal.py) and what heals it.

Every way in reads this table: `fakenvml inject NAME` and `fakenvml recover` build their
arguments from it (fakenvml/cli.py), `NodeDir.inject(NAME, gpu, **args)` validates and
writes by it (fakenvml/node.py), `fakenvml inject --node` parses by it before the command
runs in the node's pod (fakenvml/remote.py), and experiments accept `do: NAME` with its
arguments as keys (e2e/experiments.py), which reports label by `shows`. A new fault is a
row here plus its record kind's handler in the C library (src/journal.c, src/events.c).

Named tuples from collections, not dataclasses: `fakenvml inject` imports this, and the
dataclasses stack was a fifth of its start-up (fakenvml/journal.py, _RecordFields).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping

from fakenvml import xids
from fakenvml.errors import FakeNvmlError
from fakenvml.journal import NO_INSTANCE, Entry, Kind, ecc_kind

REQUIRED = object()  # a Param's default when it has none
U32 = 2**32  # the journal's data words: every number below it

# One argument after the GPU, which every fault takes first. `cli` is how the command line
# spells it: a metavar (CODE: positional), a flag (--count N), a negated flag (--no-xid:
# the value False), or a pair "--single/--double" (False/True; the command line always
# asks for one, files and the API default). `least`: the smallest number it takes.
# `only`: (other param, its value, why) that a value other than the default needs.
# `aliases`: keys files that already shipped used for it.
Param = collections.namedtuple(
    "Param",
    "name cli help default least only aliases",
    defaults=(REQUIRED, 1, None, ()),
)

# How reports name a record kind the fault appends, and what it does to the GPU's health:
# DOWN (a plugin marks it unhealthy), UP (healthy again) or None (counted, not acted on).
Shown = collections.namedtuple("Shown", "kind label health")
DOWN, UP = "down", "up"

# name: `fakenvml inject NAME`, `do: NAME`, NodeDir.inject(NAME). command: the CLI verb
# path (a heal is a command of its own: `fakenvml recover GPU`). entries(gpu index, **args):
# the records to append, in one write (one timestamp), the fault's own record first (what
# the API returns first and recordings keep; the rest are what the driver adds: its Xid,
# the recovery action it asks for). heal: the fault that undoes it (None: it heals).
# says(args): how an experiment describes it, around "{where}" (node and GPU).
Fault = collections.namedtuple(
    "Fault", "name help params entries shows heal says command", defaults=(None,)
)


def _xid(gpu: int, code: int, gpu_instance: int | None = None,
         compute_instance: int | None = None) -> list[Entry]:  # fmt: skip
    """The Xid; when the driver would then ask for a reset or reboot, a second record sets
    that recovery action (and wakes sets registered for it)."""
    if not 0 < code < U32:
        raise FakeNvmlError(f"Xid must be a positive 32-bit number, not {code}")
    gi = NO_INSTANCE if gpu_instance is None else gpu_instance
    ci = NO_INSTANCE if compute_instance is None else compute_instance
    out: list[Entry] = [(Kind.XID, gpu, code, gi, ci, 0)]
    if (action := xids.recovery_action(code)) != xids.RecoveryAction.NONE:
        out.append((Kind.RECOVERY_ACTION, gpu, action, NO_INSTANCE, NO_INSTANCE, 0))
    return out


def _ecc(gpu: int, double: bool = True, count: int = 1, xid: bool = True) -> list[Entry]:
    """A double-bit error is also Xid 48, as the driver logs it (one per injection, as the
    ECC event is: `count` moves the counters), and makes the driver ask for a GPU reset
    (the pending row remap or page retirement applies then); xid=False leaves the Xid out,
    to isolate a plugin's reaction to the ECC event itself. Single-bit errors have none."""
    if not 0 < count < U32:
        raise FakeNvmlError(f"ECC error count must be positive, not {count}")
    none = NO_INSTANCE
    out: list[Entry] = [(ecc_kind(double), gpu, count, none, none, 0)]
    if double:
        # The counted error, the Xid that reports it, the reset it asks for (_xid's
        # order): a consumer woken by either event already reads the counters and the
        # pending reset; none sees the ECC event without its Xid.
        if xid:
            out.append((Kind.XID, gpu, xids.DOUBLE_BIT_ECC, none, none, 0))
        out.append((Kind.RECOVERY_ACTION, gpu, xids.RecoveryAction.GPU_RESET, none, none, 0))
    return out


def _one(kind: Kind, data: int = 0) -> Callable[[int], list[Entry]]:
    return lambda gpu: [(kind, gpu, data, NO_INSTANCE, NO_INSTANCE, 0)]


RECOVER = "recover"
FAULTS: tuple[Fault, ...] = (
    Fault(
        name="xid",
        help="an Xid error event",
        params=(
            Param("code", "CODE", "Xid number, e.g. 79"),
            Param("gpu_instance", "--gpu-instance", None, None, least=0),
            Param("compute_instance", "--compute-instance", None, None, least=0),
        ),
        entries=_xid,
        shows=(Shown(Kind.XID, "Xid", DOWN),),
        heal=RECOVER,  # or the recovery action its code asks for (fakenvml/xids.py)
        says=lambda a: f"Xid {a['code']} on {{where}}",
    ),
    Fault(
        name="ecc",
        help="ECC error events (bump the counters)",
        params=(
            Param(
                "double",
                "--single/--double",
                ("single-bit (corrected)", "double-bit (uncorrected)"),
                default=True,
                aliases=("double_bit",),  # experiments' key before the CLI's
            ),
            Param("count", "--count", None, default=1),
            Param(
                "xid",
                "--no-xid",
                "double-bit without the Xid 48 the driver always logs with it "
                "(to isolate a plugin's reaction to the ECC event itself)",
                default=True,
                only=("double", True, "a single-bit error has no Xid"),
            ),
        ),
        entries=_ecc,
        shows=(
            Shown(Kind.ECC_DOUBLE, "ECC double-bit", DOWN),
            Shown(Kind.ECC_SINGLE, "ECC single-bit", None),
        ),
        heal=RECOVER,  # a double-bit error: or the GPU reset the driver asks for
        says=lambda a: (
            f"{'double' if a['double'] else 'single'}-bit ECC"
            f"{'' if a['xid'] else ' (no Xid 48)'} on {{where}}"
        ),
    ),
    Fault(
        name="lost",
        help="the GPU answers GPU_IS_LOST",
        params=(),
        entries=_one(Kind.LOST),
        shows=(Shown(Kind.LOST, "GPU lost", DOWN),),
        heal=RECOVER,
        says=lambda a: "{where} lost",
    ),
    Fault(
        name="fallen-off-bus",
        help="Xid 79, then lost",
        params=(),
        entries=_one(Kind.FALLEN_OFF_BUS, 79),  # Xid 79 to waiters, then GPU_IS_LOST
        shows=(Shown(Kind.FALLEN_OFF_BUS, "GPU fell off the bus", DOWN),),
        heal=RECOVER,  # the driver asks for a node reboot
        says=lambda a: "{where} fell off the bus",
    ),
    Fault(
        name=RECOVER,
        help="clear a GPU's faults",
        params=(),
        entries=_one(Kind.RECOVER),  # reachable again, recovery action NONE (an event)
        shows=(Shown(Kind.RECOVER, "recover", UP),),
        heal=None,
        says=lambda a: "recover {where}",
        command=(RECOVER,),
    ),
)
BY_NAME: dict[str, Fault] = {f.name: f for f in FAULTS}
NAMES = tuple(BY_NAME)


class OnlyWith(FakeNvmlError):
    """A Param's value that needs another's (Param.only): `param` and `other` are the two
    Params, so each way in can say it in its own words (--no-xid, `xid: false`)."""

    def __init__(self, param: Param, other: Param, value: object) -> None:
        self.param, self.other = param, other
        super().__init__(
            f"{param.name}={value!r} only with {other.name}={param.only[1]!r} ({param.only[2]})"
        )


def command(fault: Fault) -> tuple[str, ...]:
    """The fakenvml command that injects it: ("inject", name), or its own verb."""
    return fault.command or ("inject", fault.name)


def named(name: str) -> Fault:
    try:
        return BY_NAME[name]
    except KeyError:
        raise FakeNvmlError(f"{name!r}: expected a fault ({', '.join(NAMES)})") from None


def shown() -> dict[Kind, Shown]:
    """Every record kind a fault is seen as, in table order: how reports label them."""
    return {s.kind: s for f in FAULTS for s in f.shows}


def arguments(fault: Fault, given: Mapping[str, object]) -> dict[str, object]:
    """`given` with defaults filled in, refusing unknown or missing keys and values that
    break a Param's `only` (in the API's words: keyword=value)."""
    params = {p.name: p for p in fault.params}
    if unknown := sorted(set(given) - set(params)):
        raise FakeNvmlError(
            f"{fault.name}: unknown argument {', '.join(unknown)} "
            f"(expected {', '.join(params) or 'only the GPU'})"
        )
    out = {}
    for p in fault.params:
        if p.name not in given and p.default is REQUIRED:
            raise FakeNvmlError(f"{fault.name}: {p.name}= is required")
        out[p.name] = given.get(p.name, p.default)
    for p in fault.params:
        if p.only and out[p.name] != p.default and out[p.only[0]] != p.only[1]:
            raise OnlyWith(p, params[p.only[0]], out[p.name])
    return out
