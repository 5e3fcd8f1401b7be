"""`gpulab`: the lab's one command.

    gpulab infra [GROUP...] [--list]       build what labs need (engine, kind, images, ...)
    gpulab infra export DIR | import DIR | key    the same, as a directory a CI cache keeps
    gpulab lab up LAB [--subject S]        a lab up (a running cluster is reused)
    gpulab lab down LAB                    its cluster and host state deleted
    gpulab lab wait LAB [--timeout S]      until no other process drives it
    gpulab lab list                        the shipped labs, and which of them run
    gpulab lab fleet LAB [NODE COUNT]      COUNT KWOK copies of a lab's GPU node (0: none;
                                           neither: the fleet its spec declares);
                                           --live N: N of them with a DRA driver of their own
    gpulab test [--subject S,...] [--suites subject|all] [PYTEST-ARGS...]   the cluster tier
    gpulab experiment run|validate|report  fault-injection experiments on a lab
    gpulab inject LAB NODE xid 0 79        a fault into a lab node's fake GPUs
    gpulab standin -- PLUGIN-COMMAND       a device plugin against the kubelet stand-in

A node's own tools stay apart: `fakenvml` (its fake GPUs) and `gpulab-plugin`. Each
command imports what it runs when it runs: `gpulab inject` never loads the suites.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import NoReturn

    from rich.console import Console

    from clusters.labs.spec import Lab as LabSpec

# -- commands with a parser of their own: every word after the command is theirs ---------


def infra(argv: list[str]) -> int:
    """The build steps (clusters/infra/infra.py), or the CI cache's export, import and key
    (clusters/infra/infracache.py)."""
    from clusters.infra import infra, infracache

    if argv[:1] and argv[0] in infracache.COMMANDS:
        return infracache.main(argv, "gpulab infra")
    return infra.main(argv, "gpulab infra")


def suites_command(argv: Sequence[str]) -> list[str]:
    """pytest over the shipped cluster-tier suites (the e2e package, wherever it is
    installed; the gpulab_e2e pytest plugin's options --subject, --suites, --lab and
    --keep-lab) with `argv`; -k and -m choose among them, and a suite named in `argv`
    (e2e/test_seed.py[::test], e2e.test_seed) runs alone."""
    named = any(not a.startswith("-") and (a.endswith(".py") or ".py::" in a or
                                           a.startswith("e2e.")) for a in argv)  # fmt: skip
    every = [] if named else ["e2e"]
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", *every, *argv]


def run_suites(argv: list[str]) -> NoReturn:
    """`gpulab test`: the suites in this process's place (its exit status, its signals);
    refused with one line when the versions asked for ($GPULAB_KUBE_VERSION,
    $GPULAB_KUBELET_VERSION) are not a cluster the skew policy allows."""
    from clusters import versions

    try:
        versions.describe()
    except ValueError as e:
        print(f"gpulab test: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    cmd = suites_command(argv)
    os.execv(cmd[0], cmd)


def standin(argv: list[str]) -> int:
    from standin import cli

    return cli.main(argv, "gpulab standin")


def inject(argv: list[str], labs_root: Path | None = None) -> int:
    """`fakenvml inject FAULT ... --state-dir D` (or `fakenvml recover GPU ...`), D being
    where the lab keeps NODE's fake GPUs on this machine: the node's library sees it at
    once (a bind mount, no API server in between)."""
    ap = argparse.ArgumentParser(
        prog="gpulab inject",
        description="A fault into a lab node's fake GPUs: `fakenvml inject` (or `fakenvml "
        "recover`) on the state the lab keeps for that node on this machine.",
        epilog="e.g. gpulab inject seed seed-worker xid 0 79; gpulab inject seed seed-worker "
        "ecc 3 --double; gpulab inject seed seed-worker recover 0. Other fakenvml commands "
        "reach a lab node through its API server: fakenvml COMMAND --node NODE.",
    )
    ap.add_argument("lab", metavar="LAB", help="a lab (seed, hetero, ...) or its spec file")
    ap.add_argument("node", metavar="NODE", help="one of its GPU nodes (seed-worker, ...)")
    ap.add_argument("fault", nargs=argparse.REMAINDER, metavar="FAULT ...",
                    help="as `fakenvml inject` takes it (`fakenvml inject --help`), "
                    "or recover GPU")  # fmt: skip
    args = ap.parse_args(argv)
    if not args.fault:
        ap.error("name a fault, as `fakenvml inject` takes it (xid 0 79), or recover GPU")
    try:
        state = node_state(args.lab, args.node, labs_root)
    except LookupError as e:
        print(f"gpulab inject: error: {e.args[0]}", file=sys.stderr)
        return 2
    from fakenvml import cli as fakenvml
    from fakenvml import faults

    # A fault of the table by its name; those with a verb of their own (recover) run as it.
    fault = faults.BY_NAME.get(args.fault[0])
    verb = faults.command(fault) if fault else ("inject", args.fault[0])
    command = [*verb, *args.fault[1:]]
    return fakenvml.main([*command, "--state-dir", str(state)])


def node_state(lab: str, node: str, labs_root: Path | None = None) -> Path:
    """The host dir of a lab node's fakenvml state (kind bind-mounts it into the node);
    LookupError, in one line, for an unknown lab or node or a lab that is not up here."""
    from clusters.labs import kindconfig, spec
    from fakenvml.node import NodeDir

    try:
        found = spec.load(lab)
    except spec.SpecError as e:
        raise LookupError(str(e)) from None
    name, gpu_nodes = found.spec.name, [n.name for n in found.gpu_nodes]
    if node not in gpu_nodes:
        raise LookupError(f"lab {name} has no GPU node {node!r} "
                          f"(its GPU nodes: {', '.join(gpu_nodes) or 'none'})")  # fmt: skip
    if labs_root is None:
        from clusters.labs.lab import LABS_ROOT

        labs_root = LABS_ROOT
    path = kindconfig.state_dir(labs_root, found, node)
    if not NodeDir(path).exists():
        raise LookupError(f"no fake GPUs of {node} in {path}: lab {name} is not up on this "
                          f"machine (gpulab lab up {name})")  # fmt: skip
    return path


# -- commands parsed here ----------------------------------------------------------------


def _lab_up(args: argparse.Namespace) -> int:
    return _with_lab(args, lambda lab: lab.up())


def _lab_down(args: argparse.Namespace) -> int:
    return _with_lab(args, lambda lab: lab.down())


def _lab_wait(args: argparse.Namespace) -> int:
    """Until no other process drives the lab: `make test`'s skew pass waits here for the
    cluster tier to let the seed lab go, outside any test's timeout (pytest's 300 s)."""

    from clusters.labs.lab import Lab

    def wait(lab: Lab) -> None:
        if lab.host.claim(wait_s=args.timeout):
            lab.host.release()
        print(f"lab {lab.name} is free")

    return _with_lab(args, wait)


def _lab_fleet(args: argparse.Namespace) -> int:
    from clusters.labs import fleet
    from clusters.labs.lab import Lab

    if (args.node is None) != (args.count is None):
        print("gpulab lab fleet: error: give NODE and COUNT, or neither (the spec's fleet)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.count is not None and args.count < 0:
        print(f"gpulab lab fleet: error: COUNT is {args.count}: 0 or more", file=sys.stderr)
        return 2
    if args.count is not None and not 0 <= args.live <= args.count:
        print(f"gpulab lab fleet: error: --live {args.live}: 0 to COUNT ({args.count})",
              file=sys.stderr)  # fmt: skip
        return 2

    def scale(lab: Lab) -> None:
        if args.node is None:
            made = fleet.up_spec(lab.ctx)
            if not made:
                print(f"lab {lab.name}'s spec declares no fleet (a GPU node's `fleet:`)")
            lives = {n: f.live for n, f in lab.lab.fleet.items()}
        else:
            made = {args.node: fleet.up(lab.ctx, args.node, args.count, live=args.live)}
            lives = {args.node: args.live}
        for model, names in made.items():
            span = f": {names[0]} .. {names[-1]}" if names else ""
            print(f"{len(names)} copies of {model}{span}")
            for name in names[: lives[model]]:
                print(f"  {name}: live, its GPUs in {fleet.live_state(lab.ctx, model, name).path}")

    return _with_lab(args, scale)


def _with_lab(args: argparse.Namespace, do: Callable[..., object]) -> int:
    from clusters.labs.lab import Lab
    from clusters.labs.spec import SpecError
    from clusters.steps import StepError
    from clusters.subjects.subject import SubjectError

    try:
        do(Lab(args.lab, subject=getattr(args, "subject", None)))
    except (SpecError, StepError, SubjectError) as e:
        print(f"gpulab lab: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, StepError) else 2
    return 0


def _lab_list(args: argparse.Namespace) -> int:
    from clusters.labs import spec

    running, unknown = running_clusters()
    try:
        labs = spec.shipped()
    except spec.SpecError as e:  # a MIG inventory is checked by the library, not built yet
        print(f"gpulab lab list: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lab_lines(labs, running)))
    if unknown:
        print(f"gpulab lab list: which labs run is unknown: {unknown}", file=sys.stderr)
    return 0


def running_clusters() -> tuple[set[str] | None, str]:
    """The kind clusters on this machine, or None and why they are unknown."""
    from clusters import built, steps
    from clusters.labs import host

    try:
        kind = built.Products.load().kind
        if not kind:
            return None, f"kind is not built ({built.MAKE_INFRA})"
        return set(host.clusters(kind)), ""
    except (OSError, steps.StepError) as e:
        return None, str(e)


def lab_lines(labs: list[LabSpec], running: set[str] | None) -> list[str]:
    """One line a lab: name, nodes, fake GPUs, its fleet's KWOK copies, what serves them,
    whether a kind cluster of its name runs here (`?`: unknown); then the kind clusters
    that are no shipped lab."""
    from clusters.labs import servers, serving

    rows = [("LAB", "NODES", "GPUS", "FLEET", "SERVES", "CLUSTER")]
    for lab in labs:
        serves = servers.choose(lab, lambda lab=lab: serving.for_subject(lab.spec.subject)).words
        state = "?" if running is None else "running" if lab.spec.name in running else "-"
        gpus = sum(n.gpu_count for n in lab.gpu_nodes)
        copies = sum(f.copies for f in lab.fleet.values())  # its spec's KWOK copies
        rows.append((lab.spec.name, str(len(lab.nodes)), str(gpus), str(copies or "-"), serves,
                     state))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
             for r in rows]  # fmt: skip
    others = sorted((running or set()) - {lab.spec.name for lab in labs})
    if others:
        lines.append(f"other kind clusters here: {', '.join(others)}")
    return lines


def _experiment_run(args: argparse.Namespace) -> int:
    from e2e import play

    return play.run(args.file, args.subject, args.out, not args.no_reset, _console())


def _experiment_validate(args: argparse.Namespace) -> int:
    from e2e import play

    return play.validate(args.files, _console())


def _experiment_report(args: argparse.Namespace) -> int:
    from e2e import play

    return play.rerender(args.dir, _console())


def _experiment(args: argparse.Namespace) -> int:
    from e2e.experiments import ExperimentError

    try:
        return args.experiment(args)
    except ExperimentError as e:
        _console().print(f"[red]gpulab: error:[/] {e}", highlight=False)
        return 2


def _console() -> Console:
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


OWN_PARSER: dict[str, Callable[[list[str]], int]] = {
    "infra": infra,
    "test": run_suites,
    "inject": inject,
    "standin": standin,
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpulab",
        description=__doc__.split("\n\n")[0].replace("`", "").strip('"'),
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Listed for --help; main() hands their words to them before this parser sees them.
    sub.add_parser("infra", help="build what labs need: engine, kind, node image, images")
    lab = sub.add_parser("lab", help="a lab up, down, or the shipped labs listed")
    sub.add_parser("test", help="the cluster-tier suites (pytest's options, and -k/-m to choose)")
    exp = sub.add_parser("experiment", help="fault-injection experiments on a lab")
    sub.add_parser("inject", help="a fault into a lab node's fake GPUs (`gpulab inject -h`)")
    sub.add_parser("standin", help="a device plugin against the kubelet stand-in")

    acts = lab.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = acts.add_parser("up", help="the lab running its plugin (a running cluster is reused)")
    up.add_argument("lab", help="a lab under clusters/labs/ (seed, hetero, mig, dra, ...) "
                                "or a path")  # fmt: skip
    up.add_argument("--subject", help="the plugin under test: gpulab, nvidia, nvidia-v0.17.4 "
                    "or a subject file, or none: fake GPUs only (default: the lab's)")  # fmt: skip
    up.set_defaults(run=_lab_up)
    down = acts.add_parser("down", help="delete the lab's cluster and its state on this machine")
    down.add_argument("lab", help="a lab under clusters/labs/ or a path")
    down.set_defaults(run=_lab_down)
    wt = acts.add_parser("wait", help="until no other process drives the lab (its claim)")
    wt.add_argument("lab", help="a lab under clusters/labs/ or a path")
    wt.add_argument("--timeout", type=float, default=0, metavar="S",
                    help="give up after S seconds (default 0: at once)")  # fmt: skip
    wt.set_defaults(run=_lab_wait)
    acts.add_parser("list", help="the shipped labs, and which have a cluster running here"
                    ).set_defaults(run=_lab_list)  # fmt: skip
    fl = acts.add_parser("fleet", help="KWOK copies of a running lab's GPU node: its capacity, "
                         "labels and DRA slices (clusters/labs/fleet.py)")  # fmt: skip
    fl.add_argument("lab", help="a lab under clusters/labs/ or a path (up)")
    fl.add_argument("node", nargs="?", help="one of its GPU nodes, the copies' model "
                    "(with COUNT; neither: the fleet its spec declares)")  # fmt: skip
    fl.add_argument("count", type=int, nargs="?",
                    help="how many copies (0: none, the others deleted)")  # fmt: skip
    fl.add_argument("--live", type=int, default=0, metavar="N",
                    help="the first N copies run a DRA driver of their own on fake GPUs "
                    "of their own (inject with the --state-dir it prints)")  # fmt: skip
    fl.set_defaults(run=_lab_fleet)

    from e2e.play import OUT

    cmds = exp.add_subparsers(dest="action", required=True, metavar="ACTION")
    run = cmds.add_parser("run", help="run an experiment and write its report")
    run.add_argument("file", help="e2e/experiments/<name>.yaml, or a shipped name")
    run.add_argument("--subject", help="override the file's subject (a name or a subject file)")
    run.add_argument("--out", type=Path, help=f"report directory (default {OUT}/<name>-<subject>, "
                     f"on a DRA lab {OUT}/<name>)")  # fmt: skip
    run.add_argument("--no-reset", action="store_true",
                     help="leave faults and pods in place afterwards, to look at them")  # fmt: skip
    run.set_defaults(experiment=_experiment_run)
    val = cmds.add_parser("validate", help="check experiment files against the schema and lab")
    val.add_argument("files", nargs="+")
    val.set_defaults(experiment=_experiment_validate)
    rep = cmds.add_parser("report", help="re-render a report directory from recording.json")
    rep.add_argument("dir", type=Path)
    rep.set_defaults(experiment=_experiment_report)
    exp.set_defaults(run=_experiment)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] and (own := OWN_PARSER.get(words[0])):
        return own(words[1:])
    args = _parser().parse_args(words)
    return int(args.run(args))
