"""The shared YAML loader: every way a file can be wrong is one line naming the file and
the key, a refused file changes nothing, and durations have one grammar."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field, field_validator

from fakenvml import yamlmodel
from fakenvml.yamlmodel import Duration, LoadError, Strict, duration_text, seconds


class Wheel(Strict):
    size: int = Field(ge=1)


class Bell(Strict):
    kind: Literal["bell"]
    loud: bool = True


class Horn(Strict):
    kind: Literal["horn"]
    notes: int


class Bike(Strict):
    name: str
    colour: Literal["red", "blue"] = "red"
    wheels: list[Wheel] = Field(min_length=2)
    parts: list[Annotated[Bell | Horn, Field(discriminator="kind")]] = Field(default_factory=list)
    ride: Duration = 1.0

    @field_validator("name")
    @classmethod
    def _lower(cls, v: str) -> str:
        if v != v.lower():
            raise ValueError(f"{v!r}: lower-case only")
        return v


GOOD = {"name": "b", "wheels": [{"size": 26}, {"size": 26}]}


class BikeError(LoadError):
    pass


def refused(data: object, message: str) -> None:
    before = copy.deepcopy(data)
    with pytest.raises(BikeError) as e:
        yamlmodel.validate(Bike, data, "bike.yaml", error=BikeError)
    text = str(e.value)
    assert "\n" not in text
    assert text == f"bike.yaml: {message}"
    assert data == before  # validation never edits what it was given


def test_a_good_document_becomes_a_frozen_model() -> None:
    bike = yamlmodel.validate(Bike, {**GOOD, "ride": "1.5m"}, error=BikeError)
    assert bike.ride == 90.0 and [w.size for w in bike.wheels] == [26, 26]
    with pytest.raises(ValueError):
        bike.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "expected a mapping with `name:`, `wheels:`, found a list"),
        (None, "expected a mapping with `name:`, `wheels:`, found an empty document"),
        ({"wheels": GOOD["wheels"]}, "name: required key missing"),
        # an unknown key comes first: it is usually the typo behind a missing one
        ({"nmae": "b", "wheels": GOOD["wheels"]},
         "nmae: unknown key (expected one of: name, colour, wheels, parts, ride)"),
        ({**GOOD, "wheels": [{"size": 26}, {"size": 26, "spokes": 32}]},
         "wheels[1].spokes: unknown key (expected one of: size)"),
        ({**GOOD, "parts": [{"kind": "horn", "notes": 2, "loud": True}]},
         "parts[0].horn.loud: unknown key (expected one of: kind, notes)"),
        ({**GOOD, "parts": [{"kind": "bell"}, {"kind": "whistle"}]},
         "parts[1].kind: expected one of 'bell', 'horn', found 'whistle'"),
        ({**GOOD, "parts": [{"loud": True}]}, "parts[0].kind: required key missing"),
        ({**GOOD, "colour": "green"}, "colour: expected 'red' or 'blue', found 'green'"),
        ({**GOOD, "wheels": [{"size": 26}]},
         "wheels: expected at least 2 item(s), found 1 item(s)"),
        ({**GOOD, "wheels": [{"size": 0}, {"size": 26}]},
         "wheels[0].size: expected a number >= 1, found 0"),
        # strict: a string is not quietly turned into a number
        ({**GOOD, "wheels": [{"size": "26"}, {"size": 26}]},
         "wheels[0].size: expected an integer, found '26'"),
        ({**GOOD, "name": "B"}, "name: 'B': lower-case only"),
        ({**GOOD, "ride": "soon"},
         "ride: 'soon': expected a duration such as 500ms, 2s, 1.5m or a number of seconds"),
    ],
)  # fmt: skip
def test_each_problem_is_one_line_with_its_key_path(data: object, message: str) -> None:
    refused(data, message)


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)  # type: ignore[operator]
    return path


def test_load_by_name_from_the_search_dirs_or_by_path(tmp_path: Path) -> None:
    shipped, mine = tmp_path / "shipped", tmp_path / "mine"
    shipped.mkdir(), mine.mkdir()
    write(shipped, "road.yaml", "name: road\nwheels: [{size: 28}, {size: 28}]\n")
    path = write(mine, "kid.yml", "name: kid\nwheels: [{size: 12}, {size: 12}]\n")
    assert yamlmodel.load(Bike, "road", [mine, shipped]).name == "road"
    assert yamlmodel.load(Bike, path, [shipped]).wheels[0].size == 12
    assert yamlmodel.resolve("road", [shipped]) == shipped / "road.yaml"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("syntax.yaml", "name: b\nwheels: [{size: 1}\n", r"syntax\.yaml: not valid YAML at line 3, "
         r"column 1: expected ',' or ']', but got '<stream end>'$"),
        ("dup.yaml", "name: a\nwheels: []\nname: b\n",
         r"dup\.yaml: duplicate key 'name' \(line 3, column 1\)$"),
        ("list.yaml", "- name: b\n", r"list\.yaml: expected a mapping with `name:`, `wheels:`, "
         "found a list$"),
        ("empty.yaml", "", r"empty\.yaml: expected a mapping .*, found an empty document$"),
        ("bad.yaml", "name: b\nwheels: [{size: 1}]\n",
         r"bad\.yaml: wheels: expected at least 2 item\(s\), found 1 item\(s\)$"),
        ("latin1.yaml", b"name: \xe9\n", r"latin1\.yaml: not UTF-8 text$"),
    ],
)  # fmt: skip
def test_a_bad_file_is_one_line_and_is_left_as_it_was(
    tmp_path: Path, name: str, text: str | bytes, message: str
) -> None:
    path = write(tmp_path, name, text)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    with pytest.raises(BikeError, match=message) as e:
        yamlmodel.load(Bike, path, error=BikeError)
    assert "\n" not in str(e.value) and str(e.value).startswith(str(path))
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing written beside it


def test_missing_files_and_unknown_names(tmp_path: Path) -> None:
    write(tmp_path, "road.yaml", "name: road\n")
    write(tmp_path, "kid.yml", "name: kid\n")
    with pytest.raises(BikeError, match=r"^no bike 'nope' \(shipped: kid, road\)$"):
        yamlmodel.load(Bike, "nope", [tmp_path], what="bike", error=BikeError)
    with pytest.raises(BikeError, match=r"^no bike file .*/absent\.yaml$"):
        yamlmodel.load(Bike, tmp_path / "absent.yaml", what="bike", error=BikeError)
    with pytest.raises(LoadError, match=r"^no file 'x' \(shipped: none\)$"):
        yamlmodel.load(Bike, "x")


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500ms", 0.5), ("2s", 2.0), ("1.5m", 90.0), ("0s", 0.0), (3, 3.0), (0.25, 0.25),
     ("3", 3.0), ("1.5", 1.5), (" 2s ", 2.0), ("250.5ms", 0.2505)],
)  # fmt: skip
def test_durations_take_ms_s_m_or_bare_seconds(text: object, expected: float) -> None:
    assert seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1s", "'-1s': a duration cannot be negative"),
        (-0.5, "-0.5: a duration cannot be negative"),
        ("soon", "'soon': expected a duration such as 500ms, 2s, 1.5m or a number of seconds"),
        ("1h", "'1h': expected a duration"),
        ("2 s", "'2 s': expected a duration"),
        (".5s", "'.5s': expected a duration"),
        ("1e3", "'1e3': expected a duration"),
        ("", "'': expected a duration"),
        (True, "True: expected a duration"),  # YAML `yes`
        (None, "None: expected a duration"),
        (math.inf, "inf: expected a duration"),
        (math.nan, "nan: expected a duration"),
    ],
)
def test_negative_and_garbage_durations_are_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError) as e:
        seconds(value)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("s", "text"), [(2.0, "2s"), (0.5, "500ms"), (1.5, "1500ms"), (60.0, "60s"), (0.0005, "0.5ms")]
)
def test_duration_text_is_in_the_grammar_and_reads_back(s: float, text: str) -> None:
    assert duration_text(s) == text
    assert seconds(duration_text(s)) == pytest.approx(s)
