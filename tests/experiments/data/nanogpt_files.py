"""Token folders in nanoGPT's own layouts, written by the tests themselves.

- Character level, as nanoGPT's ``data/shakespeare_char/prepare.py`` leaves it: the
  sorted characters of a text are its vocabulary, ``train.bin`` / ``val.bin`` hold the
  ids as ``uint16`` (the first nine tenths of the text, then the rest), and ``meta.pkl``
  is the default-protocol pickle of ``{"vocab_size": n, "itos": {id: char}, "stoi":
  {char: id}}``.
- OpenWebText style: only the two ``uint16`` files, no metadata at all.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

VERSE = (
    "the river runs beneath the bridge of stone,\n"
    "and every lamp along the quay is lit;\n"
    "the boatmen sing of harbours they have known,\n"
    "and night comes down to listen, bit by bit.\n\n"
)
"""The text of the character-level folders: 173 characters, 28 distinct ones."""


def char_vocab(text: str = VERSE) -> tuple[dict[str, int], dict[int, str]]:
    """``(stoi, itos)`` of ``text``: its distinct characters in sorted order."""
    chars = sorted(set(text))
    return {c: i for i, c in enumerate(chars)}, dict(enumerate(chars))


def write_char_folder(root: Path, text: str = VERSE * 40, protocol: int | None = None) -> Path:
    """``train.bin``, ``val.bin`` and ``meta.pkl`` of ``text``, character by character.

    Args:
        root: The folder (created).
        text: The corpus; the default repeats :data:`VERSE` to 6,920 characters.
        protocol: The pickle protocol of ``meta.pkl``; ``None`` for the default, as
            nanoGPT writes it.

    Returns:
        ``root``.
    """
    root.mkdir(parents=True, exist_ok=True)
    stoi, itos = char_vocab(text)
    ids = np.array([stoi[c] for c in text], dtype="<u2")
    cut = int(len(ids) * 0.9)
    ids[:cut].tofile(root / "train.bin")
    ids[cut:].tofile(root / "val.bin")
    meta = {"vocab_size": len(stoi), "itos": itos, "stoi": stoi}
    with open(root / "meta.pkl", "wb") as f:
        pickle.dump(meta, f, protocol=protocol)
    return root


def write_bare_folder(root: Path, vocab: int = 50, tokens: int = 4000) -> Path:
    """Two ``uint16`` files of seeded ids below ``vocab`` and no metadata file."""
    root.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(0).integers(0, vocab, size=tokens).astype("<u2")
    ids[: tokens * 9 // 10].tofile(root / "train.bin")
    ids[tokens * 9 // 10 :].tofile(root / "val.bin")
    return root
