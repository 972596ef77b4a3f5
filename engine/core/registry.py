"""A named collection of one kind of extension: scheduling policies, routers, cost models, ...

Each extension point owns one Registry. An entry registers itself where it is defined, with the
name configs use for it, so adding one is one file plus one registration; the names a config
accepts, and the message that refuses a wrong one, come from the registry.

    POLICIES: Registry[type[Policy]] = Registry("scheduler.policy")   # engine/core/policies/base.py

    @POLICIES.register("sjf")
    class ShortestJobFirstPolicy(MixedPolicy): ...

    POLICIES.get("sjf")       # the class; an unknown name raises ValueError listing the known ones
    POLICIES.names()          # ("mixed", "nano", "sjf"), in registration order

NOTE: a registry is filled when the modules holding its entries are imported; the module that
defines an extension point imports its built-in entries, so names() is complete once that
module is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind by name. `field` is the config key that names an entry (it appears in
    error messages, e.g. "router.name")."""

    def __init__(self, field: str) -> None:
        self.field = field
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under name and return it unchanged."""

        def decorate(entry: T) -> T:
            self.add(name, entry)
            return entry

        return decorate

    def add(self, name: str, entry: T) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.field}: a registered name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.field}: {name!r} is registered twice")
        self._entries[name] = entry

    def get(self, name: str) -> T:
        """The entry called name, or a ValueError naming the field and every known name."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(self.unknown(name)) from None

    def check(self, name: object) -> None:
        """Raise the registry's ValueError unless name is registered."""
        if not isinstance(name, str) or name not in self._entries:
            raise ValueError(self.unknown(name))

    def unknown(self, name: object) -> str:
        return f"{self.field} must be one of {list(self._entries)}, got {name!r}"

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)
