"""The pieces every config schema builds on: one-line errors, name enums, typed sections.

A schema module (:mod:`experiments.data.schema`, :mod:`experiments.models.schema`,
:mod:`experiments.train.config`, and the schemas beside the language-model builders)
declares a dataclass per option of its group. What a type cannot express (a positive
size, a share in ``[0, 1)``, one key that needs another of its group) the dataclass checks
itself in ``__post_init__``, with :func:`require` and :func:`require_number`, so the check
runs wherever the section becomes its dataclass (``OmegaConf.to_object``). Builders read
their section through :func:`typed_section`, which does that, so a plain dict and a
composed config reach them with the same defaults and the same messages:
``"<group>.<key>=<value> is invalid; it must be <allowed>"``.

A section may instead name a user's class or function with Hydra's ``_target_`` key
(:func:`is_target`). :func:`target_section` types it with its group's target schema: the
keys the framework reads (``partition``, ``bucket_size_in_mb``, ...) are checked as fields,
the others become the call's keyword arguments under ``kwargs``, and ``name`` is set to
the ``_target_`` path, so logs and summaries name it as they name a registered option.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from enum import Enum
from numbers import Real
from typing import Any, Literal, cast, get_args, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

__all__ = [
    "ConfigError",
    "NameEnum",
    "TARGET",
    "is_int",
    "is_target",
    "name_enum",
    "plain",
    "require",
    "require_number",
    "schema_section",
    "target_section",
    "typed_section",
]

TARGET = "_target_"
"""Hydra's key naming the class or function a section builds (``their_pkg.module.Name``)."""


class ConfigError(ValueError):
    """A config value is invalid; raised identically on every rank before any collective."""


def require(key: str, value: Any, valid: bool, allowed: str) -> None:
    """Raise ``"<key>=<value> is invalid; it must be <allowed>"`` unless ``valid``.

    Args:
        key: The key, with its group (``dataset.alpha``), or an argument's name.
        value: The value found.
        valid: Whether the value is acceptable.
        allowed: What would be, e.g. ``"an integer > 0"``.

    Raises:
        ConfigError: If ``valid`` is false.
    """
    if not valid:
        raise ConfigError(f"{key}={value} is invalid; it must be {allowed}")


def require_number(
    key: str,
    value: Any,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    kind: Literal["", "integer", "number"] = "",
    nullable: bool = False,
    note: str = "",
) -> None:
    """Raise :func:`require`'s line unless ``value`` is a number within the bounds given.

    The allowed text is made of the bounds: ``>= 0``, ``an integer > 0``, ``in [0, 1)``,
    ``a number in (0, 1]``, ``>= 1 or null``, ``>= 0 (0 = off)``.

    Args:
        key: The key, with its group (``train.batch_size``).
        value: The value found; a ``bool`` is no number.
        at_least: Lower bound, included.
        above: Lower bound, excluded.
        at_most: Upper bound, included.
        below: Upper bound, excluded.
        kind: ``integer`` (a whole number), ``number`` (a finite one), or ``""`` (any
            number; the schema's type says which).
        nullable: Whether ``None`` is allowed too.
        note: A remark after the bounds, e.g. ``0 = off``.

    Raises:
        ConfigError: If ``value`` is not such a number.
    """
    low = at_least if above is None else above
    high = at_most if below is None else below
    real = isinstance(value, Real) and not isinstance(value, bool)
    if value is None:
        valid = nullable
    else:
        valid = (
            real
            and (kind != "integer" or is_int(value))
            and (kind != "number" or math.isfinite(value))
            and (at_least is None or value >= at_least)
            and (above is None or value > above)
            and (at_most is None or value <= at_most)
            and (below is None or value < below)
        )
    if low is not None and high is not None:
        bounds = f"in {'[' if above is None else '('}{low}, {high}{']' if below is None else ')'}"
    elif low is not None:
        bounds = f"{'>=' if above is None else '>'} {low}"
    else:
        bounds = f"{'<=' if below is None else '<'} {high}"
    words = {"integer": "an integer ", "number": "a number ", "": ""}[kind] + bounds
    words += " or null" if nullable else ""
    require(key, value, valid, f"{words} ({note})" if note else words)


def is_int(value: Any) -> bool:
    """Whether ``value`` is a whole number (``3``, ``3.0``, a numpy integer) and not a ``bool``."""
    try:
        return not isinstance(value, bool) and int(value) == value
    except (TypeError, ValueError, OverflowError):
        return False


class NameEnum(str, Enum):
    """A ``str`` enum whose members print as their value (``f"{m}" == m.value``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


def name_enum(enum_name: str, values: list[str], module: str) -> Any:
    """A :class:`NameEnum` of registered names, for a schema's ``name`` (or another choice).

    Args:
        enum_name: The class name, e.g. ``DatasetName``.
        values: The names, in the order messages list them.
        module: The module that defines it (where pickle finds it again).

    Returns:
        The enum class.
    """
    # The functional API accepts names such as "one-peer-exp" that are not identifiers.
    return NameEnum(enum_name, [(v, v) for v in values], module=module)  # type: ignore[call-overload]


def _allowed(kind: Any) -> str:
    """What a field of type ``kind`` accepts, in words: ``one of iid, dirichlet``, ``a number``."""
    args = [a for a in get_args(kind) if a is not type(None)]
    optional = len(args) < len(get_args(kind))
    kind = args[0] if optional else kind
    if isinstance(kind, type) and issubclass(kind, Enum):
        text = "one of " + ", ".join(str(m.value) for m in kind)
    else:
        words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
        text = words.get(kind, getattr(kind, "__name__", str(kind)))
    return f"{text} or null" if optional else text


def schema_section(values: Mapping[str, Any], group: str, schema: type, label: str) -> DictConfig:
    """``values`` merged into ``schema``, then built once as the dataclass, which checks itself.

    Args:
        values: The section's keys and values (keys left out take the schema's defaults).
        group: The group's name, for messages (``dataset``).
        schema: The dataclass.
        label: How messages name the option, e.g. ``dataset=digits`` (or the group).

    Returns:
        A ``DictConfig`` of ``schema`` (unknown keys cannot be added to it).

    Raises:
        ConfigError: One line naming the key: an unknown key, a value of the wrong type, or
            a value the dataclass's ``__post_init__`` refuses.
    """
    try:
        merged = cast(DictConfig, OmegaConf.merge(OmegaConf.structured(schema), values))
    except ConfigKeyError as exc:
        keys = ", ".join(f.name for f in fields(schema))
        raise ConfigError(
            f"{group}.{exc.full_key} is not a key of {label}; it must be one of {keys}"
        ) from None
    except ValidationError as exc:
        kind = get_type_hints(schema).get(str(exc.full_key))
        raise ConfigError(
            f"{group}.{exc.full_key}={exc.value} is invalid; it must be {_allowed(kind)}"
        ) from None
    OmegaConf.to_object(merged)  # the dataclass's own checks (__post_init__)
    return merged


def typed_section(
    section: Any, group: str, schemas: Mapping[str, type], default: str, target: type | None = None
) -> DictConfig:
    """A group's section merged into the schema its ``name`` selects, and checked by it.

    Keys left out, or null, take the schema's defaults, so that a plain dict such as
    ``{"name": "cifar10"}`` reads like the composed ``dataset=cifar10``; the types are
    checked as Hydra checks them at compose time, and the values by the schema's
    ``__post_init__`` (:func:`schema_section`). A group that takes a user's class by
    ``_target_`` gives its ``target`` schema, which types such a section instead
    (:func:`target_section`).

    Args:
        section: The section: a dict, a ``DictConfig`` or ``None``.
        group: The group's name, for messages (``dataset``).
        schemas: The schema dataclass of every known name, in the order messages list them.
        default: The name taken when the section gives none.
        target: The group's target schema, if it takes a ``_target_`` section.

    Returns:
        A ``DictConfig`` of the selected schema (unknown keys cannot be added to it).

    Raises:
        ConfigError: One line naming the key, for an unknown name, an unknown key, a
            value of the wrong type or one its schema refuses.
    """
    if target is not None and is_target(section):
        return target_section(section, group, target)
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    values = {k: v for k, v in dict(section or {}).items() if v is not None}
    name = str(values.pop("name", default))
    require(f"{group}.name", name, name in schemas, "one of " + ", ".join(schemas))
    return schema_section({"name": name, **values}, group, schemas[name], f"{group}={name}")


def is_target(section: Any) -> bool:
    """Whether a config section names a class or function by ``_target_`` (not by ``name``)."""
    return isinstance(section, Mapping | DictConfig) and TARGET in section


def target_section(section: Any, group: str, schema: type) -> DictConfig:
    """A ``_target_`` section in its group's target schema: framework keys typed, the rest ``kwargs``.

    The fields of ``schema`` other than ``name`` and ``kwargs`` are the keys the framework
    reads; every other key of the section is an argument of the target and goes, as given,
    into ``kwargs``. ``name`` becomes the ``_target_`` path. A section already in this form
    (a config this function returned) comes back unchanged.

    Args:
        section: The section: a dict or a ``DictConfig`` with a ``_target_`` key.
        group: The group's name, for messages (``dataset``).
        schema: The group's target dataclass, with the fields ``_target_``, ``name`` and
            ``kwargs`` beside the framework's keys.

    Returns:
        A ``DictConfig`` of ``schema``.

    Raises:
        ConfigError: One line naming the key, for a ``_target_`` that is not a dotted path,
            or a framework key of the wrong type or that its schema refuses.
    """
    if isinstance(section, DictConfig) and OmegaConf.get_type(section) is schema:
        return section
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    values = dict(section)
    path = values.get(TARGET)
    dotted = isinstance(path, str) and all(part.isidentifier() for part in path.split("."))
    require(f"{group}.{TARGET}", path, dotted, "a dotted import path such as their_pkg.module.Name")
    own = {f.name for f in fields(schema)} - {"name", "kwargs"}
    framework = {k: v for k, v in values.items() if k in own and v is not None}
    kwargs = {k: v for k, v in values.items() if k not in own}
    values = {**framework, "name": path, "kwargs": kwargs}
    return schema_section(values, group, schema, f"{group}._target_={path}")


def plain(value: Any) -> Any:
    """Return ``value`` with every :class:`NameEnum` member replaced by its ``str`` value.

    Args:
        value: A scalar, list, tuple or dict (as from ``OmegaConf.to_container``).

    Returns:
        The same structure holding only built-in types.
    """
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
