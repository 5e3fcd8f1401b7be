"""`fakenvml`: write a node's state, look at it like nvidia-smi, inject faults, move its
telemetry, make NVML calls fail or hang, tail events.

Every refusal is one line on stderr, "fakenvml: error: ...", exit status 2, and leaves the
state directory as it was: commands validate before they write.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fakenvml import durations, faults, kernlog, knobs, mig_cli, telemetry
from fakenvml.errors import FakeNvmlError
from fakenvml.journal import ALL_GPUS, JOURNAL_FILE, NO_INSTANCE, Kind, Record
from fakenvml.node import DEFAULT_STATE_DIR, STATE_DIR_ENV, NodeDir, default_state_dir

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import NoReturn

EXIT_BAD_INPUT = 2
SHIPPED_INVENTORIES = Path(__file__).resolve().parent / "inventories"
INVENTORY_DIGEST = "inventory.sha256"  # in a state dir: what `init --if-unchanged` wrote it from
FOLLOW_INTERVAL_S = 0.2  # `events --follow` is for people; a fifth of a second feels live
_NO_DATA = {Kind.LOST, Kind.FALLEN_OFF_BUS, Kind.RECOVER}  # data is implied (or unused)


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line, like every other refusal."""

    def error(self, message: str) -> NoReturn:
        raise FakeNvmlError(f"{message} (see `{self.prog} --help`)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser(argv[0] if argv else None).parse_args(argv)
        if args.command != "init" and _remote_flags(args):
            return _remote(args, argv)
        return int(args.run(args) or 0)
    except FakeNvmlError as e:
        print(f"fakenvml: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `fakenvml smi | head`: the reader left. Quiet, as a C tool dies of SIGPIPE; stdout
        # pointed at /dev/null so the interpreter's flush at exit cannot raise it again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


# --------------------------------------------------------------------------- commands


def _init(args: argparse.Namespace) -> None:
    d = NodeDir(_state_dir(args))
    if args.if_absent and d.exists():
        # A lab host already wrote it, or the pod restarted: keep the running journal,
        # which every plugin process has open.
        print(f"node state already in {d.path}; kept")
        return
    source = _inventory(args.inventory)
    digest = ""
    if args.if_unchanged:
        digest = _inventory_digest(source, args.node, args.driver_version)
        if d.exists() and _read_text(d.path / INVENTORY_DIGEST) == digest:
            kernlog.ensure(d.path)  # a state an older fakenvml wrote has no kernel log yet
            print(f"node state in {d.path} was written from this inventory; kept")
            return
    from fakenvml import inventory  # pydantic and YAML: only the commands that read YAML

    node = inventory.load(source, args.node, driver_version=args.driver_version)
    d.init(node)
    if digest:
        try:
            (d.path / INVENTORY_DIGEST).write_text(digest + "\n")
        except OSError as e:
            raise FakeNvmlError(f"cannot write {d.path / INVENTORY_DIGEST}: {e.strerror}") from None
    names = sorted({g.name for g in node.gpus})
    print(f"node {node.name}: {len(node.gpus)} GPU(s) ({', '.join(names)}) in {d.path}")


def _inventory_digest(source: Path, node: str | None, driver_version: str | None) -> str:
    """What `init --if-unchanged` compares: the inventory's bytes and the options that
    change what it writes (a state changed at run time, MIG or faults, is not a change)."""
    import hashlib

    try:
        data = source.read_bytes()
    except OSError as e:
        raise FakeNvmlError(f"cannot read inventory {source}: {e.strerror}") from None
    extra = f"\0{node or ''}\0{driver_version or ''}".encode()
    return hashlib.sha256(data + extra).hexdigest()


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _inventory(given: str) -> Path:
    """A file, or the name of a shipped inventory (`dgx-h100`): an installed package's
    files are not where a user would type their path."""
    path = Path(given)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in given:
        return path
    shipped = SHIPPED_INVENTORIES / f"{given}.yaml"
    if not shipped.is_file():
        names = ", ".join(sorted(p.stem for p in SHIPPED_INVENTORIES.glob("*.yaml")))
        raise FakeNvmlError(f"no inventory file or shipped inventory {given!r} (shipped: {names})")
    return shipped


def _build(args: argparse.Namespace) -> None:
    import shutil

    from fakenvml import library
    from fakenvml.native import build

    if shutil.which("gcc") is None:
        raise FakeNvmlError("building the library needs gcc on PATH")
    build.build("release", Path(args.out) if args.out else library.build_dir())


def _node_view(args: argparse.Namespace) -> int:
    from fakenvml import nodeview

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    return nodeview.run(Path(args.root), program)


def _install_driver(args: argparse.Namespace) -> None:
    from fakenvml import driver

    d = NodeDir(_state_dir(args))
    node = d.node() if d.exists() else None
    programs = [Path(p) for p in args.bin]
    node_dev = Path(args.dev) if args.dev else None
    modprobe = Path(args.modprobe) if args.modprobe else None
    got = driver.install(Path(args.root), node, programs, node_dev, modprobe)
    print(f"installed {got.library}")
    for program in programs:
        print(f"installed {Path(args.root) / driver.BIN_DIR / program.name}")
    if node is None:
        print(f"no GPU state in {d.path} yet: the library only (no versioned name, no /dev nodes)")
    elif got.no_device_nodes:
        print(f"no device nodes: {got.no_device_nodes}")
    else:
        names = ", ".join(p.name for p in got.device_nodes)
        print(f"device nodes under {Path(args.root) / driver.DEV_DIR}: {names}")
    if node is not None and node_dev is not None:
        if got.no_node_dev_nodes:
            print(f"no device nodes in {node_dev}: {got.no_node_dev_nodes}")
        else:
            print(f"device nodes in {node_dev}: {len(got.node_dev_nodes)}")


def _smi(args: argparse.Namespace) -> None:
    from fakenvml import smi  # imports pynvml only for the command that needs it

    state_dir = _state_dir(args)
    if args.list:
        print("\n".join(smi.listing(state_dir, args.id)))
    elif args.query:
        print("\n".join(smi.query(state_dir, args.id)))
    else:
        t = smi.table(state_dir, args.id)
        if sys.stdout.isatty():
            smi.print_rich(t)
        else:
            print(smi.format_plain(t))


def _inject(args: argparse.Namespace) -> None:
    """Any fault of the table (fakenvml/faults.py), `inject NAME` or its own verb; prints
    each record it wrote but the recovery action (which the fault's line already implies)."""
    d = NodeDir(_state_dir(args))
    fault = faults.named(args.fault)
    given = {p.name: getattr(args, p.name) for p in fault.params}
    try:
        recs = d.inject(fault.name, args.gpu, **given)
    except faults.OnlyWith as e:  # in the command line's words: --no-xid: only with --double
        needs = _flag(e.other, e.param.only[1])
        raise FakeNvmlError(f"{e.param.cli}: only with {needs} ({e.param.only[2]})") from None
    for rec in recs:
        if rec.kind != Kind.RECOVERY_ACTION:
            print(_describe(rec, d))


def _flag(p: faults.Param, value: object) -> str:
    """The flag that gives `p` `value`: "--double" of "--single/--double"."""
    no, yes = p.cli.split("/") if "/" in p.cli else (p.cli, p.cli)
    return yes if value else no


def _set(args: argparse.Namespace) -> None:
    d = NodeDir(_state_dir(args))
    for rec in d.set_sensors(args.gpu, args.assignments):
        print(_describe(rec, d))


def _process(args: argparse.Namespace) -> None:
    d = NodeDir(_state_dir(args))
    if args.action == "add":
        rec = d.add_process(args.gpu, args.pid, args.used, args.type, args.sm_util, args.mem_util)
        print(_describe(rec, d))
    elif args.action == "remove":
        print(_describe(d.remove_process(args.gpu, args.pid), d))
    else:
        for gpu, procs in sorted(d.processes().items()):
            for pid, used in sorted(procs.items()):
                print(f"GPU {gpu:<4}  pid {pid:<8}  {used // 2**20} MiB")


def _fail(args: argparse.Namespace) -> None:
    d = NodeDir(_state_dir(args))
    if args.clear:
        given = [args.error, args.gpu, args.count, args.after, args.probability, args.seed]
        if any(v not in (None, 0) for v in given):
            raise FakeNvmlError("--clear takes no --error, --gpu, --count, --after, "
                                "--probability or --seed")  # fmt: skip
        print(_describe(d.clear_knobs(fail=True, delay=False, function=args.function), d))
        return
    if not args.function or not args.error:
        raise FakeNvmlError("fail needs FUNCTION and --error (or --clear)")
    recs = d.fail_records(args.function, args.error, args.gpu, args.count, args.after,
                          args.probability, args.seed)  # fmt: skip
    # One line: the knob, then when it fails (a counted knob's FAIL_WHEN).
    print(_describe(recs[-1], d) + "".join(f", {_when(r)}" for r in recs[:-1]))


def _delay(args: argparse.Namespace) -> None:
    d = NodeDir(_state_dir(args))
    if args.clear:
        if args.duration is not None or args.gpu is not None:
            raise FakeNvmlError("--clear takes no DURATION or --gpu")
        rec = d.clear_knobs(fail=False, delay=True, function=args.function)
    elif not args.function or args.duration is None:
        raise FakeNvmlError("delay needs FUNCTION and DURATION, e.g. nvmlDeviceGetUUID 2s")
    else:
        rec = d.delay(args.function, args.duration, args.gpu)
    print(_describe(rec, d))


def _events(args: argparse.Namespace) -> None:
    if args.follow:
        _exit_on_sigterm()
    d = NodeDir(_state_dir(args))
    uuids = {g.index: g.uuid for g in d.node().gpus}
    start = args.since  # seq numbers start at 1, so "after seq N" is record index N
    for rec in d.events(start):
        _print_event(rec, uuids, args.json)
        start = rec.seq
    if not args.follow:
        return
    journal = d.path / JOURNAL_FILE
    inode = _inode(journal)
    while True:
        time.sleep(FOLLOW_INTERVAL_S)
        if _inode(journal) != inode:  # `init` replaced the journal: a new boot, seq restarts
            inode, start = _inode(journal), 0
            uuids = {g.index: g.uuid for g in d.node().gpus}
            print("-- journal re-initialised --", file=sys.stderr, flush=True)
        for rec in d.events(start):
            _print_event(rec, uuids, args.json)
            start = rec.seq


# --------------------------------------------------------------------------- helpers


_REMOTE_DESTS = ("node", "namespace", "kubeconfig", "context")


def _remote_flags(args: argparse.Namespace) -> list[str]:
    """The remote flags given (their defaults are SUPPRESS: absent unless typed)."""
    return [f"--{dest}" for dest in _REMOTE_DESTS if hasattr(args, dest)]


def _remote(args: argparse.Namespace, argv: list[str]) -> int:
    """The command, run in the fakenvml pod on --node (fakenvml/remote.py)."""
    from fakenvml import remote

    if not hasattr(args, "node"):
        raise FakeNvmlError(f"{', '.join(_remote_flags(args))}: only with --node NAME")
    if args.state_dir:
        raise FakeNvmlError("--node and --state-dir exclude each other")
    forwarded = remote.strip_remote_flags(argv)
    # An abbreviation (--nod) parses here but is not stripped: the pod would get --node
    # and exec into itself. Parse what the pod will parse, and refuse that.
    if _remote_flags(_parser(forwarded[0]).parse_args(forwarded)):
        raise FakeNvmlError("spell --node, --namespace, --kubeconfig and --context in full")
    return remote.run(
        args.node,
        forwarded,
        getattr(args, "namespace", None),
        getattr(args, "kubeconfig", None),
        getattr(args, "context", None),
    )


def _persistenced(args: argparse.Namespace) -> None:
    from fakenvml import persistenced

    _exit_on_sigterm()
    persistenced.serve(Path(args.root), _state_dir(args),
                       Path(args.ready) if args.ready else None)  # fmt: skip


def _exit_on_sigterm() -> None:
    """A command that runs until stopped exits at once, with status 0, on SIGTERM. In the
    chart's pods it is PID 1, for which the kernel ignores a signal with no handler: without
    this, every stop of a fake-GPU pod waited out its 30 s grace period and a SIGKILL."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir else default_state_dir()


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return -1


def _iso(ns: int) -> str:
    """UTC, to the microsecond (time, not datetime: one import less on every inject)."""
    seconds, rest = divmod(ns, 10**9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:06d}Z"


def _what(rec: Record) -> str:
    if rec.kind == Kind.SET:
        setting = telemetry.setting_of(rec.data, rec.gpu_instance, rec.compute_instance, rec.data2)
        return f"set {setting.text() if setting else f'sensor {rec.gpu_instance}'}"
    if rec.kind == Kind.PROCESS_ADD:
        util = rec.data2 & 0xFF, rec.data2 >> 8 & 0xFF
        given = f", sm {util[0]}%, mem {util[1]}%" if rec.data2 & telemetry.PROC_UTIL else ""
        return f"process-add pid {rec.gpu_instance} {rec.data // 2**20} MiB{given}"
    if rec.kind == Kind.PROCESS_REMOVE:
        return f"process-remove pid {rec.gpu_instance}"
    if rec.kind == Kind.FAIL:
        code = knobs.ERROR_NAMES.get(rec.data, str(rec.data))
        off = " (off)" if rec.data == 0 else ""
        times = f" x{rec.data2}" if rec.data2 else ""
        return f"fail {knobs.function_name(rec.gpu_instance)} {code}{times}{off}"
    if rec.kind == Kind.FAIL_WHEN:
        return f"fail-when {_when(rec)}"
    if rec.kind == Kind.DELAY:
        return f"delay {knobs.function_name(rec.gpu_instance)} {rec.data} ms"
    if rec.kind == Kind.CLEAR:
        what = {knobs.CLEAR_FAIL: "fail", knobs.CLEAR_DELAY: "delay"}.get(rec.data, "fail+delay")
        name = knobs.function_name(rec.gpu_instance) if rec.gpu_instance else "all"
        return f"clear {what} {name}"
    if rec.kind == Kind.XID:
        text = f"xid {rec.data}"
        if rec.gpu_instance != NO_INSTANCE or rec.compute_instance != NO_INSTANCE:
            text += f" (gi {_instance(rec.gpu_instance)}, ci {_instance(rec.compute_instance)})"
        return text
    if rec.kind in (Kind.ECC_SINGLE, Kind.ECC_DOUBLE):
        return f"{rec.kind.spelling} x{rec.data}"
    return rec.kind.spelling if rec.kind in _NO_DATA else f"{rec.kind.spelling} {rec.data}"


def _when(rec: Record) -> str:
    return knobs.when_text(rec.data, rec.data2, rec.gpu_instance, rec.compute_instance)


def _instance(value: int) -> str:
    return "-" if value == NO_INSTANCE else str(value)


def _describe(rec: Record, d: NodeDir) -> str:
    """The one line inject/recover/set/fail print: seq, time, what, where."""
    where = (
        "every GPU"
        if rec.gpu == ALL_GPUS
        else f"GPU {rec.gpu} ({d.identities().gpus[rec.gpu].uuid})"
    )
    return f"seq {rec.seq} at {_iso(rec.realtime_ns)}: {_what(rec)} on {where}"


def _print_event(rec: Record, uuids: dict[int, str], as_json: bool) -> None:
    if as_json:
        import json

        line = json.dumps(
            {
                "seq": rec.seq,
                "time": _iso(rec.realtime_ns),
                "realtime_ns": rec.realtime_ns,
                "monotonic_ns": rec.monotonic_ns,
                "kind": rec.kind.spelling,
                "gpu": None if rec.gpu == ALL_GPUS else rec.gpu,
                "uuid": uuids.get(rec.gpu),
                "what": _what(rec),
                "data": rec.data,
                "gpu_instance": None if rec.gpu_instance == NO_INSTANCE else rec.gpu_instance,
                "compute_instance": (
                    None if rec.compute_instance == NO_INSTANCE else rec.compute_instance
                ),
            }
        )
    else:
        gpu = "all" if rec.gpu == ALL_GPUS else rec.gpu
        line = f"{rec.seq:>6}  {_iso(rec.realtime_ns)}  GPU {gpu:<4}  {_what(rec)}"
    print(line, flush=True)


def _non_negative(text: str) -> int:
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, found {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, found {value}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, found {text!r}") from None


def _driver_version(text: str) -> str:
    from fakenvml import inventory

    if not inventory.valid_driver_version(text):
        raise argparse.ArgumentTypeError(f"expected like 535.261.03, found {text!r}")
    return text


def _duration_ms(text: str) -> int:
    try:
        return round(durations.seconds(text) * 1000)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _size(text: str) -> int:
    try:
        return telemetry.size_bytes(text)
    except FakeNvmlError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number >= 1, found 0")
    return value


def _add_param(parser: argparse.ArgumentParser, p: faults.Param) -> None:
    """A fault's argument as `Param.cli` spells it (fakenvml/faults.py)."""
    if "/" in p.cli:  # a choice the command line always makes: --single/--double
        pair = parser.add_mutually_exclusive_group(required=True)
        for flag, value, text in zip(p.cli.split("/"), (False, True), p.help, strict=True):
            pair.add_argument(flag, dest=p.name, action=f"store_{str(value).lower()}", help=text)
    elif p.cli.startswith("--no-"):
        parser.add_argument(p.cli, dest=p.name, action="store_false", help=p.help)
    else:
        number = _positive if p.least else _non_negative
        default = None if p.default is faults.REQUIRED else p.default
        if p.cli.startswith("--"):
            parser.add_argument(p.cli, dest=p.name, metavar="N", type=number, default=default,
                                help=p.help)  # fmt: skip
        else:
            parser.add_argument(p.name, metavar=p.cli, type=number, help=p.help)


class _Skipped:
    """Stands in for the parser of a command argv does not name: building all of them
    cost every `fakenvml inject` a few ms of start-up."""

    def __getattr__(self, name: str) -> Callable[..., _Skipped]:
        return lambda *args, **kwargs: self


class _Commands:
    """The subcommands action, building only the command `only` names (all when None)."""

    def __init__(self, sub: argparse._SubParsersAction, only: str | None) -> None:
        self.sub, self.only, self.built = sub, only, False

    def add_parser(self, name: str, **kwargs: object) -> argparse.ArgumentParser:
        if self.only not in (None, name):
            return _Skipped()  # type: ignore[return-value]
        self.built = True
        return self.sub.add_parser(name, **kwargs)  # type: ignore[arg-type]


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """fakenvml's parser; given the command argv starts with, only that command's (argv
    that names none, or an unknown one, gets them all, for help and errors)."""
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument(
        "--state-dir",
        metavar="DIR",
        help=f"node state directory (default: ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR})",
    )
    # Defaults SUPPRESS: a group parser (inject, process) and its subcommand both take
    # them, and a subcommand's None default would overwrite the group's parsed value.
    remote = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    remote.add_argument("--node", metavar="NAME", help="run it in the fakenvml pod on this "
                        "Kubernetes node, through the API (KUBECONFIG)")  # fmt: skip
    remote.add_argument("--namespace", metavar="NS", help="the pod's namespace (default: any)")
    remote.add_argument("--kubeconfig", metavar="FILE",
                        help="default: $KUBECONFIG or ~/.kube/config")  # fmt: skip
    remote.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")
    # Every state command but init (whose --node names the node it writes).
    on_node = argparse.ArgumentParser(add_help=False, parents=[state, remote])
    p = _Parser(prog="fakenvml", description="A fake NVIDIA GPU for machines that have none.")
    sub = _Commands(p.add_subparsers(dest="command", required=True, metavar="COMMAND"), only)

    c = sub.add_parser("init", parents=[state], help="write a node's state from an inventory")
    c.add_argument("inventory", metavar="INVENTORY", help="a file, or a shipped name: dgx-h100")
    c.add_argument("--node", metavar="NAME", help="node name (default: the inventory's `node:`)")
    keep = c.add_mutually_exclusive_group()
    keep.add_argument("--if-absent", action="store_true", help="keep a state that already exists")
    keep.add_argument("--if-unchanged", action="store_true",
                      help="keep a state written from this same inventory")  # fmt: skip
    c.add_argument("--driver-version", metavar="X.Y.Z", type=_driver_version,
                   help="instead of the inventory's (535.261.03 for nvidia-smi 535)")  # fmt: skip
    c.set_defaults(run=_init)

    c = sub.add_parser("build", help="compile libnvidia-ml.so.1 (needs gcc, gpulab[build])")
    c.add_argument("--out", metavar="DIR", help="build tree (default: the checkout's build/ "
                   "or $GPULAB_CACHE/fakenvml/<sources>)")  # fmt: skip
    c.set_defaults(run=_build)

    c = sub.add_parser(
        "install-driver",
        parents=[on_node],
        help="the library and the GPUs' device nodes into a node's driver root",
    )
    c.add_argument("root", metavar="DIR", help="e.g. /run/fakenvml/driver")
    c.add_argument("--bin", metavar="PATH", action="append", default=[],
                   help="also this driver program (nvidia-smi, nvidia-cuda-mps-control, ...) "
                   "as <root>/usr/bin/<its name>; repeatable")  # fmt: skip
    c.add_argument("--dev", metavar="DIR",
                   help="also the device nodes in DIR, the node's own /dev (left alone where "
                   "a real NVIDIA driver is loaded)")  # fmt: skip
    c.add_argument("--modprobe", metavar="PATH",
                   help="a static modprobe (busybox) as <root>/sbin/modprobe: chroot'd into "
                   "the root, it finds the driver's modules loaded")  # fmt: skip
    c.set_defaults(run=_install_driver)

    c = sub.add_parser(
        "node-view",
        help="run a program seeing a driver root's proc/modules, PCI sysfs ... where the "
        "kernel keeps them (a private mount namespace; root)",
    )
    c.add_argument("root", metavar="DIR", help="a driver root install-driver wrote")
    c.add_argument("program", metavar="-- PROGRAM", nargs=argparse.REMAINDER,
                   help="the program and its arguments")  # fmt: skip
    c.set_defaults(run=_node_view)

    c = sub.add_parser(
        "persistenced",
        parents=[state],
        help="serve the state to NVML in workload containers, on the driver root's "
        "nvidia-persistenced socket",
    )
    c.add_argument("root", metavar="DIR", help="the driver root, e.g. /run/fakenvml/driver")
    c.add_argument("--ready", metavar="FILE", help="touched once the socket listens")
    c.set_defaults(run=_persistenced)

    c = sub.add_parser("smi", parents=[on_node], help="nvidia-smi-like view, read through NVML")
    c.add_argument("-L", "--list", action="store_true", help="list GPUs with their UUIDs")
    c.add_argument("-q", "--query", action="store_true", help="details per GPU")
    c.add_argument("-i", "--id", metavar="GPU", help="one GPU: index, UUID or PCI bus id")
    c.set_defaults(run=_smi)

    c = sub.add_parser("inject", parents=[remote], help="inject a fault")
    injected = c.add_subparsers(dest="fault", required=True, metavar="FAULT")
    c.set_defaults(run=_inject)
    # Every fault of the table (fakenvml/faults.py): `inject NAME ...`, or, for a heal, a
    # command of its own (`recover GPU`).
    for fault in faults.FAULTS:
        verb = faults.command(fault)
        parent = injected if verb[0] == "inject" else sub
        f = parent.add_parser(verb[-1], parents=[on_node], help=fault.help)
        f.set_defaults(run=_inject, fault=fault.name)
        f.add_argument("gpu", metavar="GPU", help="index, UUID or PCI bus id")
        for param in fault.params:
            _add_param(f, param)

    c = sub.add_parser("set", parents=[on_node], help="move a GPU's telemetry (temperature, ...)")
    c.add_argument("gpu", metavar="GPU", help="index, UUID, PCI bus id, or all")
    c.add_argument("assignments", metavar="FIELD=VALUE", nargs="+",
                   help=f"FIELD: {', '.join(s.spelling for s in telemetry.Sensor)}; VALUE: "
                   "a number (units optional: 88C 350W 90%% 1980MHz), FROM..TO/PERIOD "
                   "(a triangle wave: 70..90/30s), or idle (the profile's)")  # fmt: skip
    c.set_defaults(run=_set)

    c = sub.add_parser(
        "process", parents=[remote], help="processes on a GPU (what NVML lists as running)"
    )
    acts = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = acts.add_parser("add", parents=[on_node], help="a process using GPU memory")
    a.add_argument("gpu", metavar="GPU", help="index, UUID or PCI bus id")
    a.add_argument("--pid", metavar="PID", type=_positive, required=True)
    a.add_argument("--used", metavar="SIZE", type=_size, required=True, help="e.g. 2GiB")
    a.add_argument("--type", choices=("compute", "graphics", "both"), default="compute")
    a.add_argument("--sm-util", metavar="PCT", type=_non_negative,
                   help="its SM utilisation, 0-100 (default: a share of the GPU's)")  # fmt: skip
    a.add_argument("--mem-util", metavar="PCT", type=_non_negative,
                   help="its memory utilisation, 0-100 (default: a share of mem-util)")  # fmt: skip
    a = acts.add_parser("remove", parents=[on_node], help="the process ends")
    a.add_argument("gpu", metavar="GPU", help="index, UUID or PCI bus id")
    a.add_argument("--pid", metavar="PID", type=_positive, required=True)
    acts.add_parser("list", parents=[on_node], help="processes per GPU")
    c.set_defaults(run=_process)

    c = sub.add_parser("fail", parents=[on_node], help="an NVML call answers an error")
    c.add_argument("function", metavar="FUNCTION", nargs="?",
                   help="exported name, e.g. nvmlDeviceGetMemoryInfo or nvmlInit")  # fmt: skip
    c.add_argument("--error", metavar="ERROR", help="e.g. GPU_IS_LOST, DRIVER_NOT_LOADED, UNKNOWN")
    c.add_argument("--gpu", metavar="GPU", help="only calls on this GPU (nvmlInit: it fails init)")
    c.add_argument("--count", metavar="N", type=_non_negative, default=0,
                   help="N calls fail, then it is spent (default: until cleared)")  # fmt: skip
    c.add_argument("--after", metavar="N", type=_non_negative, default=0,
                   help="the first N matching calls succeed, then calls fail")  # fmt: skip
    c.add_argument("--probability", metavar="P", type=_number,
                   help="each matching call fails with probability P (0 < P <= 1)")  # fmt: skip
    c.add_argument("--seed", metavar="S", type=_non_negative,
                   help="the draws' seed: the same seed fails the same calls "
                   "(default: random)")  # fmt: skip
    c.add_argument("--clear", action="store_true", help="remove fail knobs (FUNCTION's, or all)")
    c.set_defaults(run=_fail)

    c = sub.add_parser("delay", parents=[on_node], help="an NVML call answers late")
    c.add_argument("function", metavar="FUNCTION", nargs="?", help="exported name")
    c.add_argument("duration", metavar="DURATION", nargs="?", type=_duration_ms,
                   help="500ms, 2s, 1.5m (0: no delay)")  # fmt: skip
    c.add_argument("--gpu", metavar="GPU", help="only calls on this GPU")
    c.add_argument("--clear", action="store_true", help="remove delays (FUNCTION's, or all)")
    c.set_defaults(run=_delay)

    mig_cli.register(sub, on_node, _state_dir)

    c = sub.add_parser("events", parents=[on_node], help="print the fault journal")
    c.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    c.add_argument("--since", metavar="SEQ", type=_non_negative, default=0)
    c.add_argument("--json", action="store_true", help="one JSON object per line")
    c.set_defaults(run=_events)
    return p if sub.built or only is None else _parser()


if __name__ == "__main__":
    sys.exit(main())
