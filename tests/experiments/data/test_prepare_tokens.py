"""Tests of experiments.data.prepare_tokens: text to token files, the stdlib corpus, entropy."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.data.loaders import Placement
from experiments.data.prepare_tokens import (
    EOT,
    main,
    read_inputs,
    split_documents,
    stdlib_corpus,
    train_bpe,
    unigram_entropy,
)
from experiments.data.tokens import build_tokens
from tests.support.cli import bad_command_lines, refusal
from tests.support.launch import clean_env, launch

PHRASES = (
    "the quick brown fox jumps over a lazy dog",
    "while seven wizards quietly hex jolly boxing frogs",
    "near the café a naïve façade in 東京 keeps its données",
)


@pytest.fixture(autouse=True)
def _serial_tokenizers(monkeypatch: pytest.MonkeyPatch) -> None:
    # no tokenizer thread pool in the test process, which later tests may fork
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


def write_corpus(folder: Path, count: int = 8) -> list[str]:
    """``count`` text files of seeded word salad, plus a hidden and a binary file to skip."""
    rng = np.random.default_rng(0)
    words = " ".join(PHRASES).split()
    texts = []
    for i in range(count):
        lines = [" ".join(rng.choice(words, size=12)) for _ in range(40 + 5 * i)]
        texts.append(f"document {i}\n" + "\n".join(lines) + "\n")
        sub = folder / ("a" if i % 2 else "b")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc{i}.txt").write_text(texts[-1], encoding="utf-8")
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "notes.txt").write_text("hidden")
    (folder / "image.bin").write_bytes(bytes([0xFF, 0xFE, 0x00, 0x80]) * 50)
    return texts


def read_ids(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<u2")


def one_error_line(err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prepare_tokens: error: "), err
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_text_files_become_token_files_the_loader_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    write_corpus(corpus)
    args = ["--input", str(corpus), "--out", str(out), "--vocab-size", "400"]
    assert main([*args, "--val-fraction", "0.25", "--seed", "3"]) == 0
    printed = capsys.readouterr()
    # stdout holds the one-paragraph summary only; the bar went to the (non-tty) stderr
    assert printed.out.count("\n") == 1 and printed.out.startswith("Wrote ")
    assert "encoding" in printed.err and "100%" in printed.err.replace("\r", "\n")
    meta = json.loads((out / "meta.json").read_text())
    train, val = read_ids(out / "train.bin"), read_ids(out / "val.bin")
    assert (meta["train_tokens"], meta["val_tokens"]) == (train.size, val.size)
    assert (meta["train_documents"], meta["val_documents"]) == (6, 2)
    assert meta["dtype"] == "uint16" and meta["tokenizer"] == "bpe"
    assert 257 < meta["vocab_size"] <= 400 and max(train.max(), val.max()) < meta["vocab_size"]
    assert meta["unigram_entropy"] == pytest.approx(unigram_entropy(train))
    assert "1 non-UTF-8 files skipped" in meta["source"] and str(corpus) in meta["source"]
    # every document is encoded and closed by <|endoftext|>, in the order of the split
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / meta["tokenizer_file"]))
    eot = tok.token_to_id(EOT)
    assert meta["eot_token"] == eot
    docs, skipped = read_inputs([str(corpus)])
    assert skipped == [str(corpus / "image.bin")]
    expected = split_documents(docs, 0.25, 3)
    for ids, split_docs in zip((train, val), expected):
        assert int((ids == eot).sum()) == len(split_docs) and ids[-1] == eot
        pieces = np.split(ids, np.flatnonzero(ids == eot) + 1)[:-1]
        assert [tok.decode(p[:-1].tolist()) for p in pieces] == [t for _, t in split_docs]
    data = build_tokens(
        {"root": str(out), "eval_tokens": 256},
        placement=Placement(0, 1, 2, 0, torch.device("cpu")),
        block_size=32,
    )
    assert data.vocab_size == meta["vocab_size"] and data.train_tokens == train.size
    assert data.unigram_entropy == meta["unigram_entropy"] and data.test.num_samples > 0
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json",
        "tokenizer.json",
        "train.bin",
        "val.bin",
    ]


def test_same_inputs_and_seed_give_the_same_files(tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus")
    for out in ("one", "two"):
        args = ["--input", str(tmp_path / "corpus"), "--vocab-size", "300"]
        assert main([*args, "--out", str(tmp_path / out)]) == 0
    for name in ("train.bin", "val.bin", "meta.json", "tokenizer.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_split_is_by_whole_documents_and_seeded() -> None:
    docs = [(f"d{i}", f"text {i}") for i in range(10)]
    train, val = split_documents(docs, 0.3, seed=0)
    assert len(val) == 3 and sorted(train + val) == sorted(docs)
    assert train == [d for d in docs if d not in val] and val == sorted(val)
    assert split_documents(docs, 0.3, seed=0) == (train, val)
    assert len({tuple(split_documents(docs, 0.3, seed=s)[1]) for s in range(5)}) > 1
    assert [len(v) for _, v in (split_documents(docs[:2], f, 0) for f in (0.01, 0.99))] == [1, 1]
    with pytest.raises(ValueError, match="at least 2"):
        split_documents(docs[:1], 0.5, seed=0)


def test_max_bytes_caps_the_corpus_at_a_character_boundary(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("aaaa")
    (tmp_path / "b.txt").write_text("bé東c")  # 1 + 2 + 3 + 1 bytes
    (tmp_path / "c.txt").write_text("cccc")
    docs, _ = read_inputs([str(tmp_path)], max_bytes=8)
    assert docs == [(str(tmp_path / "a.txt"), "aaaa"), (str(tmp_path / "b.txt"), "bé")]
    docs, _ = read_inputs([str(tmp_path / "c.txt"), str(tmp_path / "a.txt")], max_bytes=None)
    assert [t for _, t in docs] == ["cccc", "aaaa"]


def test_stdlib_corpus_skips_tests_packages_and_generated_modules(tmp_path: Path) -> None:
    files = {
        "abc.py": "# written by hand\nx = 1\n",
        "zz/mod.py": '"""A module."""\n',
        "test/test_abc.py": "assert True\n",
        "pkg/tests/t.py": "t = 1\n",
        "idlelib/idle_test/t.py": "t = 2\n",
        "site-packages/thirdparty.py": "third = 1\n",
        "encodings/cp0.py": '""" Codec generated from TABLE.TXT with gencodec.py.\n"""\n',
        "token.py": '"""Token constants."""\n# Auto-generated by a script\n',
        "latin.py": "caf\xe9 = 1\n",
        "notes.txt": "not python\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("latin-1") if name == "latin.py" else text.encode()
        (tmp_path / name).write_bytes(data)
    docs = stdlib_corpus(None, root=tmp_path)
    assert docs == [("abc.py", files["abc.py"]), ("zz/mod.py", files["zz/mod.py"])]
    assert stdlib_corpus(5, root=tmp_path) == [("abc.py", "# wri")]


def test_stdlib_corpus_of_this_interpreter() -> None:
    docs = stdlib_corpus(300_000)
    paths = [p for p, _ in docs]
    assert paths == sorted(paths) and len(set(paths)) == len(paths)
    assert sum(len(t.encode()) for _, t in docs) == 300_000
    assert all(p.endswith(".py") and "site-packages" not in p for p in paths)
    assert not any(part in ("test", "tests") for p in paths for part in p.split("/"))
    assert any('"""' in t for _, t in docs)  # docstrings, as people wrote them
    assert stdlib_corpus(300_000) == docs


def test_gpt2_without_its_files_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    args = ["--input", str(tmp_path / "corpus"), "--out", str(out), "--tokenizer", "gpt2"]
    assert main(args) == 1
    one_error_line(capsys.readouterr().err, "vocab.json", "merges.txt", "--gpt2-vocab (not given)")
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    assert main([*args, "--gpt2-vocab", str(vocab), "--gpt2-merges", "gone.txt"]) == 1
    line = one_error_line(capsys.readouterr().err, "--gpt2-merges gone.txt")
    assert "--gpt2-vocab" not in line
    assert not out.exists()


def test_gpt2_tokenizer_loads_local_vocab_and_merges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = write_corpus(tmp_path / "corpus")
    # vocab.json and merges.txt in GPT-2's format, of a small BPE trained here
    files = train_bpe(texts, 320).model.save(str(tmp_path), "small")
    vocab, merges = sorted(files, key=lambda f: not f.endswith(".json"))
    out = tmp_path / "out"
    args = ["--input", str(tmp_path / "corpus"), "--out", str(out), "--tokenizer", "gpt2"]
    assert main([*args, "--gpt2-vocab", vocab, "--gpt2-merges", merges]) == 0
    assert "GPT-2's tokenizer" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == len(
        json.loads(Path(vocab).read_text())
    )
    train = read_ids(out / "train.bin")
    assert train.size == meta["train_tokens"] and train.max() < meta["vocab_size"]


@bad_command_lines(
    (["--vocab-size", "70000"], "65536"),
    (["--val-fraction", "1.0"], "--val-fraction=1.0"),
    (["--max-bytes", "0"], "--max-bytes=0"),
)
def test_bad_arguments_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    write_corpus(tmp_path / "corpus")
    args = ["--input", str(tmp_path / "corpus"), "--out", str(tmp_path / "out"), *argv]
    one_error_line(refusal(main, args, capsys, status=1), needle)


def test_missing_or_single_input_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--input", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 1
    one_error_line(capsys.readouterr().err, str(tmp_path / "nowhere"), "not found")
    (tmp_path / "one.txt").write_text("a single document")
    assert main(["--input", str(tmp_path / "one.txt"), "--out", str(tmp_path / "out")]) == 1
    one_error_line(capsys.readouterr().err, "at least 2")


def test_unigram_entropy_by_hand() -> None:
    # p = (1/2, 1/4, 1/4): H = 1/2 ln 2 + 2 * 1/4 ln 4 = 3/2 ln 2
    assert unigram_entropy([0, 0, 1, 2]) == pytest.approx(1.5 * math.log(2))
    assert unigram_entropy(np.array([5, 6, 7, 8], dtype=np.uint16)) == pytest.approx(math.log(4))
    assert unigram_entropy(torch.tensor([[3, 3], [3, 3]])) == 0.0
    with pytest.raises(ValueError, match="no tokens"):
        unigram_entropy([])


def test_command_line_on_the_stdlib_without_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "stdlib"
    command = [sys.executable, "-m", "experiments.data.prepare_tokens", "--stdlib"]
    result = launch(
        [*command, "--max-bytes", "200000", "--vocab-size", "1024", "--out", str(out)],
        timeout=300,
        env=clean_env(TOKENIZERS_PARALLELISM="false"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and "standard library" in result.stdout
    assert "100%" in result.stderr.replace("\r", "\n")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["text_bytes"] == 200_000 and meta["val_tokens"] > 0
    assert meta["source"].startswith(f"the .py sources of the Python {sys.version.split()[0]}")
