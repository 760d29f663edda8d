"""CIFAR batches are unpickled without running numpy's own unpickling code.

A batch may name numpy's array builders only, and those get inert stand-ins: a dtype state
that puts a field past the item size (which makes numpy read or write out of bounds while
it restores the array) is refused, as is anything but a plain dtype. Real batches, in the
Python 2 format CIFAR ships in and as numpy 1 and 2 pickle them today, load bit for bit.
"""

from __future__ import annotations

import _codecs
import multiprocessing
import os
import pickle
import struct
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.data.cifar import CIFAR, read_cifar
from experiments.data.safe_pickle import PLAIN_DTYPES, ArrayUnpickler
from tests.support.launch import launch

# numpy's own array builders, however this numpy names their modules
RECONSTRUCT = np.zeros(1).__reduce__()[0]
FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]
GOOD = {"data": np.arange(2 * 3072, dtype=np.uint32).astype(np.uint8).reshape(2, 3072)}
GOOD["labels"] = [3, 7]


class Reduce:
    """Pickles as ``func(*args)``, then ``BUILD`` with ``state`` when one is given."""

    def __init__(self, func: Any, args: tuple, state: Any = None) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce__(self) -> tuple:
        if self.state is None:
            return self.func, self.args
        return self.func, self.args, self.state


def structured(fields: dict[str, tuple[np.dtype, int]], itemsize: int, flags: int) -> Reduce:
    """A dtype whose fields sit at the given offsets, however far past ``itemsize``."""
    state = (3, "|", None, tuple(fields), fields, itemsize, 1, flags)
    return Reduce(np.dtype, (f"V{itemsize}", False, True), state)


def dtype_state(code: str, order: str, flags: int = 0) -> Reduce:
    """A dtype of ``code`` pickled with the given byte order and flags."""
    return Reduce(np.dtype, (code, False, True), (3, order, None, None, None, -1, -1, flags))


def array(dtype: Any, shape: tuple, raw: Any) -> Reduce:
    """An array in the ``_reconstruct`` form, with any dtype, shape and data."""
    return Reduce(RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, shape, dtype, False, raw))


OBJECT_FLAGS = np.dtype([("o", "O"), ("x", "<i8")]).__reduce__()[2][7]
FAR = 2**40

# numpy writes an item with an object field element by element: the int lands at FAR
OOB_WRITE = array(
    structured({"o": (np.dtype("O"), 0), "x": (np.dtype("<i8"), FAR)}, 16, OBJECT_FLAGS),
    (1,),
    [(None, 0x4141414141414141)],
)
# no object: the bytes are copied in, and reading the field reads FAR past them
OOB_READ = array(structured({"x": (np.dtype("<i8"), FAR)}, 8, 0), (1,), b"\0" * 8)


def _read_and_exit(folder: Path, out: Path) -> None:
    """In a forked child: the refusal's message into ``out`` and exit 0, or exit 3 if it loads."""
    try:
        read_cifar(folder, ["data_batch_1"], CIFAR["cifar10"], "hint")
    except ValueError as exc:
        out.write_text(str(exc))
        os._exit(0)
    os._exit(3)


def _batch(folder: Path, obj: Any, protocol: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "data_batch_1"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ValueError) as info:
        read_cifar(path.parent, [path.name], CIFAR["cifar10"], "hint")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


@pytest.mark.parametrize(
    ("payload", "protocol"),
    [
        ("write", 5),
        ("read", 2),
        # slow: each pair is one more process; the fast two cover both payloads and protocols
        pytest.param("write", 2, marks=pytest.mark.slow),
        pytest.param("read", 5, marks=pytest.mark.slow),
    ],
)
def test_an_out_of_bounds_dtype_is_refused_in_a_process_that_survives(
    tmp_path: Path, payload: str, protocol: int
) -> None:
    hostile = OOB_WRITE if payload == "write" else OOB_READ
    path = _batch(tmp_path / "batches", {**GOOD, "x": hostile}, protocol)
    # the reader runs in a child, so that a crash fails this test instead of killing pytest;
    # a forked one, which need not import torch and the framework again
    out = tmp_path / "refusal.txt"
    child = multiprocessing.get_context("fork").Process(
        target=_read_and_exit, args=(path.parent, out)
    )
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, child.exitcode
    [line] = out.read_text().splitlines()
    assert line.startswith(f"{path}: refused to unpickle a numpy dtype 'V")
    assert "with fields, names or a sub-array" in line


def test_the_out_of_bounds_payloads_are_live_under_plain_pickle(tmp_path: Path) -> None:
    # what the refusal prevents: numpy itself crashes on them (SIGSEGV, or SIGBUS)
    write = _batch(tmp_path / "w", {"x": OOB_WRITE})
    read = _batch(tmp_path / "r", {"x": OOB_READ})
    code = "import pickle, sys; a = pickle.loads(open(sys.argv[1], 'rb').read())['x']"
    child = launch([sys.executable, "-c", code, str(write)], timeout=120)
    assert child.returncode < 0, (child.returncode, child.stderr[-2000:])
    child = launch([sys.executable, "-c", code + "; print(a['x'])", str(read)], timeout=120)
    assert child.returncode < 0, (child.returncode, child.stderr[-2000:])


OBJECTS = np.array([1, "x"], dtype=object)
SUBARRAY = Reduce(np.dtype, ("V2", 0, 1), (3, "|", (np.dtype("u1"), (2,)), None, None, 2, 1, 0))
REFUSED = {
    "fields": (np.zeros(3, dtype=[("a", "u1"), ("b", "<i4")]), "with fields, names or a sub"),
    "sub-array": (array(SUBARRAY, (1,), b"ab"), "with fields, names or a sub-array"),
    "object": (OBJECTS, "a numpy dtype 'O8'; allowed: b1, u1"),
    "void": (np.zeros(2, dtype="V4"), "a numpy dtype 'V4'"),
    "unicode": (np.array(["ab"]), "a numpy dtype 'U2'"),
    "datetime": (np.zeros(2, dtype="M8[s]"), "a numpy dtype 'M8'"),
    "complex": (np.zeros(2, dtype=np.complex64), "a numpy dtype 'c8'"),
    "flags": (array(dtype_state("u1", "|", flags=63), (1,), b"a"), "flags of its own"),
    "order of u1": (array(dtype_state("u1", "<"), (1,), b"a"), "byte order '<'"),
    "order of f4": (array(dtype_state("f4", "|"), (1,), b"abcd"), "byte order '|'"),
    "short data": (
        Reduce(FROMBUFFER, (b"\0" * 10, np.dtype("u1"), (2, 3072), "C")),
        "of shape (2, 3072) and dtype uint8 (6144 bytes) holding 10 bytes",
    ),
    "long data": (array(np.dtype("<i4"), (2,), b"\0" * 12), "(8 bytes) holding 12 bytes"),
    "negative shape": (array(np.dtype("u1"), (-2, -3), b"\0" * 6), "of shape (-2, -3); a shape"),
    "huge shape": (array(np.dtype("u1"), (0, 2**62), b""), "of shape (0, 4611686018427387904)"),
    "float shape": (array(np.dtype("u1"), (2.0,), b"ab"), "of shape (2.0,)"),
    "order": (Reduce(FROMBUFFER, (b"ab", np.dtype("u1"), (2,), "K")), "in the order 'K'"),
    "typecode": (
        Reduce(RECONSTRUCT, (np.ndarray, (0,), b"c"), (1, (1,), np.dtype("u1"), False, b"a")),
        "_reconstruct call",
    ),
    "text data": (array(np.dtype("u1"), (1,), ["a"]), "whose data is a list"),
    "in a tuple": ((np.zeros(2, np.uint8),), "a numpy object inside a tuple"),
    "dtype alone": (np.dtype([("a", "u1")]), "with fields"),
    "codec": (Reduce(_codecs.encode, ("x", "rot13")), "only (text, 'latin1') is read"),
    "big bytes": (Reduce(bytes, (10**12,)), "only bytes() is read"),
}


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("case", list(REFUSED))
def test_anything_but_a_plain_array_is_refused_in_one_line(
    tmp_path: Path, case: str, protocol: int
) -> None:
    hostile, needle = REFUSED[case]
    path = _batch(tmp_path, {**GOOD, "x": hostile}, protocol)
    message = _refusal(path)
    assert ": refused to unpickle " in message and needle in message, message


def test_a_second_state_and_a_bare_builder_are_refused(tmp_path: Path) -> None:
    # BUILD twice on one array: the second state is refused as it arrives
    data = bytearray(pickle.dumps({"x": array(np.dtype("u1"), (1,), b"a")}, protocol=2))
    build = data.rindex(b"b")  # the array's BUILD, just before SETITEM and STOP
    again = pickle.dumps((1, (1,), np.dtype("u1"), False, b"b"), protocol=2)[2:-1]
    path = tmp_path / "data_batch_1"
    path.write_bytes(bytes(data[: build + 1]) + again + bytes(data[build:]))
    assert "a second state for a numpy array" in _refusal(path)
    # the builder itself, not called
    path.write_bytes(pickle.dumps({"f": FROMBUFFER, **GOOD}, protocol=2))
    assert "refused to unpickle numpy _frombuffer outside a numpy array" in _refusal(path)


class _Numpy1Pickler(pickle._Pickler):
    """Writes numpy's array builders under numpy 1's names, as numpy 1 pickles them."""

    NAMES = {id(RECONSTRUCT): "numpy.core.multiarray", id(FROMBUFFER): "numpy.core.numeric"}

    def save_global(self, obj: Any, name: str | None = None) -> None:
        module = self.NAMES.get(id(obj))
        if module is None:
            return super().save_global(obj, name)
        if self.proto >= 4:
            self.save(module)
            self.save(obj.__name__)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{module}\n{obj.__name__}\n".encode())
        self.memoize(obj)
        return None

    dispatch = {**pickle._Pickler.dispatch, types.FunctionType: save_global}


def _numpy1_dumps(obj: Any, protocol: int) -> bytes:
    import io

    buf = io.BytesIO()
    _Numpy1Pickler(buf, protocol=protocol).dump(obj)
    data = buf.getvalue()
    assert b"numpy.core." in data and b"numpy._core" not in data
    return data


def _plain_arrays() -> dict[str, Any]:
    """An array of every plain dtype, in both byte orders, and in every layout numpy pickles."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 6 * 4 * 8, dtype=np.uint8).tobytes()
    out: dict[str, Any] = {}
    for code in PLAIN_DTYPES:
        orders = "|" if code[1:] == "1" else "<>"
        for order in orders:
            dt = np.dtype(order + code)
            a = np.frombuffer(raw[: 24 * dt.itemsize], dtype=dt).reshape(6, 4)
            out[f"{order}{code}"] = a
            out[f"{order}{code} F"] = np.asfortranarray(a)
            out[f"{order}{code} strided"] = a[::2, 1::2]  # pickled through _reconstruct
    out["scalar"] = np.array(7.5)
    out["empty"] = np.zeros((0, 3072), np.uint8)
    out["in a list"] = [np.arange(3, dtype=np.int16), "text", 1]
    out["shared"] = out["in a list"][0]
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal down to each array's dtype, shape, layout and bytes."""
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and (a.dtype, a.shape, a.tobytes("A")) == (b.dtype, b.shape, b.tobytes("A"))
            and a.flags.f_contiguous == b.flags.f_contiguous
            and b.flags.writeable
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@pytest.mark.filterwarnings("ignore:numpy.core.* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("numpy1", [False, True], ids=["numpy._core", "numpy.core"])
def test_plain_arrays_load_bit_exactly(protocol: int, numpy1: bool) -> None:
    obj = _plain_arrays()
    data = _numpy1_dumps(obj, protocol) if numpy1 else pickle.dumps(obj, protocol=protocol)
    loaded = ArrayUnpickler(data).load()
    assert _same(pickle.loads(data), loaded)  # numpy's own unpickling, down to the byte
    assert loaded["shared"] is loaded["in a list"][0]  # one array, as pickle wrote it


def _py2_batch(data: np.ndarray, labels: list[int], name: str) -> bytes:
    """A batch as Python 2's cPickle wrote CIFAR's: protocol 2, 8-bit strings, numpy.core."""

    def text(s: str) -> bytes:  # SHORT_BINSTRING
        return b"U" + bytes([len(s)]) + s.encode()

    rows, cols = data.shape
    raw = data.tobytes()
    return b"".join([
        b"\x80\x02}(",
        text("data"),
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + text("b") + b"\x87R",
        b"(K\x01M" + struct.pack("<H", rows) + b"M" + struct.pack("<H", cols) + b"\x86",
        b"cnumpy\ndtype\n" + text("u1") + b"K\x00K\x01\x87R",
        b"(K\x03" + text("|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb",
        b"\x89T" + struct.pack("<i", len(raw)) + raw + b"tb",
        text("labels") + b"](" + b"".join(b"K" + bytes([y]) for y in labels) + b"e",
        text("batch_label") + text(name),
        text("filenames") + b"](" + b"".join(text(f"{k}.png") for k in labels) + b"e",
        b"u.",
    ])  # fmt: skip


def test_python2_cifar_batches_load_bit_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    want = []
    for i, name in enumerate(["data_batch_1", "data_batch_2"]):
        data = rng.integers(0, 256, (3 + i, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, 3 + i).tolist()
        (folder / name).write_bytes(_py2_batch(data, labels, f"training batch {i + 1} of 5"))
        # numpy's own reading of the file agrees with what was written
        plain = pickle.loads((folder / name).read_bytes(), encoding="latin1")
        assert np.array_equal(plain["data"], data) and plain["labels"] == labels
        ours = ArrayUnpickler((folder / name).read_bytes(), encoding="latin1").load()
        assert _same(plain, ours)
        want.append((data, labels))
    images, labels = read_cifar(folder, ["data_batch_1", "data_batch_2"], CIFAR["cifar10"], "")
    assert images.numpy().tobytes() == b"".join(d.tobytes() for d, _ in want)
    assert images.shape == (7, 3, 32, 32) and labels.tolist() == want[0][1] + want[1][1]


def test_a_damaged_batch_is_one_line(tmp_path: Path) -> None:
    good = pickle.dumps(GOOD, protocol=2)
    path = tmp_path / "data_batch_1"
    for damaged in (good[: len(good) // 2], b"not a pickle", pickle.dumps({"labels": [1]})):
        path.write_bytes(damaged)
        _refusal(path)
