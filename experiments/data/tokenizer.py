"""The tokenizer of a token directory, to encode prompts and decode what a model writes.

Two kinds, found from the directory's metadata (:func:`experiments.data.tokens.read_meta`):

- the BPE that ``python -m experiments.data.prepare_tokens`` saves beside the token files
  (``meta.json`` names it as ``tokenizer_file``, a ``tokenizers`` JSON; GPT-2's or one
  trained on the corpus);
- nanoGPT's characters: the ``stoi`` and ``itos`` of its ``meta.pkl``.

A directory with neither (nanoGPT's OpenWebText files, or a ``meta.json`` without
``tokenizer_file``) trains fine but has no decoder: :func:`load_tokenizer` says so in one
line.

Example::

    tok = load_tokenizer(Path("data/shakespeare_char"))
    ids = tok.encode("ROMEO:")
    tok.decode(ids)  # "ROMEO:"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from experiments.data.meta_pickle import META_PICKLE
from experiments.data.tokens import META_FILE, meta_path, read_meta

__all__ = ["Tokenizer", "CharTokenizer", "BPETokenizer", "NoDecoderError", "load_tokenizer"]


class NoDecoderError(ValueError):
    """A token directory has no tokenizer to decode its ids with."""


class Tokenizer(Protocol):
    """What sampling needs of a tokenizer.

    Attributes:
        vocab_size: Every id below it decodes; no other does.
        kind: ``bpe`` or ``char``, for messages.
    """

    vocab_size: int
    kind: str

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``; raises ``ValueError`` (one line) if it cannot be encoded."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, each below :attr:`vocab_size`."""
        ...


class CharTokenizer:
    """nanoGPT's character-level tokenizer: one id per character.

    Args:
        stoi: Character to id.
        itos: Id to character; its ids must be ``0 .. len(itos) - 1``.
        source: The file they come from, for messages.

    Raises:
        ValueError: One line naming ``source``, if the ids of ``itos`` are not
            ``0 .. n - 1`` or ``stoi`` maps a character to an id ``itos`` lacks.
    """

    kind = "char"

    def __init__(self, stoi: Mapping[str, int], itos: Mapping[int, str], source: Path) -> None:
        ids = sorted(int(i) for i in itos)
        if ids != list(range(len(ids))):
            raise ValueError(f"{source} has an itos whose ids are not 0 .. {len(ids) - 1}")
        strays = sorted(c for c, i in stoi.items() if int(i) not in itos)
        if strays:
            raise ValueError(f"{source} maps {strays[:5]} in stoi to ids that itos lacks")
        self.stoi = {str(c): int(i) for c, i in stoi.items()}
        self.itos = {int(i): str(c) for i, c in itos.items()}
        self.vocab_size = len(self.itos)
        self.source = source

    def encode(self, text: str) -> list[int]:
        """The id of every character of ``text``.

        Raises:
            ValueError: One line naming the characters that ``stoi`` lacks.
        """
        missing = sorted({c for c in text if c not in self.stoi})
        if missing:
            shown = ", ".join(repr(c) for c in missing[:20])
            more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
            raise ValueError(
                f"the text has characters the vocabulary of {self.source} lacks: {shown}{more}"
            )
        return [self.stoi[c] for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        """The characters of ``ids``, joined."""
        return "".join(self.itos[int(i)] for i in ids)


class BPETokenizer:
    """A ``tokenizers`` JSON file, as ``prepare_tokens`` saves it (byte-level BPE).

    Special tokens such as ``<|endoftext|>`` are kept in the decoded text, so that
    document boundaries show.

    Args:
        path: The tokenizer's JSON file.

    Raises:
        ValueError: One line naming the file, if ``tokenizers`` cannot read it.
    """

    kind = "bpe"

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok: Any = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own exception type
            reason = " ".join(str(exc).split())
            raise ValueError(f"{path} is not a tokenizers JSON file: {reason}") from None
        self.vocab_size = int(self._tok.get_vocab_size())
        self.source = path

    def encode(self, text: str) -> list[int]:
        """The BPE ids of ``text`` (any text encodes: every byte is in the vocabulary)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens included."""
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))


def load_tokenizer(root: Path) -> Tokenizer:
    """The tokenizer of the token directory ``root``.

    ``meta.json``'s ``tokenizer_file`` comes first, then ``meta.pkl``'s ``stoi`` / ``itos``.

    Args:
        root: The token directory (a run's ``dataset.root``).

    Returns:
        A :class:`BPETokenizer` or a :class:`CharTokenizer`.

    Raises:
        NoDecoderError: One line, if the directory has neither, or ``meta.json`` names a
            tokenizer file that is missing.
        ValueError: One line naming the file, for a bad metadata or tokenizer file.
    """
    meta = read_meta(root)
    name = meta.get("tokenizer_file")
    if name:
        path = root / str(name)
        if not path.is_file():
            raise NoDecoderError(
                f"{root / META_FILE} names tokenizer_file {name}, but {path} is missing"
            )
        return BPETokenizer(path)
    if meta.get("itos") or meta.get("stoi"):
        itos = meta.get("itos") or {i: c for c, i in meta["stoi"].items()}
        stoi = meta.get("stoi") or {c: i for i, c in itos.items()}
        return CharTokenizer(stoi, itos, meta_path(root) or root)
    raise NoDecoderError(
        f"{root} has no decoder: no {META_FILE} naming a tokenizer_file and no {META_PICKLE} "
        "with stoi/itos; make the files with python -m experiments.data.prepare_tokens, which "
        f"saves its tokenizer, or add a {META_FILE} naming a tokenizers JSON as tokenizer_file"
    )
