"""Files a pulled folder holds beside its shards, derived from the snapshot's manifest by their
formats (prep.formats.registry: `folder_files`), such as MDS's `mds/index.json` listing the
shards held: `prep pull` writes them, `prep verify` checks them like artifacts."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from prep.config import recorded_metadata_keys
from prep.formats.registry import FolderFiles, HeldShard, load
from prep.formats.units import units
from prep.transfer.held import install_bytes
from prep.transfer.shares import Artifact


@dataclass(frozen=True)
class DerivedFile:
    """One derived file: checked as an artifact of its format (shard -1), and its bytes."""

    artifact: Artifact
    raw: bytes


def derived_files(manifest: Mapping[str, Any], held: Iterable[Artifact]) -> list[DerivedFile]:
    """The derived files of the artifacts `held` (a share of the snapshot `manifest` lists)."""
    documents = {str(entry["path"]): int(entry["documents"]) for entry in manifest["artifacts"]}
    dtype = str(manifest["tokenizer"]["dtype"])
    keys = recorded_metadata_keys(manifest["config"])
    ordered = sorted(held, key=lambda artifact: artifact.path)
    found = []
    for fmt in units():
        shards = tuple(HeldShard(a.path, a.size, documents[a.path]) for a in ordered if a.format in fmt.format_names)
        if fmt.folder_files is None or not shards:
            continue
        for path, raw in cast(FolderFiles, load(fmt.folder_files))(shards, dtype, keys).items():
            found.append(DerivedFile(Artifact(path, fmt.name, -1, len(raw), hashlib.sha256(raw).hexdigest()), raw))
    return found


def install_derived(dest: Path, files: Iterable[DerivedFile]) -> None:
    """Write each derived file into `dest`, atomically and durably."""
    for file in files:
        install_bytes(dest / file.artifact.path, file.raw)
