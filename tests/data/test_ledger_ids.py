"""`prep consumed --document ID` for an id the snapshot does not hold: an error naming the id (exit 2),
not "not touched". For a deletion or contamination check a typo must not read as clean; a held id
that no sample touched still answers "not touched"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prep.data.ledger import consumed, find
from prep.data.reader import Reader
from prep.errors import NotFoundError
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline

SEQ, GLOBAL, SAMPLES = 16, 8, 8


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Path]:
    """`web` (bin and wds) built and pulled, `plain` (bin only: documents named by position) built."""
    root = tmp_path_factory.mktemp("ledgerids")
    store = root / "store"
    for name, formats in (("web", '["bin", "wds"]'), ("plain", '["bin"]')):
        write_jsonl(root / name / "corpus" / "a.jsonl", make_records(200, seed=4, prefix=name))
        pipeline = write_pipeline(root / name, tokenizer_path, dataset=name, shard_size="2KB", formats=formats)
        run_prep("build", pipeline, "--store", store, "--workers", "1")
    run_prep("pull", "web@latest", root / "web-dest", "--store", store)
    return {"store": store, "web": root / "web-dest"}


def _untouched(reader: Reader, prefix: str) -> str:
    """An id the snapshot holds that the first SAMPLES samples do not touch."""
    touched = {document.id for document in consumed(reader, SAMPLES).documents}
    return next(f"{prefix}-{n}" for n in range(199, 0, -1) if f"{prefix}-{n}" not in touched)


def test_an_id_the_named_snapshot_does_not_hold_is_refused_naming_it(built: dict[str, Path]) -> None:
    reader = Reader(built["web"], SEQ, GLOBAL)
    with pytest.raises(NotFoundError) as caught:
        find(reader, SAMPLES, "web-9999")  # a typo of an id
    assert str(caught.value) == f"web-9999: {reader.sources[0].id[:19]} holds no document of this id; check the id"
    assert not find(reader, SAMPLES, _untouched(reader, "web")).touched  # held, not touched: still the answer


def test_a_position_the_snapshot_does_not_hold_is_refused_naming_it(built: dict[str, Path]) -> None:
    """Documents named by position (no .tar at hand): a shard the manifest lacks, or a sequence past its end."""
    reader = Reader("plain@latest", SEQ, GLOBAL, store=built["store"])
    touched = {d.id for d in consumed(reader, SAMPLES).documents}
    shards = {a["path"]: a["documents"] for a in reader.sources[0].snapshot.manifest["artifacts"] if a["format"] == "bin"}
    path, documents = max(shards.items())
    for document in (f"{path}:{documents}", "bin/no-such-shard.bin:0"):
        with pytest.raises(NotFoundError, match=rf"^{document}: sha256:[0-9a-f]{{12}} holds no document of this id"):
            find(reader, SAMPLES, document)
    held = next(f"{shard}:{count - 1}" for shard, count in sorted(shards.items(), reverse=True)
                if f"{shard}:{count - 1}" not in touched)
    assert not find(reader, SAMPLES, held).touched


@pytest.mark.parametrize("as_json", [False, True])
def test_the_cli_exits_2_with_one_line(built: dict[str, Path], as_json: bool) -> None:
    flags = ["--json"] if as_json else []
    result = run_prep("consumed", built["web"], "--samples", str(SAMPLES), "--seq-len", str(SEQ), "--document",
                      "web-9999", *flags, check=False, timeout=120)
    assert result.returncode == 2, result.stderr
    if as_json:
        assert json.loads(result.stdout)["error"].startswith("web-9999: sha256:")
    else:
        assert result.stderr.startswith("prep: error: web-9999: sha256:") and result.stderr.count("\n") == 1
        assert result.stderr.endswith(" holds no document of this id; check the id\n") and not result.stdout
