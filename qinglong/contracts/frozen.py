"""Frozen records: dataclasses whose value methods are shared by every record class.

``@record`` is ``@dataclass(frozen=True, slots=True)`` (``@record(slots=False)`` without slots),
with the same ``__init__``, fields, ``replace``, ``asdict`` and pickling, and the same behaviour of
``==``, ``hash``, ``repr`` and of an assignment (:class:`~dataclasses.FrozenInstanceError`). Only
where those five methods live differs: the dataclass machinery compiles each of them anew for every
class (about 9 KiB of a process's memory per class, and a process holds about a hundred record
classes); here one function of each serves every record, reading the class's field names.
A method the class body defines itself is kept, as a dataclass keeps it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError
from operator import attrgetter
from threading import get_ident
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_IN_REPR: set[tuple[int, int]] = set()


def _key(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """The values of ``names`` of an instance, as a tuple (what a dataclass compares)."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return attrgetter(*names)


def _record_repr(self: Any) -> str:
    marker = (id(self), get_ident())
    if marker in _IN_REPR:  # a record that contains itself, as dataclasses' reprlib guard says it
        return "..."
    _IN_REPR.add(marker)
    try:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__record_repr__)
        return f"{type(self).__qualname__}({shown})"
    finally:
        _IN_REPR.discard(marker)


def _record_eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        key = type(self).__record_compare__
        return key(self) == key(other)
    return NotImplemented


def _record_hash(self: Any) -> int:
    return hash(type(self).__record_hash__(self))


def _record_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _record_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _shared(cls: type, *, slots: bool) -> type:
    own = dict(cls.__dict__)
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    made = dataclasses.dataclass(frozen=True, slots=slots, repr=False, eq=False)(cls)
    fields = dataclasses.fields(made)
    # staticmethod: a getter stored on the class is not bound to the instance it is called for
    made.__record_repr__ = tuple(f.name for f in fields if f.repr)
    made.__record_compare__ = staticmethod(_key(tuple(f.name for f in fields if f.compare)))
    made.__record_hash__ = staticmethod(_key(tuple(
        f.name for f in fields if (f.compare if f.hash is None else f.hash))))
    if "__repr__" not in own:
        made.__repr__ = _record_repr
    if "__eq__" not in own:
        made.__eq__ = _record_eq
    if not explicit_hash:
        made.__hash__ = _record_hash
    made.__setattr__ = _record_setattr
    made.__delattr__ = _record_delattr
    return made


def record(cls: type[T] | None = None, /, *, slots: bool = True) -> Any:
    """``@dataclass(frozen=True, slots=slots)`` with the value methods shared (see the module)."""
    if cls is None:
        return lambda c: _shared(c, slots=slots)
    return _shared(cls, slots=slots)
