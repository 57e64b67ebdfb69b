"""datatrove's side of tests/bench/bench_steps.py: a script run by that benchmark with the Python
of a virtualenv holding datatrove (never prep's environment: it imports nothing of prep).

    VENV/bin/python tests/bench/steps_peer.py SAMPLE.jsonl [--lid-model lid.176.ftz]

It reads the documents of SAMPLE.jsonl (`{"id", "text"}` lines, the benchmark's sample) once,
answers one JSON line on stdout (documents, text bytes, versions), then serves requests, one JSON
line each on stdin: `{"filters": [{"kind": "GopherQualityFilter", "args": {...}}, ...]}` runs the
filters in that order over every document, as a datatrove pipeline does (each filter's `run`, a
generator over the previous one's output, with datatrove's own per-document stats), and answers
`{"wall", "cpu", "kept", "changed", "reasons"}`. Only that pass is timed (wall and this process's
CPU seconds): the Document objects (fresh for each request: C4QualityFilter changes their text)
and the filters are made before it. An empty line or end of input ends the script. datatrove's
loguru logs go to stderr, which the benchmark keeps in a file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

KINDS = ("GopherRepetitionFilter", "GopherQualityFilter", "C4QualityFilter", "LanguageFilter", "PIIFormatter")
"""The datatrove steps a request may name."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sample", type=Path)
    parser.add_argument("--lid-model", type=Path, help="the fastText model LanguageFilter loads (lid.176.ftz)")
    args = parser.parse_args()
    replies = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints must not mix with the replies
    with args.sample.open(encoding="utf-8") as handle:
        texts = [json.loads(line)["text"] for line in handle]
    model = _load_model(args.lid_model) if args.lid_model else None
    _warm_up()
    versions = {name: _version(name) for name in ("datatrove", "spacy", "fasttext-numpy2-wheel")}
    _reply(replies, {"documents": len(texts), "bytes": sum(len(text.encode("utf-8")) for text in texts),
                     "versions": versions, "python": sys.version.split()[0]})
    for line in sys.stdin:
        if not line.strip():
            break
        request = json.loads(line)
        _reply(replies, _run(texts, [_make(spec, model) for spec in request["filters"]]))


def _run(texts: list[str], steps: list[Any]) -> dict[str, object]:
    """One timed pass of `steps` over fresh Documents of `texts`, with what it kept, changed and dropped."""
    from datatrove.data import Document

    documents = [Document(text=text, id=str(index)) for index, text in enumerate(texts)]
    kept: list[Any] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    stream: Iterable[Any] = iter(documents)
    for step in steps:
        stream = step.run(stream)
    kept.extend(stream)
    cpu, wall = time.process_time() - cpu_started, time.perf_counter() - started
    changed = sum(1 for document in kept if document.text != texts[int(document.id)])
    return {"wall": wall, "cpu": cpu, "kept": len(kept), "changed": changed, "reasons": _reasons(steps)}


def _reasons(steps: list[Any]) -> dict[str, int]:
    """Each filter's drops by reason, from its datatrove stats (`dropped_<reason>`; a filter that
    gives no reason counts as `<name>: dropped`)."""
    found: dict[str, int] = {}
    for step in steps:
        stats = step.stats.stats
        named = {key.removeprefix("dropped_"): int(value.total) for key, value in stats.items()
                 if key.startswith("dropped_")}
        unnamed = int(stats["dropped"].total) - sum(named.values()) if "dropped" in stats else 0
        if unnamed:
            named["dropped"] = unnamed
        found.update({f"{type(step).__name__}: {reason}": count for reason, count in named.items() if count})
    return found


def _make(spec: dict[str, Any], model: Any) -> Any:
    """A fresh datatrove step as `spec` configures it (lists of pairs made the tuples datatrove takes)."""
    from datatrove.pipeline import filters, formatters

    kind, settings = spec["kind"], dict(spec["args"])
    if kind not in KINDS:
        raise SystemExit(f"steps_peer: unknown kind {kind!r}")
    for key in ("top_n_grams", "dup_n_grams"):
        if key in settings:
            settings[key] = tuple(tuple(pair) for pair in settings[key])
    step = getattr(formatters if kind == "PIIFormatter" else filters, kind)(**settings)
    if kind == "LanguageFilter":
        if model is None:
            raise SystemExit("steps_peer: LanguageFilter needs --lid-model")
        step.model._model = model  # the loaded model: datatrove would download lid.176.bin
    return step


def _load_model(path: Path) -> Any:
    from fasttext.FastText import _FastText

    return _FastText(str(path))


def _warm_up() -> None:
    """Load the word and sentence tokenizers the filters use (spaCy's blank English pipeline)."""
    from datatrove.utils.text import split_into_sentences, split_into_words
    from datatrove.utils.typeshelper import Languages

    split_into_words("Warm up the word tokenizer.", Languages.english)
    split_into_sentences("Warm up. The sentence splitter.", Languages.english)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "none"


def _reply(stream: Any, message: dict[str, object]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


if __name__ == "__main__":
    main()
