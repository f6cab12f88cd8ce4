"""A registry: an explicit table from a name to a record, written out in one place, that fails loudly.

Every table of choices in the project (optimizers, communication schemes, tasks) has this one shape: the
module that owns the choices lists its records in a literal ``Registry(kind, [...])``; nothing registers
itself as a side effect of being imported. Looking up an unknown name, or building a table with a name twice,
raises an error that names the choices (the pattern of timm's ``OptimInfo`` and torchtitan's "Optimizer
{name} not added.").

    OPTIMIZERS = Registry("optimizer", [OptimInfo("sgd", ...), OptimInfo("birder", ...)])
    OPTIMIZERS["sgd"]          # the record; KeyError naming every known optimizer if there is none
    "sgd" in OPTIMIZERS        # membership
    OPTIMIZERS.names()         # sorted names
    list(OPTIMIZERS)           # the records, in table order
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "import_from", "lazy_attributes"]

T = TypeVar("T")


def _name_attribute(record) -> str:
    return record.name


class Registry(Generic[T]):
    """An immutable table ``name -> record``.

    Args:
        kind: what the records are, for the errors ("optimizer", "communication scheme", "task").
        records: the records, each named by ``key(record)`` (by default its ``name`` attribute).
        key: how a record's name is read.

    Raises:
        ValueError: a name appears twice (naming it and the kind).
    """

    __slots__ = ("kind", "_records")

    def __init__(self, kind: str, records: Iterable[T], key: Callable[[T], str] = _name_attribute):
        self.kind = kind
        self._records: dict[str, T] = {}
        for record in records:
            name = key(record)
            if name in self._records:
                raise ValueError(f"{kind} {name!r} is listed twice in its registry")
            self._records[name] = record

    def __getitem__(self, name: str) -> T:
        try:
            return self._records[name]
        except KeyError:
            raise KeyError(f"{self.kind} {name!r} is unknown; known: {', '.join(self.names())}") from None

    def get(self, name: str) -> T:
        """The record of ``name``; KeyError naming the known names if there is none (no default: loud)."""
        return self[name]

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def __iter__(self) -> Iterator[T]:
        return iter(self._records.values())

    def __len__(self) -> int:
        return len(self._records)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._records)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"


def import_from(package: str, module: str, name: str) -> Any:
    """``<package>.<module>``'s ``name``, the module imported now: how a table written as names (the optimizers'
    builders, the tasks' classes) reaches its code only when it is used."""
    return getattr(importlib.import_module(f"{package}.{module}"), name)


def lazy_attributes(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module-level ``__getattr__`` (PEP 562) that imports ``name`` from ``<package>.<modules[name]>``
    on first use: a package lists what it offers without importing the modules behind it (torch, for the CLI's
    config checks)."""

    def __getattr__(name: str) -> Any:
        if name in modules:
            return import_from(package, modules[name], name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
