"""The registries of encoders, methods and data sources (timm-style ``create_*``).

The registries live here, below the rooms that fill them: a module registers itself with
``@ENCODERS.register("name")`` importing only this file, and the room's ``__init__`` imports its
modules, so no module imports the package that imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from kontrast.errors import UserError, did_you_mean

T = TypeVar("T")


class AlreadyRegistered(ValueError):
    """A second ``register(name)`` of a name the registry holds (a plugin's method named as a built-in one)."""

    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name!r} registered twice")
        self.kind, self.name = kind, name


class Registry(Generic[T]):
    """Name -> factory. ``@REG.register("name")`` adds one; ``REG.get(name)`` finds it."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise AlreadyRegistered(self.kind, name)
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        if name not in self._items:
            known = ", ".join(sorted(self._items))
            raise UserError(f"unknown {self.kind} {name!r}{did_you_mean(name, self._items)}; choose one of: {known}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items


ENCODERS: Registry = Registry("encoder")
METHODS: Registry = Registry("method")
SOURCES: Registry = Registry("data source")  # kontrast.data.samples.SourceKind entries
