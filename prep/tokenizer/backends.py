"""Tokenizer backends: the reference (`tokenizers`) and a fast one (`gigatoken`) that must match it.

Every backend turns documents into exactly the reference token ids (see `prep.tokenizer`); a
backend never adds EOS. `make_backend` picks one; docs/tokenizers.md explains the choices.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from prep.cache import derived_bytes
from prep.errors import InputError, TokenizerError
from prep.tokenizer import TokenizerInfo, contains_special, reference_encode_batch
from prep.tokenizer.spans import (
    Offsets,
    SpanTexts,
    TokenArray,
    documents_containing,
    offsets_of,
    replace_spans,
    split_tokens,
)
from prep.tokenizer.unicode import documents_with_unassigned, has_unassigned_code_point

__all__ = ["Backend", "GigatokenBackend", "ReferenceBackend", "has_unassigned_code_point", "make_backend"]

BACKEND_KINDS = ("auto", "tokenizers", "gigatoken")
INSTALL_HINT = "pip install 'prep[fast]'"
# Bounds memory: the reference builds a full Encoding object (strings, offsets) per document.
REFERENCE_CHUNK_CHARS = 4 << 20
# One gigatoken call per chunk: big enough to keep every thread busy.
GIGATOKEN_CHUNK_BYTES = 32 << 20
MAX_PROBED_ADDED_TOKENS = 64


class Backend(Protocol):
    """Encodes documents to the reference token ids, one array of `dtype` per document."""

    name: str
    version: str

    def encode_batch(self, texts: list[str]) -> list[TokenArray]:
        """Encode `texts` in order; pass a whole task's batch at once, not a few documents."""
        ...

    def encode_flat(self, blob: bytes, offsets: Offsets) -> tuple[TokenArray, Offsets]:
        """Encode the valid UTF-8 texts `blob[offsets[i]:offsets[i + 1]]`: all their tokens in one
        array of `dtype`, and the n + 1 offsets of each text's tokens in it."""
        ...

    def close(self) -> None:
        """Release the backend's resources (a no-op for the built-in backends)."""
        ...


def configure_threads(threads: int) -> None:
    """Bound both libraries' Rust thread pools to `threads` for this process.

    Both read RAYON_NUM_THREADS once, when their pool first starts; `tokenizers` reads
    TOKENIZERS_PARALLELISM on every call (false means it encodes on the calling thread)."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _char_chunks(texts: Sequence[str], limit: int) -> Iterator[slice]:
    """Consecutive slices of `texts` of about `limit` characters each (at least one document)."""
    start, size = 0, 0
    for index, text in enumerate(texts):
        if size and size + len(text) > limit:
            yield slice(start, index)
            start, size = index, 0
        size += len(text)
    if start < len(texts):
        yield slice(start, len(texts))


def _invalid_text_error(texts: Sequence[str], exc: Exception) -> Exception:
    """An InputError naming the first document that is not encodable Unicode (a lone surrogate)."""
    for index, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as bad:
            return InputError(f"document {index} of the batch is not valid Unicode text: {bad.reason} "
                              f"at character {bad.start}")
    return exc


class ReferenceBackend:
    """The reference encoding itself: `tokenizers` with the loaded tokenizer's settings."""

    name = "tokenizers"

    def __init__(self, tokenizer: Tokenizer, dtype: np.dtype[Any]) -> None:
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.version = _package_version("tokenizers")

    def encode_batch(self, texts: list[str]) -> list[TokenArray]:
        """Encode with `encode_batch_fast`, a few MB at a time."""
        out: list[TokenArray] = []
        try:
            for part in _char_chunks(texts, REFERENCE_CHUNK_CHARS):
                out.extend(reference_encode_batch(self.tokenizer, texts[part], self.dtype))
        except TypeError as exc:
            raise _invalid_text_error(texts, exc) from None
        return out

    def encode_flat(self, blob: bytes, offsets: Offsets) -> tuple[TokenArray, Offsets]:
        """`encode_batch` of the decoded texts, laid end to end."""
        return _joined(self.encode_batch(list(SpanTexts(blob, offsets))), self.dtype)

    def close(self) -> None:
        """Nothing to release."""


def _joined(tokens: list[TokenArray], dtype: np.dtype[Any]) -> tuple[TokenArray, Offsets]:
    flat = np.concatenate(tokens).astype(dtype, copy=False) if tokens else np.zeros(0, dtype)
    return flat, offsets_of([len(t) for t in tokens])


def _strict_utf8(texts: Sequence[str]) -> tuple[bytes, Offsets]:
    """The texts as one UTF-8 buffer with offsets; InputError names the first one that is not
    encodable Unicode (a lone surrogate)."""
    try:
        encoded = [text.encode("utf-8") for text in texts]
    except UnicodeEncodeError as exc:
        raise _invalid_text_error(texts, exc) from None
    return b"".join(encoded), offsets_of([len(data) for data in encoded])


class GigatokenUnsupported(Exception):
    """gigatoken cannot load this tokenizer or does not reproduce the reference on a probe."""


def gigatoken_definition(tokenizer_json: str, encode_special_tokens: bool) -> str:
    """The tokenizer definition gigatoken loads: without special tokens when they stay plain text.

    gigatoken always matches added tokens as single ids; dropping the special ones reproduces
    the reference's `encode_special_tokens = True`, which skips exactly those matches."""
    if not encode_special_tokens:
        return tokenizer_json
    definition = json.loads(tokenizer_json)
    added = definition.get("added_tokens") or []
    definition["added_tokens"] = [token for token in added if not token.get("special")]
    return json.dumps(definition)


def _cached_definition(tokenizer_json: str, encode_special_tokens: bool) -> str:
    """`gigatoken_definition`, cached under the SHA-256 of the tokenizer's JSON (rewriting a
    large vocabulary's JSON costs every worker tenths of a second)."""
    if not encode_special_tokens:
        return tokenizer_json
    sha256 = hashlib.sha256(tokenizer_json.encode("utf-8", "surrogatepass")).hexdigest()
    name = f"gigatoken-definitions/{sha256}-no-specials.json"
    return derived_bytes(name, lambda: gigatoken_definition(tokenizer_json, True).encode()).decode()


def _added_tokens(tokenizer: Tokenizer) -> list[tuple[str, bool]]:
    """(content, special) of every added token, in id order."""
    decoder = tokenizer.get_added_tokens_decoder()
    return [(decoder[i].content, bool(decoder[i].special)) for i in sorted(decoder)]


_PROBES = (
    "", " ", "\n", "hello world", "Hello, World! It's 2024: we'll see 12345678901234567890.",
    "a  b   c    d\n\n\n\t\t  e   ", "   leading and trailing   ", "line\r\nline\rline\n\r\n",
    "x" * 300, "don't I'LL you'VE we'd they're 's 't", "naïve café Ångström e\u0301 n\u0303",
    "Москва 北京市 東京 서울 القاهرة ירושלים Αθήνα हिन्दी ไทย", "👨\u200d👩\u200d👧 🏳\ufe0f\u200d🌈 👍🏽 😀😀",
    "\u00a0\u2009\u3000\u2028\u2029\u0085\u000b\u000c\u180e\u200b\ufeff", "\x00\x01\x1b[0m\x7f",
    "𝟙𝟚 ½ Ⅻ ٣٤ 𝔘𝔫𝔦 \U0001d400", "\ue000\U000f0000\U0010fffd", "ǅ İ ß ﬁ Σς",
    "def f(x):\n    return x ** 2  # comment\n", "1,234.56 3.14159 1e-10 0x1F 007",
)


def _probe_texts(added: list[tuple[str, bool]]) -> list[str]:
    """Fixed adversarial probes plus each added token in the contexts its options change."""
    texts = list(_PROBES)
    for content, _ in added[:MAX_PROBED_ADDED_TOKENS]:
        texts.append(f"{content}x{content} a {content} b\n{content}\n  {content}  .{content}.")
    return texts


# A rayon pool started before os.fork has no threads in the child: using it there hangs.
_pool_started = False
_pool_inherited = False


def _after_fork_in_child() -> None:
    global _pool_inherited
    _pool_inherited = _pool_inherited or _pool_started


os.register_at_fork(after_in_child=_after_fork_in_child)


class GigatokenBackend:
    """gigatoken, routed to the reference for documents it would encode differently."""

    name = "gigatoken"

    def __init__(self, tokenizer_json: str, reference: ReferenceBackend, info: TokenizerInfo,
                 threads: int) -> None:
        import gigatoken

        try:
            self._tokenizer = gigatoken.Tokenizer.from_json(
                _cached_definition(tokenizer_json, info.encode_special_tokens))
        except Exception as exc:  # noqa: BLE001 -- gigatoken raises several types, multi-line text
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise GigatokenUnsupported(f"gigatoken cannot load it: {first_line}") from None
        self.version = _package_version("gigatoken")
        self.dtype = reference.dtype
        self.threads = threads
        self.routed_documents = 0
        self._reference = reference
        added = _added_tokens(reference.tokenizer)
        # With specials kept as plain text, the reference also hides any non-special added token
        # overlapping a special string; a definition without specials cannot, so such documents
        # go to the reference whenever non-special added tokens exist.
        has_plain_added = any(not special for _, special in added)
        self._route_specials = info.encode_special_tokens and has_plain_added and bool(info.special_tokens)
        self._special_tokens = info.special_tokens
        self._self_check(_probe_texts(added))

    def routes_to_reference(self, text: str) -> bool:
        """True for documents this backend hands to the reference instead of gigatoken."""
        if self._route_specials and contains_special(text, self._special_tokens):
            return True
        return has_unassigned_code_point(text)

    def encode_batch(self, texts: list[str]) -> list[TokenArray]:
        """Encode with gigatoken, except routed documents, which the reference encodes."""
        return split_tokens(*self.encode_flat(*_strict_utf8(texts)))

    def encode_flat(self, blob: bytes, offsets: Offsets) -> tuple[TokenArray, Offsets]:
        """Encode with gigatoken, except routed documents, which the reference encodes."""
        flat, token_offsets = self._encode_columns(blob, offsets)
        routed = self._routed(blob, offsets)
        if not routed:
            return flat, token_offsets
        self.routed_documents += len(routed)
        texts = SpanTexts(blob, offsets)
        slow = self._reference.encode_batch([texts[index] for index in routed])
        return replace_spans(flat, token_offsets, routed, slow)

    def _routed(self, blob: bytes, offsets: Offsets) -> list[int]:
        """The documents to hand to the reference (`routes_to_reference`, for a whole batch at once)."""
        routed = documents_with_unassigned(blob, offsets)
        if self._route_specials:
            routed |= documents_containing(blob, offsets, [token.encode() for token in self._special_tokens])
        return [int(index) for index in np.flatnonzero(routed)]

    def close(self) -> None:
        """Nothing to release: gigatoken's thread pool is process-wide."""

    def _parallel(self) -> bool:
        return self.threads > 1 and not _pool_inherited

    def _encode_columns(self, blob: bytes, offsets: Offsets) -> tuple[TokenArray, Offsets]:
        """gigatoken's tokens of every text, a chunk of about GIGATOKEN_CHUNK_BYTES per call."""
        ends = [0]
        while ends[-1] < len(offsets) - 1:
            limit = offsets[ends[-1]] + GIGATOKEN_CHUNK_BYTES
            ends.append(max(ends[-1] + 1, int(np.searchsorted(offsets, limit, "right")) - 1))
        parts = [self._encode_chunk(blob, offsets[start:end + 1]) for start, end in zip(ends[:-1], ends[1:])]
        if len(parts) == 1:
            return parts[0]
        flats = [flat for flat, _ in parts]
        bases = np.cumsum([0] + [len(flat) for flat in flats[:-1]])
        merged = np.concatenate([[0]] + [chunk[1:] + base for (_, chunk), base in zip(parts, bases)])
        return (np.concatenate(flats) if flats else np.zeros(0, self.dtype)), merged.astype(np.int64)

    def _encode_chunk(self, blob: bytes, offsets: Offsets) -> tuple[TokenArray, Offsets]:
        """One gigatoken call over the texts of `offsets` (a window of the batch's offsets)."""
        global _pool_started
        import awkward as ak

        first, last = int(offsets[0]), int(offsets[-1])
        content = ak.contents.NumpyArray(np.frombuffer(blob, dtype=np.uint8, count=last - first, offset=first),
                                         parameters={"__array__": "byte"})
        texts = ak.contents.ListOffsetArray(ak.index.Index64(offsets - first), content,
                                            parameters={"__array__": "bytestring"})
        parallel = self._parallel()
        _pool_started = _pool_started or parallel
        encoded = ak.to_layout(self._tokenizer.encode_batch(ak.Array(texts), parallel=parallel))
        if isinstance(encoded, ak.contents.ListOffsetArray) and isinstance(encoded.content, ak.contents.NumpyArray):
            token_offsets = np.asarray(encoded.offsets.data, dtype=np.int64)
            flat = np.asarray(encoded.content.data)[token_offsets[0]:token_offsets[-1]]
            return flat.astype(self.dtype), token_offsets - token_offsets[0]
        tokens = ak.to_list(encoded)  # another layout: rare, and slow only then
        return _joined([np.asarray(row, dtype=self.dtype) for row in tokens], self.dtype)

    def _self_check(self, probes: list[str]) -> None:
        """Refuse a tokenizer gigatoken loads but encodes differently (unsupported options)."""
        expected = self._reference.encode_batch(probes)
        for text, want, got in zip(probes, expected, self.encode_batch(probes)):
            if not np.array_equal(want, got):
                raise GigatokenUnsupported(f"gigatoken disagrees with the reference on the probe {text[:40]!r}")
        self.routed_documents = 0


def gigatoken_available() -> bool:
    """True when the optional gigatoken package can be imported."""
    try:
        import gigatoken  # noqa: F401
    except ImportError:
        return False
    return True


def make_backend(kind: str, tokenizer_path: Path, tokenizer: Tokenizer, info: TokenizerInfo,
                 threads: int) -> Backend:
    """The backend `kind` names; "auto" means gigatoken when it is installed and reproduces this
    tokenizer, else the reference. Also bounds the process's tokenizer threads to `threads`."""
    if kind not in BACKEND_KINDS:
        raise TokenizerError(f"unknown tokenizer backend {kind!r} (use {', '.join(BACKEND_KINDS)})")
    configure_threads(threads)
    reference = ReferenceBackend(tokenizer, np.dtype(info.dtype))
    if kind == "tokenizers":
        return reference
    if not gigatoken_available():
        if kind == "gigatoken":
            raise TokenizerError(f"tokenizer backend gigatoken is not installed: {INSTALL_HINT}")
        return reference
    try:
        tokenizer_json = tokenizer_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{tokenizer_path}: cannot read tokenizer: {exc}") from None
    try:
        return GigatokenBackend(tokenizer_json, reference, info, threads)
    except GigatokenUnsupported as exc:
        if kind == "gigatoken":
            raise TokenizerError(f"{tokenizer_path}: tokenizer backend gigatoken is unusable: {exc} "
                                 f"(use backend tokenizers or auto)") from None
        return reference
