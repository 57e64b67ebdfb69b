"""Benchmark (not a test): the language step's throughput (`use = "language"`, prep/steps/language.py)
on the real-text corpus of ../shared/bench/make_corpus.py, one process, document by document as a
tokenize worker runs it.

    pip install -e '.[lang]'
    python -m tests.bench.bench_language --mb 50 --runs 3 --workdir /tmp/prep-bench

It prints MB/s of document text (UTF-8 bytes of every document's whole text, as the snapshot's
`stats.steps[i].text_bytes` counts them) for two shapes of the same text: whole documents (source
files and manual pages, most longer than the MAX_CHARS the detector sees, so their cost is
bounded) and paragraphs (the documents cut at blank lines, those of 40 characters or more: short
documents, where the per-document cost weighs). Each figure is the median of --runs rounds, after
the model is loaded once (its load time is printed apart), with the reasons the step gave.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

from prep.steps.language import LanguageFilter, _detector
from prep.steps.protocol import Drop, StepDocument
from tests.bench.benchsupport import corpus


def _texts(folder: Path) -> list[str]:
    return [json.loads(line)["text"] for path in sorted(folder.glob("*.jsonl")) for line in path.open(encoding="utf-8")]


def _paragraphs(texts: list[str]) -> list[str]:
    return [part for text in texts for part in text.split("\n\n") if len(part.strip()) >= 40]


def _time(step: LanguageFilter, documents: list[StepDocument], runs: int) -> tuple[float, Counter[str]]:
    """The median seconds over `runs` rounds of applying the step to every document, and its reasons."""
    seconds, reasons = [], Counter[str]()
    for _ in range(runs):
        reasons.clear()
        start = time.perf_counter()
        for document in documents:
            outcome = step.apply(document)
            reasons[outcome.reason if isinstance(outcome, Drop) else "kept"] += 1
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), reasons


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=50, help="corpus size in MB (made once under --workdir)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--languages", default="en", help="comma-separated codes to keep")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    texts = _texts(corpus(args.workdir, args.mb))
    step = LanguageFilter(tuple(args.languages.split(",")))
    step.check()
    start = time.perf_counter()
    _detector()
    print(f"model loaded in {time.perf_counter() - start:.2f} s")
    for shape, shaped in (("documents", texts), ("paragraphs", _paragraphs(texts))):
        documents = [StepDocument(None, text) for text in shaped]
        size = sum(len(text.encode()) for text in shaped)
        seconds, reasons = _time(step, documents, max(1, args.runs))
        top = ", ".join(f"{reason} {count}" for reason, count in reasons.most_common(6))
        print(f"{shape:>10}: {len(documents):,} of {size / len(documents):,.0f} bytes on average, {size / 1e6:.1f} MB "
              f"in {seconds:.2f} s: {size / 1e6 / seconds:.2f} MB/s ({top})")


if __name__ == "__main__":
    main()
