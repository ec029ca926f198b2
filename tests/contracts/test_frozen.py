"""``@record`` behaves as ``@dataclass(frozen=True, slots=True)`` does, value method by value method."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any, Mapping

import pytest

from qinglong.contracts.frozen import record


@record
class Point:
    x: int
    y: int = 0
    note: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    secret: str = dataclasses.field(default="", repr=False)
    seen: int = dataclasses.field(default=0, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Twin:
    x: int
    y: int = 0
    note: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    secret: str = dataclasses.field(default="", repr=False)
    seen: int = dataclasses.field(default=0, compare=False)


@record(slots=False)
class Loose:
    a: int


@record
class Single:
    a: int


@record
class Empty:
    pass


@record
class Shown:
    a: int

    def __repr__(self) -> str:
        return "shown"


@record
class Child(Single):
    b: int = 2


def test_a_record_equals_hashes_and_shows_as_the_same_dataclass_would():
    for args in [(1,), (1, 2), (1, 2, {"k": 1}, "s", 5)]:
        ours, theirs = Point(*args), Twin(*args)
        assert repr(ours).replace("Point", "Twin") == repr(theirs)
        assert (ours == Point(*args)) is (theirs == Twin(*args)) is True
        if not args[2:]:
            assert hash(ours) == hash(theirs)
    assert Point(1, seen=1) == Point(1, seen=2)  # compare=False is not compared
    assert Point(1) != Point(2) and Point(1) != Twin(1)
    assert Point(1).__eq__(Twin(1)) is NotImplemented
    assert hash(Point(1, note={"a": 1})) == hash(Point(1, note={"b": 2}))  # hash=False is not hashed
    assert hash(Single(3)) == hash((3,)) and hash(Empty()) == hash(())
    assert Single(3) == Single(3) and Empty() == Empty() and Child(1) != Single(1)
    assert repr(Child(1)) == "Child(a=1, b=2)" and repr(Empty()) == "Empty()"
    assert repr(Loose(1)) == "Loose(a=1)" and Loose(1) == Loose(1) and hash(Loose(1)) == hash((1,))


def test_a_record_refuses_assignment_and_deletion_as_a_frozen_dataclass_does():
    point = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
        point.x = 2
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'y'"):
        del point.y
    with pytest.raises(dataclasses.FrozenInstanceError):
        Loose(1).a = 2
    assert not hasattr(point, "__dict__") and hasattr(Loose(1), "__dict__")


def test_a_record_keeps_what_its_body_defines_and_stays_a_dataclass():
    assert repr(Shown(1)) == "shown"
    assert dataclasses.is_dataclass(Point)
    assert [f.name for f in dataclasses.fields(Point)] == ["x", "y", "note", "secret", "seen"]
    assert dataclasses.replace(Point(1), y=5) == Point(1, 5)
    assert dataclasses.asdict(Point(1, 2)) == {"x": 1, "y": 2, "note": {}, "secret": "", "seen": 0}
    for point in (Point(1, 2, {"k": 1}), Loose(4)):
        assert pickle.loads(pickle.dumps(point)) == point
        assert copy.copy(point) == point and copy.deepcopy(point) == point
    assert Point.__match_args__ == ("x", "y", "note", "secret", "seen")


def test_a_record_that_contains_itself_shows_the_cycle_as_dots():
    box: dict[str, Any] = {}
    point = Point(1, note=box)
    box["self"] = point
    assert repr(point) == "Point(x=1, y=0, note={'self': ...}, seen=0)"
