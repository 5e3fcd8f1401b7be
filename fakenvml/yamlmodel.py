"""YAML files validated into pydantic models: one strict base, one loader, one way to
explain a refusal, one duration grammar.

Node inventories, lab specs, subjects and experiments all load through here, so a typo
reads the same in each: every refusal is one line, `<file>: <key path>: <what is wrong>`.
It lives in fakenvml, the bottom layer (clusters and e2e import fakenvml, never the other
way), and imports nothing else from the project. The plugin's config does not use it; see
plugin/config.py for why.

Durations are `500ms`, `2s`, `1.5m`, or a bare number of seconds (`3`, `0.25`, "3")
(fakenvml/durations.py; `seconds` and `duration_text` are re-exported here).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from fakenvml.durations import duration_text, seconds  # re-exported: the grammar

__all__ = ["Duration", "LoadError", "Strict", "duration_text", "seconds"]

M = TypeVar("M", bound=BaseModel)
SUFFIXES = (".yaml", ".yml")


class LoadError(Exception):
    """A YAML file that cannot become its model; the message is one line."""


class Strict(BaseModel):
    """The base of every YAML model: unknown keys are errors (a typo must not pass as a
    default), values are not coerced (YAML `count: "8"` is an error, not a guess), and a
    loaded file is a value that nothing changes afterwards."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --------------------------------------------------------------------------- durations

# A field holding a duration, validated by the grammar above and kept as float seconds.
Duration = Annotated[float, BeforeValidator(seconds)]


# --------------------------------------------------------------------------- loading


def resolve(
    name_or_path: str | Path,
    search_dirs: Iterable[Path] = (),
    *,
    what: str = "file",
    error: type[Exception] = LoadError,
) -> Path:
    """A path as given, or a bare name (no .yaml suffix, no '/') as <dir>/<name>.yaml in
    the first search dir that has it. An unknown name lists the shipped ones."""
    text = str(name_or_path)
    if text.endswith(SUFFIXES) or "/" in text or not text:
        return Path(name_or_path)
    dirs = list(search_dirs)
    for d in dirs:
        for suffix in SUFFIXES:
            if (d / f"{text}{suffix}").is_file():
                return d / f"{text}{suffix}"
    shipped = sorted({p.stem for d in dirs for s in SUFFIXES for p in d.glob(f"*{s}")})
    raise error(f"no {what} {text!r} (shipped: {', '.join(shipped) or 'none'})")


def read(path: Path, *, what: str = "file", error: type[Exception] = LoadError) -> object:
    """The YAML document in `path`, duplicate keys refused; one-line errors name the file
    and, for a syntax error, the line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"no {what} file {path}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what} file") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise error(f"cannot read {what} file {path}: {e.strerror}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except _DuplicateKey as e:
        raise error(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{path}: not valid YAML{where}: {problem}") from None


def validate(
    model: type[M], data: object, source: str | None = None, *, error: type[Exception] = LoadError
) -> M:
    """`data` (a parsed document) as `model`; the first problem as one line, prefixed
    with `source: ` when given."""
    prefix = f"{source}: " if source else ""
    if not isinstance(data, dict):
        found = "an empty document" if data is None else f"a {type(data).__name__}"
        raise error(f"{prefix}expected a mapping with {_required(model)}, found {found}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(prefix + explain(e, model)) from None


def load(
    model: type[M],
    name_or_path: str | Path,
    search_dirs: Iterable[Path] = (),
    *,
    what: str = "file",
    error: type[Exception] = LoadError,
) -> M:
    """A YAML file by path, or by name from `search_dirs`, validated as `model`."""
    path = resolve(name_or_path, search_dirs, what=what, error=error)
    return validate(model, read(path, what=what, error=error), str(path), error=error)


# --------------------------------------------------------------------------- explaining

_EXPECTED = {
    "greater_than_equal": "a number >= {ge}",
    "greater_than": "a number > {gt}",
    "less_than_equal": "a number <= {le}",
    "less_than": "a number < {lt}",
    "too_short": "at least {min_length} item(s)",
    "too_long": "at most {max_length} item(s)",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "model_type": "a mapping",
    "dict_type": "a mapping",
    "literal_error": "{expected}",
}


def explain(err: ValidationError, model: type[BaseModel]) -> str:
    """The first problem pydantic found, as one line: the key path, then what was
    expected and what was found (or the validator's own words)."""
    errors = err.errors()
    # An unknown key is usually the cause of a "missing" one (a typo), so it goes first.
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    # A plain union puts the member it tried in the path (`HealthSwitch`, `literal[False]`);
    # keys are snake_case, so a part with a capital or a bracket is such a member.
    loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and re.search(r"[A-Z\[]", x)))
    kind, ctx = e["type"], e.get("ctx") or {}
    where = key_path(loc)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        # The tag's key is not in pydantic's path; name it ("timeline[0].do").
        tag_key = str(ctx.get("discriminator", "")).strip("'")
        where = f"{where}.{tag_key}" if where else tag_key
    if kind == "extra_forbidden":
        found = _model_at(model, loc[:-1])
        keys = ", ".join(found.model_fields) if found else "?"
        what = f"unknown key (expected one of: {keys})"
    elif kind in ("missing", "union_tag_not_found"):
        what = "required key missing"
    elif kind == "union_tag_invalid":
        what = f"expected one of {ctx.get('expected_tags')}, found {ctx.get('tag')!r}"
    elif kind in ("value_error", "assertion_error"):
        msg = str(e["msg"])
        what = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    elif kind in _EXPECTED:
        found = e.get("input")
        shown = f"{len(found)} item(s)" if kind in ("too_short", "too_long") else _shown(found)
        bounds = {k: _shown(v, quoted=False) for k, v in ctx.items()}
        what = f"expected {_EXPECTED[kind].format(**bounds)}, found {shown}"
    else:
        what = f"{e['msg']}, found {e.get('input')!r}"
    return f"{where}: {what}" if where else what  # a whole-document check names its keys


def key_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's location as a YAML user writes it: `nodes[0].gpus`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value: object, *, quoted: bool = True) -> str:
    """A value as the YAML user wrote it: 2.0 as 2 (a duration field holds float seconds)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if quoted else str(value)


def _required(model: type[BaseModel]) -> str:
    keys = [f"`{k}:`" for k, f in model.model_fields.items() if f.is_required()]
    if not keys:
        return "its keys"
    shown = ", ".join(keys[:3]) + (" ..." if len(keys) > 3 else "")
    return shown


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model whose keys apply at `loc`. A discriminated union puts the tag in the
    path ("timeline", 0, "xid"): it picks the member whose Literal field holds it."""
    candidates = [model]
    for part in loc:
        if isinstance(part, int):
            continue
        fields = [c.model_fields[part] for c in candidates if part in c.model_fields]
        if fields:
            candidates = [m for f in fields for m in _models_in(f.annotation)]
        else:
            candidates = [c for c in candidates if _has_tag(c, part)]
        if not candidates:
            return None
    return candidates[0] if len(candidates) == 1 else None


def _models_in(tp: object) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _models_in(arg)]


def _has_tag(model: type[BaseModel], tag: str) -> bool:
    return any(
        typing.get_origin(f.annotation) is typing.Literal and tag in typing.get_args(f.annotation)
        for f in model.model_fields.values()
    )


class _DuplicateKey(yaml.YAMLError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # SafeLoader refuses it below ("found unhashable key")
            if key in seen:
                mark = key_node.start_mark
                raise _DuplicateKey(
                    f"duplicate key {key!r} (line {mark.line + 1}, column {mark.column + 1})"
                )
            seen.add(key)
        return super().construct_mapping(node, deep)
