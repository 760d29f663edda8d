"""The pieces every config schema builds on: one-line errors, name enums, typed sections.

A schema module (:mod:`experiments.data.schema`, :mod:`experiments.models.schema`,
:mod:`experiments.train.config`, and the schemas beside the language-model builders)
declares a dataclass per option of its group and checks what a type cannot express with
:func:`require`. Builders read their section through :func:`typed_section`, so a plain
dict and a composed config reach them with the same defaults and the same messages:
``"<group>.<key>=<value> is invalid; it must be <allowed>"``.

A section may instead name a user's class or function with Hydra's ``_target_`` key
(:func:`is_target`). :func:`target_section` types it with its group's target schema: the
keys the framework reads (``partition``, ``bucket_size_in_mb``, ...) are checked as fields,
the others become the call's keyword arguments under ``kwargs``, and ``name`` is set to
the ``_target_`` path, so logs and summaries name it as they name a registered option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from enum import Enum
from typing import Any, cast, get_args, get_type_hints

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


def typed_section(
    section: Any, group: str, schemas: Mapping[str, type], default: str
) -> DictConfig:
    """A group's section merged into the schema its ``name`` selects.

    Keys left out, or null, take the schema's defaults, so that a plain dict such as
    ``{"name": "cifar10"}`` reads like the composed ``dataset=cifar10``; the types are
    checked as Hydra checks them at compose time.

    Args:
        section: The section: a dict, a ``DictConfig`` or ``None``.
        group: The group's name, for messages (``dataset``).
        schemas: The schema dataclass of every known name, in the order messages list them.
        default: The name taken when the section gives none.

    Returns:
        A ``DictConfig`` of the selected schema (unknown keys cannot be added to it).

    Raises:
        ConfigError: One line naming the key, for an unknown name, an unknown key or a
            value of the wrong type.
    """
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    values = {k: v for k, v in dict(section or {}).items() if v is not None}
    name = str(values.pop("name", default))
    require(f"{group}.name", name, name in schemas, "one of " + ", ".join(schemas))
    schema = schemas[name]
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), {"name": name, **values})
    except ConfigKeyError as exc:
        keys = ", ".join(f.name for f in fields(schema))
        raise ConfigError(
            f"{group}.{exc.full_key} is not a key of {group}={name}; it must be one of {keys}"
        ) from None
    except ValidationError as exc:
        kind = get_type_hints(schema).get(str(exc.full_key))
        raise ConfigError(
            f"{group}.{exc.full_key}={exc.value} is invalid; it must be {_allowed(kind)}"
        ) from None
    return cast(DictConfig, merged)  # a dataclass merges into a mapping


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
        ConfigError: One line naming the key, for a ``_target_`` that is not a dotted path
            or a framework key of the wrong type.
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
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(schema), {**framework, "name": path, "kwargs": kwargs}
        )
    except ValidationError as exc:
        kind = get_type_hints(schema).get(str(exc.full_key))
        raise ConfigError(
            f"{group}.{exc.full_key}={exc.value} is invalid; it must be {_allowed(kind)}"
        ) from None
    return cast(DictConfig, merged)


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
