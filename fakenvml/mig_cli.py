"""`fakenvml mig ...` and `fakenvml reset`: MIG layouts from the command line, as
`nvidia-smi mig` makes them on a real node (the library's rules, through fakenvml/mig.py).

    fakenvml mig enable 0|all            MIG mode pending (applies at `fakenvml reset`)
    fakenvml mig disable 0|all
    fakenvml reset 0|all                 a GPU reset: pending mode becomes current
    fakenvml mig apply all all-1g.10gb   mig-parted-style config, or 3g.40gb,2g.20gb
    fakenvml mig create-gi 0 3g.40gb [--placement 4] [-C]   (-C: and its compute instance)
    fakenvml mig create-ci 0 GI [--slices 1]
    fakenvml mig destroy-ci 0 GI CI
    fakenvml mig destroy-gi 0 GI          (its compute instances first)
    fakenvml mig list [--json]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from fakenvml.node import NodeDir

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:  # imported by the commands themselves: `fakenvml inject` never needs it
    from fakenvml import mig

GPU_HELP = "index, UUID or PCI bus id"


def register(sub: argparse._SubParsersAction, state: argparse.ArgumentParser,
             state_dir: Callable[[argparse.Namespace], object]) -> None:  # fmt: skip
    """Adds `mig` and `reset` to fakenvml's command parser."""

    def node(args: argparse.Namespace) -> NodeDir:
        return NodeDir(state_dir(args))  # type: ignore[arg-type]

    c = sub.add_parser("reset", parents=[state], help="a GPU reset: pending MIG mode applies")
    c.add_argument("gpu", metavar="GPU", help=f"{GPU_HELP}, or all")
    c.set_defaults(run=lambda a: _each(node(a), a.gpu, lambda p, m: p.reset(m)))

    c = sub.add_parser("mig", help="MIG mode and instances (as nvidia-smi mig)")
    acts = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    for verb, on in (("enable", True), ("disable", False)):
        a = acts.add_parser(verb, parents=[state], help=f"{verb} MIG mode (pending until reset)")
        a.add_argument("gpu", metavar="GPU", help=f"{GPU_HELP}, or all")
        a.set_defaults(run=lambda a, on=on: _each(node(a), a.gpu, lambda p, m: p.mode(m, on)))
    a = acts.add_parser("apply", parents=[state], help="a named config or profile list")
    a.add_argument("gpu", metavar="GPU", help=f"{GPU_HELP}, or all")
    a.add_argument("config", metavar="CONFIG", help="all-1g.10gb, all-balanced, all-disabled, "
                   "or profiles: 3g.40gb,2g.20gb")  # fmt: skip
    a.set_defaults(run=lambda a: _done(_mig().configure(node(a), a.gpu, a.config)))
    a = acts.add_parser("create-gi", parents=[state], help="a GPU instance")
    a.add_argument("gpu", metavar="GPU", help=GPU_HELP)
    a.add_argument("profile", metavar="PROFILE", help="1g.10gb, or its profile id (19)")
    a.add_argument("--placement", metavar="SLICE", type=int, help="its first memory slice")
    a.add_argument("-C", "--default-compute-instance", action="store_true",
                   help="also the compute instance that spans it")  # fmt: skip
    a.set_defaults(run=lambda a: _create_gi(node(a), a))
    a = acts.add_parser("create-ci", parents=[state], help="a compute instance")
    a.add_argument("gpu", metavar="GPU", help=GPU_HELP)
    a.add_argument("gi", metavar="GI", type=int, help="GPU instance id")
    a.add_argument("--slices", type=int, help="1, 2, 3, 4 or 7 (default: the whole instance)")
    a.set_defaults(run=lambda a: _one(node(a), a.gpu, lambda p, m: p.create_ci(m, a.gi, a.slices)))
    a = acts.add_parser("destroy-ci", parents=[state], help="a compute instance")
    a.add_argument("gpu", metavar="GPU", help=GPU_HELP)
    a.add_argument("gi", metavar="GI", type=int)
    a.add_argument("ci", metavar="CI", type=int)
    a.set_defaults(run=lambda a: _one(node(a), a.gpu, lambda p, m: p.destroy_ci(m, a.gi, a.ci)))
    a = acts.add_parser("destroy-gi", parents=[state], help="a GPU instance (and its CIs)")
    a.add_argument("gpu", metavar="GPU", help=GPU_HELP)
    a.add_argument("gi", metavar="GI", type=int)
    a.set_defaults(run=lambda a: _one(node(a), a.gpu, lambda p, m: p.destroy_gi(m, a.gi)))
    a = acts.add_parser("list", parents=[state], help="MIG mode and devices per GPU")
    a.add_argument("--json", action="store_true", help="one JSON object per MIG device")
    a.set_defaults(run=lambda a: _list(node(a), a.json))


def _mig():  # type: ignore[no-untyped-def]
    from fakenvml import mig

    return mig


def _done(records: list) -> None:
    print(f"{len(records)} MIG records written")


def _each(d: NodeDir, gpu: str, change: Callable[[mig.Plan, mig.GpuMig], object]) -> None:
    plan = _mig().Plan(d)
    for m in plan.targets(gpu):
        change(plan, m)
    _done(plan.write())


def _one(d: NodeDir, gpu: str, change: Callable[[mig.Plan, mig.GpuMig], object]) -> None:
    plan = _mig().Plan(d)
    out = change(plan, plan.gpu(gpu))
    plan.write()
    if out is not None:
        print(out)


def _create_gi(d: NodeDir, a: argparse.Namespace) -> None:
    plan = _mig().Plan(d)
    m = plan.gpu(a.gpu)
    gid = plan.create_gi(m, a.profile, a.placement)
    text = f"GPU instance {gid} on GPU {m.gpu.index}"
    if a.default_compute_instance:
        text += f", compute instance {plan.create_ci(m, gid)}"
    plan.write()
    print(text)


def _list(d: NodeDir, as_json: bool) -> None:
    mig = _mig()
    devices = mig.devices(d)
    if as_json:
        import json

        for x in devices:
            print(json.dumps(x.__dict__))
        return
    for m in mig.layout(d):
        if not m.capable:
            continue
        mode = {(False, False): "disabled", (True, True): "enabled"}.get(
            (m.current, m.pending), f"{'enabled' if m.current else 'disabled'}, "
            f"{'enable' if m.pending else 'disable'} pending reset")  # fmt: skip
        print(f"GPU {m.gpu.index} {m.gpu.name}: MIG {mode}")
        for x in (x for x in devices if x.gpu == m.gpu.index):
            print(f"  {x.index}  {x.profile:<12} gi {x.gi:<2} ci {x.ci}  {x.memory_mib} MiB  "
                  f"{x.multiprocessors} SMs  {x.uuid}")  # fmt: skip
