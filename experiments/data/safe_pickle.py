"""numpy arrays out of a pickle, without running numpy's unpickling code.

Looking up numpy's own array builders is not enough to make a pickle safe: pickle may hand
``numpy.dtype.__setstate__`` any state, so a structured dtype can place a field far past
its item size, and numpy then reads or writes out of bounds while it restores the array.
:class:`ArrayUnpickler` therefore gives pickle inert stand-ins for the names numpy's
pickles use (``numpy.dtype``, ``numpy.ndarray``, ``_reconstruct`` of protocol 2 and
``_frombuffer`` of protocol 5, under numpy 1's ``numpy.core`` and numpy 2's
``numpy._core``). They only record their arguments and state. Once the whole pickle is
read, each array is checked (a dtype of :data:`PLAIN_DTYPES` in an explicit byte order, a
shape of ints >= 0, exactly ``prod(shape) * itemsize`` bytes) and built with
:func:`numpy.frombuffer`. Anything else is refused with :class:`pickle.UnpicklingError`.

Example::

    batch = ArrayUnpickler(path.read_bytes(), encoding="latin1").load()
    batch["data"].dtype  # uint8
"""

from __future__ import annotations

import math
import pickle
import reprlib
from collections.abc import Callable
from typing import Any

import numpy as np

from experiments.data.meta_pickle import PlainUnpickler

__all__ = ["ARRAY_GLOBALS", "PLAIN_DTYPES", "ArrayUnpickler"]

PLAIN_DTYPES = ("b1", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8")
"""The dtype codes an array may have (bool, integers, floats; what ``dtype.__reduce__`` writes)."""

_MAX_DIM = 2**40  # far above any real array, far below what overflows numpy's sizes
_MAX_NDIM = 32  # numpy 1's limit


def _refuse(what: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(what)


def _short(obj: Any) -> str:
    """``repr(obj)``, cut short: the values come from the file and may be large."""
    return reprlib.repr(obj)


class _Global:
    """What pickle gets for an allowed global: calling it calls ``make``.

    It takes no state, and has no attributes that ``BUILD`` could set, so that one file
    cannot change how the next one is read.
    """

    __slots__ = ("name", "make")

    def __init__(self, name: str, make: Callable[..., Any] | None) -> None:
        self.name, self.make = name, make

    def __call__(self, *args: Any) -> Any:
        if self.make is None:
            raise _refuse(f"a call of {self.name}")
        return self.make(*args)

    def __setstate__(self, state: Any) -> None:
        raise _refuse(f"a state for {self.name}")


class _Recorded:
    """A call pickle made, with its arguments and the state ``BUILD`` gave it, if any."""

    what = "call"
    state: Any = None
    has_state = False

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if self.has_state:
            raise _refuse(f"a second state for a {self.what}")
        self.state, self.has_state = state, True


class _Dtype(_Recorded):
    """Stands for ``numpy.dtype(code, align, copy)`` and its ``__setstate__``."""

    what = "numpy dtype"

    def build(self) -> np.dtype:
        """The plain dtype recorded here.

        Raises:
            pickle.UnpicklingError: For anything but a code of :data:`PLAIN_DTYPES` in an
                explicit byte order (no fields, names, sub-array, size or flags of its own).
        """
        args, state = self.args, self.state
        if not (len(args) == 3 and isinstance(args[0], str) and type(args[1]) in (bool, int)):
            raise _refuse(f"a numpy dtype made from {_short(args)}")
        code, align = args[0], args[1]
        # what numpy writes: version 3, or 4 with metadata (None but for datetimes)
        if not (
            isinstance(state, tuple)
            and (len(state), state[0]) in ((8, 3), (9, 4))
            and type(state[0]) is int
            and (len(state) == 8 or state[8] is None)
        ):
            raise _refuse(f"a numpy dtype {_short(code)} with the state {_short(state)}")
        if state[2:5] != (None, None, None):
            raise _refuse(f"a numpy dtype {_short(code)} with fields, names or a sub-array")
        if code not in PLAIN_DTYPES or align:
            raise _refuse(f"a numpy dtype {_short(code)}; allowed: {', '.join(PLAIN_DTYPES)}")
        # numpy writes -1, -1, 0 for every plain type: the item size comes from the code
        if state[5:8] != (-1, -1, 0):
            raise _refuse(
                f"a numpy dtype {_short(code)} with a size, alignment or flags of its own"
            )
        order = state[1]
        # one-byte codes have no byte order ('|'); wider ones name theirs ('<' or '>')
        if order not in (("|",) if code[1:] == "1" else ("<", ">")):
            raise _refuse(f"a numpy dtype {_short(code)} in the byte order {_short(order)}")
        return np.dtype(order + code)


def _shape(shape: Any, nbytes: int, dtype: np.dtype) -> tuple[int, ...]:
    """``shape``, checked to be ints >= 0 that hold exactly ``nbytes`` of ``dtype``."""
    if not (
        isinstance(shape, tuple)
        and len(shape) <= _MAX_NDIM
        and all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape)
    ):
        raise _refuse(
            f"a numpy array of shape {_short(shape)}; a shape is up to {_MAX_NDIM} ints >= 0"
        )
    want = math.prod(shape) * dtype.itemsize
    if want != nbytes:
        raise _refuse(
            f"a numpy array of shape {shape} and dtype {dtype} ({want} bytes) "
            f"holding {nbytes} bytes"
        )
    return shape


class _Array(_Recorded):
    """Stands for a numpy array in one of its two pickled forms.

    ``_reconstruct(ndarray, (0,), b"b")`` followed by the state
    ``(1, shape, dtype, is_fortran, raw)`` (protocol 2, and any non-contiguous array),
    or ``_frombuffer(buffer, dtype, shape, order)`` (protocol 5).
    """

    what = "numpy array"
    frombuffer = False
    _built: np.ndarray | None = None

    def build(self) -> np.ndarray:
        """The array recorded here, built with :func:`numpy.frombuffer` once checked.

        Raises:
            pickle.UnpicklingError: For any form, dtype, shape or length but the above.
        """
        if self._built is None:
            raw, dt, shape, fortran = self._parts()
            shape = _shape(shape, len(raw), dt)
            array = np.frombuffer(raw, dtype=dt).reshape(shape, order="F" if fortran else "C")
            if not (self.frombuffer or dt.isnative):
                # as numpy's own __setstate__: the values, swapped into the native byte order
                array = array.astype(dt.newbyteorder("="), order="K")
            # a bytes buffer gives a read-only view; numpy's own unpickling gives a writable array
            self._built = array if array.flags.writeable else array.copy(order="K")
        return self._built

    def _parts(self) -> tuple[bytes | bytearray, np.dtype, Any, bool]:
        """The raw bytes, the dtype, the shape and whether the bytes are in Fortran order."""
        args, state = self.args, self.state
        if self.frombuffer:
            if len(args) != 4 or self.has_state:
                raise _refuse(f"a numpy _frombuffer call with {_short(args)}")
            raw, dtype, shape, order = args
            if order not in ("C", "F"):
                raise _refuse(f"a numpy array in the order {_short(order)}")
            fortran = order == "F"
        else:
            if not (
                len(args) == 3 and args[0] is _NDARRAY and args[1:] in (((0,), b"b"), ((0,), "b"))
            ):
                raise _refuse(f"a numpy _reconstruct call with {_short(args)}")
            if not (isinstance(state, tuple) and len(state) == 5 and type(state[0]) is int):
                raise _refuse(f"a numpy array with the state {_short(state)}")
            if state[0] != 1:
                raise _refuse(f"a numpy array pickled in version {_short(state[0])}, not 1")
            _, shape, dtype, fortran, raw = state
            if type(fortran) not in (bool, int) or fortran not in (0, 1):
                raise _refuse(f"a numpy array with is_fortran={_short(fortran)}")
            if isinstance(raw, str):  # a Python 2 pickle's 8-bit string, decoded as latin1
                try:
                    raw = raw.encode("latin1")
                except UnicodeEncodeError:
                    raise _refuse("a numpy array whose data is text, not bytes") from None
        if not isinstance(dtype, _Dtype):
            raise _refuse(f"a numpy array whose dtype is a {type(dtype).__name__}")
        dt = dtype.build()  # first: an object dtype is the reason its data is a list
        if type(raw) not in (bytes, bytearray):
            # an object array keeps a list of its items here
            raise _refuse(f"a numpy array whose data is a {type(raw).__name__}, not bytes")
        return raw, dt, shape, bool(fortran)


def _frombuffer(*args: Any) -> _Array:
    array = _Array(*args)
    array.frombuffer = True
    return array


def _latin1(*args: Any) -> bytes:
    """``_codecs.encode(text, "latin1")``: how protocol 2 writes Python 3 bytes."""
    if not (len(args) == 2 and type(args[0]) is str and args[1] in ("latin1", "latin-1")):
        raise _refuse(f"the call _codecs.encode{_short(args)}; only (text, 'latin1') is read")
    try:
        return args[0].encode("latin1")
    except UnicodeEncodeError:
        raise _refuse("_codecs.encode of text beyond latin1") from None


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()``: how protocol 2 writes an empty bytes object (an empty array's data)."""
    if args:
        raise _refuse(f"the call bytes{_short(args)}; only bytes() is read")
    return b""


_NDARRAY = _Global("numpy.ndarray", None)  # only handed to _reconstruct, never called
_DTYPE = _Global("numpy.dtype", _Dtype)
_RECONSTRUCT = _Global("numpy _reconstruct", _Array)
_FROMBUFFER = _Global("numpy _frombuffer", _frombuffer)
_BYTES = _Global("bytes", _empty_bytes)

ARRAY_GLOBALS: dict[tuple[str, str], _Global] = {
    ("numpy", "dtype"): _DTYPE,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("_codecs", "encode"): _Global("_codecs.encode", _latin1),
    ("__builtin__", "bytes"): _BYTES,
    ("builtins", "bytes"): _BYTES,
}
"""The globals a pickle of numpy arrays may name (protocols 2 to 5, numpy 1 and 2)."""


# exact types: pickle makes no subclass of these without a global
_STANDINS = frozenset({_Array, _Dtype, _Global})
_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})


def _built(obj: Any) -> Any:
    """What the stand-in ``obj`` stands for: an array or a dtype, checked."""
    if isinstance(obj, (_Array, _Dtype)):
        return obj.build()
    raise _refuse(f"{obj.name} outside a numpy array")


def _build_arrays(root: Any) -> Any:
    """``root`` with every array and dtype stand-in replaced by what it stands for.

    Stand-ins are replaced in place in dicts (as values) and lists; one anywhere else (in
    a tuple or a set, or as a dict key) is refused rather than rebuilt around.
    """
    if type(root) in _STANDINS:
        return _built(root)
    seen: set[int] = set()
    stack = [root] if type(root) in _CONTAINERS else []
    while stack:  # a loop, not recursion: a pickle may nest deeper than the stack allows
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))  # the tree keeps every container alive, so ids are not reused
        kind = type(obj)
        if kind is dict or kind is list:
            for key, value in obj.items() if kind is dict else enumerate(obj):
                if kind is dict and type(key) in _STANDINS:
                    raise _refuse("a numpy object as a dict key")
                if type(value) in _STANDINS:
                    obj[key] = _built(value)  # an existing key or index: safe while iterating
                elif type(value) in _CONTAINERS:
                    stack.append(value)
        else:
            if any(type(item) in _STANDINS for item in obj):
                raise _refuse(f"a numpy object inside a {kind.__name__}")
            stack.extend(item for item in obj if type(item) in _CONTAINERS)
    return root


class ArrayUnpickler(PlainUnpickler):
    """Unpickles plain data and numpy arrays of :data:`PLAIN_DTYPES`, and nothing else.

    The names of :data:`ARRAY_GLOBALS` get their stand-ins; any other global, a persistent
    id or a copyreg extension code is refused (see
    :class:`~experiments.data.meta_pickle.PlainUnpickler`). No numpy code runs while the
    pickle is read; :meth:`load` builds the arrays afterwards.

    Args:
        data: The whole pickle.
        encoding: How to decode the 8-bit strings of a Python 2 pickle.
    """

    def find_class(self, module: str, name: str) -> Any:
        """The stand-in for ``module.name``, when it has one.

        Raises:
            pickle.UnpicklingError: For any other global.
        """
        standin = ARRAY_GLOBALS.get((module, name))
        if standin is None:
            super().find_class(module, name)
        return standin

    def load(self) -> Any:
        """The object of the pickle, with its arrays built and checked.

        Raises:
            pickle.UnpicklingError: For a global, persistent id or extension code that is
                not allowed, or an array or dtype that is not plain (see the module).
            ValueError: If the opcodes do not parse.
        """
        return _build_arrays(super().load())
