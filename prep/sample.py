"""The built-in sample: a small real-text corpus, a BPE tokenizer made offline, and the pipeline
that builds them (pipelines/sample.toml in the repository is what `prep sample` writes there).

The corpus is the docstrings of the Python standard library on this machine (sorted, so the
same Python gives the same corpus), plus a few exact duplicates and a document that spells the
EOS token, so dedup and special-token handling show in the sample build.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from prep.errors import UsageError
from prep.regular import read_regular

EOS = "<|endoftext|>"
DEFAULT_FOLDER = Path("pipelines/sample-data")
PIPELINE_NAME = "sample.toml"
MIN_CHARS = 80
_SKIPPED = frozenset({"site-packages", "dist-packages", "__pycache__"})
_TESTS = frozenset({"test", "tests", "idle_test"})
_HEADER = """\
# The built-in sample: `prep sample` writes pipelines/sample-data/ offline, then
# `prep build pipelines/sample.toml` builds it into ./prep-store.
"""
_OTHER_HEADER = """\
# The built-in sample: `prep sample FOLDER` writes FOLDER/ offline and this file beside it, then
# `prep build` of this file builds it into ./prep-store.
"""
_PIPELINE = """\
dataset = "sample"
seed = 1234

[input]
paths = ["{data}/corpus.jsonl"]
format = "jsonl"
text_field = "text"
id_field = "id"

[tokenizer]
path = "{data}/tokenizer.json"
eos = "{eos}"

[dedup]
exact = true

[output]
shard_size = "1MB"
formats = ["bin", "wds"]
"""


def stdlib_root() -> Path:
    """The folder of this Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> Iterator[Path]:
    """The standard library's modules in a fixed order: top-level ones, then those of packages,
    then test modules (installed packages below `root`, as in site-packages, are not its own)."""
    nested: list[tuple[bool, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [name for name in dirnames if name not in _SKIPPED]
        folder = Path(dirpath)
        if folder != root:
            is_test = bool(_TESTS.intersection(folder.relative_to(root).parts))
            nested.extend((is_test, folder / name) for name in filenames if name.endswith(".py"))
    yield from sorted(root.glob("*.py"))
    yield from (path for _, path in sorted(nested))


def stdlib_docstrings(limit: int) -> Iterator[tuple[str, str]]:
    """(id, text) pairs: module, class and function docstrings of 80+ characters of the standard
    library, at most `limit`; fewer only when this Python has fewer."""
    root = stdlib_root()
    count = 0
    for path in stdlib_files(root):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if doc and len(doc) >= MIN_CHARS:
                name = getattr(node, "name", "<module>")
                yield f"{module}.{name}.{getattr(node, 'lineno', 0)}", doc
                count += 1
                if count >= limit:
                    return


def tokenizer_json(texts: Iterable[str], vocab_size: int, eos: str = EOS) -> str:
    """A GPT-2-style byte-level BPE with `eos` as its only special token, trained on `texts`: its
    tokenizer.json text (what `Tokenizer.save` writes)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer.to_str(pretty=True)


def train_tokenizer(texts: Iterable[str], vocab_size: int, path: Path, eos: str = EOS) -> Path:
    """Train a GPT-2-style byte-level BPE with `eos` as its only special token into `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tokenizer_json(texts, vocab_size, eos), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Sample:
    """What make_sample wrote: the two files and how many docstrings the corpus holds."""

    corpus: Path
    tokenizer: Path
    documents: int
    records: int  # documents plus the duplicates and the document spelling EOS
    written: bool = True  # False when both files already held exactly these bytes


def make_sample(folder: Path, documents: int = 3000, vocab_size: int = 4096, force: bool = False) -> Sample:
    """Write folder/corpus.jsonl and folder/tokenizer.json from `documents` docstrings (fewer only
    when the standard library has fewer). A file there that differs from what would be written is
    refused (UsageError naming it, nothing written) unless `force`: it may hold the user's edits."""
    records = [{"id": doc_id, "text": text} for doc_id, text in stdlib_docstrings(documents)]
    extras = [{"id": f"dup-{i}", "text": records[i * 7]["text"]} for i in range(min(5, len(records) // 7))]
    extras.append({"id": "spells-eos", "text": f"A code corpus may contain the string {EOS} literally."})
    files = {folder / "corpus.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records + extras),
             folder / "tokenizer.json": tokenizer_json((r["text"] for r in records), vocab_size)}
    changed = {path: text for path, text in files.items() if _differs(path, text.encode("utf-8"))}
    for path in changed if not force else ():
        if os.path.lexists(path):
            raise UsageError(f"{path} differs from the sample this would write (edited, or made with other "
                             "--documents or --vocab-size); nothing was written: pass --force to replace it")
    for path, text in changed.items():
        _write_atomically(path, text)
    corpus, tokenizer = files
    return Sample(corpus, tokenizer, len(records), len(records) + len(extras), written=bool(changed))


def _differs(path: Path, data: bytes) -> bool:
    """Whether `path` holds anything but `data`: no file, another size or bytes, or no regular file."""
    try:
        return read_regular(path, len(data)) != data
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.EFBIG, errno.EINVAL):  # larger than `data`; a folder, a FIFO
            return True
        raise


def _write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary beside it, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".part")
    temp.write_text(text, encoding="utf-8")
    temp.replace(path)


def pipeline_path(folder: Path) -> Path:
    """Where the sample pipeline of the data in `folder` goes: beside it, as sample.toml."""
    return folder.parent / PIPELINE_NAME


def pipeline_text(folder: Path) -> str:
    """The sample pipeline reading folder/corpus.jsonl and folder/tokenizer.json, by paths relative to
    pipeline_path(folder); for DEFAULT_FOLDER it is the repository's pipelines/sample.toml."""
    data = json.dumps(folder.name or ".", ensure_ascii=False)[1:-1]  # a TOML basic string's body
    header = _HEADER if folder == DEFAULT_FOLDER else _OTHER_HEADER
    return header + _PIPELINE.format(data=data, eos=EOS)


def write_pipeline(folder: Path) -> Path | None:
    """Write the sample pipeline beside `folder` unless a file is there already (which is kept, so
    edits survive making the data again); returns the path written, or None."""
    path = pipeline_path(folder)
    if path.exists():
        return None
    _write_atomically(path, pipeline_text(folder))
    return path
