"""One contract between the C library and the control plane: src/state_format.h is the
source, fakenvml/layout.py its one Python copy. A program compiled against the header
prints every struct's size, every field's offset and size, every FNV_ #define and every
enumerator; layout.py (and the Python enums that carry the record kinds, the sensors and
the MIG refusals) must say the same, or the test names what differs."""

from __future__ import annotations

import enum
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fakenvml import journal, layout, mig, telemetry
from fakenvml.native import build

HEADER = build.SRC / "state_format.h"
# The header's enums and the Python enums that carry them: (enum, prefix of its names).
ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {
    "fnv_record_kind": (journal.Kind, "FNV_"),
    "fnv_sensor": (telemetry.Sensor, "FNV_S_"),
    "fnv_mig_why": (mig.Why, "FNV_MIG_"),
}


# The program's frame: DEFINE(x) prints a string or a number, whichever x is.
PROGRAM = r"""#include <stddef.h>
#include <stdio.h>
#include "state_format.h"
static void num(const char *n, unsigned long long v) { printf("value %s %llu\n", n, v); }
static void str(const char *n, const char *v) { printf("string %s %s\n", n, v); }
#define DEFINE(x) _Generic((x), char *: str, const char *: str, default: num)(#x, x)
int main(void) {
BODY
    return 0;
}
"""


@dataclass
class Declared:
    """What the header declares: struct members in order (a union's members as one slot
    of alternatives), #define names, enumerators."""

    structs: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    defines: list[str] = field(default_factory=list)
    enums: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Compiled:
    """What the compiler made of them."""

    sizes: dict[str, int] = field(default_factory=dict)
    fields: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # offset, size
    values: dict[str, int | str] = field(default_factory=dict)


def _names(decls: str) -> list[str]:
    """Member names of `type a, b[4], c;` declarations."""
    out = []
    for decl in filter(None, (d.strip() for d in decls.split(";"))):
        rest = re.match(r"(?:const\s+)?\w+\s+(.*)", decl, re.S)
        assert rest, f"state_format.h: cannot read the declaration {decl!r}"
        out += [re.match(r"\s*\**\s*(\w+)", part).group(1) for part in rest.group(1).split(",")]  # type: ignore[union-attr]
    return out


def declared(text: str) -> Declared:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out = Declared()
    for body, name in re.findall(r"typedef struct \{(.*?)\}\s*(\w+)\s*;", text, re.S):
        slots: list[tuple[str, ...]] = []
        for union, plain in re.findall(r"union\s*\{(.*?)\}\s*;|([^;{}]+;)", body, re.S):
            slots += [tuple(_names(union))] if union else [(n,) for n in _names(plain)]
        out.structs[name] = slots
    out.defines = re.findall(r"^#define (FNV_\w+)[ \t]+\S", text, re.M)
    for name, body in re.findall(r"enum (\w+) \{(.*?)\};", text, re.S):
        out.enums[name] = [re.match(r"\s*(\w+)", e).group(1) for e in body.split(",") if e.strip()]  # type: ignore[union-attr]
    return out


def compile_facts(d: Declared, work: Path) -> Compiled:
    lines = []
    for struct_name, slots in d.structs.items():
        lines.append(f'printf("size {struct_name} %zu\\n", sizeof({struct_name}));')
        for member in (m for slot in slots for m in slot):
            lines.append(
                f'printf("field {struct_name} {member} %zu %zu\\n", '
                f"offsetof({struct_name}, {member}), sizeof((({struct_name} *)0)->{member}));"
            )
    lines += [f"DEFINE({name});" for name in d.defines]
    enumerators = [e for es in d.enums.values() for e in es]
    lines += [f'printf("value {e} %lld\\n", (long long){e});' for e in enumerators]
    program, binary = work / "layout.c", work / "layout"
    program.write_text(PROGRAM.replace("BODY", "\n".join(lines)))
    subprocess.run(["gcc", "-std=gnu2x", "-Wall", "-Werror", f"-I{build.SRC}", str(program),
                    "-o", str(binary)], check=True)  # fmt: skip
    printed = subprocess.run([binary], capture_output=True, text=True, check=True).stdout
    out = Compiled()
    for line in printed.splitlines():
        what, name, *rest = line.split(" ")
        if what == "size":
            out.sizes[name] = int(rest[0])
        elif what == "field":
            out.fields[(name, rest[0])] = (int(rest[1]), int(rest[2]))
        else:
            out.values[name] = " ".join(rest) if what == "string" else int(rest[0])
    return out


def problems(
    d: Declared, c: Compiled, layouts: list[layout.Layout], constants: object,
    enums: dict[str, tuple[type[enum.IntEnum], str]],
) -> list[str]:  # fmt: skip
    """Every way the Python side differs from the header, one line each, naming it."""
    out = []
    mine = {lay.c_name: lay for lay in layouts}
    for name in d.structs:
        if name not in mine:
            out.append(f"{name} is a struct of state_format.h with no Layout in fakenvml/layout.py")
    for lay in layouts:
        if lay.c_name not in d.structs:
            out.append(f"layout.py's {lay.c_name} is no struct of state_format.h")
            continue
        slots = d.structs[lay.c_name]
        named = {m for slot in slots for m in slot}
        for f, _ in lay.fields:
            where = f"{lay.c_name}.{f}"
            if f not in named:
                out.append(f"{where} (layout.py) is no member of {lay.c_name} in state_format.h")
                continue
            c_at, c_size = c.fields[(lay.c_name, f)]
            if (c_at, c_size) != (lay.offsets[f], lay.sizes[f]):
                out.append(f"{where}: offset {c_at}, {c_size} bytes in state_format.h; offset "
                           f"{lay.offsets[f]}, {lay.sizes[f]} bytes in layout.py")  # fmt: skip
        for slot in slots:
            if not set(slot) & set(lay.offsets):
                at, size = c.fields[(lay.c_name, slot[0])]
                out.append(f"{lay.c_name}.{' / '.join(slot)} (offset {at}, {size} bytes in "
                           f"state_format.h) is not in layout.py")  # fmt: skip
        if c.sizes[lay.c_name] != lay.size:
            out.append(f"sizeof({lay.c_name}): {c.sizes[lay.c_name]} in state_format.h, "
                       f"{lay.size} in layout.py")  # fmt: skip
    for name in d.defines:
        py = getattr(constants, name.removeprefix("FNV_"), None)
        if isinstance(py, bytes):
            py = py.decode()
        if py != c.values[name]:
            out.append(f"{name} is {c.values[name]!r} in state_format.h, "
                       f"{name.removeprefix('FNV_')} {py!r} in layout.py")  # fmt: skip
    for enum_name, names in d.enums.items():
        if enum_name not in enums:
            out.append(f"enum {enum_name} of state_format.h has no Python enum (test_layout.ENUMS)")
            continue
        py_enum, prefix = enums[enum_name]
        in_c = {n.removeprefix(prefix): c.values[n] for n in names if not n.endswith("_COUNT")}
        in_py = {m.name: m.value for m in py_enum}
        for n in sorted(in_c.keys() | in_py.keys()):
            if in_c.get(n) != in_py.get(n):
                out.append(f"{prefix}{n} is {in_c.get(n)} in enum {enum_name}, "
                           f"{py_enum.__name__}.{n} {in_py.get(n)} in Python")  # fmt: skip
    return out


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> tuple[Declared, Compiled]:
    d = declared(HEADER.read_text())
    return d, compile_facts(d, tmp_path_factory.mktemp("layout"))


def test_the_header_was_read_whole(header: tuple[Declared, Compiled]) -> None:
    d, c = header
    assert len(d.structs) == len(layout.LAYOUTS) >= 11 and len(d.defines) >= 25
    assert d.structs["fnv_record"][6] == ("gpu_instance", "arg0")  # a union: one slot
    assert c.values["FNV_STATE_MAGIC"] == "FNVMLST1" and c.sizes["fnv_record"] == 64


def test_every_struct_field_and_number_matches_the_header(
    header: tuple[Declared, Compiled],
) -> None:
    d, c = header
    assert problems(d, c, layout.LAYOUTS, layout, ENUMS) == []


def test_a_difference_is_named(header: tuple[Declared, Compiled]) -> None:
    d, c = header
    swapped = [(n, k) for n, k in layout.LINK.fields]
    swapped[1], swapped[2] = swapped[2], swapped[1]
    short = [f for f in layout.GEN.fields if f[0] != "committed"]
    layouts = [layout.Layout("fnv_link", swapped), layout.Layout("fnv_gen", short)]

    class Constants:
        STATE_MAGIC = b"FNVMLST9"

    found = problems(d, c, layouts, Constants, {"fnv_sensor": ENUMS["fnv_sensor"]})
    for line in [
        "fnv_link.remote_index: offset 8, 4 bytes in state_format.h; "
        "offset 4, 4 bytes in layout.py",
        "fnv_gen.committed (offset 16, 8 bytes in state_format.h) is not in layout.py",
        "sizeof(fnv_gen): 64 in state_format.h, 56 in layout.py",
        "FNV_STATE_MAGIC is 'FNVMLST1' in state_format.h, STATE_MAGIC 'FNVMLST9' in layout.py",
        "fnv_device is a struct of state_format.h with no Layout in fakenvml/layout.py",
        "enum fnv_mig_why of state_format.h has no Python enum (test_layout.ENUMS)",
    ]:
        assert line in found
