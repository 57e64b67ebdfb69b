"""Check (not a test): every artifact's SHA-256 of a fixed corpus, to prove a change keeps shard bytes.

    python -m tests.bench.shard_identity record OUT.json [--workdir /tmp/prep-identity]
    python -m tests.bench.shard_identity check OUT.json [--workdir /tmp/prep-identity]

Snapshot ids change with the code, so the check compares artifacts (path and SHA-256) instead.
The corpus is fixed: short real-text documents from the scale benchmark's 1M corpus, long ones
from the 100 MB corpus, exact duplicates across files, special-token spellings, non-ASCII and
documents without ids' neighbours, in three JSON Lines files. It is built with formats bin and
wds, `shard_size = "4MB"`, 2 workers, once with the default bucket size and once with buckets
of 40,000 documents (many order tasks), each into a fresh store.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.bench.bench_scale import manifest, short_corpus
from tests.bench.benchsupport import REPO, corpus, tokenizer

BUCKET_SIZES = (0, 40_000)  # 0: the default DOCUMENTS_PER_BUCKET
_BUILD = """
import sys
import prep.runner.ordering as ordering
if int(sys.argv[1]):
    ordering.DOCUMENTS_PER_BUCKET = int(sys.argv[1])
sys.argv = ["prep", *sys.argv[2:]]
from prep.cli.main import main
main()
"""


def fixed_corpus(workdir: Path) -> Path:
    """The check's corpus (made once from the benchmarks' corpora, which are deterministic)."""
    out = workdir / "identity-corpus"
    if out.exists():
        return out
    staging = workdir / "identity-corpus.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with open(short_corpus(workdir, 1_000_000) / "part-00000.jsonl", encoding="utf-8") as handle:
        short = [json.loads(next(handle)) for _ in range(120_000)]
    with open(sorted(corpus(workdir, 100).glob("*.jsonl"))[0], encoding="utf-8") as handle:
        long = [json.loads(next(handle))["text"] for _ in range(300)]
    odd = ["a <|endoftext|> b", "naïve café Москва 北京市 😀", "line\r\nline", "\x00\x01 control", "x" * 5000]
    files: list[list[dict[str, Any]]] = [short[:60_000], short[60_000:], []]
    files[2] = [{"id": f"long{i}", "text": text} for i, text in enumerate(long)]
    files[2] += [{"id": f"odd{i}", "text": text} for i, text in enumerate(odd)]
    files[2] += [{"id": f"dup{i}", "text": row["text"]} for i, row in enumerate(short[:2000:3])]
    for index, rows in enumerate(files):
        with open(staging / f"part-{index}.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    staging.rename(out)
    return out


def artifacts(workdir: Path, per_bucket: int) -> dict[str, str]:
    """{artifact path: SHA-256} of a fresh build of the fixed corpus."""
    data = fixed_corpus(workdir)
    tok = tokenizer(corpus(workdir, 100), workdir / "tokenizer-50257.json")
    spec = workdir / "identity.toml"
    spec.write_text(f'dataset = "bench"\nseed = 7\n[input]\npaths = ["{data}"]\nid_field = "id"\n'
                    f'[tokenizer]\npath = "{tok}"\nbackend = "gigatoken"\n'
                    f'[output]\nshard_size = "4MB"\nformats = ["bin", "wds"]\n')
    store = workdir / "identity-store"
    shutil.rmtree(store, ignore_errors=True)
    subprocess.run([sys.executable, "-c", _BUILD, str(per_bucket), "build", str(spec), "--store", str(store),
                    "--workers", "2"], cwd=REPO, check=True, capture_output=True)
    found = {str(a["path"]): str(a["sha256"]) for a in manifest(store)["artifacts"]}
    shutil.rmtree(store)
    return found


def main() -> None:
    """Record or check the artifacts of every bucket size."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("file", type=Path)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-identity"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    built = {str(size): artifacts(args.workdir, size) for size in BUCKET_SIZES}
    if args.action == "record":
        args.file.write_text(json.dumps(built, indent=1, sort_keys=True))
        print(f"recorded {sum(len(found) for found in built.values())} artifacts")
        return
    recorded = json.loads(args.file.read_text())
    bad = 0
    for size, found in built.items():
        for name in sorted(set(recorded["0"]) | set(found)):
            if recorded["0"].get(name) != found.get(name):
                bad += 1
                print(f"buckets {size or 'default'}: {name}: {recorded['0'].get(name)} -> {found.get(name)}")
        print(f"buckets {size or 'default'}: {len(found)} artifacts, {len(recorded['0'])} recorded")
    print("identical" if not bad else f"{bad} differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
