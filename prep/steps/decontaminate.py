"""The built-in decontamination filter (`use = "decontaminate"`): drops documents sharing a word
n-gram with an item of a benchmark file.

Benchmark files are JSON Lines; the string values of `fields` of each item are its text. Texts
on both sides are normalised the same way: lower-cased (`str.lower`), cut into words, a word
being a maximal run of Unicode letters, digits and underscores (`\\w+`), so whitespace, line
breaks and punctuation never hide a match. Every run of `ngram` consecutive words of an item is
hashed (each word by xxh3-64, the n-gram as a polynomial over its words' hashes modulo 2**64);
a document is dropped when one of its n-grams hashes to an item's, with the reason
`contaminated: <file>` naming the first benchmark file (in path order) holding that n-gram, and
the detail (kept with the dropped document, shown by `prep trace`) naming that file's first line
holding it and the shared words. An
item shorter than `ngram` words contributes nothing (a match that short says little). Hashing can
only add false hits of probability about (document n-grams x benchmark n-grams) / 2**64.

The files are found when the pipeline is read (`paths`, globs relative to its folder), refused
unless they are regular files of JSON objects, and recorded by name and SHA-256: their contents
enter the tokenize task key, so a changed benchmark recomputes. Workers read them again, checking
each against its recorded SHA-256, and build the n-gram table once per process.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from prep.regular import read_regular
from prep.steps.catalog import register
from prep.steps.protocol import DocumentStep, Drop, Outcome, SettingError, StepDocument

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

WORD = re.compile(r"\w+")
MULTIPLIER = 0x9E3779B97F4A7C15  # odd: the polynomial's base, modulo 2**64
MAX_FILE_BYTES = 1 << 30  # a benchmark file read whole: the bound of any file prep reads whole


@dataclass(frozen=True)
class BenchmarkFile:
    """A benchmark file as the step records it: as the pipeline named it (after globbing), where
    it is on this machine (not part of the key), and its SHA-256."""

    name: str
    path: str
    sha256: str


@register
@dataclass(frozen=True)
class Decontaminate(DocumentStep):
    """Drops documents that share an n-gram of words with a benchmark item."""

    use: ClassVar[str] = "decontaminate"
    paths: tuple[str, ...] = ()
    fields: tuple[str, ...] = ("question", "answer")
    ngram: int = 13
    files: tuple[BenchmarkFile, ...] = field(default=(), metadata={"derived": True})

    def check(self) -> None:
        if not self.paths:
            raise SettingError("paths", "name at least one benchmark file (JSON Lines)")
        if not self.fields:
            raise SettingError("fields", "name at least one field of the benchmark items")
        self.require_at_least(("ngram",), 1)

    def settings(self) -> dict[str, object]:
        return {"paths": list(self.paths), "fields": list(self.fields), "ngram": self.ngram,
                "files": [{"name": file.name, "sha256": file.sha256} for file in self.files]}

    def resolve(self, base_dir: Path | None) -> Decontaminate:
        """The step with its benchmark files found, checked and hashed."""
        files = [BenchmarkFile(name, str(path), _sha256_of_items(name, path, self.fields))
                 for name, path in _found(self.paths, base_dir or Path.cwd())]
        return replace(self, files=tuple(files))

    def apply(self, document: StepDocument) -> Outcome:
        import numpy as np

        hashes, file_of, line_of = _table(self)
        grams = ngram_hashes(document.text, self.ngram)
        if not len(grams) or not len(hashes):
            return None
        at = np.searchsorted(hashes, grams).clip(0, len(hashes) - 1)
        hit = np.flatnonzero(hashes[at] == grams)
        if not len(hit):
            return None
        first = int(hit[np.argmin(file_of[at[hit]] * (1 << 32) + hit)])  # the first file's, first in the text
        name = self.files[int(file_of[at[first]])].name
        shared = " ".join(WORD.findall(document.text.lower())[first:first + self.ngram])
        return Drop(f"contaminated: {name}", f'{name} line {int(line_of[at[first]])}: "{shared}"')


def _found(patterns: tuple[str, ...], base_dir: Path) -> Iterator[tuple[str, Path]]:
    """Each file the patterns name, in pattern order, each pattern's matches sorted; SettingError
    for a pattern that matches nothing."""
    seen: set[Path] = set()
    for pattern in patterns:
        spelled = Path(pattern).expanduser()
        full = spelled if spelled.is_absolute() else base_dir / spelled
        matches = sorted(Path(found) for found in glob.glob(str(full), recursive=True)) or \
            ([full] if full.exists() else [])
        if not matches:
            raise SettingError("paths", f"{pattern!r} matches no file (relative to {base_dir})")
        for path in matches:
            if path not in seen:
                seen.add(path)
                yield (str(path.relative_to(base_dir)) if path.is_relative_to(base_dir) else str(path)), path


def _sha256_of_items(name: str, path: Path, fields: tuple[str, ...]) -> str:
    """The file's SHA-256, once its lines proved to be JSON objects; SettingError naming the line."""
    data = _read(name, path)
    for number, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            _item_texts(line, fields, f"{name}:{number}")
    return hashlib.sha256(data).hexdigest()


def _read(name: str, path: Path) -> bytes:
    """A benchmark file's bytes, read as a regular file only; SettingError when it cannot be."""
    try:
        return read_regular(path, MAX_FILE_BYTES)
    except (OSError, ValueError) as exc:
        raise SettingError("paths", f"{name}: cannot read it ({exc})") from None


def _item_texts(line: bytes, fields: tuple[str, ...], where: str) -> list[str]:
    """The texts of one benchmark item's `fields`; SettingError when the line is no JSON object."""
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise SettingError("paths", f"{where}: not JSON Lines ({exc})") from None
    if not isinstance(item, dict):
        raise SettingError("paths", f"{where}: not a JSON object")
    return [value for key in fields if isinstance(value := item.get(key), str)]


def ngram_hashes(text: str, n: int) -> npt.NDArray[np.uint64]:
    """The hash of every run of `n` words of `text` (normalised as the module says), in order."""
    import numpy as np
    import xxhash

    words = np.fromiter((xxhash.xxh3_64_intdigest(word.encode("utf-8", "surrogatepass"))
                         for word in WORD.findall(text.lower())), dtype=np.uint64)
    count = len(words) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    grams = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for offset in range(n):
            grams = grams * np.uint64(MULTIPLIER) + words[offset:offset + count]
    return grams


Table = tuple["npt.NDArray[np.uint64]", "npt.NDArray[np.int64]", "npt.NDArray[np.int64]"]
_TABLES: dict[tuple[str, ...], Table] = {}


def _table(step: Decontaminate) -> Table:
    """Every benchmark n-gram hash, sorted and unique, with the first file (index) and line holding
    it; built once per process from the files, each checked against its recorded SHA-256."""
    import numpy as np

    key = (str(step.ngram), *step.fields, *(file.sha256 for file in step.files))
    if key not in _TABLES:
        hashes, owners, lines = [], [], []
        for index, file in enumerate(step.files):
            data = read_regular(file.path, MAX_FILE_BYTES)
            if hashlib.sha256(data).hexdigest() != file.sha256:
                raise RuntimeError(f"benchmark file {file.name} ({file.path}) changed since the pipeline was read")
            for number, line in enumerate(data.splitlines(), start=1):
                for text in _item_texts(line, step.fields, f"{file.name}:{number}") if line.strip() else ():
                    grams = ngram_hashes(text, step.ngram)
                    hashes.append(grams)
                    owners.append(np.full(len(grams), index, dtype=np.int64))
                    lines.append(np.full(len(grams), number, dtype=np.int64))
        every = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
        owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
        numbers = np.concatenate(lines) if lines else np.zeros(0, dtype=np.int64)
        order = np.lexsort((numbers, owner, every))  # by hash, file, line: a hash's first is its first item
        every, owner, numbers = every[order], owner[order], numbers[order]
        first = np.concatenate([[True], every[1:] != every[:-1]]) if len(every) else np.zeros(0, dtype=bool)
        _TABLES[key] = (every[first], owner[first], numbers[first])
    return _TABLES[key]
