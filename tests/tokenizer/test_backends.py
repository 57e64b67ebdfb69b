"""The fast backend reproduces the reference exactly, on adversarial text and on every code point."""

from __future__ import annotations

import os
import signal
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from prep.errors import InputError, TokenizerError
from prep.tokenizer import load_tokenizer
from prep.tokenizer.backends import (
    GigatokenBackend,
    ReferenceBackend,
    configure_threads,
    gigatoken_definition,
    has_unassigned_code_point,
    make_backend,
)
from tests.tokenizer.conftest import EOS, BackendPair
from tests.tokenizer.strategies import batches

Backends = Callable[..., BackendPair]
CONFIGURATIONS = [(rich, special, threads) for rich in (False, True) for special in (True, False)
                  for threads in (1, 2)]


def assert_agree(pair: BackendPair, texts: list[str]) -> None:
    fast, reference = pair
    expected = reference.encode_batch(texts)
    actual = fast.encode_batch(texts)
    assert len(actual) == len(texts)
    for text, want, got in zip(texts, expected, actual):
        assert got.dtype == fast.dtype
        assert np.array_equal(want, got), f"backends disagree on {text[:80]!r}"


@pytest.fixture(autouse=True)
def _restore_thread_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_backend sets thread variables for the process; undo that after each test."""
    monkeypatch.setenv("RAYON_NUM_THREADS", "2")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")


@pytest.mark.parametrize(("rich", "encode_special_tokens", "threads"), CONFIGURATIONS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=batches)
def test_backends_agree_on_adversarial_text(backends: Backends, rich: bool, encode_special_tokens: bool,
                                            threads: int, texts: list[str]) -> None:
    assert_agree(backends(rich, encode_special_tokens, threads), texts)


ADVERSARIAL = [
    "", "", " ", "\r\n" * 50 + "\n\r" * 50 + "\r" * 30, " " * 5000, "\t \n" * 700, "9" * 10000,
    "x" * 100_000, "Ж" * 20_000, "👨\u200d👩\u200d👧" * 300, "e" + "\u0301" * 500,
    "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|>" * 100, " <pad> x<pad>y <|im_start|>user",
    "<|endoftext|>endoftext<|endoftext", "hello world<|endoftext|>hello world",
    "\U000329e3's \U000329e3'll", "\u088f'll \u0c5c's \U00016ea0'd",  # letters newer than the reference's tables
]


@pytest.mark.parametrize(("rich", "encode_special_tokens", "threads"), CONFIGURATIONS)
def test_backends_agree_on_edge_documents(backends: Backends, rich: bool, encode_special_tokens: bool,
                                          threads: int) -> None:
    assert_agree(backends(rich, encode_special_tokens, threads), ADVERSARIAL)


def test_backends_agree_on_a_document_of_several_megabytes(backends: Backends) -> None:
    pieces = ["The quick brown fox's 12345 jumps; ", "naïve café Ωμέγα данные 数据 🙂 ", "\r\n\t  ",
              "def f(x):\n    return x\n", "<|endoftext|>"]
    document = "".join(pieces[i % len(pieces)] for i in range(84_000))
    assert len(document.encode()) > 2_000_000
    texts = [document, "", "tail"]
    expected = backends(False, True, 1)[1].encode_batch(texts)
    for threads in (1, 2):
        actual = backends(False, True, threads)[0].encode_batch(texts)
        assert all(np.array_equal(want, got) for want, got in zip(expected, actual))


def test_forked_child_of_a_parallel_user_encodes_sequentially(backends: Backends) -> None:
    """A rayon pool used before fork has no threads in the child: a parallel call there hangs."""
    fast, _ = backends(False, True, 2)
    texts = ["hello world " * 1000] * 400
    expected = fast.encode_batch(texts)  # starts gigatoken's pool in this process
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        signal.alarm(60)  # a hang ends the child with SIGALRM instead of blocking the suite
        same = all(np.array_equal(a, b) for a, b in zip(expected, fast.encode_batch(texts)))
        os._exit(0 if same else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_special_strings_are_text_or_ids_as_configured(backends: Backends) -> None:
    text = "a<|endoftext|>b"
    plain, _ = backends(False, True, 1)
    special, _ = backends(False, False, 1)
    eos_id = plain._reference.tokenizer.token_to_id(EOS)
    assert eos_id not in plain.encode_batch([text])[0].tolist()
    assert eos_id in special.encode_batch([text])[0].tolist()


def test_gigatoken_definition_drops_only_special_tokens(rich_bpe_path: Path) -> None:
    original = rich_bpe_path.read_text(encoding="utf-8")
    assert gigatoken_definition(original, encode_special_tokens=False) == original
    kept = Tokenizer.from_str(gigatoken_definition(original, encode_special_tokens=True))
    assert sorted(token.content for token in kept.get_added_tokens_decoder().values()) == ["endoftext", "hello world"]


def test_special_strings_route_only_when_plain_added_tokens_exist(backends: Backends) -> None:
    simple, _ = backends(False, True, 1)
    rich, _ = backends(True, True, 1)
    keeping_ids, _ = backends(True, False, 1)
    assert not simple.routes_to_reference("x<|endoftext|>")
    assert rich.routes_to_reference("x<|endoftext|>")
    assert not rich.routes_to_reference("plain text")
    assert not keeping_ids.routes_to_reference("x<|endoftext|>")


def test_unassigned_code_points_are_routed() -> None:
    assert not has_unassigned_code_point("plain ASCII")
    assert not has_unassigned_code_point("naïve Ωμέγα 数据 😀 \U0010fffd")
    assert has_unassigned_code_point("ok \u0378")
    assert has_unassigned_code_point("CJK extension J \U000323b0")
    assert has_unassigned_code_point("😀 then \U00050000")


def _assigned_code_points() -> list[int]:
    """Every assigned code point of planes 0, 1 and 14, and every 7th of the CJK planes 2 and 3."""
    candidates = [*range(0x20000), *range(0x20000, 0x40000, 7), *range(0xE0000, 0xF0000)]
    return [c for c in candidates if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) != "Cn"]


def test_gigatoken_agrees_on_every_assigned_code_point(backends: Backends) -> None:
    """The routing rule is complete: outside unassigned code points gigatoken itself agrees."""
    fast, reference = backends(False, True, 1)
    chars = [chr(c) for c in _assigned_code_points()]
    documents = ["".join(f"{c}'s a{c}1 {c}{c}\n" for c in chars[i:i + 256]) for i in range(0, len(chars), 256)]
    assert not any(fast.routes_to_reference(document) for document in documents)
    assert_agree((fast, reference), documents)


def test_lone_surrogates_are_input_errors(backends: Backends) -> None:
    fast, reference = backends(False, True, 1)
    for backend in (fast, reference):
        with pytest.raises(InputError, match="document 1 of the batch is not valid Unicode"):
            backend.encode_batch(["fine", "bad \ud800 text"])
        with pytest.raises(InputError, match="document 2 of the batch is not valid Unicode"):
            backend.encode_batch(["fine", "routed \u0378", "bad \udfff", "fine"])


def test_make_backend_kinds(bpe_path: Path) -> None:
    tokenizer, info = load_tokenizer(bpe_path, EOS)
    assert isinstance(make_backend("tokenizers", bpe_path, tokenizer, info, 1), ReferenceBackend)
    chosen = make_backend("auto", bpe_path, tokenizer, info, 1)
    assert isinstance(chosen, GigatokenBackend)
    assert chosen.name == "gigatoken" and chosen.version != "unknown"
    assert isinstance(make_backend("gigatoken", bpe_path, tokenizer, info, 1), GigatokenBackend)
    with pytest.raises(TokenizerError, match="unknown tokenizer backend 'fastest'"):
        make_backend("fastest", bpe_path, tokenizer, info, 1)


def test_make_backend_without_gigatoken(bpe_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer, info = load_tokenizer(bpe_path, EOS)
    monkeypatch.setitem(sys.modules, "gigatoken", None)  # makes `import gigatoken` fail
    assert isinstance(make_backend("auto", bpe_path, tokenizer, info, 1), ReferenceBackend)
    with pytest.raises(TokenizerError, match=r"gigatoken is not installed: pip install 'prep\[fast\]'"):
        make_backend("gigatoken", bpe_path, tokenizer, info, 1)


def _variant(bpe_path: Path, name: str, change: Callable[[Tokenizer], None]) -> Path:
    tokenizer = Tokenizer.from_file(str(bpe_path))
    change(tokenizer)
    path = bpe_path.with_name(name)
    tokenizer.save(str(path))
    return path


def _set_normalizer(tokenizer: Tokenizer) -> None:
    tokenizer.normalizer = normalizers.NFKC()


def _drop_split_regex(tokenizer: Tokenizer) -> None:
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


@pytest.mark.parametrize(("change", "reason"), [
    (_set_normalizer, "cannot load it: Unsupported normalizer type: NFKC"),  # gigatoken refuses to load
    (_drop_split_regex, "disagrees with the reference on the probe"),  # loads, encodes differently
])
def test_unsupported_tokenizers_fall_back_or_fail(bpe_path: Path, change: Callable[[Tokenizer], None],
                                                  reason: str) -> None:
    path = _variant(bpe_path, f"{change.__name__}.json", change)
    tokenizer, info = load_tokenizer(path, EOS)
    assert isinstance(make_backend("auto", path, tokenizer, info, 1), ReferenceBackend)
    with pytest.raises(TokenizerError, match=f"{path.name}: tokenizer backend gigatoken is unusable: .*{reason}"):
        make_backend("gigatoken", path, tokenizer, info, 1)


@pytest.mark.parametrize(("threads", "parallelism"), [(1, "false"), (3, "true")])
def test_configure_threads_sets_both_libraries(threads: int, parallelism: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    configure_threads(threads)
    assert os.environ["RAYON_NUM_THREADS"] == str(threads)
    assert os.environ["TOKENIZERS_PARALLELISM"] == parallelism
    with pytest.raises(ValueError, match="at least 1"):
        configure_threads(0)
