"""Tokenizer backends: the reference (`tokenizers`) and a fast one (`gigatoken`) that must match it.

Every backend turns documents into exactly the reference token ids (see `prep.tokenizer`); a
backend never adds EOS. `make_backend` picks one; docs/tokenizers.md explains the choices.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import sys
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from prep.cache import derived_bytes
from prep.errors import InputError, TokenizerError
from prep.tokenizer import TokenizerInfo, contains_special, reference_encode_batch

BACKEND_KINDS = ("auto", "tokenizers", "gigatoken")
INSTALL_HINT = "pip install 'prep[fast]'"
# Bounds memory: the reference builds a full Encoding object (strings, offsets) per document.
REFERENCE_CHUNK_CHARS = 4 << 20
# One parallel gigatoken call per chunk: big enough to keep every thread busy.
GIGATOKEN_CHUNK_CHARS = 32 << 20
MAX_PROBED_ADDED_TOKENS = 64

TokenArray = np.ndarray[Any, np.dtype[Any]]


class Backend(Protocol):
    """Encodes documents to the reference token ids, one array of `dtype` per document."""

    name: str
    version: str

    def encode_batch(self, texts: list[str]) -> list[TokenArray]:
        """Encode `texts` in order; pass a whole task's batch at once, not a few documents."""
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

    def close(self) -> None:
        """Nothing to release."""


@functools.cache
def _unassigned_tables() -> tuple[np.ndarray[Any, np.dtype[np.bool_]], np.ndarray[Any, np.dtype[np.bool_]]]:
    """Lookup tables of code points unassigned in Python's Unicode database (category Cn).

    The second table covers UTF-16 code units and also flags surrogates (astral characters).
    Building it takes about a second, so it is cached on disk under the Unicode database's
    version (the only thing it depends on) and every worker process loads it in milliseconds."""
    unassigned = _cached_unassigned_table()
    units = unassigned[:0x10000].copy()
    units[0xD800:0xE000] = True
    return unassigned, units


def _cached_unassigned_table() -> np.ndarray[Any, np.dtype[np.bool_]]:
    def build() -> bytes:
        table = np.fromiter((unicodedata.category(chr(c)) == "Cn" for c in range(0x110000)),
                            dtype=np.bool_, count=0x110000)
        return bytes(np.packbits(table).tobytes())

    packed = np.frombuffer(derived_bytes(f"unicode-unassigned-{unicodedata.unidata_version}.bits", build),
                           dtype=np.uint8)
    if packed.size * 8 < 0x110000:  # a damaged cache entry
        packed = np.frombuffer(build(), dtype=np.uint8)
    return np.unpackbits(packed, count=0x110000).astype(np.bool_)


# Every code point below U+0378 is assigned (and stays so: Unicode never unassigns a code point).
_FIRST_UNASSIGNED = 0x378


def _compact_header() -> int | None:
    """The size of a compact non-ASCII str's header, from sys.getsizeof; None where sizes do not
    follow CPython's compact layout (header + (length + 1) * bytes per character)."""
    try:
        header = sys.getsizeof(chr(0xE9) * 2) - 3  # built at run time: no cached UTF-8 copy
        sizes = [sys.getsizeof(chr(c) * 5) for c in (0xE9, 0x100, 0x10000)]
    except TypeError:  # interpreters without sys.getsizeof for str
        return None
    return header if sizes == [header + 6, header + 12, header + 24] else None


_COMPACT_HEADER = _compact_header()


def _char_width(text: str) -> int:
    """Bytes per character of a non-ASCII str read in O(1) from its size: 1 or 4 when the size says
    so, else 0 (two bytes, or unsure).

    Hazard: sys.getsizeof also counts a cached UTF-8 (or wchar_t) copy, and non-compact strings
    are bigger, so only 1 is a proof (all code points below U+0100): any other layout is bigger than
    header + length + 1. 4 is a hint only: callers must stay correct whatever the width."""
    if _COMPACT_HEADER is None or type(text) is not str:
        return 0
    extra = sys.getsizeof(text) - _COMPACT_HEADER
    length = len(text) + 1
    return 1 if extra == length else 4 if extra == 4 * length else 0


def _any_unassigned(table: np.ndarray[Any, np.dtype[np.bool_]], codes: np.ndarray[Any, np.dtype[Any]]) -> bool:
    """True when `table` flags any of `codes`; looks up only codes at or above U+0378 (few in most text)."""
    return bool(table[codes[codes >= _FIRST_UNASSIGNED]].any())


def has_unassigned_code_point(text: str) -> bool:
    """True when `text` holds a code point unassigned in Python's Unicode database.

    gigatoken's Unicode tables are newer than the reference's regex engine: it classes characters
    added by recent Unicode versions as letters, the reference as unassigned, so they split text
    differently. Python's database (14.0 on 3.11) predates both, so its gaps cover every such
    character. Cheap checks first: ASCII and one-byte (Latin-1) strings never qualify (O(1)); then
    UTF-16 code units, whose surrogates send astral text on to a check of its UTF-32 code points."""
    if text.isascii():
        return False
    width = _char_width(text)
    if width == 1:
        return False
    unassigned, units = _unassigned_tables()
    if width != 4:
        code_units = np.frombuffer(text.encode("utf-16-le", "surrogatepass"), dtype=np.uint16)
        if not _any_unassigned(units, code_units):
            return False
    code_points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return _any_unassigned(unassigned, code_points)


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
        try:
            return self._encode_routed(texts)
        except (TypeError, InputError) as exc:  # positions must name the whole batch
            raise _invalid_text_error(texts, exc) from None

    def _encode_routed(self, texts: list[str]) -> list[TokenArray]:
        routed = [index for index, text in enumerate(texts) if self.routes_to_reference(text)]
        if not routed:
            return self._encode_fast(texts)
        self.routed_documents += len(routed)
        routed_set = set(routed)
        fast_indices = [index for index in range(len(texts)) if index not in routed_set]
        out: list[TokenArray | None] = [None] * len(texts)
        fast = self._encode_fast([texts[index] for index in fast_indices])
        slow = self._reference.encode_batch([texts[index] for index in routed])
        for index, tokens in zip(fast_indices + routed, fast + slow):
            out[index] = tokens
        return [tokens for tokens in out if tokens is not None]

    def close(self) -> None:
        """Nothing to release: gigatoken's thread pool is process-wide."""

    def _parallel(self) -> bool:
        return self.threads > 1 and not _pool_inherited

    def _encode_fast(self, texts: list[str]) -> list[TokenArray]:
        if not self._parallel():
            # One call per document: no awkward-array assembly, so faster than a batch call.
            return [self._tokenizer.encode(text).astype(self.dtype) for text in texts]
        return [tokens for part in _char_chunks(texts, GIGATOKEN_CHUNK_CHARS)
                for tokens in self._encode_parallel(texts[part])]

    def _encode_parallel(self, texts: list[str]) -> list[TokenArray]:
        global _pool_started
        import awkward as ak

        _pool_started = True
        encoded = self._tokenizer.encode_batch(texts, parallel=True)
        layout = ak.to_layout(encoded)
        if isinstance(layout, ak.contents.ListOffsetArray):
            offsets = np.asarray(layout.offsets.data)
            flat = np.asarray(layout.content.data)
        else:
            flat = ak.to_numpy(ak.flatten(encoded, axis=1))
            offsets = np.concatenate(([0], np.cumsum(ak.to_numpy(ak.num(encoded, axis=1)))))
        flat = flat.astype(self.dtype)
        return [flat[offsets[i]:offsets[i + 1]] for i in range(len(texts))]

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
