"""Tests of experiments.data.tokenizer: the decoder of a token folder, on real folders."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from experiments.data.prepare_tokens import EOT, prepare
from experiments.data.tokenizer import BPETokenizer, CharTokenizer, NoDecoderError, load_tokenizer
from tests.experiments.data.nanogpt_files import (
    VERSE,
    char_vocab,
    write_bare_folder,
    write_char_folder,
)


def test_nanogpt_characters_round_trip(tmp_path: Path) -> None:
    tok = load_tokenizer(write_char_folder(tmp_path))
    stoi, _ = char_vocab()
    assert isinstance(tok, CharTokenizer) and tok.vocab_size == len(stoi)
    ids = tok.encode(VERSE)
    assert ids == [stoi[c] for c in VERSE] and tok.decode(ids) == VERSE
    with pytest.raises(ValueError) as info:
        tok.encode("the Zebra\t")
    message = str(info.value)
    assert "lacks: '\\t', 'Z'" in message and "meta.pkl" in message and "\n" not in message


def test_a_pickle_with_only_stoi_or_itos_decodes(tmp_path: Path) -> None:
    root = write_char_folder(tmp_path)
    stoi, itos = char_vocab()
    for meta in ({"vocab_size": len(stoi), "stoi": stoi}, {"vocab_size": len(stoi), "itos": itos}):
        (root / "meta.pkl").write_bytes(pickle.dumps(meta))
        tok = load_tokenizer(root)
        assert tok.decode(tok.encode("the river")) == "the river"


def test_itos_must_number_its_characters_from_zero(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="itos whose ids are not 0 .. 1"):
        CharTokenizer({"a": 0, "b": 2}, {0: "a", 2: "b"}, tmp_path / "meta.pkl")
    with pytest.raises(ValueError, match=r"maps \['c'\] in stoi to ids that itos lacks"):
        CharTokenizer({"a": 0, "c": 3}, {0: "a", 1: "b"}, tmp_path / "meta.pkl")


def test_the_bpe_prepare_tokens_saved_round_trips(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    docs = [(f"d{i}", f"document {i}: the river runs under the bridge\n" * 20) for i in range(4)]
    root = tmp_path / "bpe"
    meta = prepare(docs, root, source="test", vocab_size=300, progress=False)
    tok = load_tokenizer(root)
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == meta["vocab_size"]
    text = "the bridge, é and 東"  # bytes the corpus never had still encode
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(EOT) == [meta["eot_token"]] and tok.decode([meta["eot_token"]]) == EOT
    # a meta.json naming a file that is gone
    (root / "tokenizer.json").unlink()
    with pytest.raises(NoDecoderError, match="names tokenizer_file tokenizer.json, but .* missing"):
        load_tokenizer(root)
    (root / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a tokenizers JSON file: "):
        load_tokenizer(root)


def test_folders_without_a_decoder_say_so_in_one_line(tmp_path: Path) -> None:
    bare = write_bare_folder(tmp_path / "owt")
    described = write_bare_folder(tmp_path / "described")
    (described / "meta.json").write_text(json.dumps({"vocab_size": 50}))
    for root in (bare, described):
        with pytest.raises(NoDecoderError) as info:
            load_tokenizer(root)
        assert str(info.value).startswith(f"{root} has no decoder: ")
        assert "\n" not in str(info.value)
