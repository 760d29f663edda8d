"""nanoGPT's ``meta.pkl``, read without running anything it holds.

nanoGPT's character-level ``prepare.py`` writes, beside ``train.bin`` and ``val.bin``,
a pickle of ``{"vocab_size": int, "itos": {int: str}, "stoi": {str: int}}``. A pickle is
a small program: :func:`pickle.load` calls whatever function the file names
(``os.system`` included). :class:`PlainUnpickler` refuses every name a file asks for, so
the only objects it can build are those pickle makes without looking anything up:
containers, strings, numbers, booleans and ``None``. :func:`read_meta_pickle` then
accepts only dicts, lists, tuples, strings, ints, floats, booleans and ``None``, and
checks the keys nanoGPT writes.

Example::

    meta = read_meta_pickle(Path("data/shakespeare_char/meta.pkl"))
    meta["vocab_size"], meta["itos"][0]  # 65, "\\n"
"""

from __future__ import annotations

import io
import pickle
import pickletools
from pathlib import Path
from typing import Any, NoReturn

from experiments.schema import is_int

__all__ = ["META_PICKLE", "PLAIN_TYPES", "PlainUnpickler", "read_meta_pickle"]

META_PICKLE = "meta.pkl"
"""nanoGPT's metadata file beside the token files."""

PLAIN_TYPES = (dict, list, tuple, str, int, float, bool, type(None))
"""The only types a ``meta.pkl`` may hold (exactly these, no subclasses)."""

_ALLOWED = "dicts, lists, tuples, strings, numbers, booleans and None"


class _Refused(pickle.UnpicklingError):
    """The pickle asked for something it may not have; ``what`` says what."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that looks up no global at all, and so can call nothing.

    Every class or function a pickle names (through ``GLOBAL``, ``STACK_GLOBAL`` or
    ``INST``) reaches :meth:`find_class`, which refuses it before anything is imported;
    persistent ids are refused too. Without a callable, ``REDUCE``, ``NEWOBJ``, ``OBJ``
    and ``BUILD`` cannot run code.

    The copyreg extension codes (``EXT1``, ``EXT2``, ``EXT4``) are the one way past
    :meth:`find_class`: the object an earlier ordinary load fetched for a code comes
    from copyreg's cache. :meth:`load` therefore refuses them before it unpickles.

    Args:
        data: The whole pickle.
        encoding: How to decode the 8-bit strings of a Python 2 pickle (``pickle.Unpickler``'s).
    """

    def __init__(self, data: bytes, encoding: str = "ASCII") -> None:
        super().__init__(io.BytesIO(data), encoding=encoding)
        self._data = data

    def load(self) -> Any:
        """The object of the pickle, once no extension code is found in its opcodes.

        Raises:
            pickle.UnpicklingError: For an extension code, a global or a persistent id.
            ValueError: If the opcodes do not parse.
        """
        for opcode, arg, _ in pickletools.genops(self._data):  # parses only, runs nothing
            if opcode.name.startswith("EXT"):
                raise _Refused(f"the copyreg extension code {arg} ({opcode.name})")
        return super().load()

    def find_class(self, module: str, name: str) -> NoReturn:
        """Refuse the global ``module.name``.

        Raises:
            pickle.UnpicklingError: Always.
        """
        raise _Refused(f"the global {module}.{name}")

    def persistent_load(self, pid: Any) -> NoReturn:
        """Refuse a persistent id (an object stored outside the pickle).

        Raises:
            pickle.UnpicklingError: Always.
        """
        raise _Refused(f"a persistent id ({type(pid).__name__})")


def _first_foreign(obj: Any) -> str | None:
    """The type name of the first object in ``obj`` that is not plain, or ``None``."""
    stack, seen = [obj], set()
    while stack:  # a loop, not recursion: a pickle may nest deeper than the stack allows
        item = stack.pop()
        if type(item) not in PLAIN_TYPES:
            return type(item).__name__
        if isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))  # memo references may make cycles
            stack.extend(item)  # a dict's keys, or the items of a list or tuple
            if isinstance(item, dict):
                stack.extend(item.values())
    return None


def _check_vocab(path: Path, meta: dict[str, Any]) -> None:
    """Check ``vocab_size``, ``stoi`` and ``itos`` where present."""
    vocab = meta.get("vocab_size")
    if vocab is not None and not (is_int(vocab) and vocab > 0):
        raise ValueError(f"{path} gives vocab_size={vocab!r}; it must be an integer > 0")
    itos, stoi = meta.get("itos"), meta.get("stoi")
    if itos is not None and not (
        isinstance(itos, dict)
        and all(is_int(k) and k >= 0 and isinstance(v, str) for k, v in itos.items())
    ):
        raise ValueError(f"{path} has an itos that is not a dict of ids >= 0 to strings")
    if stoi is not None and not (
        isinstance(stoi, dict)
        and all(isinstance(k, str) and is_int(v) and v >= 0 for k, v in stoi.items())
    ):
        raise ValueError(f"{path} has a stoi that is not a dict of strings to ids >= 0")
    if vocab is not None:
        ids = [*(itos or {}), *(stoi or {}).values()]
        if ids and max(ids) >= vocab:
            raise ValueError(
                f"{path} maps a token to id {max(ids)}, not below its vocab_size={vocab}"
            )


def read_meta_pickle(path: Path) -> dict[str, Any]:
    """A nanoGPT ``meta.pkl`` as a dict, read with :class:`PlainUnpickler` and checked.

    Args:
        path: The file.

    Returns:
        Its dict; ``vocab_size``, ``itos`` and ``stoi`` are checked where present.

    Raises:
        ValueError: One line naming the file, if it asks for a global (a function or a
            class, ``os.system`` say), a persistent id, holds an object other than
            :data:`PLAIN_TYPES` (a set, bytes), is not a readable pickle, is not a dict,
            or has a bad ``vocab_size``, ``itos`` or ``stoi``. Nothing from the file runs.
    """
    data = path.read_bytes()
    try:
        meta = PlainUnpickler(data).load()
    except _Refused as exc:
        raise ValueError(
            f"{path} is refused: it asks for {exc.what}; a meta.pkl may hold only "
            f"{_ALLOWED}, and nothing from it was run"
        ) from None
    except Exception as exc:  # a damaged pickle fails in many ways; each is one line here
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"{path} is not a readable pickle: {reason}") from None
    foreign = _first_foreign(meta)
    if foreign is not None:
        raise ValueError(
            f"{path} is refused: it holds a {foreign}; a meta.pkl may hold only {_ALLOWED}"
        )
    if not isinstance(meta, dict):
        raise ValueError(f"{path} must hold a dict, not a {type(meta).__name__}")
    _check_vocab(path, meta)
    return meta
