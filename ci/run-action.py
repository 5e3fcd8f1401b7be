#!/usr/bin/env python3
"""Runs a composite action's steps here, in the order and with the contexts a GitHub
runner gives them, to try action.yml without pushing it.

    ci/run-action.py --input subject=examples/tiny-gpu-plugin/subject.yaml --dry-run
    ci/run-action.py --input subject=examples/tiny-gpu-plugin/subject.yaml [--work DIR]

`run:` steps run under bash as the runner runs them (`bash --noprofile --norc -eo pipefail`),
with ${{ }} expressions resolved (inputs, github.action_path, github.workspace, runner.temp,
runner.os, steps.<id>.outputs, steps.<id>.outcome, env; always(), success(), failure()),
and $GITHUB_OUTPUT, $GITHUB_ENV, $GITHUB_PATH, $GITHUB_STEP_SUMMARY files read back after
each step. `uses:` steps are emulated where they can be: setup-python and setup-go check
that the tool is here; cache/restore and cache/save keep entries in WORK/cache/<key>;
upload-artifact copies into WORK/artifacts/<name>. Any other `uses:` is refused before a
step runs. --dry-run prints the steps in order, resolved as far as they can be before
running (a step output shows as <steps.ID.outputs.NAME>).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EMULATED = {
    "actions/setup-python": "check_python",
    "actions/setup-go": "check_go",
    "actions/cache/restore": "cache_restore",
    "actions/cache/save": "cache_save",
    "actions/upload-artifact": "upload_artifact",
}
STATUS_FUNCS = ("always", "success", "failure", "cancelled")


class ActionError(Exception):
    """The action cannot run here; the message says which step and why."""


# -- expressions -------------------------------------------------------------------------

TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||[!()])"
    r"|(?P<name>[A-Za-z_][\w.-]*(?:\(\))?))"
)


@dataclass
class Unknown:
    """A value not known before the run (a step's output in --dry-run)."""

    text: str

    def __str__(self) -> str:
        return f"<{self.text}>"


class Expr:
    """GitHub's expression language, the part actions use: literals, context paths,
    == != ! && || and parentheses, and the status functions."""

    def __init__(self, text: str, lookup: Callable[[str], Any], status: Callable[[str], bool]):
        self.tokens = self._lex(text)
        self.text, self.lookup, self.status = text, lookup, status
        self.i = 0

    @staticmethod
    def _lex(text: str) -> list[tuple[str, str]]:
        out, pos = [], 0
        while pos < len(text.rstrip()):
            m = TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ActionError(f"cannot read the expression {text!r} at {text[pos:]!r}")
            kind = m.lastgroup or ""
            out.append((kind, m.group(kind)))
            pos = m.end()
        return out

    def value(self) -> Any:
        v = self._or()
        if self.i != len(self.tokens):
            raise ActionError(f"cannot read the expression {self.text!r}")
        return v

    def uses_status(self) -> bool:
        return any(k == "name" and v.removesuffix("()") in STATUS_FUNCS for k, v in self.tokens)

    def _peek(self) -> str:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else ""

    def _take(self) -> tuple[str, str]:
        if self.i >= len(self.tokens):
            raise ActionError(f"the expression {self.text!r} ends early")
        self.i += 1
        return self.tokens[self.i - 1]

    def _or(self) -> Any:
        v = self._and()
        while self._peek() == "||":
            self._take()
            right = self._and()
            v = v if _truthy(v) else right
        return v

    def _and(self) -> Any:
        v = self._cmp()
        while self._peek() == "&&":
            self._take()
            right = self._cmp()
            v = right if _truthy(v) else v
        return v

    def _cmp(self) -> Any:
        v = self._unary()
        while self._peek() in ("==", "!="):
            op = self._take()[1]
            right = self._unary()
            if isinstance(v, Unknown) or isinstance(right, Unknown):
                v = Unknown(f"{v} {op} {right}")
            else:
                v = (_norm(v) == _norm(right)) == (op == "==")
        return v

    def _unary(self) -> Any:
        if self._peek() == "!":
            self._take()
            v = self._unary()
            return Unknown(f"!{v}") if isinstance(v, Unknown) else not _truthy(v)
        return self._atom()

    def _atom(self) -> Any:
        kind, tok = self._take()
        if tok == "(":
            v = self._or()
            if self._take()[1] != ")":
                raise ActionError(f"unbalanced parentheses in {self.text!r}")
            return v
        if kind == "str":
            return tok[1:-1].replace("''", "'")
        if kind == "num":
            return float(tok)
        if kind == "name":
            if tok.endswith("()"):
                if tok[:-2] not in STATUS_FUNCS:
                    raise ActionError(f"the function {tok} is not emulated ({self.text!r})")
                return self.status(tok[:-2])
            if tok in ("true", "false"):
                return tok == "true"
            if tok == "null":
                return None
            return self.lookup(tok)
        raise ActionError(f"unexpected {tok!r} in {self.text!r}")


def _truthy(v: Any) -> bool:
    if isinstance(v, Unknown):
        return True  # a dry run shows what would run if it were
    return bool(v) and v != 0


def _norm(v: Any) -> Any:
    """GitHub compares strings case-insensitively, and null as ''."""
    if v is None:
        return ""
    return v.lower() if isinstance(v, str) else v


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


# -- the runner --------------------------------------------------------------------------


@dataclass
class Step:
    index: int
    spec: dict[str, Any]

    @property
    def title(self) -> str:
        return str(self.spec.get("name") or self.spec.get("uses") or f"run #{self.index}")


@dataclass
class Runner:
    action_dir: Path
    inputs: dict[str, str]
    workspace: Path
    work: Path
    dry_run: bool = False
    steps_ctx: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # $GITHUB_ENV's, for later steps
    path_prepend: list[str] = field(default_factory=list)
    failed: bool = False

    # -- contexts --

    def lookup(self, path: str) -> Any:
        head, *rest = path.split(".")
        if head == "inputs" and len(rest) == 1:
            return self.inputs.get(rest[0], "")
        if head == "github" and rest in (["action_path"], ["workspace"]):
            return str(self.action_dir if rest[0] == "action_path" else self.workspace)
        if head == "runner" and rest in (["temp"], ["os"], ["arch"]):
            return {"temp": str(self.temp), "os": "Linux", "arch": "X64"}[rest[0]]
        if head == "env" and len(rest) == 1:
            return self.env.get(rest[0], os.environ.get(rest[0], ""))
        if head == "steps" and len(rest) >= 2:
            if self.dry_run:
                return Unknown(path)
            got = self.steps_ctx.get(rest[0], {})
            if rest[1] == "outputs" and len(rest) == 3:
                return got.get("outputs", {}).get(rest[2], "")
            if rest[1] in ("outcome", "conclusion") and len(rest) == 2:
                return got.get(rest[1], "")
        raise ActionError(f"the context {path} is not emulated here")

    def status(self, fn: str) -> bool:
        return {"always": True, "success": not self.failed, "failure": self.failed,
                "cancelled": False}[fn]  # fmt: skip

    def evaluate(self, text: str) -> Any:
        return Expr(text, self.lookup, self.status).value()

    def resolve(self, value: Any) -> str:
        """A string with every ${{ }} replaced by its value's text."""
        return re.sub(r"\$\{\{(.*?)\}\}", lambda m: _text(self.evaluate(m[1])), _text(value))

    def should_run(self, step: Step) -> bool | Unknown:
        cond = step.spec.get("if")
        if cond is None:
            return not self.failed
        text = _text(cond).strip()
        if text.startswith("${{") and text.endswith("}}"):
            text = text[3:-2]
        expr = Expr(text, self.lookup, self.status)
        v = expr.value()
        if not expr.uses_status() and self.failed:
            return False  # an `if` without a status function means success() && (...)
        return v if isinstance(v, Unknown) else _truthy(v)

    @property
    def temp(self) -> Path:
        return self.work / "temp"

    # -- running --

    def check(self, steps: list[Step]) -> None:
        """Refuse what cannot run here before anything runs."""
        for s in steps:
            if "uses" in s.spec:
                if _action_name(s.spec["uses"]) not in EMULATED:
                    raise ActionError(f"step {s.index} ({s.title}): uses {s.spec['uses']}, "
                                      f"which this harness cannot run (it emulates "
                                      f"{', '.join(EMULATED)})")  # fmt: skip
            elif "run" in s.spec:
                if s.spec.get("shell") not in ("bash", None):
                    shell = s.spec.get("shell")
                    raise ActionError(f"step {s.index} ({s.title}): shell {shell!r} is not "
                                      "emulated (bash is)")  # fmt: skip
            else:
                raise ActionError(f"step {s.index} ({s.title}): neither run nor uses")

    def run(self, steps: list[Step], out: Callable[[str], None] = print) -> int:
        self.check(steps)
        if not self.dry_run:
            for d in (self.temp, self.work / "cache", self.work / "artifacts"):
                d.mkdir(parents=True, exist_ok=True)
        for s in steps:
            go = self.should_run(s)
            sid = s.spec.get("id") or f"__{s.index}"
            if self.dry_run:
                self._show(s, go, out)
                continue
            if not go:
                out(f"- {s.index}. {s.title}: skipped")
                self.steps_ctx[sid] = {"outputs": {}, "outcome": "skipped",
                                       "conclusion": "skipped"}  # fmt: skip
                continue
            out(f"> {s.index}. {s.title}")
            try:
                outputs = self._uses(s) if "uses" in s.spec else self._run(s)
                outcome = "success"
            except ActionError as e:
                out(f"x {s.index}. {s.title}: {e}")
                outputs, outcome = {}, "failure"
                self.failed = True
            self.steps_ctx[sid] = {"outputs": outputs, "outcome": outcome, "conclusion": outcome}
        return 1 if self.failed else 0

    def write_scripts(self, steps: list[Step], out: Path) -> int:
        """Each run: step's script, resolved as in a dry run, with shellcheck's shell."""
        out.mkdir(parents=True, exist_ok=True)
        for s in steps:
            if "run" in s.spec:
                text = self._dry(s.spec["run"])
                (out / f"{s.index:02d}.sh").write_text(
                    f"# shellcheck shell=bash\n# {s.title}\n{text}"
                )
        return 0

    def _show(self, s: Step, go: bool | Unknown, out: Callable[[str], None]) -> None:
        cond = s.spec.get("if")
        when = "" if cond is None else f"  [if {self._dry(cond)}]"
        if go is False:
            when += " (skipped)"
        out(f"{s.index}. {s.title}{when}")
        if "uses" in s.spec:
            out(f"     uses: {s.spec['uses']}")
        for k, v in (s.spec.get("with") or {}).items():
            out(f"     with {k}: {self._dry(v)}")
        for k, v in (s.spec.get("env") or {}).items():
            out(f"     env {k}={self._dry(v)}")
        if "run" in s.spec:
            for line in self._dry(s.spec["run"]).rstrip("\n").splitlines():
                out(f"     $ {line}")

    def _dry(self, value: Any) -> str:
        try:
            return self.resolve(value)
        except ActionError as e:
            return f"{_text(value)}  (unresolved: {e})"

    def _step_env(self, s: Step) -> tuple[dict[str, str], dict[str, Path]]:
        files = {}
        step_dir = Path(tempfile.mkdtemp(prefix=f"step{s.index}.", dir=self.temp))
        for name in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY"):
            files[name] = step_dir / name.lower()
            files[name].touch()
        path = os.pathsep.join([*self.path_prepend, os.environ.get("PATH", "")])
        env = {**os.environ, **self.env, "PATH": path, "CI": "true",
               "GITHUB_ACTIONS": "true", "GITHUB_ACTION_PATH": str(self.action_dir),
               "GITHUB_WORKSPACE": str(self.workspace), "RUNNER_TEMP": str(self.temp),
               "RUNNER_OS": "Linux"}  # fmt: skip
        env.update({k: str(v) for k, v in files.items()})
        env.update({k: self.resolve(v) for k, v in (s.spec.get("env") or {}).items()})
        return env, files

    def _run(self, s: Step) -> dict[str, str]:
        env, files = self._step_env(s)
        script = files["GITHUB_OUTPUT"].parent / "script.sh"
        script.write_text(self.resolve(s.spec["run"]))
        cwd = self.resolve(s.spec.get("working-directory") or self.workspace)
        rc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                            cwd=cwd, env=env, check=False).returncode  # fmt: skip
        self.env.update(_read_kv(files["GITHUB_ENV"]))
        self.path_prepend[:0] = [p for p in files["GITHUB_PATH"].read_text().splitlines() if p]
        summary = files["GITHUB_STEP_SUMMARY"].read_text()
        if summary:
            with (self.work / "step-summary.md").open("a") as f:
                f.write(summary)
        if rc != 0:
            raise ActionError(f"exited {rc}")
        return _read_kv(files["GITHUB_OUTPUT"])

    def _uses(self, s: Step) -> dict[str, str]:
        with_ = {k: self.resolve(v) for k, v in (s.spec.get("with") or {}).items()}
        handler = getattr(self, EMULATED[_action_name(s.spec["uses"])])
        return handler(with_)  # type: ignore[no-any-return]

    # -- emulated actions --

    def check_python(self, with_: dict[str, str]) -> dict[str, str]:
        want = with_.get("python-version", "")
        exe = shutil.which(f"python{want}") if want else shutil.which("python3")
        if not exe:
            raise ActionError(f"no python{want} on PATH (setup-python would install it)")
        return {"python-path": exe, "python-version": want}

    def check_go(self, with_: dict[str, str]) -> dict[str, str]:
        want = with_.get("go-version", "")
        got = subprocess.run(["go", "version"], capture_output=True, text=True, check=False)
        if got.returncode != 0 or f"go{want}" not in got.stdout:
            raise ActionError(f"no go {want} on PATH ({got.stdout.strip() or 'none'})")
        return {"go-version": got.stdout.split()[2].removeprefix("go")}

    def _entry(self, key: str) -> Path:
        if not key:
            raise ActionError("the cache key is empty")
        return self.work / "cache" / re.sub(r"[^\w.-]", "_", key)

    def cache_restore(self, with_: dict[str, str]) -> dict[str, str]:
        entry = self._entry(with_.get("key", ""))
        if not entry.is_dir():
            return {"cache-hit": "", "cache-primary-key": with_["key"]}
        for i, path in enumerate(_paths(with_.get("path", ""))):
            dest = Path(path)
            if dest.exists():
                shutil.rmtree(dest)
            _copy(entry / str(i), dest)
        return {"cache-hit": "true", "cache-primary-key": with_["key"],
                "cache-matched-key": with_["key"]}  # fmt: skip

    def cache_save(self, with_: dict[str, str]) -> dict[str, str]:
        entry = self._entry(with_.get("key", ""))
        if entry.exists():  # as GitHub: an entry is never overwritten
            print(f"  cache entry {with_['key']} exists; not saved again")
            return {}
        tmp = entry.with_name(entry.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for i, path in enumerate(_paths(with_.get("path", ""))):
            if not Path(path).exists():
                raise ActionError(f"nothing to save at {path}")
            _copy(Path(path), tmp / str(i))
        tmp.rename(entry)
        return {}

    def upload_artifact(self, with_: dict[str, str]) -> dict[str, str]:
        dest = self.work / "artifacts" / (with_.get("name") or "artifact")
        found = [Path(p) for p in _paths(with_.get("path", "")) if Path(p).exists()]
        if not found:
            if with_.get("if-no-files-found", "warn") == "error":
                raise ActionError(f"no files at {with_.get('path')}")
            print(f"  warning: no files at {with_.get('path')}; nothing uploaded")
            return {}
        shutil.rmtree(dest, ignore_errors=True)  # one upload per name and run
        dest.mkdir(parents=True)
        for p in found:
            _copy(p, dest / p.name)
        return {"artifact-id": dest.name}


def _action_name(uses: str) -> str:
    return uses.split("@", 1)[0]


def _paths(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _copy(src: Path, dest: Path) -> None:
    """A copy keeping modes, owners and links (cp -a: the harness runs as root)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "--", str(src), str(dest)], check=True)


def _read_kv(path: Path) -> dict[str, str]:
    """name=value lines and name<<DELIMITER blocks, as the runner reads $GITHUB_OUTPUT."""
    out, lines = {}, path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1 : end])
            i = end + 1
            continue
        if "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        i += 1
    return out


def load(action: Path, given: dict[str, str]) -> tuple[list[Step], dict[str, str]]:
    """The action's steps and its inputs (given, else defaults); ActionError for an
    unknown or a missing required input, or an action that is not composite."""
    try:
        spec = yaml.safe_load(action.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ActionError(f"cannot read {action}: {e}") from e
    runs = (spec or {}).get("runs") or {}
    if runs.get("using") != "composite":
        raise ActionError(f"{action} is not a composite action (runs.using: {runs.get('using')})")
    declared = spec.get("inputs") or {}
    if unknown := set(given) - set(declared):
        raise ActionError(f"unknown input(s) {', '.join(sorted(unknown))} "
                          f"(declared: {', '.join(declared)})")  # fmt: skip
    inputs = {}
    for name, meta in declared.items():
        meta = meta or {}
        if name in given:
            inputs[name] = given[name]
        elif meta.get("required") and "default" not in meta:
            raise ActionError(f"input {name} is required ({meta.get('description', '')})")
        else:
            inputs[name] = _text(meta.get("default", ""))
    steps = [Step(i, s) for i, s in enumerate(runs.get("steps") or [], 1)]
    return steps, inputs


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(prog="ci/run-action.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--action", type=Path, default=root / "action.yml", help="action.yml")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--workspace", type=Path, default=Path.cwd(), help="github.workspace")
    ap.add_argument(
        "--work",
        type=Path,
        default=root / "out" / "run-action",
        help="runner.temp, the emulated cache and artifacts (default %(default)s)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the resolved steps; run none")
    ap.add_argument(
        "--scripts",
        type=Path,
        metavar="DIR",
        help="write each run: step's script to DIR/NN.sh (for shellcheck); run none",
    )
    args = ap.parse_args(argv)
    try:
        given = dict(_pair(i) for i in args.input)
        steps, inputs = load(args.action, given)
        r = Runner(args.action.resolve().parent, inputs, args.workspace.resolve(),
                   args.work.resolve(), dry_run=args.dry_run)  # fmt: skip
        r.check(steps)
        if args.scripts:
            r.dry_run = True
            return r.write_scripts(steps, args.scripts)
        if args.dry_run:
            print(f"action {r.action_dir}, workspace {r.workspace}, runner.temp {r.temp}")
        return r.run(steps)
    except ActionError as e:
        print(f"run-action: error: {e}", file=sys.stderr)
        return 2


def _pair(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ActionError(f"--input {text!r} is not NAME=VALUE")
    name, value = text.split("=", 1)
    return name, value


if __name__ == "__main__":
    raise SystemExit(main())
