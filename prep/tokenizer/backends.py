"""Tokenizer backends: the reference (`tokenizers`) and a fast one (`gigatoken`) that must match it.

Every backend turns documents into exactly the reference token ids (see `prep.tokenizer`); a
backend never adds EOS. `make_backend` picks one; docs/tokenizers.md explains the choices.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from prep.errors import InputError, TokenizerError
from prep.tokenizer import (
    TokenizerInfo,
    UnencodableDocument,
    contains_special,
    first_line,
    read_tokenizer_file,
    reference_encode_batch,
)
from prep.tokenizer.spans import (
    Offsets,
    SpanTexts,
    TokenArray,
    documents_containing,
    offsets_of,
    replace_spans,
    split_tokens,
)
from prep.tokenizer.support import (
    added_tokens,
    cached_definition,
    gigatoken_definition,
    probe_texts,
    unsupported_added_tokens,
)
from prep.tokenizer.unicode import documents_with_unassigned, has_unassigned_code_point

__all__ = ["Backend", "GigatokenBackend", "ReferenceBackend", "gigatoken_definition", "has_unassigned_code_point",
           "make_backend"]

BACKEND_KINDS = ("auto", "tokenizers", "gigatoken")
INSTALL_HINT = "pip install 'prep[fast]'"
# Bounds memory: the reference builds a full Encoding object (strings, offsets) per document.
REFERENCE_CHUNK_CHARS = 4 << 20
# One gigatoken call per chunk: big enough to keep every thread busy.
GIGATOKEN_CHUNK_BYTES = 32 << 20


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
    """The reference encoding itself: `tokenizers` with the loaded tokenizer's settings; `source`
    (the tokenizer file) is what its errors name."""

    name = "tokenizers"

    def __init__(self, tokenizer: Tokenizer, dtype: np.dtype[Any], source: str = "tokenizer") -> None:
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.source = source
        self.version = _package_version("tokenizers")

    def encode_batch(self, texts: list[str]) -> list[TokenArray]:
        """Encode with `encode_batch_fast`, a few MB at a time."""
        out: list[TokenArray] = []
        try:
            for part in _char_chunks(texts, REFERENCE_CHUNK_CHARS):
                out.extend(reference_encode_batch(self.tokenizer, texts[part], self.dtype))
        except TypeError as exc:
            raise _invalid_text_error(texts, exc) from None
        except Exception as exc:  # noqa: BLE001 -- tokenizers raises plain Exception (no unk token, say)
            raise self._unencodable(texts, exc) from None
        return out

    def _unencodable(self, texts: Sequence[str], exc: Exception) -> Exception:
        """UnencodableDocument for the first of `texts` the tokenizer fails on alone."""
        for index, text in enumerate(texts):
            try:
                self.tokenizer.encode(text, add_special_tokens=False)
            except Exception as bad:  # noqa: BLE001 -- as above
                return UnencodableDocument(self.source, first_line(bad), index)
        return exc

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

        added = added_tokens(reference.tokenizer)
        reason = unsupported_added_tokens(added, info.encode_special_tokens)
        if reason is not None:
            raise GigatokenUnsupported(reason)
        try:
            self._tokenizer = gigatoken.Tokenizer.from_json(
                cached_definition(tokenizer_json, info.encode_special_tokens))
        except Exception as exc:  # noqa: BLE001 -- gigatoken raises several types, multi-line text
            raise GigatokenUnsupported(f"gigatoken cannot load it: {first_line(exc)}") from None
        self.version = _package_version("gigatoken")
        self.dtype = reference.dtype
        self.threads = threads
        self.routed_documents = 0
        self._reference = reference
        # With specials kept as plain text, the reference also hides any non-special added token
        # overlapping a special string; a definition without specials cannot, so such documents
        # go to the reference whenever non-special added tokens exist.
        has_plain_added = any(not token.special for token in added)
        self._route_specials = info.encode_special_tokens and has_plain_added and bool(info.special_tokens)
        self._special_tokens = info.special_tokens
        self._self_check(probe_texts(added))

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
        try:
            slow = self._reference.encode_batch([texts[index] for index in routed])
        except UnencodableDocument as exc:
            raise exc.at(routed[exc.index]) from None
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
        try:
            expected = self._reference.encode_batch(probes)
        except UnencodableDocument as exc:
            raise GigatokenUnsupported(f"the reference cannot encode the probe {probes[exc.index][:40]!r}: "
                                       f"{exc.reason}") from None
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


def _read_loaded_file(path: Path, sha256: str) -> str:
    """The text of the tokenizer file `sha256` names: the one the reference was loaded from, so that
    both libraries encode with the same definition even when the file is replaced meanwhile."""
    try:
        data = read_tokenizer_file(path)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read tokenizer: {exc}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise TokenizerError(f"{path}: tokenizer file changed while it was read")
    return text


def make_backend(kind: str, tokenizer_path: Path, tokenizer: Tokenizer, info: TokenizerInfo,
                 threads: int) -> Backend:
    """The backend `kind` names; "auto" means gigatoken when it is installed and reproduces this
    tokenizer, else the reference. Also bounds the process's tokenizer threads to `threads`."""
    if kind not in BACKEND_KINDS:
        raise TokenizerError(f"unknown tokenizer backend {kind!r} (use {', '.join(BACKEND_KINDS)})")
    configure_threads(threads)
    reference = ReferenceBackend(tokenizer, np.dtype(info.dtype), str(tokenizer_path))
    if kind == "tokenizers":
        return reference
    if not gigatoken_available():
        if kind == "gigatoken":
            raise TokenizerError(f"tokenizer backend gigatoken is not installed: {INSTALL_HINT}")
        return reference
    tokenizer_json = _read_loaded_file(tokenizer_path, info.sha256)
    try:
        return GigatokenBackend(tokenizer_json, reference, info, threads)
    except GigatokenUnsupported as exc:
        if kind == "gigatoken":
            raise TokenizerError(f"{tokenizer_path}: tokenizer backend gigatoken is unusable: {exc} "
                                 f"(use backend tokenizers or auto)") from None
        return reference
