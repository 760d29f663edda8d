"""A section's ``_target_``: import it, check the section's keys against its signature, call it.

A config section that names a user's class or function by Hydra's ``_target_`` key (typed by
:func:`experiments.schema.target_section`) becomes a :class:`Target`. Building one imports the
object; :meth:`Target.check` compares the section's keys, and the arguments the framework
adds, with the object's signature; :meth:`Target.call` calls it through
``hydra.utils.instantiate`` (so nested ``_target_`` arguments are built too, and ``_convert_``
defaults to ``all``: plain lists and dicts). Each failure is one :class:`ConfigError` line
naming the config key and its value, raised the same way on every rank:

- ``model._target_=pkg.mod.Nope does not import (module 'pkg.mod' has no attribute 'Nope'); ...``
- ``model.hiden=32 is not an argument of pkg.mod.MLP; it must be one of width, hidden``
- ``model._target_=pkg.mod.MLP needs the argument width, which the config does not give; ...``
- ``model._target_=pkg.mod.MLP raised ValueError: hidden must be >= 1, got -1``

Example::

    target = Target.load("model", "torch.nn.Linear", {"out_features": 3})
    target.check(extra=["in_features"])
    layer = target.call(in_features=4)
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from experiments.schema import TARGET, ConfigError

__all__ = ["HYDRA_KEYS", "Target", "locate", "one_line"]

HYDRA_KEYS = frozenset({TARGET, "_args_", "_recursive_", "_convert_", "_partial_"})
"""Keys ``hydra.utils.instantiate`` reads itself; they are no arguments of the target."""


def one_line(exc: BaseException) -> str:
    """``"<Type>: <message>"`` of an exception, its whitespace folded into single spaces."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_HYDRA_LOG = logging.getLogger("hydra.utils")


def _drop(record: logging.LogRecord) -> bool:
    """A logging filter that lets nothing through."""
    return False


def locate(key: str, path: str) -> Any:
    """The object at the dotted ``path``, found by ``hydra.utils.get_object``.

    Args:
        key: The config key, for messages (``model._target_``).
        path: ``package.module.Name`` (or ``package.module.Class.method``).

    Returns:
        The object.

    Raises:
        ConfigError: One line naming ``key=path`` and why: no module of that name, an
            attribute that is missing, or the module raised while being imported.
    """
    _HYDRA_LOG.addFilter(_drop)  # it logs each failed lookup over several lines
    try:
        return get_object(path)
    except Exception as exc:  # Hydra's several lines; the reason is their cause
        raise _not_importable(key, path, _reason(path, exc)) from None
    finally:
        _HYDRA_LOG.removeFilter(_drop)


def _reason(path: str, exc: BaseException) -> BaseException:
    """Why ``get_object(path)`` raised ``exc``: its cause, or the missing attribute it hides.

    Hydra imports ``a.b`` when module ``a`` has no attribute ``b``; that import's
    ``ModuleNotFoundError`` for ``a.b`` itself then stands for the ``AttributeError``.
    """
    cause = exc.__cause__ or exc
    missing = isinstance(cause, ModuleNotFoundError) and (path + ".").startswith(f"{cause.name}.")
    if not missing:
        return cause
    # the chain holds the attribute lookups tried, a module's ``__path__`` among them
    # when ``a.b`` is a module and not a package: the one that names the path's own part
    found: list[AttributeError] = []
    context = cause.__context__
    while context is not None and len(found) < 8:
        if isinstance(context, AttributeError):
            found.append(context)
        context = context.__context__
    named = [e for e in found if str(e).endswith(f"attribute '{cause.name.rsplit('.', 1)[-1]}'")]
    return (named or found or [cause])[0]


def _not_importable(key: str, path: str, exc: BaseException) -> ConfigError:
    return ConfigError(
        f"{key}={path} does not import ({one_line(exc)}); it must name a class or function "
        "of an importable module (installed, or on PYTHONPATH)"
    )


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):  # some builtins have none: their call is the check
        return None


@dataclass(frozen=True)
class Target:
    """A section's imported ``_target_`` with the arguments the config gives it.

    Attributes:
        group: The config group, for messages (``dataset``).
        path: The ``_target_`` path as written.
        obj: The imported class or function.
        kwargs: The config's arguments (plain values; Hydra's own keys included).
    """

    group: str
    path: str
    obj: Any
    kwargs: dict[str, Any]

    @classmethod
    def load(cls, group: str, path: str, kwargs: Mapping[str, Any]) -> Target:
        """Import ``path`` for a section of ``group`` whose arguments are ``kwargs``.

        Args:
            group: The config group.
            path: The ``_target_`` path.
            kwargs: The config's arguments (a ``DictConfig`` is made plain).

        Returns:
            The target.

        Raises:
            ConfigError: If the path does not import or names no callable.
        """
        if isinstance(kwargs, DictConfig):
            kwargs = OmegaConf.to_container(kwargs, resolve=True)  # type: ignore[assignment]
        obj = locate(f"{group}.{TARGET}", path)
        if not callable(obj):
            raise ConfigError(
                f"{group}.{TARGET}={path} is of type {type(obj).__name__}; it must name a class or function"
            )
        return cls(group, path, obj, {k: v for k, v in dict(kwargs).items() if k != TARGET})

    @classmethod
    def of(cls, group: str, section: Any) -> Target:
        """The target of a section typed by :func:`~experiments.schema.target_section`.

        Raises:
            ConfigError: If its path does not import or names no callable.
        """
        return cls.load(group, str(section[TARGET]), section["kwargs"])

    @property
    def key(self) -> str:
        """``<group>._target_``, the key of messages about the target as a whole."""
        return f"{self.group}.{TARGET}"

    def arguments(self) -> dict[str, Any]:
        """The config's arguments of the target, without Hydra's own keys."""
        return {k: v for k, v in self.kwargs.items() if k not in HYDRA_KEYS}

    def takes(self, name: str) -> bool:
        """Whether the signature names a keyword parameter ``name`` (``**kwargs`` does not count)."""
        sig = _signature(self.obj)
        if sig is None or name not in sig.parameters:
            return False
        return sig.parameters[name].kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )

    def accepts(self, name: str) -> bool:
        """Whether a keyword argument ``name`` binds: a parameter of that name, or ``**kwargs``."""
        sig = _signature(self.obj)
        if sig is None:
            return True
        var_keyword = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
        return var_keyword or self.takes(name)

    def default(self, name: str) -> Any:
        """The default of parameter ``name``, or ``inspect.Parameter.empty``."""
        sig = _signature(self.obj)
        if sig is None or name not in sig.parameters:
            return inspect.Parameter.empty
        return sig.parameters[name].default

    def check(self, *, positional: int = 0, extra: Iterable[str] = ()) -> None:
        """Check the config's keys, and what the framework adds, against the signature.

        Args:
            positional: How many positional arguments the framework passes first (an
                optimizer's parameters, a scheduler's optimizer, a topology's sizes).
            extra: Keyword arguments the framework passes (``split``).

        Raises:
            ConfigError: One line for a key that is no argument (a misspelt one, say), or a
                required argument that neither the config nor the framework gives.
        """
        sig = _signature(self.obj)
        if sig is None:
            return
        kinds = inspect.Parameter
        params = [
            p
            for p in sig.parameters.values()
            if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        ]
        by_position = [
            p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        framework = {p.name for p in by_position[:positional]}
        keywords = [
            p.name for p in params if p.kind != kinds.POSITIONAL_ONLY and p.name not in framework
        ]
        given = self.arguments()
        if not any(p.kind == kinds.VAR_KEYWORD for p in sig.parameters.values()):
            for key, value in given.items():
                if key not in keywords:
                    allowed = ", ".join(keywords) or "none (it takes no keyword arguments)"
                    raise ConfigError(
                        f"{self.group}.{key}={value} is not an argument of {self.path}; "
                        f"it must be one of {allowed}"
                    )
        if "_args_" in self.kwargs:  # positional arguments from the config: the call will tell
            return
        supplied = set(given) | set(extra) | framework
        for p in params:
            if p.default is kinds.empty and p.name not in supplied:
                raise ConfigError(
                    f"{self.key}={self.path} needs the argument {p.name}, which the config does "
                    f"not give; set {self.group}.{p.name}"
                )

    def fill(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The framework's values the signature names and the config leaves out.

        Args:
            values: Candidates, such as the dataset's ``num_classes``; ``None`` for unknown.

        Returns:
            Those to pass: named by the signature, absent from the config, and known.

        Raises:
            ConfigError: If a required parameter among them has no known value.
        """
        given = self.arguments()
        out: dict[str, Any] = {}
        for name, value in values.items():
            if name in given or not self.takes(name):
                continue
            if value is not None:
                out[name] = value
            elif self.default(name) is inspect.Parameter.empty:
                raise ConfigError(
                    f"{self.key}={self.path} needs the argument {name}, which the data does not "
                    f"give; set {self.group}.{name}"
                )
        return out

    def call(self, *args: Any, **extra: Any) -> Any:
        """Call the target through ``hydra.utils.instantiate`` with the config's arguments.

        Args:
            *args: Positional arguments, passed through as they are.
            **extra: Keyword arguments added to the config's (plain values).

        Returns:
            What the target returns.

        Raises:
            ConfigError: One line, if the call raised; the original exception is its cause.
        """
        node = OmegaConf.create({TARGET: self.path, "_convert_": "all", **self.kwargs})
        try:
            return instantiate(node, *args, **extra)
        except InstantiationException as exc:
            cause = exc.__cause__ or exc
            raise self.raised(cause) from cause
        except Exception as exc:
            raise self.raised(exc) from exc

    def returned(self, result: Any, must: str) -> ConfigError:
        """The one line of a call that returned ``result``, which is not ``must`` (in words)."""
        return ConfigError(
            f"{self.key}={self.path} returned an object of type {type(result).__name__}; "
            f"it must return {must}"
        )

    def raised(self, exc: BaseException) -> ConfigError:
        """The one line of a call of the target that raised ``exc``."""
        return ConfigError(f"{self.key}={self.path} raised {one_line(exc)}")
