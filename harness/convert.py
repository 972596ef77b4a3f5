"""Plain mappings (from Hydra/OmegaConf) into frozen dataclasses, with one-line errors.

Every config object handed to engine/ or sim/ goes through to_dataclass(): unknown keys, missing
required fields, values of the wrong type and values the dataclass itself rejects all become a
ConfigError whose message starts with the dotted config path of the offending field, so the
entry point can print one clean line instead of a traceback.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any


class ConfigError(ValueError):
    """A user-supplied config value failed validation; str() names the field."""


def refuse_unread(config: Any, where: str, unread: Iterable[tuple[str, str]], chosen: str) -> None:
    """The check that no setting is silently ignored: of `unread` (a field of the dataclass config
    that its choices, described by `chosen`, do not read; and what would read it), the first set
    away from its default (the neutral value, which asks for nothing) is a ValueError naming it."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for name, reader in unread:
        value = getattr(config, name)
        if value != defaults[name]:
            raise ValueError(f"{where}.{name}={value!r} is ignored by {chosen}; it is read only with {reader}")


def to_dataclass(cls: type, data: Any, where: str) -> Any:
    """Build cls from a mapping, checking field names and types; where is the config path."""
    if dataclasses.is_dataclass(data) and isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} fields, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; {cls.__name__} accepts {sorted(fields)}")
    missing = [
        name for name, f in fields.items()
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required field(s) {missing} of {cls.__name__}")
    kwargs = {name: coerce(value, hints[name], f"{where}.{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as error:
        if isinstance(error, ConfigError):
            raise
        message = str(error)
        # Our own dataclasses already name the full path (workload.rate ...); others get it here.
        raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check value against a type hint; ints widen to float, lists become tuples where declared."""
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, where)
            except ConfigError:
                pass  # try the next member; the error below names them all
        allowed = " or ".join(_type_name(a) for a in args)
        raise ConfigError(f"{where} must be {allowed}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where} must be one of {list(args)}, got {value!r}")
        return value
    if origin in (tuple, list):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            items = [coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
        elif origin is list and args:
            items = [coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
        else:
            items = list(value)
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return to_dataclass(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)  # YAML writes big sizes as 80.0e+9
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an int, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))
