"""nanoGPT's own data folders: ``meta.pkl`` read safely, and folders with no metadata.

The folders are written here in nanoGPT's layouts (:mod:`.nanogpt_files`). A hostile
``meta.pkl`` is refused, and its payload is shown to be live: plain ``pickle.load``
runs it, the reader does not.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import re
import sys
from pathlib import Path

import pytest

from experiments.data.meta_pickle import read_meta_pickle
from experiments.data.tokens import build_tokens, read_meta, token_sizes
from experiments.train.checkpoint import latest_checkpoint, load_shard
from experiments.train.run import ConfigError, run, validate
from tests.experiments.data.common import CPU
from tests.experiments.data.nanogpt_files import (
    VERSE,
    char_vocab,
    write_bare_folder,
    write_char_folder,
)
from tests.experiments.train.lm_corpus import lm_overrides
from tests.support.launch import compose_config

QUICK = ["logger=none", "log.progress=false", "log.every=4", "log.consensus_every=0"]


class Point:
    """A class of the tests' own: a pickle of an instance names it as a global."""

    def __init__(self, x: int) -> None:
        self.x = x


class Payload:
    """Pickles as a call of ``func(*args)``, which plain unpickling makes."""

    def __init__(self, func: object, *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple:
        return self.func, self.args


class Later(Payload):
    """A :class:`Payload` as another's function: what it unpickles to is then called."""

    def __call__(self, *args: object) -> None:  # the pickler asks for a callable
        raise TypeError("only what this unpickles to is called")


def _place():
    from experiments.data.loaders import Placement

    return Placement(0, 1, 4, 0, CPU)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_nanogpt_meta_reads_in_every_protocol(tmp_path: Path, protocol: int) -> None:
    root = write_char_folder(tmp_path, protocol=protocol)
    meta = read_meta_pickle(root / "meta.pkl")
    stoi, itos = char_vocab()
    assert meta == {"vocab_size": len(stoi), "itos": itos, "stoi": stoi}
    # read_meta takes it where there is no meta.json
    assert read_meta(root) == meta


def test_a_char_folder_trains_with_no_extra_keys(tmp_path: Path, world_of_one) -> None:
    root = write_char_folder(tmp_path / "chars")
    vocab = len(set(VERSE))
    data = build_tokens({"root": str(root)}, placement=_place(), block_size=16)
    assert data.vocab_size == vocab
    cfg = compose_config(
        *QUICK, *lm_overrides(root), "train.max_steps=8", "checkpoint.every_steps=8"
    )
    assert cfg.dataset.vocab_size is None
    validate(cfg, 1)
    summary = run(cfg, run_dir=tmp_path / "run")
    assert summary["train/steps"] == 8 and summary["eval/loss"] > 0
    # the model's vocabulary is meta.pkl's
    shard = load_shard(latest_checkpoint(tmp_path / "run" / "checkpoints"), 0)
    assert shard["model"]["wte.weight"].shape[0] == vocab
    assert summary["unigram_entropy"] is None  # meta.pkl has none


def _write(path: Path, obj: object, protocol: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def _hostile(how: str, command: str) -> bytes:
    """A meta.pkl whose loading runs ``os.system(command)``."""
    if how == "inst":  # the protocol-0 INST opcode, which no modern pickler writes
        return b"(S'" + command.encode() + b"'\nios\nsystem\n."
    protocol = {"p0": 0, "p2": 2, "default": None}[how]
    return pickle.dumps({"vocab_size": 28, "x": Payload(os.system, command)}, protocol=protocol)


@pytest.mark.parametrize("how", ["p0", "p2", "default", "inst"])
def test_a_hostile_meta_pickle_is_refused_and_runs_nothing(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "ran"
    root = write_char_folder(tmp_path / "data")
    (root / "meta.pkl").write_bytes(_hostile(how, f"touch {marker}"))
    readers = (
        lambda: read_meta_pickle(root / "meta.pkl"),
        lambda: token_sizes({"root": str(root)}, 16),  # what every rank calls first
    )
    for read in readers:
        with pytest.raises(ValueError) as info:
            read()
        message = str(info.value)
        assert "\n" not in message and str(root / "meta.pkl") in message
        assert re.search(r" is refused: it asks for the global (os|posix)\.system;", message)
        assert not marker.exists()
    # the payload is live: plain unpickling runs it
    pickle.loads((root / "meta.pkl").read_bytes())
    assert marker.exists()


def _builtin_payload(func: str, command: str) -> Payload:
    """A payload that runs ``command`` through ``builtins.eval`` or ``builtins.getattr``."""
    if func == "eval":
        return Payload(eval, f"__import__('os').system({command!r})")
    # getattr(__import__("os"), "system")(command): no module is named but builtins
    return Payload(Later(getattr, Payload(__import__, "os"), "system"), command)


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize("func", ["eval", "getattr"])
def test_builtins_eval_and_getattr_are_refused(tmp_path: Path, func: str, protocol: int) -> None:
    marker = tmp_path / "ran"
    payload = _builtin_payload(func, f"touch {marker}")
    path = _write(tmp_path / "meta.pkl", {"vocab_size": 3, "x": payload}, protocol)
    with pytest.raises(ValueError) as info:
        read_meta_pickle(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path} is refused: ")
    # protocols 0 and 2 write Python 2's module name, which pickle maps when it imports
    assert re.search(rf"asks for the global (builtins|__builtin__)\.{func};", message)
    assert not marker.exists()
    # the payload is live: plain unpickling runs it
    pickle.loads(path.read_bytes())
    assert marker.exists()


def test_an_inst_opcode_naming_eval_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = f"__import__('os').system('touch {marker}')"
    path = tmp_path / "meta.pkl"
    path.write_bytes(b"(S" + repr(code).encode() + b"\nibuiltins\neval\n.")
    with pytest.raises(ValueError, match=r" is refused: it asks for the global builtins\.eval;"):
        read_meta_pickle(path)
    assert not marker.exists()
    pickle.loads(path.read_bytes())
    assert marker.exists()


def test_an_extension_code_cannot_reach_copyregs_cache(tmp_path: Path) -> None:
    # a code fetched once by an ordinary load is cached, and the unpickler takes it from
    # the cache without asking find_class: such a file must be refused before loading
    code = 0x7FFF_FFF0
    copyreg.add_extension(os.system.__module__, "system", code)
    try:
        first, second = tmp_path / "first", tmp_path / "second"
        pickle.loads(pickle.dumps(Payload(os.system, f"touch {first}"), protocol=2))
        assert first.exists()  # the code now sits in the cache
        path = _write(tmp_path / "meta.pkl", {"x": Payload(os.system, f"touch {second}")}, 2)
        assert b"\x84" in path.read_bytes()  # EXT4
        with pytest.raises(ValueError, match=f"asks for the copyreg extension code {code} "):
            read_meta_pickle(path)
        assert not second.exists()
    finally:
        copyreg.remove_extension(os.system.__module__, "system", code)


def test_a_class_instance_is_refused_by_its_name(tmp_path: Path) -> None:
    path = _write(tmp_path / "meta.pkl", {"vocab_size": 3, "point": Point(1)})
    with pytest.raises(ValueError, match=f"asks for the global {__name__}.Point;"):
        read_meta_pickle(path)
    assert pickle.loads(path.read_bytes())["point"].x == 1  # a plain load builds it


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        ({"vocab_size": 3, "chars": {"a", "b"}}, "holds a set"),
        ({"vocab_size": 3, "raw": b"abc"}, "holds a bytes"),
        ({"vocab_size": 3, "n": 1 + 2j}, "the global builtins.complex"),
        ([1, 2, 3], "must hold a dict, not a list"),
        ({"vocab_size": 0}, "vocab_size=0"),
        ({"vocab_size": 2, "itos": {0: "a", 5: "b"}}, "id 5, not below its vocab_size=2"),
        ({"vocab_size": 2, "stoi": {"a": "0"}}, "stoi that is not a dict"),
    ],
)
def test_anything_but_plain_nanogpt_metadata_is_one_line(tmp_path: Path, obj, needle) -> None:
    path = _write(tmp_path / "meta.pkl", obj)
    with pytest.raises(ValueError) as info:
        read_meta_pickle(path)
    assert needle in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_persistent_ids_and_damaged_files_are_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf)
    pickler.persistent_id = lambda obj: "outside" if obj == "x" else None  # type: ignore[method-assign]
    pickler.dump({"vocab_size": 2, "k": "x"})
    path = tmp_path / "meta.pkl"
    path.write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="asks for a persistent id"):
        read_meta_pickle(path)
    good = pickle.dumps({"vocab_size": 2})
    for damaged in (good[: len(good) // 2], b"not a pickle at all", b""):
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match="is not a readable pickle: ") as info:
            read_meta_pickle(path)
        assert "\n" not in str(info.value)


def test_cycles_and_deep_nesting_are_plain(tmp_path: Path) -> None:
    loop: list = []
    loop.append(loop)
    path = _write(tmp_path / "meta.pkl", {"vocab_size": 2, "loop": loop})
    meta = read_meta_pickle(path)
    assert meta["loop"][0] is meta["loop"]
    # lists nested deeper than the recursion limit (PROTO 2, EMPTY_LIST x n, APPEND x n - 1):
    # the check walks them without recursing
    depth = sys.getrecursionlimit() * 3
    path.write_bytes(b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".")
    with pytest.raises(ValueError, match="must hold a dict, not a list"):
        read_meta_pickle(path)


def test_meta_json_is_preferred_over_meta_pickle(tmp_path: Path) -> None:
    root = write_char_folder(tmp_path)
    (root / "meta.json").write_text('{"vocab_size": 40}')
    assert token_sizes({"root": str(root)}, 16) == (16, 40)


def test_no_metadata_names_the_key_and_gpt2s_vocabulary(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    root = write_bare_folder(tmp_path / "owt")
    cfg = compose_config(*QUICK, *lm_overrides(root))
    with pytest.raises(ConfigError) as info:
        validate(cfg, 1)
    message = str(info.value)
    assert message.startswith(f"vocab_size unknown: {root} holds no meta.json or meta.pkl; ")
    assert "dataset.vocab_size" in message and "50257" in message and "50304" in message
    assert "\n" not in message
    validate(compose_config(*QUICK, *lm_overrides(root), "dataset.vocab_size=50"), 1)
    assert token_sizes({"root": str(root), "vocab_size": 50304}, 16) == (16, 50304)


def test_a_char_folder_without_a_vocab_size_says_which_file(tmp_path: Path) -> None:
    root = write_char_folder(tmp_path)
    stoi, itos = char_vocab()
    _write(root / "meta.pkl", {"itos": itos, "stoi": stoi})
    with pytest.raises(ConfigError, match=f"^vocab_size unknown: {root / 'meta.pkl'} does not"):
        token_sizes({"root": str(root)}, 16)
