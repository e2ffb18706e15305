"""A handle's read-only fields, each the same-named field of the record the handle last read: one
declaration a field instead of a property each."""

from __future__ import annotations

from typing import Generic, NoReturn, TypeVar, cast, overload

T = TypeVar("T")


class Shown(Generic[T]):
    """``id = Shown[str]("_record")``: ``handle.id`` reads ``handle._record.id``; like a property with
    no setter, it cannot be assigned."""

    __slots__ = ("_name", "_record")

    def __init__(self, record: str) -> None:
        self._record = record
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Shown[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object | None, owner: type) -> Shown[T] | T:
        if obj is None:
            return self
        return cast(T, getattr(getattr(obj, self._record), self._name))

    def __set__(self, obj: object, value: NoReturn) -> NoReturn:
        raise AttributeError(f"{type(obj).__name__}.{self._name} is read-only")
